"""The SGLang server log beside its profile traces: the log's decode lines matched to each trace's
steps, and the profiler's slowdown measured from the lines outside the profiled windows.

SGLang 0.5.23 logs ``Decode batch, #running-req: B, #token: K, ..., gen throughput (token/s): G``
from ``SchedulerMetricsReporter.report_decode_stats``
(``srt/managers/scheduler_components/metrics_reporter.py``), called at the end of
``process_batch_result_decode`` every ``--decode-log-interval`` decode batches (default 40; 1 gives
one line per step; the CPU engine says ``cpu graph: ...`` where CUDA says ``cuda graph: ...``).
G = the tokens decoded since the previous line over the time since it, so with interval 1 and one
token per request B / G is the step's period: the time between the ends of two decode
``process_batch_result`` calls, a prefill between them included. K is the KV pool's used tokens
(``token_to_kv_pool_allocator``), which under ``event_loop_normal`` is the batch's summed context
and under ``event_loop_overlap`` already the next batch's (it is scheduled before this one's
result is processed): so a line belongs to the step whose (B, K - offset) it states, at a shift
and offset the matching finds.

A profiling window is the log between ``Profiling starts ... (with profile id: ID)`` and ``Stop
profiling`` (``SchedulerProfilerManager``, ``srt/managers/scheduler_components/profiler_manager.py``);
a trace belongs to the window of its profile id (its file is ``<ID>-TP-<rank>.trace.json.gz``),
else to the window of its position among the traces. The timestamps have a resolution of a
second, so they do not place a line: order, batch size and token count do (:func:`align`).

Outside every window the server ran unprofiled: those lines' periods, fitted with the forward's
form (``a + b B + c B C``, :mod:`calibrate.real.from_trace.forms`) over their batch sizes and contexts,
give the unprofiled period at each matched step; the profiler's slowdown is the median of the
in-window period over it (:func:`slowdown`), and its spread is the stated uncertainty of removing
it.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from pathlib import Path
from typing import Optional

from calibrate.real.from_trace.torch_trace import TraceRead, TraceStep
from sim.errors import UserInputError

_START = re.compile(r"Profiling starts.*?(?:profile id: (?P<id>[^)\s]+))?\)?\s*$")
_TRACE_ID = re.compile(r"^(?P<id>.+)-TP-\d+(?:-[A-Za-z]+-\d+)*\.trace\.json(?:\.gz)?$")
MAX_SHIFT = 3  # a line states its own step, the next one (overlap), or one more around a window's edge


def _records(lines: list[str]) -> list[tuple[int, dict]]:
    from sim.engines.sglang.server_log import parse_line

    out = []
    for i, ln in enumerate(lines):
        if "Decode batch" in ln and (r := parse_line(ln)) is not None and r["kind"] == "decode":
            out.append((i, r))
    return out


def windows(lines: list[str]) -> list[tuple[int, int, Optional[str]]]:
    """The profiling windows in log order: (first line, line after the last, profile id or None)."""
    out = []
    for i, ln in enumerate(lines):
        m = _START.search(ln) if "Profiling starts" in ln else None
        if m:
            end = next((j for j in range(i + 1, len(lines)) if "Stop profiling" in lines[j]), len(lines))
            out.append((i, end, m.group("id")))
    return out


def trace_profile_id(source: str) -> Optional[str]:
    """The profile id in a trace's file name (``<ID>-TP-0.trace.json.gz``), or None."""
    m = _TRACE_ID.match(Path(source).name)
    return m.group("id") if m else None


def window_of(read: TraceRead, index: int, wins: list[tuple[int, int, Optional[str]]]):
    """The window of trace number ``index``: by profile id, else by position; None when the log
    has no window for it."""
    pid = trace_profile_id(read.source)
    named = [w for w in wins if pid is not None and w[2] == pid]
    if len(named) == 1:
        return named[0]
    return wins[index] if index < len(wins) else None


def align(decodes: list[TraceStep], recs: list[dict]) -> tuple[list[tuple[int, dict]], int, int]:
    """Match a window's decode lines to the trace's decode steps, in order: line j to step j +
    shift for the shift in [-MAX_SHIFT, MAX_SHIFT] and KV offset (K - the step's summed context)
    that match the most lines with an equal batch size and that offset (without token counts in
    the trace, the batch size alone). Returns (pairs (step index, record), shift, offset)."""
    best: tuple[int, int, int, list] = (-1, 0, 0, [])
    for shift in range(-MAX_SHIFT, MAX_SHIFT + 1):
        cands = [(j + shift, r) for j, r in enumerate(recs)
                 if 0 <= j + shift < len(decodes) and r.get("running_req") == decodes[j + shift].num_reqs]
        offsets = Counter(r.get("kv_tokens", 0) - decodes[k].sum_ctx for k, r in cands
                          if decodes[k].sum_ctx is not None and isinstance(r.get("kv_tokens"), int))
        off = offsets.most_common(1)[0][0] if offsets else 0
        pairs = [(k, r) for k, r in cands if decodes[k].sum_ctx is None or not isinstance(r.get("kv_tokens"), int)
                 or r["kv_tokens"] - decodes[k].sum_ctx == off]
        key = (len(pairs), -abs(shift))
        if key > (best[0], -abs(best[1])):
            best = (len(pairs), shift, off, pairs)
    return best[3], best[1], best[2]


