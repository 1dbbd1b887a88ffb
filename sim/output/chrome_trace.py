"""A run's timeline as a Chrome trace (the JSON that ``torch.profiler`` exports; it opens in
Perfetto and chrome://tracing), built from the saved steps tables.

Per setting one process with two tracks: the scheduler thread (CPU phases recv, schedule,
launch, sync wait, process) and the device stream (forwards). Flow arrows go from each launch
to its forward and, where the next batch was built on tokens still on the device (the FutureMap
under ``overlap``, the lazy ``mx.async_eval`` chain under ``overlap_mlx``, vLLM's placeholders under
``async``), from forward k-1 to forward k. Counters: running requests, waiting queue length and KV token usage, sampled when
each batch is scheduled. Timestamps are microseconds from the start of the run.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Optional

import pandas as pd

from sim.atomic import atomic_path
from sim.errors import UserInputError
from sim.output.run_files import atomic_write_text
from sim.output.run_tables import RunTables

CPU_TID, DEVICE_TID = 1, 2
# (phase name, start column, end column) of the scheduler thread's phases
PHASES = (("recv", "recv_start", "schedule_start"), ("schedule", "schedule_start", "launch_start"),
          ("launch", "launch_start", "launch_end"), ("sync wait", "sync_start", "process_start"),
          ("process", "process_start", "process_end"))
DEVICE_DEPENDENCY = {"overlap": "FutureMap: tokens of forward k-1 read on the device",
                     "overlap_mlx": "mx.async_eval chain: built on lazy tokens of forward k-1",
                     "async": "vLLM batch queue: step k scheduled on a placeholder for k-1's token"}


def parse_window(text: Optional[str]) -> tuple[float, float]:
    """``"0.2:0.5"`` -> (0.2, 0.5) seconds; either side may be empty (open). None -> everything.

    Raises:
        UserInputError: not ``START:END`` with numbers and START < END."""
    if not text:
        return (-math.inf, math.inf)
    lo, sep, hi = text.partition(":")
    try:
        start = float(lo) if lo.strip() else -math.inf
        end = float(hi) if hi.strip() else math.inf
    except ValueError:
        start = end = math.nan
    if not sep or math.isnan(start) or math.isnan(end) or not start < end:
        raise UserInputError(f"--window {text}", "", "expected START:END in seconds of simulated time, START < END")
    return (start, end)


def _us(t: float) -> float:
    return round(float(t) * 1e6, 3)


def _cpu_events(df: pd.DataFrame, pid: int) -> list[dict]:
    spans = []
    for r in df.itertuples(index=False):
        for name, a, b in PHASES:
            start, end = getattr(r, a), getattr(r, b)
            if math.isfinite(start) and math.isfinite(end) and end >= start:
                spans.append((start, end, name, r))
    spans.sort(key=lambda s: (s[0], s[1]))
    events = []
    for i, (start, end, name, r) in enumerate(spans):
        if i + 1 < len(spans):  # one thread: a phase ends no later than the next one starts
            end = min(end, spans[i + 1][0])
        events.append({"ph": "X", "cat": "cpu_phase", "name": name, "pid": pid, "tid": CPU_TID,
                       "ts": _us(start), "dur": round(_us(end) - _us(start), 3),  # ends where the next starts
                       "args": {"batch": int(r.seq), "kind": str(r.kind), "batch_size": int(r.num_reqs)}})
    return events


def _device_events(df: pd.DataFrame, pid: int) -> list[dict]:
    return [{"ph": "X", "cat": "gpu_user_annotation", "name": f"forward {r.kind}", "pid": pid, "tid": DEVICE_TID,
             "ts": _us(r.forward_start), "dur": _us(r.forward_end - r.forward_start),
             "args": {"batch": int(r.seq), "kind": str(r.kind), "batch_size": int(r.num_reqs),
                      "tokens": int(r.num_tokens), "sum_ctx": int(r.sum_ctx)}}
            for r in df.itertuples(index=False)]


def _flow(name: str, cat: str, flow_id: int, pid: int, src: tuple[int, float], dst: tuple[int, float]) -> list[dict]:
    return [{"ph": "s", "cat": cat, "name": name, "id": flow_id, "pid": pid, "tid": src[0], "ts": _us(src[1])},
            {"ph": "f", "bp": "e", "cat": cat, "name": name, "id": flow_id, "pid": pid, "tid": dst[0],
             "ts": _us(dst[1])}]


def _flows(df: pd.DataFrame, pid: int, setting: str, id_base: int) -> list[dict]:
    events = []
    rows = list(df.itertuples(index=False))

    def inside_start(r) -> float:
        # 0.1 us into the forward: back-to-back forwards share their boundary timestamp, and a
        # flow end binds to the slice enclosing its timestamp
        return r.forward_start + min(1e-7, (r.forward_end - r.forward_start) / 2)
    for r in rows:
        # the arrow leaves inside the launch slice and lands on the forward it enqueued
        src = r.launch_end - min(1e-7, (r.launch_end - r.launch_start) / 2)
        events += _flow("launch -> forward", "launch", id_base + 2 * int(r.seq), pid, (CPU_TID, src),
                        (DEVICE_TID, inside_start(r)))
    dep = DEVICE_DEPENDENCY.get(setting)
    if dep:
        for prev, r in zip(rows, rows[1:]):
            # batch k was launched before the CPU had processed k-1: its inputs came from the device
            if str(r.kind) == "decode" and prev.process_start > r.launch_start:
                src = prev.forward_end - min(1e-7, (prev.forward_end - prev.forward_start) / 2)
                events += _flow(dep, "device_dependency", id_base + 2 * int(r.seq) + 1, pid, (DEVICE_TID, src),
                                (DEVICE_TID, inside_start(r)))
    return events


def _counters(df: pd.DataFrame, pid: int, kv_pool_tokens: Optional[int]) -> list[dict]:
    events = []
    have = set(df.columns)
    for r in df.itertuples(index=False):
        ts = _us(r.schedule_start)
        if "num_running" in have:
            events.append({"ph": "C", "name": "running requests", "pid": pid, "ts": ts,
                           "args": {"running": int(r.num_running)}})
        if "num_queued" in have:
            events.append({"ph": "C", "name": "waiting queue", "pid": pid, "ts": ts, "args": {"queued": int(r.num_queued)}})
        if "kv_used" in have and kv_pool_tokens:
            events.append({"ph": "C", "name": "KV token usage", "pid": pid, "ts": ts,
                           "args": {"token usage": round(float(r.kv_used) / kv_pool_tokens, 6)}})
    return events


def chrome_trace(run: RunTables, window: tuple[float, float] = (-math.inf, math.inf)) -> dict:
    """The Chrome trace object (``{"traceEvents": [...], ...}``) of a saved run.

    Args:
        run: the run's tables (:func:`sim.output.run_tables.load_run_tables`).
        window: (start, end) seconds; steps that overlap it are kept whole.

    Raises:
        UserInputError: no step falls in the window.
    """
    events: list[dict] = []
    kept = 0
    for i, (setting, steps) in enumerate(run.steps.items()):
        pid = i + 1
        last = steps[["process_end", "forward_end"]].max(axis=1)
        first = steps[["recv_start", "forward_start"]].min(axis=1)
        df = steps[(last >= window[0]) & (first <= window[1])]
        kept += len(df)
        events += [
            {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"{run.scenario_name}: {setting}"}},
            {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": CPU_TID, "args": {"name": "scheduler thread (CPU)"}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": DEVICE_TID, "args": {"name": "device stream"}},
        ]
        events += _cpu_events(df, pid) + _device_events(df, pid)
        events += _flows(df, pid, setting, id_base=(pid << 32))
        events += _counters(df, pid, run.kv_pool_tokens)
    if kept == 0:
        raise UserInputError("--window", "", f"no step of {run.folder} falls in {window[0]}:{window[1]} s")
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"generator": "overlap-sim trace", "scenario": run.scenario_name,
                          "seed": run.payload.get("seed"), "settings": list(run.steps)}}


def write_chrome_trace(trace: dict, path: Path) -> Path:
    """Write the trace as JSON (gzip-compressed when the name ends in ``.gz``), atomically."""
    path = Path(path)
    text = json.dumps(trace, separators=(",", ":"))
    if path.suffix == ".gz":
        with atomic_path(path) as tmp, gzip.open(tmp, "wt") as fh:
            fh.write(text)
    else:
        atomic_write_text(path, text)
    return path
