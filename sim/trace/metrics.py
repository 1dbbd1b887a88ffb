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

from sim.trace.columns import matches, values_of

if TYPE_CHECKING:  # a table is a DataFrame or the recorder's Columns; pandas is imported by whoever built it
    import pandas as pd

    from sim.trace.columns import Columns

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


def served(summary: dict) -> bool:
    """Whether a setting's run served its load: its server did not die (``outcome``, absent in a
    summary of a run that finished) and some measured request completed. A run that did not
    has no ratio to another setting and no verdict of its own."""
    return summary.get("outcome", "ok") == "ok" and bool(summary.get("completed"))


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
    # fsum: correctly rounded, so the mean does not depend on BLAS threads (sweeps on Dask = local);
    # a sum beyond the largest double (values near 1e308 s: only a corrupt trace) is +-inf, and
    # infinities of both signs NaN, as numpy's (fsum raises on both)
    terms = (values * weights).tolist()
    try:
        out[f"mean_{prefix}_ms"] = math.fsum(terms) / total * 1e3
    except (OverflowError, ValueError):
        with np.errstate(over="ignore", invalid="ignore"):
            out[f"mean_{prefix}_ms"] = float(np.sum(terms)) / total * 1e3
    out[f"median_{prefix}_ms"] = weighted_quantile(values, weights, 0.5) * 1e3
    out[f"p99_{prefix}_ms"] = weighted_quantile(values, weights, 0.99) * 1e3


GROWTH_KEYS = ["ttft_growth", "in_server_mid", "in_server_last"]  # after SUMMARY_KEYS (not bench_serving's)


def ttft_growth(n: int, st: float, stt: float, sy: float, sty: float) -> float:
    """The least-squares slope of the measured completed requests' TTFT (``ttft_growth``) against
    their arrival time, from the sums over them of t, t², y and ty (t: arrival less the measured
    window's start, y: TTFT, seconds): seconds of TTFT gained per second of arrivals. In an open
    loop whose arrivals outpace the server the waiting queue grows and so does every later
    request's wait: the slope is then about the offered load over the capacity, less 1 (0.25 for
    arrivals 25% beyond it); a server that keeps up gives about 0. NaN with fewer than 3 requests
    or every arrival at one time."""
    den = n * stt - st * st
    if n < 3 or not den > 0:
        return math.nan
    return (n * sty - st * sy) / den


def probe_times(arrival_s: np.ndarray) -> tuple[float, float]:
    """Where an open loop's requests in the server are counted (``in_server_mid``,
    ``in_server_last``): the midpoint of the measured requests' arrivals (``arrival_s``, seconds,
    any order) and the last of them; (NaN, NaN) without one."""
    if not len(arrival_s):
        return (math.nan, math.nan)
    first, last = float(np.min(arrival_s)), float(np.max(arrival_s))
    return (first + (last - first) / 2, last)


def in_server(arrival_s: np.ndarray, finish_s: np.ndarray, at_s: float) -> int:
    """How many requests (arrival and finish or failure times, seconds) were in the server at
    ``at_s``: arrived at or before it, not finished by it (waiting or running)."""
    return int(((arrival_s <= at_s) & (at_s < finish_s)).sum())


def growth_words(growth: float) -> str:
    """A TTFT growth (``ttft_growth``, seconds a second of arrivals) in words: ``"1.62 s"`` from a
    second a second on, else ``"316 ms"``."""
    return f"{growth:.2f} s" if growth >= 1 else f"{growth * 1e3:.0f} ms"


GROWTH_WARN = 0.05  # TTFT gained per second of arrivals beyond which an open loop's queue grew
IN_SERVER_GREW = 1.25  # the requests in the server at the last arrival over those at the midpoint, beyond which
# (and beyond three standard deviations of the two counts' difference: IN_SERVER_SIGMAS) the backlog grew
IN_SERVER_SIGMAS = 3.0
GROWN_TTFT, GROWN_IN_SERVER = "TTFT", "requests in the server"  # what showed it (queue_growth)


