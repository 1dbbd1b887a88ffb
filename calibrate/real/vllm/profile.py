"""A vLLM profile from the real vLLM server: its own functions, timed step by step.

``overlap-sim calibrate --engine vllm`` starts the real vLLM 0.32 server (CPU build) once per
setting (``sync``, ``async``) with the tracer (:mod:`realengines.vllm.tracer`), runs designed
closed-loop loads (:func:`calibrate.real.vllm.sessions.design`) and prices the curves of
:data:`sim.engines.vllm.profile.VLLM_CURVE_AXES` from the steps it ran
(:mod:`calibrate.real.vllm.trace`):

- decode waves: for each batch size B and context C, B clients with prompts of ``C - 16`` tokens
  and 32 output tokens (equal lengths, so each wave starts and ends together): its all-decode
  steps price ``vllm.forward(B, C)`` (steps whose mean context is within 16 tokens of C) and
  the phase curves at ``num_reqs`` B;
- prefills: ``vllm.forward(N, C)`` for N >= 128 new tokens at mean context C: N / C clients
  with C-token prompts and one output token when C <= N, else one client whose prompt repeats a
  cached (C - N)-token prefix (whole 128-token blocks: the CPU platform's block size) that a
  warm-up request put in the prefix cache. Requests sent together reach the engine core one at
  a time (:mod:`sim.engines.vllm.frontend`): the first alone, the others during its prefill. So
  each group of N / C > 1 prompts is sent behind a blocker, a lone request of
  :data:`calibrate.real.vllm.sessions.BLOCKER_TOKENS` tokens that the engine core prefills alone while the group arrives; the
  group is then prefilled in one step of N tokens (without the blocker, the first calibration
  measured 512-token steps at no context below 512, and the curve stopped at 256 tokens);
- shared-prefix decode waves: B = 4, 8, 16 clients whose prompts share a cached 384-token prefix
  (a warm-up request put it in the prefix cache) and continue with their own tokens to a mean
  context of 512: their forward, against the forward curve of distinct contexts, gives the share
  of a shared prefix's attention cost a step saves (``metadata.shared_prefix``,
  :func:`shared_prefix_saving`); their steps price no forward point.

Times are wall seconds (``perf_counter``) of each call, so what the engine core loses to the API
server on the core they share is in them; ``dispatch``, ``roundtrip``, ``collect`` and ``pickup``
are intervals between one process's call and the other's (see :mod:`sim.engines.vllm.costs`).
The base curves come from ``sync``; ``async`` keeps its own curves in ``setting_curves`` for the
phases whose code or timing differs under async scheduling: the worker's ``execute_model``
outside the forward and ``sample_tokens`` (the worker's async output copy shares its core:
``sample_tokens`` measured x1.8), ``vllm.collect`` (sampled only where the engine core was
already waiting for the output) and ``vllm.pickup`` (the worker taking an RPC that was already
queued: ``sample_tokens`` behind ``execute_model``, and the next step's ``execute_model``).

The model forward (``vllm.forward``) is one curve priced from the steps of both settings: it is
the same code under both loops. Two calibrations on 2026-12-01 (one sync-then-async, one
sync-async-async-sync) measured the async session's forward x1.1-1.5 slower, thread CPU time
included, at nearly every point; the interleaved validation sessions of the same day (5 per
setting, 6 loads each) and a later one-server check measured it x0.95-1.19 by load and about
x1.0 on decode overall. The cause was not found (no correlation with the engine core's
activity during the forward); a per-setting forward curve would carry whichever it was into
every async prediction, and it left prefills of more than 128 tokens unmeasured under async
(priced at a third of their real time by extrapolation: 32 ms for a real 104 ms).
The front end (``vllm.frontend_in``/``frontend_out``,
:func:`calibrate.real.vllm.trace.frontend_samples`) is measured from the client's records of
each session. Simplification: ``vllm.add_request`` is priced per call at
``num_reqs`` 1 (the tracer times each ``EngineCore.add_request``).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from calibrate.real.vllm import speculative as vllm_speculative, structured as vllm_structured, trace as vllm_trace
from calibrate.real.vllm.merge import drop_incomplete_rows, merge_sample, note_sources
from calibrate.real.environment import Engine, mean_probe, model_metadata, session_order
from calibrate.real.vllm.sessions import (SHARED_LOAD, SHARED_PREFIX_TOKENS, VllmGrid, design, run_session,
                                          run_speculative_session, run_structured_session)
from calibrate.real.vllm.trace import frontend_samples

# the vLLM 0.32 function each host curve is timed from (E: engine core, W: worker, A: API server)
HOST_FUNCTIONS = {
    "vllm.add_request": "EngineCore.add_request (E, v1/engine/core.py)",
    "vllm.schedule": "Scheduler.schedule (E, v1/core/sched/scheduler.py; AsyncScheduler under async)",
    "vllm.dispatch": "end of Scheduler.schedule to start of GPUModelRunner.execute_model (E->W: the execute_model "
                     "RPC over the shared-memory broadcast queue)",
    "vllm.prepare": "GPUModelRunner.execute_model less _model_forward (W, v1/worker/gpu_model_runner.py; the CPU "
                    "runner's _prepare_inputs)",
    "vllm.roundtrip": "end of execute_model to start of sample_tokens (W->E->W, sync: the None reply and the "
                      "sample_tokens RPC)",
    "vllm.sample": "GPUModelRunner.sample_tokens (W)",
    "vllm.collect": "end of sample_tokens to start of Scheduler.update_from_output (W->E: the output's reply)",
    "vllm.update": "Scheduler.update_from_output (E)",
    "vllm.pickup": "async: the worker taking an RPC already queued for it (W)",
    "vllm.frontend_in": "client send to the first EngineCore.add_request (A: the OpenAI API server)",
    "vllm.frontend_out": "end of update_from_output to the client's receipt of the tokens (E output thread, A)",
    "vllm.frontend_work": "OutputProcessor.process_outputs of one engine-core output (A)",
}

def samples(steps: list[vllm_trace.VllmStep], grid: VllmGrid, setting: str) -> list[dict]:
    """Profile samples (``{"curve", "point", "times_s"}``) from one session's steps."""
    acc: dict[tuple, list[float]] = {}

    def add(curve: str, point: dict, t: float) -> None:
        if t == t and t >= 0:
            acc.setdefault((curve, tuple(sorted(point.items()))), []).append(t)

    sizes = set(grid.decode_batch_sizes)
    by_k = {s.k: s for s in steps}
    for s in steps:
        if not s.num_reqs or s.execute is None or s.sample is None or s.update is None:
            continue
        sched_end = s.schedule["t0"] + s.schedule["dur"]
        ex_end = s.execute["t0"] + s.execute["dur"]
        sa_end = s.sample["t0"] + s.sample["dur"]
        nxt = by_k.get(s.k + 1)
        # a shared prefix's forward is not a distinct context's (shared_prefix_saving prices it)
        distinct = not any(vllm_trace.client_rid(r).startswith(SHARED_LOAD) for r in s.reqs)
        if distinct and s.is_decode and s.num_reqs in sizes:
            c = min(grid.contexts, key=lambda x: abs(x - s.ctx))
            if abs(c - s.ctx) <= grid.decode_steps // 2:
                add("vllm.forward", {"num_tokens": s.num_tokens, "ctx": c}, s.forward)
        elif (distinct and not any(t == 1 for t in s.tok) and s.num_tokens in grid.prefill_tokens
              and s.ctx in grid.contexts):
            add("vllm.forward", {"num_tokens": s.num_tokens, "ctx": int(s.ctx)}, s.forward)
        if s.num_reqs not in sizes:
            continue
        n = {"num_reqs": s.num_reqs}
        add("vllm.schedule", n, s.schedule["dur"])
        add("vllm.prepare", n, s.execute["dur"] - s.forward)
        add("vllm.sample", n, s.sample["dur"])
        add("vllm.update", n, s.update["dur"])
        if setting == "sync":
            add("vllm.dispatch", n, s.execute["t0"] - sched_end)
            add("vllm.roundtrip", n, s.sample["t0"] - ex_end)
            add("vllm.collect", n, s.update["t0"] - sa_end)
            continue
        # async: sample_tokens was queued behind execute_model; the next step's execute_model was
        # queued (scheduled) before this sample_tokens began; the engine core was waiting (it
        # had scheduled the next step) before this step's output came back
        add("vllm.pickup", n, s.sample["t0"] - ex_end)
        if nxt is not None and nxt.execute is not None and nxt.schedule["t0"] + nxt.schedule["dur"] < s.sample["t0"]:
            add("vllm.pickup", n, nxt.execute["t0"] - sa_end)
        if nxt is not None and nxt.schedule["t0"] + nxt.schedule["dur"] < sa_end:
            add("vllm.collect", n, s.update["t0"] - sa_end)
    return [{"curve": c, "point": dict(p), "times_s": ts} for (c, p), ts in sorted(acc.items())]


