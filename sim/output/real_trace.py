"""Measured GPU gaps from a real Chrome trace (``torch.profiler``'s ``export_chrome_trace``,
or any Chrome trace JSON, optionally gzipped), in the simulator's summary keys.

Forward steps are found in one of these ways, first that applies:

1. ``step_name`` given: the spans of a ``record_function`` annotation of that name (an exact
   match, or the name followed by ``#``, a space or ``(``, e.g. ``ProfilerStep#3``).
   Device-side copies of the annotation (``gpu_user_annotation``) are used when present;
   otherwise the device kernels launched inside each CPU span (linked by the profiler's
   ``correlation`` ids); in a trace without device kernels (a CPU run) the CPU spans themselves.
2. No name: device kernels (``kernel``, ``gpu_memcpy``, ``gpu_memset`` events) grouped per step
   by the ``ProfilerStep#N`` annotations of ``torch.profiler``'s schedule if any, else split
   wherever the device idles longer than ``split_gap_us`` between kernels.

A step's device span is [first kernel start, last kernel end]. Gaps: start of step k+1 minus end
of step k (clipped at 0). Idle fraction: 1 - busy/(last end - first start), busy being the union
of the steps' spans.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from pathlib import Path
from typing import Optional

import numpy as np

from sim.errors import UserInputError
from sim.jsonio import loads_top_level

KERNEL_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver", "runtime"}
GAP_KEYS = ["num_steps", "gpu_idle_fraction", "mean_gap_ms", "median_gap_ms", "p99_gap_ms",
            "mean_forward_ms", "duration_s"]


# Bounds on a span's times, in microseconds (the Chrome trace unit). |ts| up to 2**53 us (about
# 285 years: epoch-based profiler clocks, ~1.7e15 us, fit; beyond it a float no longer holds whole
# microseconds). dur, and the spread of one pid's spans (first start to last end), up to 7 days: a
# profile of a serving run covers seconds to hours, not weeks; more is a corrupt trace.
MAX_ABS_TS_US = float(2 ** 53)
MAX_SPAN_US = 7 * 24 * 3600 * 1e6
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")


def read_trace_events(path: Path) -> list[dict]:
    """The ``traceEvents`` list of a Chrome trace file (a JSON object or a bare array).

    Every complete span (``ph: "X"``) must have a ``ts`` and ``dur`` that are finite JSON numbers
    (or numeric strings, which Perfetto also reads) with ``dur >= 0``, ``|ts| <= 2**53`` us and
    ``dur <= 7 days``, and one pid's spans must lie within 7 days of each other (see
    ``MAX_ABS_TS_US`` and ``MAX_SPAN_US``).

    Raises:
        UserInputError: unreadable, not JSON (e.g. a trace cut short), ``traceEvents`` given twice
            in the top-level object, no event list, or a span's times out of those bounds (naming
            ``traceEvents[i].ts`` or ``.dur``)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data, dups = loads_top_level(raw)
    except OSError as err:
        raise UserInputError(str(path), "", f"cannot read the trace ({err.strerror or err})") from None
    except EOFError:
        raise UserInputError(str(path), "", "gzip stream ends early: the trace is truncated") from None
    except RecursionError:
        raise UserInputError(str(path), "", "JSON nested too deeply to read: not a Chrome trace") from None
    except (ValueError, UnicodeDecodeError) as err:
        where = f" at line {err.lineno} column {err.colno}" if isinstance(err, json.JSONDecodeError) else ""
        raise UserInputError(str(path), "", f"not valid Chrome trace JSON{where} (truncated or not a trace?)") from None
    if "traceEvents" in dups:
        raise UserInputError(str(path), "traceEvents", f"given {dups.count('traceEvents') + 1} times in the "
                             "top-level object: JSON readers keep one and drop the rest, so which events count "
                             "is unclear; the trace is corrupt or two traces were joined")
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise UserInputError(str(path), "traceEvents", "expected a list of trace events")
    _check_span_times(events, str(path))
    events = [e for e in events if isinstance(e, dict)]
    odd = [e for e in events if e.get("ph") == "X" and (not isinstance(e.get("args", {}), dict) or
                                                        not isinstance(e.get("pid", 0), (int, str)))]
    if odd:
        first = odd[0]
        raise UserInputError(str(path), "traceEvents", f"every span's args an object and its pid a number or a "
                             f"string: {len(odd)} span(s) are not (first: {first.get('name')!r} with args "
                             f"{first.get('args')!r}, pid {first.get('pid')!r}); not a trace this reads")
    return events


