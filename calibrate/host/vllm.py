"""Host costs from vLLM's own server with the model's forward stubbed.

``overlap-sim calibrate --engine vllm --host-only --out host.json`` starts the real vLLM 0.32
server (CPU build) once per setting (``sync``: ``EngineCore.step``; ``async``:
``--async-scheduling``, ``EngineCore.step_with_batch_queue``) exactly as ``calibrate --engine
vllm`` does (:mod:`calibrate.real.vllm.profile`: API server, engine core and worker in their own
processes, the RPCs between them, the tracer), with one change: ``GPUModelRunner._model_forward``
(``v1/worker/gpu_model_runner.py``) is a stub (:func:`realengines.vllm.startup._stub_forward`)
that holds the worker :data:`STUB_HOLD_S` busy-waiting and returns zero hidden states. Busy, not
asleep: on a GPU host the worker's thread spins while the device runs (CUDA's default
synchronisation spins when the host has more cores than GPUs), and a stub that sleeps instead
measured the RPC intervals after it 1.4-1.7x dearer on this VM (the wake-up from idle;
``benchmarks/stub_check.py --hold-control``). So every host function runs as in a server,
both settings the same way, and the grid reaches what a GPU serves: decode batches to 256,
contexts to 8k, prefills to 8k tokens (one step of 8192 tokens: vLLM 0.32's
``max_num_batched_tokens`` default for an H200-class card's API server, ``engine/arg_utils.py``),
prefix-cache hits, and chunked prefills where a wave's prompts exceed the step budget.

The curves and the mapping of vLLM's functions to them are the CPU calibration's
(:func:`calibrate.real.vllm.profile.samples`, :mod:`sim.engines.vllm.costs`): ``schedule``,
``prepare`` (``execute_model`` less the stub), ``sample``, ``update``, ``add_request``, the RPC
intervals ``dispatch``/``roundtrip``/``collect`` (sync) and ``pickup``/``collect`` (async), the API
server's ``frontend_in``/``frontend_out``; the base curves from ``sync``, ``async``'s own in
``setting_curves``. The result is a *host-costs file* (:data:`sim.engines.vllm.profile.VLLM_HOST_CURVES`,
``metadata.kind = "host"``, ``engine = "vllm"``); ``overlap-sim compose DEVICE HOST`` joins it to a
card's forward curves (:mod:`calibrate.host.compose_vllm`).

Decode waves: for batch size B and context C, B closed-loop clients with prompts of C - 16
tokens, twice B requests; the output is long enough that all B requests decode together after
the wave's prefills (B C / 8192 steps) and the API server's admission (about 1 ms a request
here) and before the first one ends (:meth:`VllmHostGrid.output_tokens`). Waves are cut to
``max_wave_tokens`` (B x C) so the KV cache (allocated, never written) fits
``VLLM_CPU_KVCACHE_SPACE`` (:data:`KV_CACHE_GIB`). A host curve is over ``num_reqs`` alone; the
medians per (B, C) are kept in ``metadata.context_dependence`` so a reader sees whether the
context matters. The timings are wall seconds; the thread CPU seconds of the same calls are
kept beside them (``metadata.contention``): where they agree, the other processes on this
machine's two cores did not inflate the phase. The API server's output side
(``frontend_out``, ``frontend_work``) is timed in a frontend session of each setting
(:func:`frontend_session`: the stub asleep :data:`FRONTEND_HOLD_S` a step, so that the API
server and the load's client keep up on two cores), pooled over the settings, and kept only at
batch sizes where it kept up with the steps (:func:`kept_up`; ``metadata.frontend`` lists what
was left out): beyond, the latency measured is a queue. (Until 6 December 2026 it came from the
host sessions, whose 4 ms busy steps it kept up with to 4 requests; and the load's client counted
no empty-text token of the stub's, so those latencies were to interpolated times:
``realengines/client.py``.)

What the stub cannot see (``metadata.stub.limits``): the worker's input preparation and sampling
are the CPU platform's (on a GPU, FlashAttention metadata, the input copies to the device, GPU
sampling and its copy back); no KV write and no model compute between the phases (warm caches);
the device's own time is the simulator's, from the card's curves.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from calibrate.errors import CalibrationInputError
from calibrate.host import yardstick
from calibrate.real.vllm import trace as vllm_trace
from calibrate.real.environment import Engine, mean_probe, session_order
from calibrate.real.jobs import Prompts, request
from calibrate.real.vllm.merge import POOLED_CURVES, merge_sample
from calibrate.real.vllm.profile import HOST_FUNCTIONS, add_request_samples, frontend_samples, samples
from calibrate.real.vllm.sessions import VllmGrid, design, run_session

STUB_HOLD_S = 0.004  # the stub's hold: about a small model's decode forward on an H200 (s)
# the frontend sessions' hold (s), asleep: a step period the API server and the load's client, on
# this host's two cores, keep up with at 256 requests (at the host sessions' 4 ms, busy, they fell
# behind beyond 4 requests: a queue of up to 960 ms at 256, on 2026-12-02)
FRONTEND_HOLD_S = 0.08
FRONT = "f"  # the frontend sessions' wave names and request ids start with f<B>x<C>
FRONTEND_POOLED = ("vllm.frontend_out", "vllm.frontend_work")  # one curve over both settings' frontend sessions
KV_CACHE_GIB = "2"  # the wave cap's KV (2^18 tokens of the tiny model: 1 GiB) with room for the next wave
ADMIT_S_PER_REQ = 0.001  # the API server's admission of one request here (s), for the wave length
STUB_LIMITS = ("the stub replaces GPUModelRunner._model_forward (vLLM 0.32): the worker busy-waits in its place "
               "(as a GPU host's worker spins while the device runs) and returns zero hidden states; no KV writes and no "
               "model compute between the phases (warm caches); the worker's input preparation and sampling are "
               "the CPU platform's (CPU attention metadata, CPU sampling; on a GPU, FlashAttention metadata, input "
               "copies to the device, GPU sampling and its copy back, not measured here)")

PHASE_FIELDS = {"vllm.schedule": "schedule", "vllm.sample": "sample", "vllm.update": "update"}
WAVE = "h"  # the host decode waves' load names and request ids start with h<B>x<C>


@dataclass(frozen=True)
class VllmHostGrid(VllmGrid):
    """The host grid: what a GPU server runs (lengths in tokens). ``max_wave_tokens`` caps batch
    size x context of a decode wave; ``max_num_batched_tokens`` is the server's step budget."""

    decode_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    contexts: tuple[int, ...] = (128, 1024, 4096, 8192)
    prefill_tokens: tuple[int, ...] = (128, 512, 2048, 8192)
    prefill_repeats: int = 3
    shared_batch_sizes: tuple[int, ...] = ()  # a forward matter (shared-prefix attention): not a host curve
    max_num_seqs: int = 256
    max_model_len: int = 8192 + 1024
    max_num_batched_tokens: int = 8192
    max_wave_tokens: int = 1 << 18

    def server_args(self) -> list[str]:
        return super().server_args() + ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]

    def wave_fits(self, batch: int, ctx: int) -> bool:
        return batch * ctx <= self.max_wave_tokens

    def output_tokens(self, batch: int, ctx: int, hold_s: float = STUB_HOLD_S) -> int:
        """A wave's output tokens: ``decode_steps`` with every request decoding, after the steps
        its prefills take and the steps (at the stub's pace, ``hold_s`` a step) the API server
        admits it in."""
        prefill_steps = math.ceil(batch * ctx / self.max_num_batched_tokens)
        admit_steps = math.ceil(batch * ADMIT_S_PER_REQ / hold_s)
        return self.decode_steps + prefill_steps + admit_steps

    def check(self) -> None:
        """Raises CalibrationInputError (naming the flag) for a grid the server cannot run."""
        if not self.decode_batch_sizes or min(self.decode_batch_sizes) < 1:
            raise CalibrationInputError("--batch-sizes", "", "expected batch sizes of at least 1")
        if not self.contexts or min(self.contexts) <= self.decode_steps:
            raise CalibrationInputError("--contexts", "", f"expected every context above {self.decode_steps} tokens "
                                        f"(got {min(self.contexts, default=0)})")
        for b in self.decode_batch_sizes:
            if not self.wave_fits(b, min(self.contexts)):
                raise CalibrationInputError("--batch-sizes", "", f"a batch of {b} at the shortest context "
                                            f"{min(self.contexts)} (--contexts) exceeds the wave cap of "
                                            f"{self.max_wave_tokens} tokens")
        # a request is at most a context long plus its output (a prefill of N tokens is N / C prompts
        # of C tokens, or a cached prefix and N new ones: C in all)
        longest = max(self.output_tokens(b, c) + c for b in self.decode_batch_sizes for c in self.contexts
                      if self.wave_fits(b, c))
        if longest > self.max_model_len:
            raise CalibrationInputError("--contexts", "", f"a request of {longest} tokens exceeds the server's "
                                        f"max_model_len {self.max_model_len}")


