"""A vLLM profile from the real vLLM server: its own functions, timed step by step.

``overlap-sim calibrate --engine vllm`` starts the real vLLM 0.32 server (CPU build) once per
setting (``sync``, ``async``) with the tracer (:mod:`realengines.vllm.tracer`), runs designed
closed-loop loads (:func:`design`) and prices the curves of
:data:`sim.engines.vllm.costs.VLLM_CURVE_AXES` from the steps it ran
(:mod:`calibrate.real.vllm_trace`):

- decode waves: for each batch size B and context C, B clients with prompts of ``C - 16`` tokens
  and 32 output tokens (equal lengths, so each wave starts and ends together): its all-decode
  steps price ``vllm.forward(B, C)`` (steps whose mean context is within 16 tokens of C) and
  the phase curves at ``num_reqs`` B;
- prefills: ``vllm.forward(N, C)`` for N >= 128 new tokens at mean context C: N / C clients
  with C-token prompts and one output token (one step prefills them together) when C <= N,
  else one client whose prompt repeats a cached (C - N)-token prefix (whole 128-token blocks:
  the CPU platform's block size) that a warm-up request put in the prefix cache.

Times are wall seconds (``perf_counter``) of each call, so what the engine core loses to the API
server on the core they share is in them; ``dispatch``, ``roundtrip`` and ``collect`` are the
intervals between one process's call and the other's (see :mod:`sim.engines.vllm.costs`).
The base curves come from ``sync``; ``async`` keeps its own curves in ``setting_curves``, the
forward included: in the interleaved validation sessions of 2026-12-01 (5 per setting), the
worker's forward of a decode step of 4 to 16 requests ran x1.01-1.27 slower under async
scheduling than under the synchronous loop (median per session), its ``execute_model`` outside
the forward x1.1 and ``sample_tokens`` x1.8 (the worker's async output copy shares its core).
The front end (``vllm.frontend_in``/``frontend_out``, :func:`frontend_samples`) is measured from
the client's records of each session. Simplification: ``vllm.add_request`` is priced per call at
``num_reqs`` 1 (the tracer times each ``EngineCore.add_request``).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from calibrate.real import vllm_trace
from calibrate.real.environment import Engine, mean_probe, model_metadata, run_module, run_probed
from calibrate.real.jobs import Prompts, request

SESSION_TIMEOUT_S = 3600
BLOCK_SIZE = 128  # vllm/platforms/cpu.py: the CPU platform's default block size


@dataclass(frozen=True)
class VllmGrid:
    """What to measure (tokens)."""

    decode_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    contexts: tuple[int, ...] = (128, 256, 512, 768)
    prefill_tokens: tuple[int, ...] = (128, 256, 512)
    decode_steps: int = 32
    waves: int = 2
    prefill_repeats: int = 5
    max_num_seqs: int = 16
    max_model_len: int = 1024
    seed: int = 0

    def server_args(self) -> list[str]:
        return ["--max-model-len", str(self.max_model_len), "--max-num-seqs", str(self.max_num_seqs)]


BACKLOG_FACTOR = 2.0  # frontend_out: a delivery delay above this x the median is a backlog


def design(grid: VllmGrid) -> list[dict]:
    """The loads of one calibration session (``realengines.server``'s ``loads``)."""
    prompts = Prompts(grid.seed)
    loads = []
    for c in grid.contexts:
        for b in grid.decode_batch_sizes:
            reqs = [request(f"d{b}x{c}-{i}", prompts.new(c - grid.decode_steps // 2), grid.decode_steps)
                    for i in range(b * grid.waves)]
            loads.append({"name": f"decode-b{b}-c{c}", "concurrency": b, "warmup_requests": 0, "requests": reqs})
    for n in grid.prefill_tokens:
        for c in grid.contexts:
            name = f"prefill-n{n}-c{c}"
            if c <= n:
                k = n // c
                reqs = [request(f"{name}-{i}", prompts.new(c), 1) for i in range(k * grid.prefill_repeats)]
                loads.append({"name": name, "concurrency": k, "warmup_requests": 0, "requests": reqs})
            elif (c - n) % BLOCK_SIZE == 0:
                shared = prompts.new(c - n)
                reqs = [request(f"{name}-w", shared + prompts.new(BLOCK_SIZE), 1)]
                reqs += [request(f"{name}-{i}", shared + prompts.new(n), 1) for i in range(grid.prefill_repeats)]
                loads.append({"name": name, "concurrency": 1, "warmup_requests": 1, "requests": reqs})
    return loads


def samples(steps: list[vllm_trace.VllmStep], grid: VllmGrid, setting: str) -> list[dict]:
    """Profile samples (``{"curve", "point", "times_s"}``) from one session's steps."""
    acc: dict[tuple, list[float]] = {}

    def add(curve: str, point: dict, t: float) -> None:
        if t == t and t >= 0:
            acc.setdefault((curve, tuple(sorted(point.items()))), []).append(t)

    sizes = set(grid.decode_batch_sizes)
    for s in steps:
        if not s.num_reqs or s.execute is None or s.sample is None or s.update is None:
            continue
        sched_end = s.schedule["t0"] + s.schedule["dur"]
        ex_end = s.execute["t0"] + s.execute["dur"]
        sa_end = s.sample["t0"] + s.sample["dur"]
        if s.is_decode and s.num_reqs in sizes:
            c = min(grid.contexts, key=lambda x: abs(x - s.ctx))
            if abs(c - s.ctx) <= grid.decode_steps // 2:
                add("vllm.forward", {"num_tokens": s.num_tokens, "ctx": c}, s.forward)
        elif not any(t == 1 for t in s.tok) and s.num_tokens in grid.prefill_tokens and s.ctx in grid.contexts:
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
    return [{"curve": c, "point": dict(p), "times_s": ts} for (c, p), ts in sorted(acc.items())]


def frontend_samples(folder: Path, engine_records: list[dict], steps: list[vllm_trace.VllmStep],
                     loads: list[dict], sizes: set[int] | None = None) -> list[dict]:
    """The API server's share of a request's latency, from the client's records (``<load>.json``
    in ``folder``: send time and each token's arrival, ``perf_counter``) joined with the engine
    core's trace (same clock):

    - ``vllm.frontend_in`` (num_reqs n): from the client's send to ``EngineCore.add_request``:
      HTTP handling, ``OpenAIServingCompletion``, the input processor and the trip to the engine
      core's input queue. n = 1: the requests of the loads that run one request at a time (the
      engine idle when each is sent, no other request in the API server); n > 1: the first
      ``add_request`` after a burst of the load's first n requests, sent together to an idle
      server (the handlers interleave, so the first of them reaches the engine core late);
    - ``vllm.frontend_out`` (num_reqs n): from the end of ``update_from_output`` of a step that
      ran the load's full concurrency n (n in ``sizes``, default any) to the client's receipt of
      each of that step's tokens: the engine core's output thread,
      ``OutputProcessor.process_outputs`` in the API server, the streamed chunk.

    ``loads``: the session's loads (``name``, ``concurrency``), as its spec lists them. A request's j-th token is paired with the j-th step that
      sampled for it (its prompt complete), for the requests whose client received as many
      chunks as steps sampled for them (no two tokens in one chunk, no preemption). When the
      client falls behind the stream, its delays grow token by token (a backlog: up to 150 ms
      here): that is queueing, which the simulator's API server produces itself, not the service
      time; delays above :data:`BACKLOG_FACTOR` times the point's median are left out (in the
      shipped profile's sessions 13-47% of a point's samples, the most at batch 1 and 16). The
      same cut applies to ``frontend_in``: a lone request that took 5-15 times the median (the
      session's first, up to 104 ms) waited behind something else.
    """
    prompt = {vllm_trace.client_rid(r["rid"]): r["prompt"] for r in engine_records if r["ph"] == "add"}
    added = {vllm_trace.client_rid(r["rid"]): r["t0"] for r in engine_records if r["ph"] == "add"}
    delivered: dict[str, list[tuple[float, int]]] = {}
    for st in steps:
        if st.update is None:
            continue
        end = st.update["t0"] + st.update["dur"]
        for rid, tok, done in zip(st.reqs, st.tok, st.done):
            c = vllm_trace.client_rid(rid)
            if done + tok >= prompt.get(c, float("inf")):
                delivered.setdefault(c, []).append((end, st.num_reqs))
    acc: dict[str, dict[int, list[float]]] = {"vllm.frontend_in": {}, "vllm.frontend_out": {}}
    for load in loads:
        path = folder / f"{load['name']}.json"
        if not path.exists():
            continue
        recs = json.loads(path.read_text()).get("requests", [])
        burst = sorted(recs, key=lambda r: r["send_s"])[:load["concurrency"]]
        if load["concurrency"] > 1 and all(r["rid"] in added and not r.get("error") for r in burst):
            acc["vllm.frontend_in"].setdefault(load["concurrency"], []).append(
                min(added[r["rid"]] for r in burst) - burst[0]["send_s"])
        for r in recs:
            if r.get("error") or r["rid"] not in added:
                continue
            if load["concurrency"] == 1:
                acc["vllm.frontend_in"].setdefault(1, []).append(added[r["rid"]] - r["send_s"])
            steps_of = delivered.get(r["rid"], [])
            if len(r.get("token_times_s", [])) == len(steps_of):
                for t, (end, n) in zip(r["token_times_s"], steps_of):
                    if n == load["concurrency"] and (sizes is None or n in sizes):
                        acc["vllm.frontend_out"].setdefault(n, []).append(t - end)
    out = []
    for c, by in acc.items():
        for n, ts in sorted(by.items()):
            ts = [x for x in ts if x >= 0]
            if ts:  # a backlog's queueing (or a wait behind what the loads did not show) is not the latency
                cap = BACKLOG_FACTOR * statistics.median(ts)
                ts = [x for x in ts if x <= cap]
            if ts:
                out.append({"curve": c, "point": {"num_reqs": n}, "times_s": ts})
    return out


def add_request_samples(engine_records: list[dict]) -> list[dict]:
    times = [r["dur"] for r in engine_records if r["ph"] == "add"]
    return [{"curve": "vllm.add_request", "point": {"num_reqs": 1}, "times_s": times}] if times else []


def run_session(engine: Engine, model_dir: Path, grid: VllmGrid, setting: str, folder: Path,
                report: Callable[[str], None]) -> Path:
    """Run (or reuse a finished) calibration session of ``setting``; returns its folder."""
    out = folder / setting
    spec = {"engine": "vllm", "model_dir": str(model_dir), "setting": setting, "port": 30300,
            "server_args": grid.server_args(), "trace": True, "ready_timeout_s": 900, "loads": design(grid),
            "pause_between_loads_s": 1.0}
    spec_path = folder / f"{setting}.json"
    text = json.dumps(spec)
    if (out / "session.json").exists() and spec_path.exists() and spec_path.read_text() == text:
        report(f"{setting}: reusing {out}")
        return out
    folder.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(text)
    if out.exists():
        for old in out.glob("*"):
            old.unlink()
    report(f"{setting}: real vLLM server, {len(spec['loads'])} loads")
    run_probed(engine, folder / f"{setting}.hostspeed.json",
               lambda: run_module(engine, "realengines.server", [str(spec_path), str(out)],
                                  folder / f"{setting}.log", timeout_s=SESSION_TIMEOUT_S))
    return out


def calibrate_vllm(engine: Engine, model_dir: Path, grid: VllmGrid, folder: Path, command: str = "",
                   settings: tuple[str, ...] = ("sync", "async"), report: Callable[[str], None] = print) -> dict:
    """Run the sessions and build the vLLM profile (base curves from the first setting).

    Raises:
        ProfileError: a curve without samples or a grid with holes (the message names it).
        RuntimeError: the server failed in the vLLM environment.
    """
    from calibrate.measure import host_cpu
    from calibrate.profile import build_profile
    from sim.engines.vllm.costs import VLLM_CURVES

    merged: dict[tuple, dict] = {}
    versions: dict = {}
    outs = [run_session(engine, model_dir, grid, setting, folder, report) for setting in settings]
    reference = mean_probe(folder / f"{s}.hostspeed.json" for s in settings)
    for i, (setting, out) in enumerate(zip(settings, outs)):
        versions = json.loads((out / "session.json").read_text()).get("versions", {})
        eng, wrk = vllm_trace.read_files(sorted(out.glob("trace.*.jsonl")))
        steps_ = vllm_trace.steps(eng, wrk)
        got = (samples(steps_, grid, setting) + add_request_samples(eng)
               + frontend_samples(out, eng, steps_, design(grid), set(grid.decode_batch_sizes)))
        for smp in got:
            if i == 0:
                merged[(smp["curve"], tuple(sorted(smp["point"].items())), setting)] = smp
            elif smp["curve"] not in ("vllm.dispatch", "vllm.roundtrip", "vllm.collect"):
                merged[(smp["curve"], tuple(sorted(smp["point"].items())), setting)] = {**smp, "setting": setting}
    for setting in settings:
        _drop_incomplete_rows(merged, grid, report, setting)
    smp_list = list(merged.values())
    meta = {"backend": "vllm", "device": "cpu", "engine": "vllm", "engine_version": engine.version,
            "device_name": f"cpu (vLLM {engine.version} CPU build, worker on its own core)",
            "host_cpu": host_cpu(), "host_cores": os.cpu_count(), "platform": platform.platform(),
            "libraries": versions, "model": model_metadata(), "dtype": "float32",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "grid": {k: v for k, v in grid.__dict__.items()}, "repeats": min(len(s["times_s"]) for s in smp_list),
            "warmup": 0, "quick": False, "settings": list(settings), "base_setting": settings[0],
            "command": command, "timing": "wall seconds (perf_counter) of vLLM's own functions in the server's "
            "processes; dispatch, roundtrip and collect are the intervals between them (sync)"}
    if reference:
        meta["host_speed"] = reference
    return build_profile(meta, smp_list, VLLM_CURVES)


def _drop_incomplete_rows(merged: dict, grid: VllmGrid, report: Callable[[str], None], setting: str) -> None:
    """Leave out the forward samples of ``setting`` at a token count that lacks a context of the
    grid (a prefill whose prompts the server happened to split over two steps): the curve needs
    a full grid, and steps beyond the largest complete row are then priced by extrapolation."""
    fwd = [k for k in merged if k[0] == "vllm.forward" and k[2] == setting]
    seen: dict[int, set] = {}
    for k in fwd:
        p = dict(k[1])
        seen.setdefault(p["num_tokens"], set()).add(p["ctx"])
    for n, ctxs in sorted(seen.items()):
        if set(grid.contexts) - ctxs:
            report(f"vllm.forward ({setting}): no step of {n} tokens at context(s) "
                   f"{sorted(set(grid.contexts) - ctxs)}; the {n}-token row is left out")
            for k in fwd:
                if dict(k[1])["num_tokens"] == n:
                    del merged[k]


def phase_table(profile: dict) -> list[tuple[str, str, float]]:
    """(curve, point, median ms) of every sample point, for a summary."""
    return [(s["curve"] + (f"[{s['setting']}]" if s.get("setting") else ""),
             ",".join(str(v) for v in s["point"].values()), statistics.median(s["times_s"]) * 1e3)
            for s in profile["samples"]]