def _period(r: dict) -> Optional[float]:
    g = r.get("gen_throughput_tok_s")
    b = r.get("running_req")
    return b / g if isinstance(g, (int, float)) and g > 0 and isinstance(b, int) and b > 0 else None


def unprofiled_points(lines: list[str], wins, offset: int) -> list[tuple[float, float, float]]:
    """(B, context per request, period s) of the decode lines outside every window (the context:
    (K - ``offset``) / B); a window's first line after it is left out (its period spans the
    profiler's stop)."""
    inside = set()
    for a, b, _ in wins:
        inside.update(range(a, b + 1))
    out, after_window = [], False
    for i, r in _records(lines):
        if i in inside:
            after_window = True
            continue
        if after_window:
            after_window = False
            continue
        p = _period(r)
        if p is not None and isinstance(r.get("kv_tokens"), int):
            out.append((float(r["running_req"]), max(0.0, (r["kv_tokens"] - offset) / r["running_req"]), p))
    return out


def robust_fit(points: list[tuple[float, float, float]]):
    """The forward's form over (B, C, period) points, refitted once without the points more than
    50% off the first fit (a line whose period spans a prefill between two decodes)."""
    from calibrate.real.from_trace.forms import fit

    first = fit("forward.decode", points)
    kept = [p for p in points if first(p[0], p[1]) > 0 and abs(p[2] - first(p[0], p[1])) / first(p[0], p[1]) <= 0.5]
    return fit("forward.decode", kept) if len(kept) >= 3 else first


def log_check(reads: list[TraceRead], log_path: Path) -> dict:
    """Check each trace against its window of the log and measure the profiler's slowdown.

    Per trace: its window, the matched lines (:func:`align`), the period the log states against the
    trace's (end of process(k) minus end of process(k-1); without Python stacks, forward start to
    forward start). Then the unprofiled lines' fit (:func:`robust_fit`) at every matched step
    and ``slowdown``: the median of the in-window period over it, with ``uncertainty_rel`` (half
    the ratio of its quartiles, less one; at least the spread between the windows' medians).

    Returns ``{"log", "decode_lines", "matched", "period_log_median_s", "period_trace_median_s",
    "median_abs_rel_diff", "max_abs_rel_diff", "unprofiled_lines", "period_unprofiled_median_s",
    "profiler_slowdown", "host_slowdown", "slowdown_uncertainty_rel", "unprofiled_fit", "traces":
    [...]}`` (None where a quantity cannot be computed).

    Raises:
        UserInputError: the log cannot be read or has no batch line (names the file).
    """
    from sim.engines.sglang.server_log import parse_log

    parse_log(log_path)  # one-line errors for a missing, empty or foreign log
    lines = Path(log_path).read_text(encoding="utf-8", errors="replace").splitlines()
    wins = windows(lines)
    all_recs = _records(lines)
    per_trace, offsets, matched_steps = [], [], []
    diffs, logs, traces = [], [], []
    for index, read in enumerate(reads):
        w = window_of(read, index, wins)
        a, b = (w[0], w[1]) if w else (0, len(lines))
        recs = [r for i, r in all_recs if a <= i < b]
        decodes = [s for s in read.steps if s.kind == "decode"]
        pairs, shift, off = align(decodes, recs)
        offsets.append(off)
        mine = []
        for k, r in pairs:
            p = _period(r)
            if k == 0 or p is None:
                continue
            prev, cur = decodes[k - 1], decodes[k]
            if math.isfinite(cur.process_end_us) and math.isfinite(prev.process_end_us):
                t = (cur.process_end_us - prev.process_end_us) * 1e-6
            else:
                t = (cur.span.start_us - prev.span.start_us) * 1e-6
            if t > 0:
                logs.append(p)
                traces.append(t)
                diffs.append(abs(p - t) / t)
            ctx = cur.sum_ctx / cur.num_reqs if cur.sum_ctx is not None else (r["kv_tokens"] - off) / cur.num_reqs
            mine.append((float(cur.num_reqs), ctx, p, cur.forward_s))
        matched_steps.append(mine)
        per_trace.append({"trace": read.source, "window": [a, b] if w else None,
                          "profile_id": w[2] if w else None, "decode_lines": len(recs), "matched": len(pairs),
                          "shift": shift, "kv_offset": off})
    med = lambda v: statistics.median(v) if v else None  # noqa: E731
    outside = unprofiled_points(lines, wins, Counter(offsets).most_common(1)[0][0] if offsets else 0) if wins else []
    out = {"log": str(log_path), "decode_lines": sum(t["decode_lines"] for t in per_trace),
           "matched": sum(t["matched"] for t in per_trace),
           "period_log_median_s": med(logs), "period_trace_median_s": med(traces),
           "median_abs_rel_diff": med(diffs), "max_abs_rel_diff": max(diffs) if diffs else None,
           "unprofiled_lines": len(outside), "period_unprofiled_median_s": med([p[2] for p in outside]),
           "profiler_slowdown": None, "host_slowdown": None, "slowdown_uncertainty_rel": None, "unprofiled_fit": None,
           "traces": per_trace}
    if len(outside) >= 3 and any(matched_steps):
        form = robust_fit(outside)
        out["unprofiled_fit"] = form.as_json()
        host_only = any(r.device != "cpu" for r in reads)
        out.update(slowdown(form, matched_steps, host_only=host_only))
        inside = [(b, c, p) for steps in matched_steps for b, c, p, _ in steps]
        if not host_only and len(inside) >= 3:
            out["local"] = local_slowdown(form, robust_fit(inside), matched_steps)
    return out