def queue_growth(summary: dict) -> tuple[str, tuple] | None:
    """How a run's backlog grew through it, if it did: (:data:`GROWN_TTFT`, (``ttft_growth``,))
    where its TTFT rose more than :data:`GROWTH_WARN` seconds per second of arrivals and, over the
    measured window, by more than its median TTFT (the waiting queue grew); else
    (:data:`GROWN_IN_SERVER`, (``in_server_mid``, ``in_server_last``)) where the requests in the
    server at the last arrival exceed those at the arrivals' midpoint by :data:`IN_SERVER_GREW`
    times and by :data:`IN_SERVER_SIGMAS` standard deviations of the difference of two counts
    (``sqrt(mid + last + 1)``: two Poisson counts of a server that keeps up, as an infinite-server
    queue's; near capacity a count spreads more, and the finding reads "or nearly"): the
    requests were admitted (SGLang's prefill-first admission while the KV pool has room) and the
    running batch kept growing, each step slower, while TTFT stayed flat, or the run is too
    short for its own latency to reach a steady state. None: it kept up. Either way the open
    loop's throughput and latency answer for the run's length, not for a steady state."""
    growth = summary.get("ttft_growth")
    median_s = (summary.get("median_ttft_ms") or math.nan) / 1e3
    duration = summary.get("duration_s") or 0.0
    if isinstance(growth, float) and growth > GROWTH_WARN and growth * duration > median_s:
        return GROWN_TTFT, (growth,)
    mid, last = summary.get("in_server_mid"), summary.get("in_server_last")
    if (isinstance(mid, (int, float)) and isinstance(last, (int, float)) and mid >= 0
            and last > IN_SERVER_GREW * mid and last - mid > IN_SERVER_SIGMAS * math.sqrt(mid + last + 1)):
        return GROWN_IN_SERVER, (mid, last)
    return None


def queue_grew(summary: dict) -> bool:
    """Whether a run's backlog grew through it (:func:`queue_growth`)."""
    return queue_growth(summary) is not None


def queue_growth_words(grown: tuple[str, tuple]) -> str:
    """:func:`queue_growth`'s finding in words: ``"TTFT +55 ms per second of arrivals"`` or
    ``"requests in the server 215 at the arrivals' midpoint, 1,294 at the last"``."""
    label, values = grown
    if label == GROWN_TTFT:
        return f"TTFT +{growth_words(values[0])} per second of arrivals"
    return f"{label} {values[0]:,.0f} at the arrivals' midpoint, {values[1]:,.0f} at the last"


def measured_window(requests: pd.DataFrame | Columns) -> tuple[float, float]:
    """(start, end) seconds of the measured window: first measured arrival, last measured finish
    (NaN ones skipped; (NaN, NaN) without a measured request)."""
    measured = ~values_of(requests, "warmup").astype(bool)
    if not measured.any():
        return (math.nan, math.nan)
    return (_skipna(values_of(requests, "arrival_s")[measured], np.min),
            _skipna(values_of(requests, "finish_s")[measured], np.max))


def _skipna(values: np.ndarray, reduce) -> float:
    """``reduce`` (np.min, np.max) of ``values`` without their NaNs, as pandas' ``min``/``max``
    skip them; NaN when nothing is left."""
    values = np.asarray(values, dtype=np.float64)
    values = values[~np.isnan(values)]
    return float(reduce(values)) if len(values) else math.nan


def forward_gaps(forward_start: np.ndarray, forward_end: np.ndarray) -> np.ndarray:
    """Device idle time (seconds) before each forward of a steps table in launch order: its start
    minus the previous forward's end, a negative one as 0 (NaN for the first, and where either
    is NaN). Shapes (n,) -> (n,). The same floats as pandas' ``shift(1)`` and ``clip(lower=0)``,
    which keep -0.0 and NaN (what this project computed before 5 December 2026)."""
    start = np.asarray(forward_start, dtype=np.float64)
    previous_end = np.empty(len(start), dtype=np.float64)
    previous_end[:1] = math.nan
    previous_end[1:] = np.asarray(forward_end, dtype=np.float64)[:-1]
    gap = start - previous_end
    return np.where(np.isnan(gap) | (gap >= 0.0), gap, 0.0)


def step_gaps(steps: pd.DataFrame) -> pd.Series:
    """:func:`forward_gaps` of a steps DataFrame (in launch order), as a Series on its index."""
    import pandas as pd

    return pd.Series(forward_gaps(steps["forward_start"].to_numpy(), steps["forward_end"].to_numpy()),
                     index=steps.index)


