"""A real server's run in the simulator's trace schema (:mod:`sim.trace.recorder`), so that
measured and predicted runs go through the same metrics code (:func:`sim.trace.metrics.summarize`).

The client (:mod:`realengines.client`) gives the requests table and the inter-token latencies:
arrival = when the client sent the request, first token and finish = when the client read
them (bench_serving's definitions; tokens of a chunk spread over its gap). The engine's tracer
gives the steps table: one row per batch with its kind, size and the wall-clock span of each
phase; on the CPU engine ``forward_start``/``forward_end`` are the model's forward and sampling
on the scheduler's thread. Times are seconds from the first measured send.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.errors import CalibrationInputError
from calibrate.real import sglang_trace
from sim.trace.recorder import REQUEST_COLUMNS, STEP_COLUMNS


def read_load(path: Path) -> dict:
    """A client result file (``<load>.json`` of a session)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CalibrationInputError(str(path), "", f"not a readable load result ({err})") from None


def prompt_len(spec: dict) -> int:
    """A request's prompt length: ``input_len`` (a load the engine's client drew) or its token ids."""
    return int(spec["input_len"]) if "input_len" in spec else len(spec["input_ids"])


def requests_frames(load: dict, specs: dict[str, dict], t0: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(requests, itl) tables from the client's records. ``specs``: rid -> the request sent
    (its prompt length and, for the simulator, ``cached_len``); ``t0``: the time origin."""
    rows, itl = [], []
    for i, rec in enumerate(load["requests"]):
        spec = specs[rec["rid"]]
        ok = not rec["error"] and rec["end_s"] is not None and rec["output_len"] > 0
        times = rec["token_times_s"]
        if ok and not rec["warmup"]:
            itl.extend(np.diff(times).tolist())
        rows.append((i, rec["send_s"] - t0, prompt_len(spec), int(spec.get("cached_len", 0)),
                     int(spec["max_new_tokens"]), int(rec["output_len"]) if ok else 0,
                     (rec["first_s"] - t0) if ok and rec["first_s"] is not None else math.nan,
                     (rec["end_s"] - t0) if ok else math.nan, "completed" if ok else "failed",
                     bool(rec["warmup"]), 0, "" if ok else "cut_off"))
    requests = pd.DataFrame(rows, columns=REQUEST_COLUMNS)
    itl_frame = pd.DataFrame({"itl_s": np.asarray(itl, dtype=np.float64), "weight": np.ones(len(itl), dtype=np.int64)})
    return requests, itl_frame


def sglang_steps_frame(records: list[dict], t0: float, t1: float, rid_index: dict[str, int],
                       warm: set[str]) -> pd.DataFrame:
    """The steps table of SGLang's tracer records scheduled in [t0, t1] (wall clock), times
    relative to ``t0``. ``rid_index``: request id -> row of the requests table (to count
    warm-up members); request ids of other loads are ignored."""
    its = sglang_trace.iterations(records, clock="wall")
    rows = []
    after_idle = False
    for it in its:
        s = it.step
        if s is None:
            after_idle = after_idle or it.t0 >= t0
            continue
        if not (t0 <= s.t_schedule <= t1) or s.iter < 0:
            continue
        members = [r for r in s.rids if r in rid_index]
        rows.append((s.iter, s.kind, s.num_reqs, s.num_tokens, s.ctx, sum(r in warm for r in members), 0, 0,
                     after_idle, 0, s.running, s.waiting, it.t0 - t0, s.t_schedule - t0,
                     s.t_schedule + s.schedule - t0, s.t_schedule + s.schedule - t0, s.forward_start - t0,
                     s.forward_start - t0, s.forward_end - t0, s.forward_end - t0, s.process_start - t0,
                     s.process_end - t0))
        after_idle = False
    steps = pd.DataFrame(rows, columns=STEP_COLUMNS)
    steps["kind"] = pd.Categorical(steps["kind"], categories=["extend", "decode"])
    return steps.sort_values("seq", kind="stable").reset_index(drop=True)


def vllm_steps_frame(steps: list, t0: float, t1: float, rid_index: dict[str, int], warm: set[str]) -> pd.DataFrame:
    """The steps table of vLLM's joined steps (:func:`calibrate.real.vllm.trace.steps`) scheduled
    in [t0, t1] (wall clock), times relative to ``t0``: schedule = ``Scheduler.schedule``, launch
    up to the worker's ``execute_model``, the forward = the model forward(s) inside it, process =
    ``update_from_output``. Steps without tokens are left out (the simulator records none)."""
    from calibrate.real.vllm.trace import client_rid

    rows = []
    for s in steps:
        if not s.num_tokens or s.update is None or not (t0 <= s.schedule["t0"] <= t1) or s.forward != s.forward:
            continue
        members = [client_rid(r) for r in s.reqs]
        sched_end = s.schedule["t0"] + s.schedule["dur"]
        rows.append((s.k, "decode" if s.is_decode else "extend", s.num_reqs, s.num_tokens,
                     int(sum(d + t for d, t in zip(s.done, s.tok))),
                     sum(m in warm for m in members if m in rid_index), 0, len(s.finished), False, 0,
                     s.running, s.waiting, s.schedule["t0"] - t0, s.schedule["t0"] - t0, sched_end - t0,
                     sched_end - t0, s.execute["t0"] - t0, s.forward_start - t0, s.forward_end - t0,
                     s.forward_end - t0, s.update["t0"] - t0, s.update["t0"] + s.update["dur"] - t0))
    frame = pd.DataFrame(rows, columns=STEP_COLUMNS)
    frame["kind"] = pd.Categorical(frame["kind"], categories=["extend", "decode"])
    return frame.sort_values("seq", kind="stable").reset_index(drop=True)