def local_slowdown(unprofiled, profiled, matched_steps) -> dict:
    """The profiler's slowdown as a function of the step's shape, on the CPU engine: the in-window
    periods and the unprofiled ones each fitted with the forward's form, the slowdown at (B, C)
    their ratio (at least 1: the profiler does not speed a step up). One factor does not describe
    it: measured on this project's VM (``benchmarks/results/own-server-sglang-cpu.json``), the
    same server's steps were slowed x1.61 at batch 1, x1.41 at batch 16 and x1.20 at batch 16
    with 1k-token contexts (the tracer adds a cost per Python call and per dispatched op, not per
    FLOP). ``reference_context``: the matched steps' median context, at which a host phase that
    depends on the batch size only is corrected. ``uncertainty_rel``: 1.48 times the root sum of
    the two fits' median relative residuals squared (a median absolute deviation taken as 0.674
    sigma), at least the worst window's median |period / profiled form - 1|."""
    per = []
    for steps in matched_steps:
        r = [p / profiled(b, c) for b, c, p, _ in steps if profiled(b, c) > 0]
        if r:
            per.append(abs(statistics.median(r) - 1))
    res = [f.median_rel_residual for f in (unprofiled, profiled) if math.isfinite(f.median_rel_residual)]
    u = 1.48 * math.sqrt(sum(x * x for x in res))
    ctx = [c for steps in matched_steps for _, c, _, _ in steps]
    out = {"profiled_fit": profiled.as_json(), "unprofiled_fit": unprofiled.as_json(),
           "reference_context": statistics.median(ctx), "uncertainty_rel": max([u, *per])}
    f = local_factor(out)
    at = [f(b, c) for steps in matched_steps for b, c, _, _ in steps]
    out["factor_range"] = [min(at), max(at)]
    return out


def local_factor(local: dict):
    """``f(B, C)``: the slowdown :func:`local_slowdown` measured, from its two stored forms."""
    from calibrate.real.from_trace.forms import value

    def f(b: float, c: float | None = None) -> float:
        c = local["reference_context"] if c is None else c
        unprof = value(local["unprofiled_fit"], "forward.decode", b, c)
        return max(1.0, value(local["profiled_fit"], "forward.decode", b, c) / unprof) if unprof > 0 else 1.0
    return f


def _spread(ratios: list[float], per: list[Optional[float]]) -> float:
    s = statistics.median(ratios)
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 4 else [s, s, s]
    u = math.sqrt(q[2] / q[0]) - 1 if q[0] > 0 else 0.0
    meds = [m for m in per if m]
    return max(u, max(meds) / min(meds) - 1) if len(meds) > 1 else u


def slowdown(form, matched_steps: list[list[tuple[float, float, float, float]]], host_only: bool = False) -> dict:
    """``profiler_slowdown``: the median over every matched step (B, C, in-window period, trace
    forward) of its period over the unprofiled form there; ``host_slowdown``: what the host's part
    of the period was slowed by: the same on the CPU engine (its forward is host work, slowed
    alike), on a GPU (``host_only``: kernels are not slowed) the median of (period - forward) over
    (unprofiled period - forward) where the host's part is at least a tenth of the unprofiled
    period; ``slowdown_uncertainty_rel`` for the factor applied (module docstring); per window too.
    Empty when no step matched."""
    ratios, per, host, host_per = [], [], [], []
    for steps in matched_steps:
        r = [p / form(b, c) for b, c, p, _ in steps if form(b, c) > 0]
        h = [(p - f) / (form(b, c) - f) for b, c, p, f in steps if form(b, c) - f >= 0.1 * form(b, c) > 0 and p > f]
        ratios += r
        host += h
        per.append(statistics.median(r) if r else None)
        host_per.append(statistics.median(h) if h else None)
    if not ratios:
        return {}
    out = {"profiler_slowdown": statistics.median(ratios), "slowdown_per_window": per}
    if not host_only:
        out.update(host_slowdown=out["profiler_slowdown"], slowdown_uncertainty_rel=_spread(ratios, per))
    elif host:
        out.update(host_slowdown=statistics.median(host), slowdown_uncertainty_rel=_spread(host, host_per))
    else:  # a device-bound period: the log cannot see the host's share
        out.update(host_slowdown=None, slowdown_uncertainty_rel=None)
    return out