def shared_prefix_steps(steps: list[vllm_trace.VllmStep], grid: VllmGrid) -> list[tuple[int, float, float]]:
    """``(num_reqs, mean context, forward s)`` of the decode steps of the shared-prefix loads
    (every request of the step holds the shared prefix), at the loads' batch sizes."""
    out = []
    for s in steps:
        if (s.is_decode and s.num_reqs in grid.shared_batch_sizes and s.forward == s.forward
                and all(vllm_trace.client_rid(r).startswith(SHARED_LOAD) for r in s.reqs)):
            out.append((s.num_reqs, s.ctx, s.forward))
    return out


def shared_prefix_saving(forward: Callable[[float, float], float], measured: list[tuple[int, float, float]],
                         prefix: int = SHARED_PREFIX_TOKENS) -> dict | None:
    """The share ``f`` of a shared prefix's attention cost that a step saves
    (:mod:`sim.engines.vllm.costs`): per measured step of m requests at mean context C, the ``f``
    in [0, 1] for which ``forward(m, C - f (m - 1) p / m)`` equals its forward (bisection; the
    curve of distinct contexts rises with the context; a step slower than the full context
    gives 0, one faster than the context without the repeats gives 1); the median per batch
    size, and their median. None without steps (steps of one request, or of a non-finite
    context or forward, are left out).

    Args:
        forward: the forward curve of distinct contexts, ``(num_tokens, ctx) -> s``.
        measured: :func:`shared_prefix_steps`' tuples.
        prefix: the shared prefix (tokens).
    """
    by_batch: dict[int, list[float]] = {}
    for m, ctx, fwd in measured:
        if m < 2 or not (math.isfinite(fwd) and math.isfinite(ctx)):
            continue
        repeat = (m - 1) * prefix / m
        lo, hi = 0.0, 1.0
        if fwd >= forward(m, ctx):
            f = 0.0
        elif fwd <= forward(m, ctx - repeat):
            f = 1.0
        else:
            for _ in range(40):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if forward(m, ctx - mid * repeat) > fwd else (lo, mid)
            f = (lo + hi) / 2
        by_batch.setdefault(m, []).append(f)
    if not by_batch:
        return None
    per = {m: statistics.median(v) for m, v in sorted(by_batch.items())}
    return {"saving": statistics.median(per.values()), "by_batch": {str(m): round(v, 4) for m, v in per.items()},
            "prefix_tokens": prefix, "steps": sum(len(v) for v in by_batch.values())}


