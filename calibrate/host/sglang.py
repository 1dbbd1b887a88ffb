"""Host costs from SGLang's own scheduler with the model's forward stubbed.

``overlap-sim calibrate --engine sglang --host-only --out host.json`` runs SGLang 0.5.23's real
``Scheduler`` in-process (:mod:`realengines.sglang.drive`) with ``ModelRunner._forward_raw``
replaced by a stub that returns zero logits at once (``stub_forward``, see
``realengines.sglang.drive._stub_forward``). Every host function runs as in a server, so the
grid reaches what a GPU serves (decode batches to 256, contexts to 8k, prefills to 8k tokens)
without any model compute, on any host. The design and the mapping of SGLang's functions to the
profile's phases are the full CPU-engine calibration's (:mod:`calibrate.real.sglang_profile`):

- ``recv`` = ``ingest_requests`` (+ the loop's own overhead), over requests received;
- ``schedule.*`` = ``get_next_batch_to_run``, over the batch's requests;
- ``launch.*`` = ``run_batch`` less ``ModelRunner.forward`` and ``ModelRunner.sample`` (the
  ``ForwardBatch`` building and, under overlap, the FutureMap), over requests (decode) or new
  tokens (prefill);
- ``process.*`` = ``process_batch_result``, over the batch's requests.

Each phase is measured under both loops (``normal``: ``event_loop_normal``; ``overlap``:
``event_loop_overlap``, its costs in ``setting_curves.overlap``). The result is a *host-costs
file*: the profile format with the host curves only (:data:`sim.model.profile.SGLANG_HOST_CURVES`),
``metadata.kind = "host"``; ``overlap-sim compose`` joins it to a device's forward curves.

The decode waves are cut to ``max_wave_tokens`` (batch x context) so the KV pool, allocated but
never written, stays within the host's memory; a host curve is over batch size alone, and the
contexts a batch size was measured at are in ``metadata.context_dependence`` (the schedule,
launch and process medians per (batch, context), so a reader sees whether context matters).
What the stub cannot see is stated in ``metadata.stub``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from calibrate.errors import CalibrationInputError
from calibrate.host import yardstick
from calibrate.real import sglang_trace
from calibrate.real.environment import Engine, mean_probe, session_order
from calibrate.real.sglang_profile import HOST_FUNCTIONS, SglangGrid, design, metadata, run_job, samples
from calibrate.real import sglang_structured

STUB_LIMITS = ("the stub replaces ModelRunner._forward_raw: no KV writes and no model compute (the host phases "
               "run on a cache a real forward would have disturbed), no attention-backend metadata planning "
               "(FlashInfer plans on the host on CUDA; not in these curves), no wait for a device (the simulator "
               "prices it from the device curves); the request objects are handed to the scheduler's receiver "
               "in-process (no ZMQ deserialisation in recv)")


@dataclass(frozen=True)
class SglangHostGrid(SglangGrid):
    """The host grid: what a GPU server runs. Lengths in tokens; ``max_wave_tokens`` caps batch
    size x context of a decode wave (the KV pool is sized for it)."""

    decode_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    decode_contexts: tuple[int, ...] = (128, 1024, 4096, 8192)
    decode_steps: int = 32
    decode_waves: int = 2
    extend_tokens: tuple[int, ...] = (1, 16, 128, 512, 2048, 8192)
    extend_prefixes: tuple[int, ...] = (0, 1024, 4096)
    extend_repeats: int = 3
    context_length: int = 12288
    max_running_requests: int = 256
    mem_fraction_static: float = 0.06
    max_wave_tokens: int = 1 << 18

    def server_args(self) -> list[str]:
        # one prefill per wave (no chunking), so a wave of B requests prices schedule.extend(B)
        return super().server_args() + ["--chunked-prefill-size", "-1",
                                         "--max-prefill-tokens", str(self.max_wave_tokens + max(self.decode_contexts))]

    def wave_fits(self, batch: int, ctx: int) -> bool:
        return batch * ctx <= self.max_wave_tokens

    def check(self) -> None:
        super().check()
        if not any(self.wave_fits(b, c) for b in self.decode_batch_sizes for c in self.decode_contexts):
            raise CalibrationInputError("--contexts", "", f"no decode wave within {self.max_wave_tokens} tokens")
        for b in self.decode_batch_sizes:
            if not self.wave_fits(b, min(self.decode_contexts)):
                raise CalibrationInputError("--batch-sizes", "", f"a batch of {b} at the shortest context "
                                            f"{min(self.decode_contexts)} exceeds {self.max_wave_tokens} tokens")


def host_samples(trace_samples: list[dict]) -> tuple[list[dict], list[dict]]:
    """(host samples, stub forward samples) of one run's samples (:func:`sglang_profile.samples`)."""
    host = [s for s in trace_samples if not s["curve"].startswith("forward")]
    stub = [s for s in trace_samples if s["curve"].startswith("forward")]
    return host, stub