def _check_span_times(events: list, source: str) -> None:
    """Refuse spans whose ts or dur is not a number within the bounds, naming the first
    (``traceEvents[i].ts`` / ``.dur``, i its index in the file's list), and a pid whose spans
    spread over more than ``MAX_SPAN_US``."""
    bad = []  # (index, field) of each span whose ts or dur is out
    reach: dict = {}  # pid -> [min start, index, max end, index, sum of starts, count]
    for i, e in enumerate(events):
        if not isinstance(e, dict):  # (an event is a JSON object in the trace event format)
            raise UserInputError(source, f"traceEvents[{i}]", f"an event object (got {type(e).__name__} {e!r:.40}); "
                                 "the trace is corrupt")
        if e.get("ph") != "X":
            continue
        ts, dur = e.get("ts"), e.get("dur")  # (a complete event, ph X, has both: without dur it is corrupt)
        if type(ts) is not float:  # the common case first: the rest (int, str, bool, None) checked
            ts = _number(ts)
        elif ts - ts != 0:  # nan, inf
            ts = None
        if type(dur) is not float:
            dur = _number(dur)
        elif dur - dur != 0:
            dur = None
        if ts is None or abs(ts) > MAX_ABS_TS_US:
            bad.append((i, "ts"))
        elif dur is None or not 0 <= dur <= MAX_SPAN_US:
            bad.append((i, "dur"))
        elif not bad:
            pid = e.get("pid")
            r = reach.get(pid) if isinstance(pid, (int, str)) else None
            if r is None:
                if isinstance(pid, (int, str)):
                    reach[pid] = [ts, i, ts + dur, i, ts, 1]
            else:
                if ts < r[0]:
                    r[0], r[1] = ts, i
                if ts + dur > r[2]:
                    r[2], r[3] = ts + dur, i
                r[4] += ts
                r[5] += 1
    if bad:
        i, fld = bad[0]
        first = events[i]
        raise UserInputError(source, f"traceEvents[{i}].{fld}", "every span's ts and dur a finite number of "
                             f"microseconds, dur not negative, |ts| <= 2**53 and dur <= 7 days ({MAX_SPAN_US:.0f} "
                             f"us): {len(bad)} span(s) are not (first: {first.get('name')!r} with ts "
                             f"{first.get('ts')!r}, dur {first.get('dur')!r}); the trace is corrupt, and measuring "
                             "the rest would leave gaps out")
    for pid, (lo, i_lo, hi, i_hi, total, n) in reach.items():
        if hi - lo > MAX_SPAN_US:
            mean = total / n  # the outlier: the end farther from the spans' mean start
            i = i_lo if mean - lo > hi - mean else i_hi
            raise UserInputError(source, f"traceEvents[{i}].ts", f"pid {pid!r}'s spans spread over {hi - lo:.3g} us, "
                                 f"from the start of traceEvents[{i_lo}] to the end of traceEvents[{i_hi}]: more than "
                                 f"7 days ({MAX_SPAN_US:.0f} us) is not one run's trace; a corrupt timestamp")