def host_design(grid: VllmHostGrid) -> list[dict]:
    """The loads of one host session: the decode waves within the cap, then the CPU calibration's
    prefill loads (:func:`calibrate.real.vllm.sessions.design`) at the host grid's lengths."""
    prompts = Prompts(grid.seed + 1)
    loads = []
    for c in grid.contexts:
        for b in grid.decode_batch_sizes:
            if not grid.wave_fits(b, c):
                continue
            out = grid.output_tokens(b, c)
            reqs = [request(f"{WAVE}{b}x{c}-{i}", prompts.new(c - grid.decode_steps // 2), out)
                    for i in range(b * grid.waves)]
            loads.append({"name": f"{WAVE}{b}x{c}", "concurrency": b, "warmup_requests": 0, "requests": reqs})
    return loads + design(replace(grid, decode_batch_sizes=()))


def frontend_design(grid: VllmHostGrid) -> list[dict]:
    """The loads of one frontend session: a decode wave of each batch size at the shortest context
    (the API server's output side does not read the context), each lasting ``decode_steps`` past
    its prefills and admission at :data:`FRONTEND_HOLD_S` a step."""
    prompts = Prompts(grid.seed + 2)
    c = min(grid.contexts)
    loads = []
    for b in grid.decode_batch_sizes:
        out = grid.output_tokens(b, c, FRONTEND_HOLD_S)
        reqs = [request(f"{FRONT}{b}x{c}-{i}", prompts.new(c - grid.decode_steps // 2), out)
                for i in range(b * grid.waves)]
        loads.append({"name": f"{FRONT}{b}x{c}", "concurrency": b, "warmup_requests": 0, "requests": reqs})
    return loads


def _wave_of(rid: str) -> tuple[int, int] | None:
    head = vllm_trace.client_rid(rid).split("-", 1)[0]
    if not head.startswith(WAVE) or "x" not in head:
        return None
    b, _, c = head[len(WAVE):].partition("x")
    return (int(b), int(c)) if b.isdigit() and c.isdigit() else None


def context_dependence(steps: list[vllm_trace.VllmStep]) -> list[dict]:
    """Per decode wave (B, C), over its steps with all B requests decoding: the median
    ``schedule``, ``prepare``, ``sample`` and ``update`` (ms) and how many steps."""
    acc: dict[tuple, dict[str, list[float]]] = {}
    for s in steps:
        wave = _wave_of(s.reqs[0]) if s.reqs else None
        if wave is None or not s.is_decode or s.num_reqs != wave[0] or None in (s.execute, s.sample, s.update):
            continue
        row = acc.setdefault(wave, {"schedule": [], "prepare": [], "sample": [], "update": []})
        row["schedule"].append(s.schedule["dur"])
        row["prepare"].append(s.execute["dur"] - s.forward)
        row["sample"].append(s.sample["dur"])
        row["update"].append(s.update["dur"])
    return [{"num_reqs": b, "ctx": c, "steps": len(v["schedule"]),
             **{f"{k}_ms": round(statistics.median(x) * 1e3, 4) for k, x in v.items()}}
            for (b, c), v in sorted(acc.items())]


def contention(steps: list[vllm_trace.VllmStep], sizes: set[int]) -> dict:
    """Per phase timed as one call (``schedule``, ``prepare``, ``sample``, ``update``): the median
    over steps of the call's thread CPU time over its wall time, at the grid's batch sizes. Near 1:
    the call ran without being preempted (what the other processes on this host's cores took
    from it is small); ``prepare`` is ``execute_model`` less the stub, in CPU and in wall time."""
    ratios: dict[str, list[float]] = {}
    for s in steps:
        if s.num_reqs not in sizes or None in (s.execute, s.sample, s.update):
            continue
        for curve, field in PHASE_FIELDS.items():
            rec = getattr(s, field)
            if rec["dur"] > 0:
                ratios.setdefault(curve, []).append(rec["cpu"] / rec["dur"])
        wall = s.execute["dur"] - s.forward
        if wall > 0 and s.forward_cpu == s.forward_cpu:
            ratios.setdefault("vllm.prepare", []).append((s.execute["cpu"] - s.forward_cpu) / wall)
    return {k: round(statistics.median(v), 3) for k, v in sorted(ratios.items())}


def step_periods(steps: list[vllm_trace.VllmStep]) -> dict[int, float]:
    """Per ``num_reqs``: the median time (s) from one decode step's ``update_from_output`` end to
    the next one's, over consecutive decode steps of that many requests (the pace at which the
    engine core hands the API server a step's outputs)."""
    gaps: dict[int, list[float]] = {}
    prev = None
    for s in steps:
        if s.update is None:
            continue
        end = s.update["t0"] + s.update["dur"]
        if prev is not None and s.is_decode and prev[1] == s.num_reqs:
            gaps.setdefault(s.num_reqs, []).append(end - prev[0])
        prev = (end, s.num_reqs)
    return {n: statistics.median(v) for n, v in gaps.items()}


def kept_up(smp: dict, periods: dict[int, float]) -> bool:
    """Whether a ``vllm.frontend_out`` sample point measures the output side's latency rather
    than a queue: its median is below the step period at that batch size (:func:`step_periods`).
    Above it, the API server (and the load's client, on the same cores here) fell behind the
    stub's pace, so each token's delay is mostly the wait behind earlier steps' tokens, which the
    simulator's FIFO would then count again as service (:mod:`sim.engines.vllm.frontend`)."""
    period = periods.get(smp["point"]["num_reqs"])
    return period is not None and statistics.median(smp["times_s"]) < period


def stub_env(spin: bool = True, hold_s: float = STUB_HOLD_S) -> dict[str, str]:
    """The stubbed server's environment (``realengines/vllm/startup.py`` reads the stub's switches):
    the stub holds ``hold_s`` a step, busy-waiting (``spin``) or asleep."""
    env = {"OVERLAP_SIM_VLLM_STUB_HOLD_S": repr(hold_s), "VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB,
           "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}  # the tiny model states 4096 positions; the stub reads none
    if spin:
        env["OVERLAP_SIM_VLLM_STUB_SPIN"] = "1"
    return env


def stub_session(engine: Engine, model_dir: Path, grid: VllmHostGrid, setting: str, folder: Path,
                 report: Callable[[str], None], name: str, spin: bool = True) -> Path:
    """Run (or reuse) one stubbed server session of ``setting`` over :func:`host_design` in
    ``folder/host-<name>``; returns its folder. Raises RuntimeError when the server fails."""
    return run_session(engine, model_dir, grid, setting, folder, report, f"host-{name}", loads=host_design(grid),
                       env=stub_env(spin))


def frontend_session(engine: Engine, model_dir: Path, grid: VllmHostGrid, setting: str, folder: Path,
                     report: Callable[[str], None], name: str) -> Path:
    """Run (or reuse) the frontend session of ``setting`` (:func:`frontend_design`, the stub asleep
    :data:`FRONTEND_HOLD_S` a step) in ``folder/frontend-<name>``; returns its folder. Its engine
    core's phases are not used: only the API server's output side, ``vllm.frontend_out`` and
    ``vllm.frontend_work``, which at the host sessions' pace fell behind (:func:`kept_up`).
    Raises RuntimeError when the server fails."""
    return run_session(engine, model_dir, grid, setting, folder, report, f"frontend-{name}",
                       loads=frontend_design(grid), env=stub_env(spin=False, hold_s=FRONTEND_HOLD_S))


def control_grid(grid: dict) -> VllmHostGrid:
    """The stub check's control: the stubbed server on a full CPU calibration's own grid and server
    configuration (``grid``: its ``metadata.grid``; batch sizes, contexts, prefill lengths,
    ``max_num_seqs``, ``max_model_len``) with the CPU API server's default step budget of 2048 tokens,
    so that the stub is compared with the real forward on the same server."""
    return VllmHostGrid(decode_batch_sizes=tuple(grid["decode_batch_sizes"]), contexts=tuple(grid["contexts"]),
                        prefill_tokens=tuple(grid["prefill_tokens"]), max_num_seqs=grid["max_num_seqs"],
                        max_model_len=grid["max_model_len"], max_num_batched_tokens=2048)


def calibrate_vllm_host(engine: Engine, model_dir: Path, grid: VllmHostGrid, folder: Path,
                        settings: tuple[str, ...] = ("sync", "async"), command: str = "",
                        report: Callable[[str], None] = print, sessions: int = 1, spin: bool = True) -> dict:
    """Run the stubbed server ``sessions`` times under each of ``settings`` (:func:`session_order`),
    then a frontend session for each (:func:`frontend_session`), time the host yardstick beside the runs (:func:`calibrate.host.yardstick.reading_beside`) and
    build the host-costs file (:func:`host_costs`). Finished sessions and the yardstick's reading
    are reused from ``folder`` (an interrupted calibration resumes). ``spin`` False: the stub sleeps
    its hold instead of busy-waiting (the stub check's control: benchmarks/stub_check.py).

    Raises:
        CalibrationInputError: a grid the server cannot run, or points without samples.
        RuntimeError: the server failed in the vLLM environment.
    """
    grid.check()
    order = session_order(settings, sessions)
    t0 = time.perf_counter()
    outs = [stub_session(engine, model_dir, grid, setting, folder, report, name, spin) for setting, name in order]
    fronts = [frontend_session(engine, model_dir, grid, setting, folder, report, name) for setting, name in order]
    ruler = yardstick.reading_beside(folder / "yardstick.json", report)
    probe = mean_probe(folder / f"host-{name}.hostspeed.json" for _, name in order)
    host = host_costs(engine, grid, order, outs, ruler, settings, command, probe, fronts)
    host["metadata"]["wall_s"] = round(time.perf_counter() - t0, 1)
    host["metadata"]["stub"]["hold"] = "busy-wait" if spin else "sleep"
    return host


def host_costs(engine: Engine, grid: VllmHostGrid, order: list[tuple[str, str]], outs: list[Path],
               ruler: dict | None, settings: tuple[str, ...] = ("sync", "async"), command: str = "",
               probe: dict | None = None, fronts: list[Path] | None = None) -> dict:
    """The host-costs file (a dict in the profile format, :data:`sim.engines.vllm.profile.VLLM_HOST_CURVES`)
    from the stubbed sessions' folders (``order[i]`` = (setting, name) of ``outs[i]``): every
    sample of the CPU calibration's mapping but the forward's, the first setting's as the base
    curves, the others' own in ``setting_curves`` (``dispatch`` and ``roundtrip`` are synchronous
    only); ``metadata`` says what was stubbed, what timed each curve, ``context_dependence`` and
    ``contention`` per session, and the yardstick's reading. ``fronts[i]``: the frontend session
    (:func:`frontend_session`) of ``order[i]``, whose ``vllm.frontend_out`` and ``vllm.frontend_work``
    replace that session's (None: the host sessions' own, as before 6 December 2026).

    Raises:
        CalibrationInputError: a session's trace is missing or a grid point has no samples.
    """
    import json
    import os
    import platform
    from datetime import datetime, timezone

    from calibrate.measure import host_cpu
    from calibrate.profile import build_profile
    from calibrate.real.environment import model_metadata
    from sim.engines.vllm.profile import VLLM_HOST_CURVES

    loads = host_design(grid)
    sizes = set(grid.decode_batch_sizes)
    merged: dict[tuple, dict] = {}
    contexts: dict[str, list[dict]] = {}
    cpu_wall: dict[str, dict] = {}
    stub_ms: list[float] = []
    behind: dict[str, list[dict]] = {}
    versions: dict = {}
    # the frontend sessions' output side pooled over the settings: the API server's output handler
    # is the same code under both (async scheduling changes the engine core's loop), and its engine
    # core sleeps there, so what differs between them is noise
    pooled = POOLED_CURVES + (FRONTEND_POOLED if fronts else ())
    front_loads = frontend_design(grid) if fronts else []
    for i, ((setting, name), out) in enumerate(zip(order, outs)):
        versions = json.loads((out / "session.json").read_text()).get("versions", {})
        eng, wrk = vllm_trace.read_files(sorted(out.glob("trace.*.jsonl")))
        steps = vllm_trace.steps(eng, wrk)
        got = samples(steps, grid, setting) + add_request_samples(eng) + frontend_samples(out, eng, steps, loads, sizes)
        # the API server's output side (frontend_out, frontend_work): the frontend session's where
        # there is one (its pace kept up with), else this session's
        side, side_folder, side_steps = f"host-{name}", out, steps
        if fronts:
            side, side_folder = f"frontend-{name}", fronts[i]
            f_eng, f_wrk = vllm_trace.read_files(sorted(side_folder.glob("trace.*.jsonl")))
            side_steps = vllm_trace.steps(f_eng, f_wrk)
            got = [smp for smp in got if smp["curve"] != "vllm.frontend_out"] + [
                smp for smp in frontend_samples(side_folder, f_eng, side_steps, front_loads, sizes)
                if smp["curve"] == "vllm.frontend_out"]
        got += vllm_trace.output_work_samples(sorted(side_folder.glob("trace.*.jsonl")), sizes)
        periods = step_periods(side_steps)
        for smp in got:
            if smp["curve"] == "vllm.forward":
                continue
            if smp["curve"] == "vllm.frontend_out" and not kept_up(smp, periods):
                behind.setdefault(side, []).append(
                    {"num_reqs": smp["point"]["num_reqs"], "latency_ms": round(statistics.median(smp["times_s"]) * 1e3, 3),
                     "step_period_ms": round(periods.get(smp["point"]["num_reqs"], float("nan")) * 1e3, 3)})
                continue
            merge_sample(merged, smp, setting, settings, pooled)
        stub_ms += [s.forward * 1e3 for s in steps if s.forward == s.forward]
        contexts[f"host-{name}"] = context_dependence(steps)
        cpu_wall[f"host-{name}"] = contention(steps, sizes)
    _check_coverage(merged, grid, settings)
    smp_list = list(merged.values())
    meta = {"kind": "host", "backend": "vllm", "device": "host", "engine": "vllm", "engine_version": engine.version,
            "device_name": f"host only (vLLM {engine.version} server, CPU build, forward stubbed)",
            "host_cpu": host_cpu(), "host_cores": os.cpu_count(), "platform": platform.platform(),
            "libraries": versions, "model": model_metadata(), "dtype": "float32",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "grid": {k: v for k, v in grid.__dict__.items()}, "repeats": min(len(s["times_s"]) for s in smp_list),
            "settings": list(settings), "base_setting": settings[0], "command": command,
            "sessions": [f"host-{name}" for _, name in order],
            "timing": "wall seconds (perf_counter) of vLLM's own functions in the server's processes, the model's "
                      "forward stubbed; dispatch, roundtrip, collect and pickup are the intervals between them",
            "stub": {"replaced": "vllm.v1.worker.gpu_model_runner.GPUModelRunner._model_forward (vLLM 0.32)",
                     "hold_s": STUB_HOLD_S, "limits": STUB_LIMITS,
                     "stub_forward_median_ms": round(statistics.median(stub_ms), 4) if stub_ms else None},
            "context_dependence": contexts, "contention": cpu_wall,
            "frontend": {"rule": "vllm.frontend_out kept where its median latency is below the median decode step "
                                 "period at that batch size (calibrate.host.vllm.kept_up); the client of the loads "
                                 "runs on the same cores as the API server here, so the kept points are an upper "
                                 "bound of the API server's own cost",
                         "sessions": "frontend" if fronts else "host",
                         **({"hold_s": FRONTEND_HOLD_S, "hold": "sleep",
                             "why": "frontend_out and frontend_work from sessions whose stub sleeps FRONTEND_HOLD_S a "
                                    "step (decode waves at the shortest context): at the host sessions' 4 ms busy "
                                    "steps the API server and the client fell behind beyond a few requests"}
                            if fronts else {}),
                         "left_out": behind},
            "curve_sources": {name: {"source": "measured", "engine": f"vllm {engine.version}", "function": fn,
                                     "forward": "stubbed"} for name, fn in HOST_FUNCTIONS.items()}}
    if ruler:
        meta["yardstick"] = ruler
    if probe:
        meta["host_speed"] = probe
    return build_profile(meta, smp_list, VLLM_HOST_CURVES)


def _check_coverage(merged: dict, grid: VllmHostGrid, settings: tuple[str, ...]) -> None:
    have = {(k[0], dict(k[1]).get("num_reqs"), k[2]) for k in merged}
    want = [(c, b, st) for st in settings for c in ("vllm.schedule", "vllm.prepare", "vllm.sample", "vllm.update")
            for b in grid.decode_batch_sizes]
    missing = [f"{c} at {b} requests ({st})" for c, b, st in want if (c, b, st) not in have]
    if missing:
        raise CalibrationInputError("calibration", "", f"no samples for {len(missing)} host points, e.g. {missing[0]}")


def run_host_calibration(args) -> int:
    """``calibrate --engine vllm --host-only``: host costs from vLLM's server, forward stubbed."""
    from calibrate.host.command import run_host_command

    changes = {k: tuple(v) for k, v in (("decode_batch_sizes", args.batch_sizes), ("contexts", args.contexts),
                                        ("prefill_tokens", args.extend_tokens)) if v}
    if args.prefixes:
        raise CalibrationInputError("--prefixes", "", "not with --engine vllm (its prefix hits come from "
                                    "--extend-tokens below --contexts)")
    grid = replace(VllmHostGrid(), **changes)
    grid = replace(grid, max_num_seqs=max(grid.max_num_seqs, max(grid.decode_batch_sizes)))
    if min(grid.contexts) > grid.decode_steps:  # else check() names --contexts
        longest = max(grid.output_tokens(b, c) + c for b in grid.decode_batch_sizes for c in grid.contexts)
        grid = replace(grid, max_model_len=max(grid.max_model_len, longest))  # the stub reads no position
    grid.check()
    return run_host_command(args, "vllm", grid, calibrate_vllm_host)
