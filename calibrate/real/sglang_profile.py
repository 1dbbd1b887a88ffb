"""A calibration profile from SGLang's own code: its real scheduler, timed phase by phase.

``overlap-sim calibrate --engine sglang`` runs SGLang 0.5.23's ``Scheduler`` in-process with its
own event loop (:mod:`realengines.sglang.drive`) on a designed request list and prices every
curve of the profile (:mod:`calibrate.profile`) from what the real functions cost
(:mod:`calibrate.real.sglang_trace`):

- decode grid: for each batch size B and context C, a wave of B requests with prompts of
  ``C - decode_steps/2`` tokens decoding ``decode_steps`` tokens together; its decode steps
  price ``forward.decode(B, C)``, ``launch.decode(B)``, ``schedule.decode(B)`` and
  ``process.decode(B)``; its prefill prices ``schedule.extend(B)``, ``process.extend(B)`` and its
  receive ``recv(B)`` (the empty receives of the decode steps price ``recv(0)``);
- extend grid: for each new-token count T and cached prefix P, a request of P tokens (finished
  at its prefill: the radix cache keeps it), then one of the same P tokens plus T new ones:
  ``forward.extend(T, P)`` and ``launch.extend(T)`` from the second's prefill.

Times are the scheduler thread's CPU time (``time.thread_time``): robust to other processes on
the machine. On the CPU engine the forward runs on that thread, so ``forward`` is CPU time too
(``ModelRunner.forward`` + ``ModelRunner.sample``); ``launch`` is the rest of ``run_batch``. The
wall time of each iteration outside the phases (loop overhead, the tracer: tens of microseconds)
is added to ``recv``. The requests stop by length (``ignore_eos``) or, with ``stop_strings``, also
carry stop strings that never match (the per-token stop check costs CPU in ``process``).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from calibrate.errors import CalibrationInputError
from calibrate.real import sglang_trace
from calibrate.real.environment import (Engine, mean_probe, model_metadata, run_module, run_probed, session_order,
                                        tp_bind)
from calibrate.real.jobs import Prompts, request
from calibrate.real import sglang_structured


DRIVER_TIMEOUT_S = 1800  # one in-process run: about a minute here; a hung one is stopped


@dataclass(frozen=True)
class SglangGrid:
    """What to measure. Lengths in tokens."""

    decode_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    decode_contexts: tuple[int, ...] = (128, 256, 512, 768)
    decode_steps: int = 32
    decode_waves: int = 2  # each (B, C) wave is sent this many times
    extend_tokens: tuple[int, ...] = (16, 64, 128, 256, 512)
    extend_prefixes: tuple[int, ...] = (0, 256, 512)
    extend_repeats: int = 5
    stop_strings: tuple[str, ...] = ()
    context_length: int = 2048
    max_running_requests: int = 16
    mem_fraction_static: float = 0.05
    seed: int = 0

    def server_args(self) -> list[str]:
        return ["--context-length", str(self.context_length), "--max-running-requests", str(self.max_running_requests),
                "--mem-fraction-static", str(self.mem_fraction_static)]

    def wave_fits(self, batch: int, ctx: int) -> bool:
        """Whether the design has a decode wave of ``batch`` requests at context ``ctx`` (all do
        here; the host grid cuts the largest)."""
        return True

    def check(self) -> None:
        """Raises CalibrationInputError for a grid the server cannot run."""
        if max(self.decode_batch_sizes) > self.max_running_requests:
            raise CalibrationInputError("--batch-sizes", "", f"a batch of {max(self.decode_batch_sizes)} exceeds "
                                        f"--max-running-requests {self.max_running_requests}")
        longest = max(max(self.decode_contexts) + self.decode_steps,
                      max(self.extend_tokens) + max(self.extend_prefixes) + 1)
        if longest > self.context_length:
            raise CalibrationInputError("--contexts", "", f"requests of {longest} tokens exceed the context "
                                        f"length {self.context_length}")
        if min(self.decode_contexts) <= self.decode_steps // 2:
            raise CalibrationInputError("--contexts", "", f"contexts must exceed decode_steps/2 = {self.decode_steps // 2}")


@dataclass
class Design:
    """The job's requests and, per request id, the profile point its steps measure."""

    waves: list = field(default_factory=list)  # lists of requests
    decode_point: dict = field(default_factory=dict)  # rid -> (B, C)
    extend_point: dict = field(default_factory=dict)  # rid -> (T, P) for measured prefills

    def job(self, model_dir: str, overlap: bool, grid: SglangGrid) -> dict:
        reqs = [r for wave in self.waves for r in wave]
        return {"model_dir": model_dir, "overlap": overlap, "server_args": grid.server_args(),
                "arrival": {"kind": "waves", "waves": [[r["rid"] for r in w] for w in self.waves]}, "requests": reqs}