def add_request_samples(engine_records: list[dict]) -> list[dict]:
    times = [r["dur"] for r in engine_records if r["ph"] == "add"]
    return [{"curve": "vllm.add_request", "point": {"num_reqs": 1}, "times_s": times}] if times else []


def calibrate_vllm(engine: Engine, model_dir: Path, grid: VllmGrid, folder: Path, command: str = "",
                   settings: tuple[str, ...] = ("sync", "async"), report: Callable[[str], None] = print,
                   sessions: int = 1, speculative: dict | None = None, structured: bool = False) -> dict:
    """Run the sessions (``sessions`` per setting, :func:`session_order`) and build the vLLM
    profile: base curves from the first setting, the other settings' own curves in
    ``setting_curves``, the curves of :data:`calibrate.real.vllm.merge.POOLED_CURVES` from every session; a point's
    samples are those of every session that measured it. ``speculative`` (a config,
    :func:`calibrate.real.vllm.speculative.check_config`): each session is followed by one with
    the server drafting, whose steps give the speculative host curves; ``structured``: and by
    one whose requests all carry a JSON schema (the grammar curves).

    Raises:
        ProfileError: a curve without samples or a grid with holes (the message names it).
        RuntimeError: the server failed in the vLLM environment.
        ValueError: ``sessions`` below 1.
    """
    from calibrate.measure import host_cpu
    from calibrate.profile import build_profile
    from sim.engines.vllm.profile import MIXED_SUM_OF_PARTS, VLLM_CURVES
    from sim.model.profile import profile_curves

    merged: dict[tuple, dict] = {}
    versions: dict = {}
    shared: dict[str, list[tuple[int, float, float]]] = {}
    order = session_order(settings, sessions)
    outs, spec_outs, grammar_outs = [], [], []
    for setting, name in order:
        outs.append(run_session(engine, model_dir, grid, setting, folder, report, name))
        if speculative:
            spec_outs.append(run_speculative_session(engine, model_dir, grid, setting, folder, report, name,
                                                     speculative))
        if structured:
            grammar_outs.append(run_structured_session(engine, model_dir, grid, setting, folder, report, name))
    reference = mean_probe(folder / f"{name}.hostspeed.json" for _, name in order)
    for (setting, _), out in zip(order, outs):
        versions = json.loads((out / "session.json").read_text()).get("versions", {})
        eng, wrk = vllm_trace.read_files(sorted(out.glob("trace.*.jsonl")))
        steps_ = vllm_trace.steps(eng, wrk)
        shared.setdefault(setting, []).extend(shared_prefix_steps(steps_, grid))
        got = (samples(steps_, grid, setting) + add_request_samples(eng)
               + frontend_samples(out, eng, steps_, design(grid), set(grid.decode_batch_sizes))
               + vllm_trace.output_work_samples(sorted(out.glob("trace.*.jsonl")), set(grid.decode_batch_sizes)))
        for smp in got:
            merge_sample(merged, smp, setting, settings)
    drop_incomplete_rows(merged, grid.contexts, report, settings[0])
    smp_list = list(merged.values())
    meta = {"backend": "vllm", "device": "cpu", "engine": "vllm", "engine_version": engine.version,
            "device_name": f"cpu (vLLM {engine.version} CPU build, worker on its own core)" if grid.tensor_parallel_size == 1
            else f"cpu (vLLM {engine.version} CPU build, {grid.tensor_parallel_size} tensor-parallel workers, "
                 f"cores {grid.server_env()['VLLM_CPU_OMP_THREADS_BIND']})",
            "tensor_parallel_size": grid.tensor_parallel_size,
            "host_cpu": host_cpu(), "host_cores": os.cpu_count(), "platform": platform.platform(),
            "libraries": versions, "model": model_metadata(), "dtype": "float32",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "grid": {k: v for k, v in grid.__dict__.items()}, "repeats": min(len(s["times_s"]) for s in smp_list),
            "warmup": 0, "quick": False, "settings": list(settings), "base_setting": settings[0],
            "sessions": [name for _, name in order],
            "command": command, "timing": "wall seconds (perf_counter) of vLLM's own functions in the server's "
            "processes; dispatch, roundtrip, collect and pickup are the intervals between them"}
    if reference:
        meta["host_speed"] = reference
    meta["curve_sources"] = {**{name: {"source": "measured", "engine": f"vllm {engine.version}", "function": fn,
                                       "forward": "vLLM's CPU forward"} for name, fn in HOST_FUNCTIONS.items()},
                             "vllm.forward": {"source": "measured", "engine": f"vllm {engine.version}",
                                              "function": "GPUModelRunner._model_forward (the model's forward, CPU)"}}
    meta["mixed_steps"] = MIXED_SUM_OF_PARTS  # the CPU forward prices each request's own part
    profile = build_profile(meta, smp_list, VLLM_CURVES)
    forward = profile_curves(profile, "median", None, VLLM_CURVES)["vllm.forward"]
    sizes = set(grid.decode_batch_sizes)
    if speculative:  # the drafter's passes are priced from the forward curves built so far
        meta["speculative"] = vllm_speculative.add_samples(merged, meta, order, spec_outs, speculative, sizes,
                                                           grid.decode_steps, settings, report)
        note_sources(meta, vllm_speculative.FUNCTIONS, engine.version)
    if structured:
        meta["structured_output"] = vllm_structured.add_samples(merged, order, grammar_outs, sizes, settings)
        note_sources(meta, vllm_structured.FUNCTIONS, engine.version)
    if speculative or structured:
        profile = build_profile(meta, list(merged.values()), VLLM_CURVES)
    saving = shared_prefix_saving(forward, [x for steps_ in shared.values() for x in steps_])
    if saving is not None:  # each setting's own where its sessions measured it
        own = {st: shared_prefix_saving(forward, steps_) for st, steps_ in shared.items()}
        saving["by_setting"] = {st: round(v["saving"], 4) for st, v in own.items() if v is not None}
        profile["metadata"]["shared_prefix"] = saving
        report(f"shared prefix: {saving['saving']:.2f} of its attention cost saved per repeat "
               f"(by batch size {saving['by_batch']}, by setting {saving['by_setting']}, {saving['steps']} steps)")
    return profile


def phase_table(profile: dict) -> list[tuple[str, str, float]]:
    """(curve, point, median ms) of every sample point, for a summary."""
    return [(s["curve"] + (f"[{s['setting']}]" if s.get("setting") else ""),
             ",".join(str(v) for v in s["point"].values()), statistics.median(s["times_s"]) * 1e3)
            for s in profile["samples"]]