def _number(value) -> Optional[float]:
    """A JSON number, or a string holding one (as some exporters write, and Perfetto reads), as a
    finite float; None for anything else (bool, null, nan, inf, other text)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        if _JSON_NUMBER.fullmatch(value.strip()) is None:
            return None
        value = float(value)
    elif not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:  # an int too large for a float
        return None
    return value if math.isfinite(value) else None


def _spans(events: list[dict], pred) -> list[dict]:
    out = []
    for e in events:
        if e.get("ph") == "X" and pred(e):
            try:
                float(e["ts"]), float(e.get("dur", 0.0))
            except (KeyError, TypeError, ValueError):
                continue
            out.append(e)
    return out


def _name_matcher(name: str):
    pattern = re.compile(re.escape(name) + r"(?:$|[#\s(])")
    return lambda e: isinstance(e.get("name"), str) and pattern.match(e["name"]) is not None


def _kernels_by_cpu_span(kernels: list[dict], launches: list[dict], cpu_spans: list[dict]) -> list[tuple[float, float]]:
    """Device span of the kernels whose launch (same ``correlation``) falls in each CPU span."""
    launch_ts = {}
    for ev in launches:
        corr = (ev.get("args") or {}).get("correlation")
        if corr is not None:
            launch_ts[corr] = float(ev["ts"])
    spans = sorted((float(s["ts"]), float(s["ts"]) + float(s.get("dur", 0.0))) for s in cpu_spans)
    starts = np.array([s[0] for s in spans])
    groups: dict[tuple, list] = {}
    for k in kernels:
        t = launch_ts.get((k.get("args") or {}).get("correlation"))
        if t is None:
            continue
        i = int(np.searchsorted(starts, t, side="right")) - 1
        if i >= 0 and t <= spans[i][1]:
            g = groups.setdefault((k.get("pid"), i), [math.inf, -math.inf, k.get("pid")])
            g[0] = min(g[0], float(k["ts"]))
            g[1] = max(g[1], float(k["ts"]) + float(k.get("dur", 0.0)))
    return [tuple(g) for g in groups.values()]


def _split_by_gap(kernels: list[dict], split_gap_us: float) -> list[tuple]:
    steps: list[list] = []
    last: dict = {}  # device pid -> its open step
    for k in sorted(kernels, key=lambda e: float(e["ts"])):
        start, end, pid = float(k["ts"]), float(k["ts"]) + float(k.get("dur", 0.0)), k.get("pid")
        cur = last.get(pid)
        if cur is not None and start - cur[1] <= split_gap_us:
            cur[1] = max(cur[1], end)
        else:
            last[pid] = cur = [start, end, pid]
            steps.append(cur)
    return [tuple(s) for s in steps]


def _as_steps(spans: list[dict]) -> list[tuple]:
    return [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e.get("pid")) for e in spans]


def find_steps(events: list[dict], step_name: Optional[str] = None, split_gap_us: float = 50.0,
               pid=None) -> tuple[list[tuple[float, float]], str]:
    """Forward steps as (start_us, end_us) device spans in time order, and how they were found.

    Steps are kept for one device (trace ``pid``: a GPU in a CUDA trace, a process in a CPU
    trace): ``pid`` if given, else the one with the most steps.

    Raises:
        UserInputError: nothing in the trace looks like a step (the message says what was sought)."""
    kernels = _spans(events, lambda e: e.get("cat") in KERNEL_CATS)
    launches = _spans(events, lambda e: e.get("cat") in LAUNCH_CATS)
    if step_name:
        match = _name_matcher(step_name)
        on_device = _spans(events, lambda e: e.get("cat") == "gpu_user_annotation" and match(e))
        if on_device:
            found = _as_steps(on_device)
            mode = f"device spans of annotation {step_name!r}"
        else:
            cpu = _spans(events, lambda e: e.get("cat") != "gpu_user_annotation" and match(e))
            if not cpu:
                raise UserInputError("--step-name", step_name, "no span of that name in the trace "
                                     "(record_function names are case-sensitive)")
            if kernels:
                found = _kernels_by_cpu_span(kernels, launches, cpu)
                mode = f"device kernels launched inside annotation {step_name!r}"
            else:
                found = _as_steps(cpu)
                mode = f"CPU spans of annotation {step_name!r} (no device kernels in the trace)"
    elif kernels:
        profiler_steps = _spans(events, _name_matcher("ProfilerStep"))
        if profiler_steps and launches:
            found = _kernels_by_cpu_span(kernels, launches, profiler_steps)
            mode = "device kernels grouped by ProfilerStep#N"
        else:
            found = _split_by_gap(kernels, split_gap_us)
            mode = f"device kernels split at idle gaps > {split_gap_us:g} us"
    else:
        raise UserInputError("", "", "no device kernels in the trace (a CPU-only profile?): pass --step-name NAME, "
                                     "the record_function annotation around each forward")
    found = [s for s in found if math.isfinite(s[0]) and math.isfinite(s[1])]
    counts: dict = {}
    for s in found:
        counts[s[2]] = counts.get(s[2], 0) + 1
    if pid is None and counts:
        pid = max(counts, key=counts.get)
    elif pid is not None and str(pid) not in {str(p) for p in counts}:
        raise UserInputError("--pid", str(pid), f"no steps on that pid; steps were found on pids {sorted(map(str, counts))}")
    found = sorted((s[0], s[1]) for s in found if str(s[2]) == str(pid))
    if not found:
        raise UserInputError("", "", f"no forward steps found ({mode})")
    if len(counts) > 1:
        mode += f", pid {pid} (of {len(counts)} pids with steps; choose with --pid)"
    return found, mode


def _gaps_us(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    # idle time before each step after the first; rounded to the nanosecond so that
    # back-to-back spans written with microsecond floats give exactly 0
    return np.round(np.clip(starts[1:] - np.maximum.accumulate(ends)[:-1], 0.0, None), 3)


def gap_summary(steps: list[tuple[float, float]]) -> dict:
    """The simulator's gap keys from (start_us, end_us) device spans in time order: num_steps,
    gpu_idle_fraction, mean/median/p99_gap_ms, mean_forward_ms, duration_s (first start to last end)."""
    starts = np.array([s[0] for s in steps], dtype=np.float64)
    ends = np.array([s[1] for s in steps], dtype=np.float64)
    gaps_us = _gaps_us(starts, ends)
    gaps_ms = gaps_us / 1e3
    duration_us = float(ends.max() - starts.min())
    busy_us = duration_us - float(gaps_us.sum())
    out = {"num_steps": int(len(steps)),
           "gpu_idle_fraction": float(max(0.0, 1.0 - busy_us / duration_us)) if duration_us > 0 else math.nan,
           "mean_gap_ms": float(gaps_ms.mean()) if len(gaps_ms) else math.nan,
           "median_gap_ms": float(np.percentile(gaps_ms, 50)) if len(gaps_ms) else math.nan,
           "p99_gap_ms": float(np.percentile(gaps_ms, 99)) if len(gaps_ms) else math.nan,
           "mean_forward_ms": float((ends - starts).mean() / 1e3),
           "duration_s": duration_us / 1e6}
    return out


def measure_gaps(path: Path, step_name: Optional[str] = None, split_gap_us: float = 50.0, pid=None) -> dict:
    """Read a Chrome trace and summarise its forward steps' gaps (:func:`gap_summary`), plus
    ``mode`` (how steps were found), ``source`` (the file) and ``gaps_ms`` (every gap, in order).

    Raises:
        UserInputError: unreadable or truncated trace, or no steps found (names the file)."""
    events = read_trace_events(path)
    try:
        steps, mode = find_steps(events, step_name, split_gap_us, pid)
    except UserInputError as err:  # name the file, and the flag the problem came from
        raise UserInputError(str(path), f"{err.source} {err.field}".strip(), err.expected) from None
    out = gap_summary(steps)
    out["gaps_ms"] = (_gaps_us(np.array([s[0] for s in steps]), np.array([s[1] for s in steps])) / 1e3).tolist()
    out.update(mode=mode, source=str(path))
    return out