def design(grid: SglangGrid) -> Design:
    """The waves of the calibration job (see the module docstring)."""
    d = Design()
    prompts = Prompts(grid.seed)
    n = 0

    def rid() -> str:
        nonlocal n
        n += 1
        return f"c{n - 1}"

    def stop(req: dict) -> dict:
        if grid.stop_strings:
            req["stop"] = list(grid.stop_strings)
        return req

    for _ in range(grid.decode_waves):
        for ctx in grid.decode_contexts:
            for b in grid.decode_batch_sizes:
                if not grid.wave_fits(b, ctx):
                    continue
                wave = [stop(request(rid(), prompts.new(ctx - grid.decode_steps // 2), grid.decode_steps))
                        for _ in range(b)]
                for r in wave:
                    d.decode_point[r["rid"]] = (b, ctx)
                d.waves.append(wave)
    for _ in range(grid.extend_repeats):
        for prefix in grid.extend_prefixes:
            for tokens in grid.extend_tokens:
                ids = prompts.new(prefix + tokens)
                if prefix:
                    d.waves.append([request(rid(), ids[:prefix], 1)])
                r = request(rid(), ids, 1)
                d.extend_point[r["rid"]] = (tokens, prefix)
                d.waves.append([r])
    return d


def samples(its: list[sglang_trace.Iteration], d: Design) -> list[dict]:
    """Profile samples (``{"curve", "point", "times_s"}``) from the job's iterations."""
    acc: dict[tuple, list[float]] = {}

    def add(curve: str, point: dict, t: float) -> None:
        acc.setdefault((curve, tuple(sorted(point.items()))), []).append(t)

    for it in its:
        if not it.control:  # a server's cache flush between loads is not a receive's cost
            add("recv", {"num_reqs": it.n_new}, it.recv + it.other)
    for s in sglang_trace.steps(its):
        rid = s.rids[0]
        if s.mode == "DECODE" and rid in d.decode_point:
            b, ctx = d.decode_point[rid]
            if s.num_reqs != b:
                continue
            add("forward.decode", {"num_reqs": b, "ctx": ctx}, s.forward)
            add("launch.decode", {"num_reqs": b}, s.launch)
            add("schedule.decode", {"num_reqs": b}, s.schedule)
            if s.process == s.process:
                add("process.decode", {"num_reqs": b}, s.process)
        elif s.mode == "EXTEND":
            if rid in d.decode_point and s.num_reqs == d.decode_point[rid][0]:
                add("schedule.extend", {"num_reqs": s.num_reqs}, s.schedule)
                if s.process == s.process:
                    add("process.extend", {"num_reqs": s.num_reqs}, s.process)
            elif rid in d.extend_point and s.num_reqs == 1:
                tokens, prefix = d.extend_point[rid]
                add("forward.extend", {"num_tokens": tokens, "prefix": prefix}, s.forward)
                add("launch.extend", {"num_tokens": tokens}, s.launch)
    return [{"curve": c, "point": dict(p), "times_s": ts} for (c, p), ts in sorted(acc.items())]


def check_coverage(samples_: list[dict], grid: SglangGrid) -> None:
    """Raises CalibrationInputError when a grid point got no samples (the real scheduler batched
    the waves differently than designed)."""
    have = {(s["curve"], tuple(sorted(s["point"].items()))) for s in samples_}
    want = [("forward.decode", {"num_reqs": b, "ctx": c}) for b in grid.decode_batch_sizes for c in grid.decode_contexts]
    want += [("forward.extend", {"num_tokens": t, "prefix": p}) for t in grid.extend_tokens for p in grid.extend_prefixes]
    missing = [f"{c} {p}" for c, p in want if (c, tuple(sorted(p.items()))) not in have]
    if missing:
        raise CalibrationInputError("calibration", "", f"no samples for {len(missing)} grid points, e.g. {missing[0]}")


# the SGLang 0.5.23 function each host curve is timed from (srt/managers/scheduler.py unless named)
HOST_FUNCTIONS = {
    "recv": "Scheduler.ingest_requests (recv_requests + process_input_requests)",
    "schedule.extend": "Scheduler.get_next_batch_to_run (a prefill batch)",
    "schedule.decode": "Scheduler.get_next_batch_to_run (a decode batch)",
    "launch.extend": "Scheduler.run_batch less ModelRunner.forward and ModelRunner.sample (a prefill)",
    "launch.decode": "Scheduler.run_batch less ModelRunner.forward and ModelRunner.sample (a decode step)",
    "process.extend": "Scheduler.process_batch_result (a prefill batch)",
    "process.decode": "Scheduler.process_batch_result (a decode batch)",
}



def metadata(engine: Engine, grid: SglangGrid, meta: dict, settings: tuple[str, ...], command: str) -> dict:
    import os
    import platform

    from calibrate.measure import host_cpu

    return {
        "backend": "sglang", "device": "cpu", "engine": "sglang", "engine_version": engine.version,
        "device_name": f"cpu (SGLang {engine.version} CPU engine, {meta.get('torch_threads', 1)} torch thread)",
        "host_cpu": host_cpu(), "host_cores": os.cpu_count(), "platform": platform.platform(),
        "libraries": {"sglang": meta.get("sglang"), "torch": meta.get("torch"), "python": meta.get("python")},
        "model": model_metadata(), "dtype": "float32",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "grid": asdict(grid), "repeats": grid.decode_waves * (grid.decode_steps - 1), "warmup": 0, "quick": False,
        "settings": list(settings), "base_setting": settings[0], "scheduler_limits": meta.get("limits", {}), "command": command,
        "timing": "the scheduler thread's CPU time (time.thread_time) of SGLang's own functions, in-process: "
                  "recv = ingest_requests (+ loop overhead), schedule = get_next_batch_to_run, forward = "
                  "ModelRunner.forward + sample, launch = run_batch - forward, process = process_batch_result",
        "sync_latency_s": 0.0,
        "curve_sources": {**{name: {"source": "measured", "engine": f"sglang {engine.version}", "function": fn,
                                    "forward": "SGLang's CPU forward (ModelRunner.forward)"}
                             for name, fn in HOST_FUNCTIONS.items()},
                          **{name: {"source": "measured", "engine": f"sglang {engine.version}",
                                    "function": "ModelRunner.forward + ModelRunner.sample (CPU)"}
                             for name in ("forward.decode", "forward.extend")}},
    }


TP_SESSION_TIMEOUT_S = 3600  # a TP calibration session (every wave through the server): minutes here


def tp_launch(tp: int) -> tuple[list[str], dict]:
    """(server arguments, environment) of SGLang's CPU server at tensor-parallel size ``tp``:
    ``--tp-size`` and ``SGLANG_CPU_OMP_THREADS_BIND`` (each rank its own cores,
    :func:`calibrate.real.environment.tp_bind`; SGLang 0.5.23 refuses more ranks than NUMA
    nodes without it, ``numa_utils.init_threads_binding``); none at 1.

    Raises:
        CalibrationInputError: more ranks than cores (named ``--tensor-parallel-size``).
    """
    if tp <= 1:
        return [], {}
    return ["--tp-size", str(tp)], {"SGLANG_CPU_OMP_THREADS_BIND": tp_bind(tp)}


def design_loads(d: Design) -> list[dict]:
    """The calibration job's waves as one server session's loads (:mod:`realengines.server`), for
    a calibration through the server (tensor parallelism: the in-process driver builds rank 0
    alone): each decode wave a load of its B requests sent at once (concurrency B), and the
    prefills, one request at a time in the design's order, one load (the server flushes its
    prefix cache between loads; a cached-prefix point's prefix request precedes it in the same
    load)."""
    loads, single = [], []
    for i, wave in enumerate(d.waves):
        if len(wave) == 1 and wave[0]["rid"] not in d.decode_point:
            single.append(wave[0])
            continue
        loads.append({"name": f"wave{i}", "concurrency": len(wave), "warmup_requests": 0, "requests": wave})
    if single:
        loads.append({"name": "prefills", "concurrency": 1, "warmup_requests": 0, "requests": single})
    return loads


def run_tp_session(engine: Engine, model_dir: Path, grid: SglangGrid, d: Design, setting: str, tp: int,
                   folder: Path, name: str, report: Callable[[str], None]) -> Path:
    """Run (or reuse: a finished session with the same spec is kept) the calibration's waves
    through SGLang's server at tensor-parallel size ``tp`` (:func:`design_loads`, the project's
    client, the tracer on); returns rank 0's trace (:func:`calibrate.real.sglang_trace.rank_zero`).

    Raises:
        RuntimeError: the server session failed. CalibrationInputError: no rank-0 trace.
    """
    tp_args, env = tp_launch(tp)
    spec = {"engine": "sglang", "model_dir": str(model_dir), "setting": setting, "port": 30161,
            "server_args": [*grid.server_args(), *tp_args], "env": env, "trace": True, "client_nice": 0,
            "loads": design_loads(d)}
    out, spec_path = folder / name, folder / f"{name}.json"
    text = json.dumps(spec)
    done = (out / "session.json").exists() and spec_path.exists() and spec_path.read_text() == text
    if done:
        report(f"{name}: reusing {out}")
    else:
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("*"):
            old.unlink()
        spec_path.write_text(text)
        report(f"{name}: SGLang's server at TP {tp}, the calibration's {len(spec['loads'])} waves")
        run_probed(engine, folder / f"{name}.hostspeed.json",
                   lambda: run_module(engine, "realengines.server", [str(spec_path), str(out)],
                                      folder / f"{name}.log", timeout_s=TP_SESSION_TIMEOUT_S))
    traces = [p for p in sglang_trace.rank_zero(sorted(out.glob("trace.*.jsonl")))
              if any(r["ph"] == "schedule" for r in sglang_trace.read_records(p)[1])]
    if not traces:
        raise CalibrationInputError(str(out), "", "no trace of the rank-0 scheduler")
    return traces[0]


def run_job(engine: Engine, job: dict, folder: Path, name: str, report: Callable[[str], None]) -> Path:
    """Run (or reuse: a finished trace is kept) one in-process driver job; returns its trace."""
    out = folder / f"{name}.jsonl"
    job_path = folder / f"{name}.job.json"
    text = json.dumps(job)
    if out.exists() and job_path.exists() and job_path.read_text() == text:
        report(f"{name}: reusing {out}")
        return out
    folder.mkdir(parents=True, exist_ok=True)
    job_path.write_text(text)
    out.unlink(missing_ok=True)
    report(f"{name}: running SGLang's scheduler in-process ({len(job['requests'])} requests)")
    run_probed(engine, folder / f"{name}.hostspeed.json",
               lambda: run_module(engine, "realengines.sglang.drive", [str(job_path), str(out)],
                                  folder / f"{name}.log", timeout_s=DRIVER_TIMEOUT_S))
    return out


def calibrate_sglang(engine: Engine, model_dir: Path, grid: SglangGrid, folder: Path,
                     settings: tuple[str, ...] = ("normal", "overlap"), command: str = "",
                     report: Callable[[str], None] = print, sessions: int = 1, structured: bool = False,
                     tp_size: int = 1) -> dict:
    """Run the calibration job ``sessions`` times under each of ``settings`` (in the alternating
    order of :func:`calibrate.real.environment.session_order`; runs named ``calibrate-<name>``)
    and build one profile.

    The base curves hold the forward (the same model on the same thread under every loop: its
    samples pooled over the runs) and the CPU phases measured under the first setting; each
    further setting's CPU phases go into ``setting_curves`` (:mod:`sim.model.profile`); a point's
    samples are those of every run of its setting. A finished run's trace is reused
    (``folder``), so an interrupted calibration resumes, and a larger ``sessions`` adds runs to
    the ones already there. ``structured``: each run is followed by a structured-output run of
    the same loop (``calibrate-<name>-json``, :mod:`calibrate.real.sglang_structured`), whose
    samples price the ``grammar.*`` curves (``metadata.structured_output``). ``tp_size`` above 1:
    the waves run through SGLang's server at that tensor-parallel size (:func:`run_tp_session`;
    rank 0's phases, which hold the request broadcast and the forward's all-reduces, in wall time:
    a rank waiting for the other at an all-reduce spends no CPU, and on 4 December 2026 rank 0's
    forward took 30.1 ms of wall time for 14.7 ms of CPU at the design's mean), recorded as
    ``metadata.tp_size``; not with ``structured``.

    Raises:
        CalibrationInputError: a grid the server cannot run, or points without samples; TP with
            ``structured``.
        RuntimeError: the driver or server failed in the SGLang environment.
        ValueError: ``sessions`` below 1.
    """
    from calibrate.profile import build_profile

    grid.check()
    if tp_size > 1 and structured:
        raise CalibrationInputError("--tensor-parallel-size", "", "not with --structured-output (the constrained "
                                    "runs are in-process, rank 0 alone)")
    d = design(grid)
    merged: dict[tuple, dict] = {}
    meta: dict = {}
    order = session_order(settings, sessions)
    traces, grammar_traces = [], []
    for setting, name in order:
        if tp_size > 1:
            traces.append(run_tp_session(engine, model_dir, grid, d, setting, tp_size, folder, f"calibrate-{name}",
                                         report))
            continue
        traces.append(run_job(engine, d.job(str(model_dir), setting == "overlap", grid), folder, f"calibrate-{name}",
                              report))
        if structured:
            grammar_traces.append(run_job(engine, sglang_structured.job(str(model_dir), setting == "overlap", grid),
                                          folder, f"calibrate-{name}-json", report))
    reference = mean_probe(folder / f"calibrate-{name}.hostspeed.json" for _, name in order)
    for (setting, _), trace in zip(order, traces):
        meta, records, _ = sglang_trace.read_records(trace)
        # at TP the ranks wait for each other inside the forward (the all-reduces) and the receive
        # (the broadcast), which rank 0's CPU time does not hold: its phases in wall time
        got = samples(sglang_trace.iterations(records, clock="wall" if tp_size > 1 else "cpu"), d)
        check_coverage(got, grid)
        for smp in got:
            if smp["curve"].startswith("forward"):
                key = (smp["curve"], tuple(sorted(smp["point"].items())))
                tag = {}
            else:
                key = (smp["curve"], tuple(sorted(smp["point"].items())), setting)
                tag = {} if setting == settings[0] else {"setting": setting}
            merged.setdefault(key, {**smp, **tag, "times_s": []})["times_s"].extend(smp["times_s"])
    metadata_ = metadata(engine, grid, meta or {}, settings, command)
    if structured:
        metadata_["structured_output"] = sglang_structured.add_samples(
            merged, order, grammar_traces, settings, set(grid.decode_batch_sizes), plain_traces=traces)
    if tp_size > 1:
        metadata_["tp_size"] = tp_size
        metadata_["tp_calibration"] = ("the design's waves through SGLang's server at this tensor-parallel size, "
                                       "the project's client; rank 0's trace (it receives and broadcasts the "
                                       "requests; its forward waits for the all-reduces)")
    # the fewest samples any point has (a prefill point is measured extend_repeats times, a
    # decode point once per decode step of its waves)
    metadata_["repeats"] = min(len(s["times_s"]) for s in merged.values())
    if reference:
        metadata_["host_speed"] = reference
    if sessions > 1:
        metadata_["sessions"] = [f"calibrate-{name}" for _, name in order]
    return build_profile(metadata_, list(merged.values()))


def phase_table(profile: dict) -> list[tuple[str, str, float, float]]:
    """(curve, point, median ms, mean ms) of the CPU phases, for a summary."""
    rows = []
    for s in profile["samples"]:
        if s["curve"].startswith("forward"):
            continue
        ts = s["times_s"]
        rows.append((s["curve"], ",".join(f"{v}" for v in s["point"].values()),
                     statistics.median(ts) * 1e3, statistics.fmean(ts) * 1e3))
    return rows