def context_dependence(its: list[sglang_trace.Iteration], d) -> list[dict]:
    """Per decode (batch, context): the median schedule, launch and process (ms) and how many steps."""
    acc: dict[tuple, dict] = {}
    for s in sglang_trace.steps(its):
        point = d.decode_point.get(s.rids[0])
        if s.mode != "DECODE" or point is None or s.num_reqs != point[0]:
            continue
        row = acc.setdefault(point, {"schedule": [], "launch": [], "process": []})
        row["schedule"].append(s.schedule)
        row["launch"].append(s.launch)
        if s.process == s.process:
            row["process"].append(s.process)
    return [{"num_reqs": b, "ctx": c, "steps": len(v["launch"]),
             **{f"{k}_ms": round(statistics.median(x) * 1e3, 4) for k, x in v.items() if x}}
            for (b, c), v in sorted(acc.items())]


def calibrate_sglang_host(engine: Engine, model_dir: Path, grid: SglangHostGrid, folder: Path,
                          settings: tuple[str, ...] = ("normal", "overlap"), command: str = "",
                          report: Callable[[str], None] = print, sessions: int = 1, structured: bool = False) -> dict:
    """Run the stubbed scheduler ``sessions`` times under each of ``settings``, time the host
    yardstick (:mod:`calibrate.host.yardstick`) beside the runs, and build the host-costs file
    (:func:`host_costs`). ``structured``: each run is followed by a stubbed structured-output run
    of the same loop (``host-<name>-json``, :mod:`calibrate.real.sglang_structured`: the stub's
    zero logits sampled at temperature 1 under the mask give tokens the grammar allows), whose
    samples price the ``grammar.*`` curves.

    A finished run (and the yardstick's reading) is reused from ``folder``: an interrupted
    calibration resumes. Wall time here: about 40 s per run, most of it SGLang's start-up, and
    15 s for the yardstick.

    Raises:
        CalibrationInputError: a grid the server cannot run, or points without samples.
        RuntimeError: the driver failed in the SGLang environment.
    """
    import time

    grid.check()
    d = design(grid)
    order = session_order(settings, sessions)
    t0 = time.perf_counter()
    traces, grammar_traces = [], []
    for setting, name in order:
        job = {**d.job(str(model_dir), setting == "overlap", grid), "stub_forward": True}
        traces.append(run_job(engine, job, folder, f"host-{name}", report))
        if structured:
            gjob = {**sglang_structured.job(str(model_dir), setting == "overlap", grid), "stub_forward": True}
            grammar_traces.append(run_job(engine, gjob, folder, f"host-{name}-json", report))
    ruler = yardstick.reading_beside(folder / "yardstick.json", report)
    probe = mean_probe(folder / f"host-{name}.hostspeed.json" for _, name in order)
    host = host_costs(engine, grid, order, traces, ruler, settings, command, probe, grammar_traces)
    host["metadata"]["wall_s"] = round(time.perf_counter() - t0, 1)
    return host


