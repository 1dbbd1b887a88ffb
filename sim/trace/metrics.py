"""Metrics of a run's trace, with SGLang ``bench_serving``'s names and definitions.

TTFT: arrival to first token delivered. TPOT: (E2E - TTFT) / (output tokens - 1). ITL: gaps
between consecutive delivered tokens of a request, over all tokens of all measured requests.
Throughputs are over the measured window: from the first arrival of a measured (non-warm-up)
request to the last finish of one. GPU gap: device idle time between the end of one forward and
the start of the next; gaps that follow an idle scheduler (no request to run) are left out of
the gap distribution but counted in ``gpu_idle_fraction``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the tables are DataFrames; pandas is imported by whoever built them
    import pandas as pd

SUMMARY_KEYS = [
    "completed", "failed", "duration_s", "request_throughput", "output_throughput",
    "total_input_tokens", "total_output_tokens",
    "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
    "mean_e2e_latency_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms",
    "num_steps", "gpu_idle_fraction", "mean_gap_ms", "median_gap_ms", "p99_gap_ms",
    "mean_sync_wait_ms", "mean_decode_batch_size", "overshoot_tokens",
]


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The q-quantile (0..1) of ``values`` where each value occurs ``weights`` times.

    Matches ``numpy.percentile(np.repeat(values, weights), 100*q)`` (linear interpolation)
    without materialising the repeats. NaN when the total weight is 0.
    """
    values = np.asarray(values, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.int64)
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    total = int(weights.sum())
    if total == 0:
        return math.nan
    order = np.argsort(values, kind="stable")
    values, cum = values[order], np.cumsum(weights[order])
    pos = q * (total - 1)  # position in the repeated, sorted array
    lo, hi = math.floor(pos), math.ceil(pos)
    v_lo = values[np.searchsorted(cum, lo, side="right")]
    v_hi = values[np.searchsorted(cum, hi, side="right")]
    return float(v_lo + (v_hi - v_lo) * (pos - lo))


def _stats_ms(values: np.ndarray, prefix: str, out: dict, weights: np.ndarray | None = None) -> None:
    if weights is None:
        weights = np.ones(len(values), dtype=np.int64)
    total = weights.sum() if len(values) else 0
    if total == 0:
        out[f"mean_{prefix}_ms"] = out[f"median_{prefix}_ms"] = out[f"p99_{prefix}_ms"] = math.nan
        return
    # fsum: correctly rounded, so the mean does not depend on BLAS threads (sweeps on Dask = local)
    out[f"mean_{prefix}_ms"] = math.fsum((values * weights).tolist()) / total * 1e3
    out[f"median_{prefix}_ms"] = weighted_quantile(values, weights, 0.5) * 1e3
    out[f"p99_{prefix}_ms"] = weighted_quantile(values, weights, 0.99) * 1e3


def measured_window(requests: pd.DataFrame) -> tuple[float, float]:
    """(start, end) seconds of the measured window: first measured arrival, last measured finish."""
    measured = requests[~requests["warmup"].astype(bool)]
    if measured.empty:
        return (math.nan, math.nan)
    return float(measured["arrival_s"].min()), float(measured["finish_s"].max())


def step_gaps(steps: pd.DataFrame) -> pd.Series:
    """Device idle time (seconds) before each forward: its start minus the previous forward's end
    (NaN for the first). Index aligned with ``steps`` (which must be in launch order)."""
    prev_end = steps["forward_end"].shift(1)
    return (steps["forward_start"] - prev_end).clip(lower=0.0)