def summarize(steps: pd.DataFrame | Columns, requests: pd.DataFrame | Columns, itl: pd.DataFrame | Columns) -> dict:
    """The summary of one run (keys in :data:`SUMMARY_KEYS`; latencies in ms, throughputs per s).

    Args:
        steps, requests, itl: the trace tables (schema in :mod:`sim.trace.recorder`), each a
            DataFrame or :class:`sim.trace.columns.Columns` (the same answer, to the bit).
    """
    out: dict = {}
    measured = ~values_of(requests, "warmup").astype(bool)
    done = measured & matches(requests, "status", "completed")
    out["completed"] = int(done.sum())
    out["failed"] = int((measured & matches(requests, "status", "failed")).sum())
    start, end = measured_window(requests)
    duration = end - start if measured.any() else 0.0
    out["duration_s"] = float(duration)
    output_tokens = values_of(requests, "output_tokens")[done]
    out["total_input_tokens"] = int(values_of(requests, "input_len")[done].sum())
    out["total_output_tokens"] = int(output_tokens.sum())
    out["request_throughput"] = out["completed"] / duration if duration > 0 else 0.0
    out["output_throughput"] = out["total_output_tokens"] / duration if duration > 0 else 0.0

    arrival = values_of(requests, "arrival_s")[done]
    ttft = values_of(requests, "first_token_s")[done] - arrival
    e2e = values_of(requests, "finish_s")[done] - arrival
    multi = output_tokens > 1
    tpot = ((e2e - ttft)[multi] / (output_tokens[multi] - 1))
    _stats_ms(ttft, "ttft", out)
    t = arrival - start
    out["ttft_growth"] = ttft_growth(len(t), float(t.sum()), float((t * t).sum()), float(ttft.sum()),
                                     float((t * ttft).sum())) if len(t) else math.nan
    settled = measured & (matches(requests, "status", "completed") | matches(requests, "status", "failed"))
    arrived, left = values_of(requests, "arrival_s")[settled], values_of(requests, "finish_s")[settled]
    probes = probe_times(values_of(requests, "arrival_s")[measured])
    out["in_server_mid"], out["in_server_last"] = (
        (in_server(arrived, left, probes[0]), in_server(arrived, left, probes[1])) if settled.any()
        else (math.nan, math.nan))
    _stats_ms(tpot, "tpot", out)
    _stats_ms(values_of(itl, "itl_s"), "itl", out, values_of(itl, "weight"))
    _stats_ms(e2e, "e2e_latency", out)

    if len(steps) and duration > 0:
        fs, fe = values_of(steps, "forward_start"), values_of(steps, "forward_end")
        in_window = (fs >= start) & (fs < end)
        busy = (np.clip(fe, start, end) - np.clip(fs, start, end)).sum()
        gaps = forward_gaps(fs, fe)
        gap_mask = in_window & ~values_of(steps, "after_idle").astype(bool) & ~np.isnan(gaps)
        decode = in_window & matches(steps, "kind", "decode")
        out["num_steps"] = int(in_window.sum())
        out["gpu_idle_fraction"] = float(max(0.0, 1.0 - busy / duration))
        _stats_ms(gaps[gap_mask], "gap", out)
        wait = (values_of(steps, "process_start") - values_of(steps, "sync_start"))[in_window]
        out["mean_sync_wait_ms"] = float(np.nanmean(wait)) * 1e3 if in_window.any() else math.nan
        out["mean_decode_batch_size"] = float(values_of(steps, "num_reqs")[decode].mean()) if decode.any() else math.nan
        out["overshoot_tokens"] = int(values_of(steps, "overshoot")[in_window].sum())
    else:
        out.update(num_steps=0, gpu_idle_fraction=math.nan, mean_gap_ms=math.nan, median_gap_ms=math.nan,
                   p99_gap_ms=math.nan, mean_sync_wait_ms=math.nan, mean_decode_batch_size=math.nan,
                   overshoot_tokens=0)
    return {k: out[k] for k in SUMMARY_KEYS + GROWTH_KEYS}


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