def host_costs(engine: Engine, grid: SglangHostGrid, order: list[tuple[str, str]], traces: list[Path],
               ruler: dict | None, settings: tuple[str, ...] = ("normal", "overlap"), command: str = "",
               probe: dict | None = None, grammar_traces: list[Path] = ()) -> dict:
    """The host-costs file (a dict in the profile format, :data:`sim.model.profile.SGLANG_HOST_CURVES`)
    from the stubbed runs' traces (``order[i]`` = (setting, name) of ``traces[i]``): the host
    samples of :func:`calibrate.real.sglang_profile.samples`, the first setting's as the base
    curves and the others' in ``setting_curves``; ``metadata`` as the CPU-engine calibration's plus
    ``kind: host``, the stub's limits, ``context_dependence``, ``curve_sources`` and ``yardstick``;
    ``grammar_traces`` (one per run, in ``order``; may be empty): the stubbed structured-output
    runs, priced into the ``grammar.*`` curves (``metadata.structured_output``).

    Raises:
        CalibrationInputError: points without samples. RuntimeError: a trace of an unstubbed run.
    """
    from calibrate.profile import build_profile
    from sim.model.profile import SGLANG_HOST_CURVES

    d = design(grid)
    merged: dict[tuple, dict] = {}
    stub_ms: dict[str, list[float]] = {}
    contexts: dict[str, list[dict]] = {}
    meta: dict = {}
    for (setting, name), trace in zip(order, traces):
        meta, records, _ = sglang_trace.read_records(trace)
        if not meta.get("stub_forward"):
            raise RuntimeError(f"{trace}: not a stubbed run (metadata.stub_forward missing)")
        its = sglang_trace.iterations(records)
        host, stub = host_samples(samples(its, d))
        _check_host_coverage(host, grid)
        for smp in host:
            key = (smp["curve"], tuple(sorted(smp["point"].items())), setting)
            tag = {} if setting == settings[0] else {"setting": setting}
            merged.setdefault(key, {**smp, **tag, "times_s": []})["times_s"].extend(smp["times_s"])
        stub_ms.setdefault(setting, []).extend(t * 1e3 for s in stub for t in s["times_s"])
        contexts[name] = context_dependence(its, d)
    structured = (sglang_structured.add_samples(merged, order, grammar_traces, settings, set(grid.decode_batch_sizes))
                  if grammar_traces else None)
    meta_ = metadata(engine, grid, meta or {}, settings, command)
    meta_.update({
        "kind": "host", "device": "host", "device_name": f"host only (SGLang {engine.version} scheduler, forward stubbed)",
        "stub": {"replaced": "sglang.srt.model_executor.model_runner.ModelRunner._forward_raw (SGLang 0.5.23)",
                 "limits": STUB_LIMITS,
                 "stub_forward_median_ms": {k: round(statistics.median(v), 4) for k, v in stub_ms.items() if v}},
        "timing": meta_["timing"].replace("forward = ModelRunner.forward + sample", "forward stubbed"),
        "context_dependence": contexts,
        "curve_sources": host_curve_sources(engine.version),
    })
    if structured:
        meta_["structured_output"] = structured
        meta_["curve_sources"].update({c: {"source": "measured", "engine": f"sglang {engine.version}",
                                           "function": sglang_structured.FUNCTIONS[c]} for c in structured["curves"]})
    meta_.pop("sync_latency_s", None)
    if ruler:
        meta_["yardstick"] = ruler
    meta_["repeats"] = min(len(s["times_s"]) for s in merged.values())
    if probe:
        meta_["host_speed"] = probe
    if len(order) > len(settings):
        meta_["sessions"] = [f"host-{name}" for _, name in order]
    return build_profile(meta_, list(merged.values()), SGLANG_HOST_CURVES)


def host_curve_sources(version: str) -> dict:
    """``metadata.curve_sources`` of a host-costs file: per host curve, what timed it."""
    return {name: {"source": "measured", "engine": f"sglang {version}", "function": fn, "forward": "stubbed"}
            for name, fn in HOST_FUNCTIONS.items()}


def _check_host_coverage(host: list[dict], grid: SglangHostGrid) -> None:
    have = {(s["curve"], s["point"].get("num_reqs", s["point"].get("num_tokens"))) for s in host}
    want = [(c, b) for c in ("schedule.decode", "launch.decode", "process.decode") for b in grid.decode_batch_sizes]
    want += [("launch.extend", t) for t in grid.extend_tokens]
    missing = [f"{c} at {v}" for c, v in want if (c, v) not in have]
    if missing:
        raise CalibrationInputError("calibration", "", f"no samples for {len(missing)} host points, e.g. {missing[0]}")


def run_host_calibration(args) -> int:
    """``calibrate --engine sglang --host-only``: host costs from SGLang's scheduler, forward stubbed
    (with ``--structured-output``, the grammar curves too)."""
    import functools
    from dataclasses import replace

    from calibrate.host.command import run_host_command
    from calibrate.real.cli import grid_changes

    grid = replace(SglangHostGrid(), **grid_changes(args))
    grid = replace(grid, max_running_requests=max(grid.max_running_requests, max(grid.decode_batch_sizes)),
                   context_length=max(grid.context_length, max(grid.decode_contexts) + grid.decode_steps,
                                      max(grid.extend_tokens) + max(grid.extend_prefixes) + 1))
    grid.check()
    structured = bool(getattr(args, "structured_output", False))
    return run_host_command(args, "sglang", grid, functools.partial(calibrate_sglang_host, structured=structured),
                            ["--structured-output"] if structured else [])