def summarize(steps: pd.DataFrame, requests: pd.DataFrame, itl: pd.DataFrame) -> dict:
    """The summary of one run (keys in :data:`SUMMARY_KEYS`; latencies in ms, throughputs per s).

    Args:
        steps, requests, itl: the trace tables (schema in :mod:`sim.trace.recorder`).
    """
    out: dict = {}
    measured = requests[~requests["warmup"].astype(bool)]
    done = measured[measured["status"] == "completed"]
    out["completed"] = int(len(done))
    out["failed"] = int((measured["status"] == "failed").sum())
    start, end = measured_window(requests)
    duration = end - start if len(measured) else 0.0
    out["duration_s"] = float(duration)
    out["total_input_tokens"] = int(done["input_len"].sum())
    out["total_output_tokens"] = int(done["output_tokens"].sum())
    out["request_throughput"] = out["completed"] / duration if duration > 0 else 0.0
    out["output_throughput"] = out["total_output_tokens"] / duration if duration > 0 else 0.0

    ttft = (done["first_token_s"] - done["arrival_s"]).to_numpy()
    e2e = (done["finish_s"] - done["arrival_s"]).to_numpy()
    multi = done["output_tokens"].to_numpy() > 1
    tpot = ((e2e - ttft)[multi] / (done["output_tokens"].to_numpy()[multi] - 1))
    _stats_ms(ttft, "ttft", out)
    _stats_ms(tpot, "tpot", out)
    _stats_ms(itl["itl_s"].to_numpy(), "itl", out, itl["weight"].to_numpy())
    _stats_ms(e2e, "e2e_latency", out)

    if len(steps) and duration > 0:
        fs, fe = steps["forward_start"].to_numpy(), steps["forward_end"].to_numpy()
        in_window = (fs >= start) & (fs < end)
        busy = (np.clip(fe, start, end) - np.clip(fs, start, end)).sum()
        gaps = step_gaps(steps).to_numpy()
        gap_mask = in_window & ~steps["after_idle"].to_numpy(dtype=bool) & ~np.isnan(gaps)
        decode = in_window & (steps["kind"] == "decode").to_numpy()
        out["num_steps"] = int(in_window.sum())
        out["gpu_idle_fraction"] = float(max(0.0, 1.0 - busy / duration))
        _stats_ms(gaps[gap_mask], "gap", out)
        wait = (steps["process_start"] - steps["sync_start"]).to_numpy()[in_window]
        out["mean_sync_wait_ms"] = float(np.nanmean(wait)) * 1e3 if in_window.any() else math.nan
        out["mean_decode_batch_size"] = float(steps["num_reqs"].to_numpy()[decode].mean()) if decode.any() else math.nan
        out["overshoot_tokens"] = int(steps["overshoot"].to_numpy()[in_window].sum())
    else:
        out.update(num_steps=0, gpu_idle_fraction=math.nan, mean_gap_ms=math.nan, median_gap_ms=math.nan,
                   p99_gap_ms=math.nan, mean_sync_wait_ms=math.nan, mean_decode_batch_size=math.nan,
                   overshoot_tokens=0)
    return {k: out[k] for k in SUMMARY_KEYS}


def hidden_cpu_share(steps: pd.DataFrame, start: float = -math.inf, end: float = math.inf) -> float:
    """The share of the scheduler's CPU time that ran while a forward was running: the summed
    overlap of every step's ``schedule_start..schedule_end`` and ``process_start..process_end``
    with the union of all steps' ``forward_start..forward_end``, over those phases' summed length,
    for phases that start in ``[start, end)`` (s). What overlap scheduling exists to raise: 0 in a
    synchronous loop, near 1 when the CPU work hides behind the forward (vLLM's async scheduling
    measured 89% on a CPU host). NaN when no such phase has a positive length.

    Args:
        steps: a steps table (:mod:`sim.trace.recorder` columns), simulated or measured.
    """
    fs, fe = steps["forward_start"].to_numpy(float), steps["forward_end"].to_numpy(float)
    ok = np.isfinite(fs) & np.isfinite(fe) & (fe > fs)
    order = np.argsort(fs[ok], kind="stable")
    busy: list[list[float]] = []  # the union of the forwards, sorted, disjoint
    for a, b in zip(fs[ok][order], fe[ok][order]):
        if busy and a <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], b)
        else:
            busy.append([a, b])
    starts = np.array([b[0] for b in busy])
    total = hidden = 0.0
    for a_col, b_col in (("schedule_start", "schedule_end"), ("process_start", "process_end")):
        for a, b in zip(steps[a_col].to_numpy(float), steps[b_col].to_numpy(float)):
            if not (math.isfinite(a) and math.isfinite(b) and b > a and start <= a < end):
                continue
            total += b - a
            i = max(int(np.searchsorted(starts, a, side="right")) - 1, 0)
            while i < len(busy) and busy[i][0] < b:
                hidden += max(0.0, min(b, busy[i][1]) - max(a, busy[i][0]))
                i += 1
    return hidden / total if total > 0 else math.nan
