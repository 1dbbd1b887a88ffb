"""The harness's timeline, written in the simulator's trace schema (:mod:`sim.trace.recorder`).

Times come from ``time.perf_counter`` (CLOCK_MONOTONIC on Linux: one clock for every process of
the machine, so the device process's stamps line up with the scheduler's), relative to the
run's start. Tokens are delivered when ``process`` ends, as in the simulator.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sim.trace.recorder import REQUEST_COLUMNS, STEP_COLUMNS

clock = time.perf_counter


@dataclass(eq=False)
class Step:
    """One launched batch: its composition (set when scheduled) and its timeline (seconds).

    ``batch`` is the :class:`calibrate.bookkeeping.bookkeeper.ExtendBatch` / ``DecodeBatch``; ``got`` the
    request ids that receive a token from it (set when processed); ``tokens`` the sampled ids.
    """

    seq: int
    kind: str
    batch: object
    num_reqs: int
    num_tokens: int
    sum_ctx: int
    num_warmup: int
    num_running: int
    num_queued: int
    kv_used: int
    after_idle: bool = False
    overshoot: int = 0
    finished: int = 0
    recv_start: float = math.nan
    schedule_start: float = math.nan
    schedule_end: float = math.nan
    launch_start: float = math.nan
    launch_end: float = math.nan
    forward_start: float = math.nan
    forward_end: float = math.nan
    sync_start: float = math.nan
    process_start: float = math.nan
    process_end: float = math.nan
    tokens: list = field(default_factory=list)
    handle: object = None  # the device's reference to the launched forward

    def row(self, t0: float) -> tuple:
        rel = [getattr(self, c) - t0 for c in STEP_COLUMNS[12:]]
        return (self.seq, self.kind, self.num_reqs, self.num_tokens, self.sum_ctx, self.num_warmup, self.overshoot,
                self.finished, self.after_idle, self.kv_used, self.num_running, self.num_queued, *rel)


class TraceRecorder:
    """Collects steps and token deliveries; builds the steps, requests and itl tables."""

    def __init__(self, t0: float, num_requests: int, warmup_requests: int):
        self.t0 = t0
        self.steps: list[Step] = []
        self.deliveries: list[tuple[float, list]] = []  # (time, request ids that got a token)
        self.finish_s = np.full(num_requests, np.nan)
        self.output_tokens = np.zeros(num_requests, dtype=np.int64)
        self.warmup_requests = warmup_requests

    def processed(self, step: Step, got: list, finished_rids: list, t: float) -> None:
        """``step``'s results were processed at ``t``: ``got`` received a token, ``finished_rids`` finished."""
        self.steps.append(step)
        self.deliveries.append((t, got))
        for rid in finished_rids:
            self.finish_s[rid] = t

    def frames(self, arrival_s: np.ndarray, workload) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        """(steps, requests, itl) tables with the simulator's columns, times relative to the start."""
        steps = pd.DataFrame([s.row(self.t0) for s in sorted(self.steps, key=lambda s: s.seq)], columns=STEP_COLUMNS)
        steps["kind"] = pd.Categorical(steps["kind"], categories=["extend", "decode"])
        n = len(arrival_s)
        first = np.full(n, np.nan)
        last = np.full(n, np.nan)
        count = np.zeros(n, dtype=np.int64)
        itl: list[float] = []
        warm = self.warmup_requests
        for t, got in self.deliveries:
            t -= self.t0
            for rid in got:
                if count[rid] == 0:
                    first[rid] = t
                elif rid >= warm:
                    itl.append(t - last[rid])
                last[rid] = t
                count[rid] += 1
        done = ~np.isnan(self.finish_s)
        requests = pd.DataFrame({
            "rid": np.arange(n), "arrival_s": arrival_s - self.t0, "input_len": workload.input_len,
            "cached_len": workload.cached_len, "output_len": workload.output_len,
            "output_tokens": np.where(done, count, 0), "first_token_s": first, "finish_s": self.finish_s - self.t0,
            "status": np.where(done, "completed", "failed"), "warmup": np.arange(n) < warm,
            "retractions": 0, "failure": np.where(done, "", "cut_off")})[REQUEST_COLUMNS]
        itl_frame = pd.DataFrame({"itl_s": np.asarray(itl, dtype=np.float64),
                                  "weight": np.ones(len(itl), dtype=np.int64)})
        return steps, requests, itl_frame
