"""A calibration profile from an SGLang server's own ``torch.profiler`` trace (``/start_profile``).

    overlap-sim calibrate --from-trace TRACE.json.gz [--server-log server.log] --out profile.json

What SGLang 0.5.23 writes (read in its source) and what is read here:

- ``/start_profile`` (``srt/entrypoints/http_server.py``, ``start_profile_async``) runs
  ``torch.profiler.profile`` in the scheduler process (``SchedulerProfilerManager._start_profile``,
  ``srt/managers/scheduler_components/profiler_manager.py``) with ``with_stack`` on unless the
  request says ``false`` (``TokenizerManager.start_profile``, ``srt/managers/tokenizer_control_mixin.py``)
  and exports ``<profile_id>-TP-<rank>.trace.json.gz`` (Chrome trace JSON). There is no
  ``torch.profiler.schedule``, so no ``ProfilerStep#N`` markers.
- **Steps.** ``ModelRunner.forward`` wraps each forward in
  ``profile_range(build_step_span_name(forward_batch))`` (``srt/model_executor/model_runner.py``,
  ``srt/utils/profile_utils.py``): a ``record_function`` span named ``step[DECODE bs=4]`` or
  ``step[EXTEND bs=3 toks=384]``; with ``"detailed_annotations": true`` in the request the name also
  carries the token aggregates (``srt/model_executor/step_span_utils.py``): decode ``g_sk`` = the sum
  of the requests' KV lengths, extend ``c_sq`` = new tokens and ``c_sk`` = the sum of prefix + new
  tokens. Those give the profile's coordinates: decode (num_reqs, ctx = g_sk / bs); extend
  (num_tokens = toks, prefix = (c_sk - c_sq) / bs, the mean cached prefix per request).
- **Forward time.** On a GPU trace, the device kernels (``kernel``, ``gpu_memcpy``, ``gpu_memset``
  events) whose launch (the ``cuda_runtime``/``cuda_driver`` event with the same ``correlation``)
  lies inside the step span, or inside the enclosing ``Scheduler.run_batch`` after the span's start
  when the trace has Python stacks (so sampling, ``ModelRunner.sample``, counts): the step's device
  time is last kernel end - first kernel start. Without launch events, the span's device copy
  (``gpu_user_annotation``). On a CPU trace (SGLang's CPU engine: the forward runs on the
  scheduler thread), the span's own duration (the CPU ops of ``ModelRunner.forward``) plus the
  ``ModelRunner.sample`` calls inside the same ``run_batch`` (Python stacks only): what
  ``calibrate --engine sglang`` calls ``forward``.
- **Host phases**, only with Python stacks (``python_function`` events named
  ``sglang/srt/managers/scheduler.py(LINE): FUNC``), per scheduler iteration (from one
  ``Scheduler.ingest_requests`` to the next; ``event_loop_normal``/``event_loop_overlap``,
  ``scheduler.py``): ``recv`` = ``ingest_requests`` plus the loop's time outside the phases (as
  ``calibrate --engine sglang``), at the number of ``handle_generate_request`` calls inside it;
  ``schedule`` = ``get_next_batch_to_run``; ``launch`` = ``run_batch`` minus the forward (on a GPU
  trace: ``run_batch``, whose forward is launched, not run); ``process`` = ``process_batch_result``
  of the batch (under ``event_loop_overlap`` the batch launched in an earlier iteration: its
  ``result_queue`` is processed after the next launch). Time blocked in CUDA synchronisation
  (``cuda_runtime`` events named ``*Synchronize``) is taken out of every phase: the simulator models
  that wait itself.

Simplifications (stated in the profile's ``metadata.timing``):

- A trace describes the steps the server ran, not a grid: the context (and prefix) axis is binned
  into at most :data:`MAX_BINS` nodes, each step moved to its bin's node along the least-squares
  plane ``t = c0 + c1 x + c2 y + c3 x y`` fitted over all steps of its kind, and grid cells with no
  step are filled from that plane (their samples carry ``"filled": true``).
- Extend steps are keyed by the batch's total new tokens and the mean prefix per request: exact
  for one request or no prefix, which is how the simulator prices them (``sim.model.profile_costs``).
- The profile's phases were measured under the trace's loop only and apply to both settings.
- Python stacks cost time: ``torch.profiler``'s Python tracer slows every Python call, so host
  phases are longer than without the profiler, and so is the forward on a CPU engine, or on a GPU
  whose kernels wait for their launches (eager mode, a small model; CUDA graphs launch a decode in
  one call). Kernel durations themselves are not slowed. docs/real-engines.md gives the factor
  measured on this project's VM (SGLang 0.5.23 CPU engine); :func:`log_check` measures it.
"""

from __future__ import annotations

import math
import re
import statistics
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from sim.errors import UserInputError

STEP_NAME = re.compile(r"^step\[(?P<stage>[A-Z_]+) bs=(?P<bs>\d+)(?: toks=(?P<toks>\d+))?(?P<rest>[^\]]*)\]$")
KEY_VALUE = re.compile(r"(\w+)=(\d+)")
PY_NAME = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<func>[\w<>]+)$")
SCHEDULER_FILE = "sglang/srt/managers/scheduler.py"
MODEL_RUNNER_FILE = "sglang/srt/model_executor/model_runner.py"
# scheduler functions (SGLang 0.5.23 scheduler.py) -> role
SCHEDULER_FUNCS = {"ingest_requests": "recv", "get_next_batch_to_run": "schedule", "run_batch": "run_batch",
                   "process_batch_result": "process", "handle_generate_request": "new_request",
                   "event_loop_normal": "loop", "event_loop_overlap": "loop"}
KERNEL_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}
SYNC_NAME = re.compile(r"Synchronize")
KINDS = {"DECODE": "decode", "EXTEND": "extend"}
MAX_BINS = 3


@dataclass
class Span:
    start_us: float
    dur_us: float
    name: str = ""

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us

    def contains(self, t_us: float) -> bool:
        return self.start_us <= t_us <= self.end_us


@dataclass
class TraceStep:
    """One ``ModelRunner.forward`` of the trace. Times in seconds; NaN where the trace does not
    show a phase."""

    label: str
    kind: str  # "decode", "extend" or the stage in lower case (mixed, verify, draft, idle: not used)
    num_reqs: int
    num_tokens: int  # new tokens (a decode: one per request)
    sum_ctx: Optional[int]  # the requests' KV lengths summed (detailed annotations), else None
    span: Span  # the CPU span of ModelRunner.forward
    forward_s: float
    forward_source: str
    schedule_s: float = math.nan
    launch_s: float = math.nan
    process_s: float = math.nan
    process_end_us: float = math.nan
    run_start_us: float = math.nan  # the enclosing Scheduler.run_batch (Python stacks only)

    @property
    def point(self) -> Optional[tuple[float, float]]:
        """The profile coordinates: decode (num_reqs, ctx), extend (num_tokens, prefix); None
        without token aggregates."""
        if self.sum_ctx is None:
            return None
        if self.kind == "decode":
            return float(self.num_reqs), self.sum_ctx / self.num_reqs
        return float(self.num_tokens), (self.sum_ctx - self.num_tokens) / self.num_reqs


@dataclass
class TraceRead:
    """What the trace holds: its steps in launch order, the receive samples ``(new requests,
    seconds)``, the loop, the device, and how the forward was timed."""

    source: str
    steps: list[TraceStep]
    recv: list[tuple[int, float]] = field(default_factory=list)
    loop: str = ""  # "normal", "overlap" or "" (no Python stacks)
    device: str = "cpu"
    device_name: str = ""
    with_stack: bool = False
    host_name: str = ""
    start_time: str = ""
    skipped_steps: int = 0
    assumed: dict = field(default_factory=dict)  # token counts given by flags (assume_counts)


def _num(e: dict, key: str, source: str, index: int) -> float:
    v = e.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise UserInputError(source, f"traceEvents[{index}].{key}", f"a finite number (event {e.get('name')!r})")
    return float(v)


def read_trace(path: Path) -> TraceRead:
    """Read an SGLang ``torch.profiler`` trace (Chrome trace JSON, optionally gzipped).

    Raises:
        UserInputError: unreadable or not a trace (names the file), a step span without ``ts``
            or ``dur`` (names the event), no ``step[...]`` span of a decode or extend forward.
    """
    source = str(path)
    data, events = _load(Path(path))
    head = _trace_head(data, events)
    steps_raw, py, kernels, launches, gpu_ann, syncs = [], {}, [], {}, {}, []
    for i, e in enumerate(events):
        if e.get("ph") != "X":
            continue
        name, cat = e.get("name"), e.get("cat")
        if not isinstance(name, str):
            continue
        if cat in KERNEL_CATS:
            kernels.append((i, e))
        elif cat in LAUNCH_CATS:
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launches[corr] = _num(e, "ts", source, i)
            if SYNC_NAME.search(name):
                syncs.append(Span(_num(e, "ts", source, i), _num(e, "dur", source, i), name))
        elif cat == "python_function":
            m = PY_NAME.match(name)
            if m and m.group("file").endswith((SCHEDULER_FILE, MODEL_RUNNER_FILE)):
                func = m.group("func")
                role = SCHEDULER_FUNCS.get(func) if m.group("file").endswith(SCHEDULER_FILE) else \
                    ("sample" if func == "sample" else None)
                if role:
                    py.setdefault(role, []).append(Span(_num(e, "ts", source, i), _num(e, "dur", source, i), func))
        elif STEP_NAME.match(name):
            if cat == "gpu_user_annotation":
                gpu_ann.setdefault(name, []).append(Span(_num(e, "ts", source, i), _num(e, "dur", source, i)))
            else:
                steps_raw.append((i, e))
    if not steps_raw:
        raise UserInputError(source, "traceEvents", "no ModelRunner.forward step spans ('step[DECODE bs=..]', "
                             "SGLang 0.5.23 model_runner.py): not an SGLang scheduler trace, or the profile "
                             "caught no forward (send load while profiling)")
    for role in py:
        py[role] = _outermost(sorted(py[role], key=lambda s: s.start_us))
    syncs = _Syncs(syncs)
    gpu = bool(kernels)
    read = TraceRead(source, [], loop=_loop(py), device="cuda" if gpu else "cpu",
                     device_name=head.get("device_name", ""), with_stack=bool(py.get("run_batch")),
                     host_name=head.get("host_name", ""), start_time=head.get("start_time", ""))
    # (launch ts, kernel ts, kernel dur) in launch order; kernels without a launch event are not grouped
    k_sorted = sorted(k for k in ((launches.get((e.get("args") or {}).get("correlation")), _num(e, "ts", source, i),
                                   _num(e, "dur", source, i)) for i, e in kernels) if k[0] is not None)
    k_launch = [k[0] for k in k_sorted]
    runs = py.get("run_batch", [])
    run_starts = [r.start_us for r in runs]
    samples_ = py.get("sample", [])
    sample_starts = [x.start_us for x in samples_]
    for i, e in sorted(steps_raw, key=lambda ie: _num(ie[1], "ts", source, ie[0])):
        span = Span(_num(e, "ts", source, i), _num(e, "dur", source, i), e["name"])
        m = STEP_NAME.match(e["name"])
        stage, bs = m.group("stage"), int(m.group("bs"))
        kv = {k: int(v) for k, v in KEY_VALUE.findall(m.group("rest"))}
        kind = KINDS.get(stage, stage.lower())
        if kind == "decode":
            tokens, sum_ctx = kv.get("g_sq", bs), kv.get("g_sk")
        else:
            tokens = int(m.group("toks") or kv.get("c_sq", 0))
            sum_ctx = kv.get("c_sk")
        rb = _containing(runs, run_starts, span.start_us)
        window = Span(span.start_us, (rb.end_us if rb else span.end_us) - span.start_us)
        if gpu:
            ks = k_sorted[bisect_left(k_launch, window.start_us):bisect_right(k_launch, window.end_us)]
            if ks:
                t0, t1 = min(k[1] for k in ks), max(k[1] + k[2] for k in ks)
                fwd, how = (t1 - t0) * 1e-6, "device kernels launched in the step (first start to last end)"
            elif e["name"] in gpu_ann and gpu_ann[e["name"]]:
                a = gpu_ann[e["name"]].pop(0)
                fwd, how = a.dur_us * 1e-6, "the step span's device copy (gpu_user_annotation)"
            else:
                read.skipped_steps += 1
                continue
        else:
            after = samples_[bisect_left(sample_starts, span.end_us):bisect_right(sample_starts, rb.end_us)] if rb \
                else []
            extra = sum(x.dur_us for x in after)
            fwd = (span.dur_us + extra) * 1e-6
            how = "CPU span of ModelRunner.forward" + (" + ModelRunner.sample" if extra else "")
        step = TraceStep(e["name"], kind, bs, tokens, sum_ctx, span, fwd, how)
        step.run_start_us = rb.start_us if rb else math.nan
        if rb:
            cpu_fwd = 0.0 if gpu else fwd
            step.launch_s = max(0.0, (rb.dur_us - syncs.blocked(rb)) * 1e-6 - cpu_fwd)
        read.steps.append(step)
    if not any(s.kind in ("decode", "extend") for s in read.steps):
        raise UserInputError(source, "traceEvents", "no DECODE or EXTEND step with a forward time "
                             "(GPU trace: kernels need their launch events, cuda_runtime with correlation ids)")
    if read.with_stack:
        _phases(read, py, syncs)
    return read


def _load(path: Path) -> tuple[dict, list[dict]]:
    """(the trace's top-level object, its events), parsed once; a file that does not parse is
    reported as :func:`sim.output.real_trace.read_trace_events` reports it (one line)."""
    import gzip
    import json

    from sim.output.real_trace import read_trace_events

    try:
        raw = path.read_bytes()
        data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        events = data.get("traceEvents") if isinstance(data, dict) else data
        if not isinstance(events, list):
            raise ValueError("no event list")
    except Exception:
        read_trace_events(path)  # raises the one-line error naming the file
        raise
    return (data if isinstance(data, dict) else {}), [e for e in events if isinstance(e, dict)]


def _trace_head(data: dict, events: list[dict]) -> dict:
    """device_name (GPU traces: ``deviceProperties``), host_name, start_time (from
    ``baseTimeNanoseconds``, the Unix time of ts 0 in torch 2.x traces) when present."""
    out = {"host_name": str(data.get("host_name", ""))}
    props = data.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict) and props[0].get("name"):
        out["device_name"] = str(props[0]["name"])
    base = data.get("baseTimeNanoseconds")
    ts = [e.get("ts") for e in events[:50]]
    ts = [t for t in ts if isinstance(t, (int, float))]
    if isinstance(base, (int, float)) and ts:
        try:
            out["start_time"] = datetime.fromtimestamp(base * 1e-9 + min(ts) * 1e-6, timezone.utc).isoformat(
                timespec="seconds")
        except (OverflowError, OSError, ValueError):
            pass
    return out


def _outermost(spans: list[Span]) -> list[Span]:
    """Drop spans nested inside an earlier span of the same list (a function and its wrapper)."""
    out: list[Span] = []
    for s in spans:
        if out and out[-1].contains(s.start_us) and s.end_us <= out[-1].end_us + 1e-3:
            continue
        out.append(s)
    return out


def _containing(spans: list[Span], starts: list[float], t_us: float) -> Optional[Span]:
    """The span of ``spans`` (sorted by start, not nested; ``starts`` their starts) that contains
    ``t_us``, if any."""
    i = bisect_right(starts, t_us) - 1
    return spans[i] if i >= 0 and spans[i].contains(t_us) else None


def _loop(py: dict) -> str:
    loops = {s.name for s in py.get("loop", [])}
    if "event_loop_overlap" in loops:
        return "overlap"
    if "event_loop_normal" in loops:
        return "normal"
    return "normal" if py.get("run_batch") else ""


class _Syncs:
    """The CUDA synchronisation calls of the trace, sorted, for :meth:`blocked`."""

    def __init__(self, spans: list[Span]):
        self.spans = sorted(spans, key=lambda s: s.start_us)
        self.starts = [s.start_us for s in self.spans]
        self.longest = max((s.dur_us for s in self.spans), default=0.0)

    def blocked(self, within: Span) -> float:
        """Microseconds of synchronisation inside ``within``."""
        lo = bisect_left(self.starts, within.start_us - self.longest)
        hi = bisect_left(self.starts, within.end_us)
        return sum(max(0.0, min(s.end_us, within.end_us) - max(s.start_us, within.start_us))
                   for s in self.spans[lo:hi])


def _phases(read: TraceRead, py: dict, syncs: "_Syncs") -> None:
    """Host phases per scheduler iteration (see the module docstring)."""
    ingests = py.get("recv", [])
    scheds, runs, procs = py.get("schedule", []), py.get("run_batch", []), py.get("process", [])
    news = py.get("new_request", [])
    by_run = {s.run_start_us: s for s in read.steps if math.isfinite(s.run_start_us)}
    new_starts = sorted(s.start_us for s in news)
    starts = [[s.start_us for s in spans] for spans in (scheds, runs, procs)]
    pending = None  # overlap: the step whose result the next iteration processes
    for i, ing in enumerate(ingests):
        t0 = ing.start_us
        t1 = ingests[i + 1].start_us if i + 1 < len(ingests) else math.inf
        sched, rb, proc = (spans[bisect_left(st, t0):bisect_left(st, t1)]
                           for spans, st in zip((scheds, runs, procs), starts))
        step = None
        if rb:
            step = by_run.get(rb[0].start_us)
        if step is not None and sched:
            step.schedule_s = (sched[0].dur_us - syncs.blocked(sched[0])) * 1e-6
        # process: same iteration's batch (normal), or the one launched before (overlap)
        target = step if read.loop != "overlap" else pending
        for p in proc:
            if target is not None and math.isnan(target.process_s) and (read.loop == "overlap" or not rb
                                                                        or p.start_us >= rb[0].start_us):
                target.process_s = (p.dur_us - syncs.blocked(p)) * 1e-6
                target.process_end_us = p.end_us
        if read.loop == "overlap" and rb:
            pending = step
        n_new = bisect_right(new_starts, ing.end_us) - bisect_left(new_starts, ing.start_us)
        recv = ing.dur_us - syncs.blocked(ing)
        if math.isfinite(t1) and i > 0:  # the first receive may have begun before the profiler started
            busy = ing.dur_us + sum(s.dur_us for s in (*sched, *rb, *proc))
            recv += max(0.0, (t1 - t0) - busy)  # the loop's time outside the phases
            read.recv.append((n_new, recv * 1e-6))


# ---------------------------------------------------------------------------------------------
# the profile


def _plane(points: list[tuple[float, float, float]]):
    """Least-squares t = c0 + c1 x + c2 y + c3 x y (minimum-norm when a coordinate is constant)."""
    import numpy as np

    a = np.array([[1.0, x, y, x * y] for x, y, _ in points])
    t = np.array([p[2] for p in points])
    coef, *_ = np.linalg.lstsq(a, t, rcond=None)
    return lambda x, y: float(coef[0] + coef[1] * x + coef[2] * y + coef[3] * x * y), \
        lambda x: float(coef[2] + coef[3] * x)


def _bins(values: list[float]) -> list[float]:
    """At most MAX_BINS nodes for the second axis: the distinct values when few, else the medians
    of equal-count bins (rounded to whole tokens)."""
    distinct = sorted(set(values))
    if len(distinct) <= MAX_BINS:
        return distinct
    ordered = sorted(values)
    n = len(ordered)
    nodes = []
    for b in range(MAX_BINS):
        chunk = ordered[b * n // MAX_BINS:(b + 1) * n // MAX_BINS]
        if chunk:
            nodes.append(float(round(statistics.median(chunk))))
    return sorted(set(nodes))


def grid_samples(curve: str, axes: tuple[str, str], points: list[tuple[float, float, float]]) -> list[dict]:
    """Samples on a full grid for a two-axis curve from scattered ``(x, y, seconds)`` steps (see
    the module docstring): first-axis nodes are the distinct x, second-axis nodes :func:`_bins`;
    each step moves to its nearest node along the fitted plane; empty cells are filled."""
    from sim.model.profile import MIN_FORWARD_S

    plane, slope = _plane(points)
    xs = sorted({p[0] for p in points})
    ys = _bins([p[1] for p in points])
    cells: dict[tuple[float, float], list[float]] = {}
    for x, y, t in points:
        node = min(ys, key=lambda n: abs(n - y))
        cells.setdefault((x, node), []).append(max(MIN_FORWARD_S, t + slope(x) * (node - y)))
    out = []
    for x in xs:
        for y in ys:
            point = {axes[0]: x, axes[1]: y}
            if (x, y) in cells:
                out.append({"curve": curve, "point": point, "times_s": cells[(x, y)]})
            else:
                out.append({"curve": curve, "point": point, "times_s": [max(MIN_FORWARD_S, plane(x, y))],
                            "filled": True})
    return out


def assume_counts(read: TraceRead, context: Optional[float], prefix: Optional[float]) -> int:
    """Give the steps whose span carries no token counts (a profile started without
    ``detailed_annotations``, SGLang's default) assumed ones: ``context`` tokens of KV per request
    for a decode, ``prefix`` cached tokens per request for a prefill (None: leave them without).
    Returns how many steps got assumed counts; they are listed in the profile's
    ``metadata.grid.assumed``."""
    n = 0
    for s in read.steps:
        if s.sum_ctx is not None:
            continue
        if s.kind == "decode" and context is not None:
            s.sum_ctx = round(context * s.num_reqs)
        elif s.kind == "extend" and prefix is not None:
            s.sum_ctx = round(prefix * s.num_reqs) + s.num_tokens
        else:
            continue
        n += 1
    if n:
        read.assumed = {"steps": n, "decode_context": context, "extend_prefix": prefix}
    return n


def profile_samples(read: TraceRead) -> list[dict]:
    """The profile's samples from the trace's steps (see the module docstring).

    Raises:
        UserInputError: a curve the simulator needs has no step (names the curve and what to record).
    """
    src = read.source
    acc: dict[tuple, list[float]] = {}

    def add(curve: str, axis: str, x: float, t: float) -> None:
        if math.isfinite(t):
            acc.setdefault((curve, axis, float(x)), []).append(t)

    fwd: dict[str, list] = {"decode": [], "extend": []}
    for s in read.steps:
        if s.kind not in fwd:
            continue
        if s.point is None:
            raise UserInputError(src, f"traceEvents: {s.label}", "token counts in the step span (g_sk / c_sk): "
                                 "profile with \"detailed_annotations\": true in the /start_profile request, or "
                                 "state them with --trace-context (decodes) and --trace-prefix (prefills)")
        fwd[s.kind].append((*s.point, s.forward_s))
        add(f"schedule.{s.kind}", "num_reqs", s.num_reqs, s.schedule_s)
        add(f"process.{s.kind}", "num_reqs", s.num_reqs, s.process_s)
        if s.kind == "decode":
            add("launch.decode", "num_reqs", s.num_reqs, s.launch_s)
        else:
            add("launch.extend", "num_tokens", s.num_tokens, s.launch_s)
    for n, t in read.recv:
        add("recv", "num_reqs", n, t)
    missing = [k for k in ("decode", "extend") if not fwd[k]]
    if missing:
        raise UserInputError(src, f"forward.{missing[0]}", f"no {missing[0].upper()} step in the trace: profile a "
                             "window with both prefills and decodes (start the profile before sending load)")
    out = grid_samples("forward.decode", ("num_reqs", "ctx"), fwd["decode"])
    out += grid_samples("forward.extend", ("num_tokens", "prefix"), fwd["extend"])
    for (curve, axis, x), ts in sorted(acc.items()):
        out.append({"curve": curve, "point": {axis: x}, "times_s": ts})
    have = {s["curve"] for s in out}
    from sim.model.profile import CURVE_AXES

    lacking = [c for c in CURVE_AXES if c not in have]
    if lacking:
        why = ("the trace has no Python stacks (record with \"with_stack\": true)" if not read.with_stack
               else "no step of that kind had this phase in the trace's window")
        raise UserInputError(src, lacking[0], f"no samples for the scheduler's host phase: {why}")
    return out


def build_trace_profile(read: TraceRead, command: str = "", model: str = "", note: str = "",
                        log_check: Optional[dict] = None) -> dict:
    """The calibration profile (:mod:`sim.model.profile`) of a read trace."""
    from calibrate.profile import build_profile

    samples = profile_samples(read)
    device_name = read.device_name or ("cpu (SGLang CPU engine)" if read.device == "cpu" else "cuda")
    meta = {
        "backend": "sglang", "engine": "sglang", "device": read.device,
        "device_name": f"{device_name}, from a torch.profiler trace",
        "host_cpu": f"unknown (trace host {read.host_name})" if read.host_name else "unknown",
        "libraries": {"sglang": "unknown (the trace does not say; read for 0.5.23)"},
        "model": {"name": model or "unknown"}, "dtype": "unknown",
        "date": read.start_time or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "grid": {"source": "torch.profiler trace", "trace": read.source, "steps": len(read.steps),
                 "skipped_steps": read.skipped_steps, **({"assumed": read.assumed} if read.assumed else {})},
        "repeats": min(len(s["times_s"]) for s in samples if not s.get("filled")), "warmup": 0, "quick": False,
        "settings": [read.loop] if read.loop else [], "base_setting": read.loop or "normal",
        "command": command, "note": note, "sync_latency_s": 0.0,
        "timing": "SGLang torch.profiler trace (calibrate.real.sglang_torch_trace): forward = "
                  + ("device kernels per step (first start to last end)" if read.device != "cpu" else
                     "CPU span of ModelRunner.forward + ModelRunner.sample")
                  + "; recv/schedule/launch/process = wall time of the scheduler's Python functions under the "
                  "profiler's Python tracer (slower than unprofiled), CUDA synchronisation taken out; measured "
                  f"under event_loop_{read.loop or 'normal'} only; context/prefix binned, empty cells filled "
                  "from a fitted plane (samples marked filled)",
    }
    if log_check:
        meta["server_log_check"] = log_check
    return build_profile(meta, samples)


# ---------------------------------------------------------------------------------------------
# the server log as a check


def log_check(read: TraceRead, log_path: Path) -> dict:
    """Compare the decode step period the server log states with the trace's.

    SGLang 0.5.23 logs ``Decode batch, #running-req: B, #token: K, ..., gen throughput (token/s): G``
    from ``SchedulerMetricsReporter.report_decode_stats``
    (``srt/managers/scheduler_components/metrics_reporter.py``), called at the end of
    ``process_batch_result_decode`` every ``--decode-log-interval`` decode batches (default 40;
    1 gives one line per step); G = the tokens decoded since the last such line / the time since
    it. With interval 1 and one token per request, B / G is the time between the ends of two
    consecutive decode ``process_batch_result`` calls: in the trace, the end of process(k) minus
    the end of process(k-1) (without Python stacks: forward start(k) - forward start(k-1)).
    Lines are taken between the profiler's ``Profiling starts`` and ``Stop profiling`` lines when
    the log has them, and matched to the trace's decode steps in order by (B, K) = (bs, g_sk):
    ``report_decode_stats`` reads ``scheduler.running_batch`` and the KV pool, which under
    ``event_loop_overlap`` already hold the next batch (scheduled before this one's result is
    processed), so there a line is matched by the next step's (bs, g_sk).

    The log's decode lines outside that window at the same batch sizes (the server unprofiled)
    give ``profiler_slowdown``: the median period inside over the median outside (the contexts
    differ, so it is a rough figure; the profiler's Python tracer is what it mostly measures).

    Returns ``{"log", "decode_lines", "matched", "period_log_median_s", "period_trace_median_s",
    "median_abs_rel_diff", "max_abs_rel_diff", "unprofiled_lines", "period_unprofiled_median_s",
    "profiler_slowdown"}`` (NaN-free: quantities that cannot be computed are None).

    Raises:
        UserInputError: the log cannot be read or has no batch line (names the file).
    """
    from sim.engines.sglang.server_log import parse_lines, parse_log

    parse_log(log_path)  # one-line errors for a missing, empty or foreign log
    lines = Path(log_path).read_text(encoding="utf-8", errors="replace").splitlines()
    starts = [i for i, ln in enumerate(lines) if "Profiling starts" in ln]
    a = starts[-1] if starts else 0
    b = next((i for i in range(a, len(lines)) if "Stop profiling" in lines[i]), len(lines))
    recs = [r for r in parse_lines(lines[a:b], str(log_path)).records if r["kind"] == "decode"]
    decodes = [s for s in read.steps if s.kind == "decode"]
    # the line of batch k states the running batch and the KV pool when process(k) runs: under
    # event_loop_overlap the next batch k+1 is already scheduled then (its requests, one more
    # KV slot each), so its (bs, g_sk) are the line's
    after = {id(a): b for a, b in zip(read.steps, read.steps[1:])}
    pairs, j = [], 0
    for k, s in enumerate(decodes):
        key = s
        if read.loop == "overlap":
            key = after.get(id(s))
            if key is None or key.kind != "decode":
                continue
        for jj in range(j, len(recs)):
            r = recs[jj]
            if r.get("running_req") == key.num_reqs and (key.sum_ctx is None or r.get("kv_tokens") == key.sum_ctx):
                pairs.append((k, r))
                j = jj + 1
                break
    diffs, logs, traces = [], [], []
    for k, r in pairs:
        g = r.get("gen_throughput_tok_s")
        if k == 0 or not g:
            continue
        prev, cur = decodes[k - 1], decodes[k]
        if math.isfinite(cur.process_end_us) and math.isfinite(prev.process_end_us):
            t = (cur.process_end_us - prev.process_end_us) * 1e-6
        else:
            t = (cur.span.start_us - prev.span.start_us) * 1e-6
        p = cur.num_reqs / g
        logs.append(p)
        traces.append(t)
        diffs.append(abs(p - t) / t)
    med = lambda v: statistics.median(v) if v else None  # noqa: E731
    # the same batch sizes outside the profiler's window: how much the profiler slowed the steps
    sizes = {r.get("running_req") for _, r in pairs}
    outside = [] if not starts else [r for r in parse_lines(lines[:a] + lines[b:], str(log_path)).records
                                     if r["kind"] == "decode" and r.get("running_req") in sizes]
    unprofiled = [r["running_req"] / r["gen_throughput_tok_s"] for r in outside if r.get("gen_throughput_tok_s")]
    slowdown = med(logs) / med(unprofiled) if logs and unprofiled else None
    return {"log": str(log_path), "decode_lines": len(recs), "matched": len(pairs),
            "period_log_median_s": med(logs), "period_trace_median_s": med(traces),
            "median_abs_rel_diff": med(diffs), "max_abs_rel_diff": max(diffs) if diffs else None,
            "unprofiled_lines": len(unprofiled), "period_unprofiled_median_s": med(unprofiled),
            "profiler_slowdown": slowdown}


def summary_rows(read: TraceRead) -> list[tuple[str, str, int, float, float]]:
    """(kind, point, steps, forward median ms, schedule + launch + process median ms) per kind and
    batch (medians over the steps; NaN without Python stacks)."""
    groups: dict[tuple, list[TraceStep]] = {}
    for s in read.steps:
        if s.kind in ("decode", "extend"):
            groups.setdefault((s.kind, s.num_reqs, s.num_tokens), []).append(s)
    rows = []
    for (kind, bs, toks), ss in sorted(groups.items()):
        host = [x for s in ss for x in [s.schedule_s + s.launch_s + s.process_s] if math.isfinite(x)]
        rows.append((kind, f"bs={bs}" + (f" toks={toks}" if kind == "extend" else ""), len(ss),
                     statistics.median(s.forward_s for s in ss) * 1e3,
                     statistics.median(host) * 1e3 if host else math.nan))
    return rows


# ---------------------------------------------------------------------------------------------
# the command


def run_from_trace(args) -> int:
    """``overlap-sim calibrate --from-trace TRACE [--server-log LOG] --out PROFILE``: read, build,
    check against the log, write the profile atomically, print a summary. Returns 0.

    Raises:
        UserInputError: a bad trace, log or output path (one line, exit 2; nothing written)."""
    import shlex
    import sys

    from calibrate.profile import save_profile
    from sim.atomic import check_output_file

    check_output_file(args.out, "--out")
    if args.server_log is not None and not Path(args.server_log).is_file():
        raise UserInputError(str(args.server_log), "", "no such server log (--server-log)")
    for flag in ("trace_context", "trace_prefix"):
        v = getattr(args, flag, None)
        if v is not None and not (math.isfinite(v) and 0 <= v <= 1e7 and (v >= 1 or flag == "trace_prefix")):
            raise UserInputError("--" + flag.replace("_", "-"), "", f"tokens per request, a number from "
                                 f"{0 if flag == 'trace_prefix' else 1} to 1e7 (got {v!r})")
    read = read_trace(Path(args.from_trace))
    check = log_check(read, Path(args.server_log)) if args.server_log is not None else None
    assume_counts(read, getattr(args, "trace_context", None), getattr(args, "trace_prefix", None))
    argv = ["overlap-sim", "calibrate", "--from-trace", str(args.from_trace)]
    if args.server_log is not None:
        argv += ["--server-log", str(args.server_log)]
    for flag in ("trace_context", "trace_prefix"):
        if getattr(args, flag, None) is not None:
            argv += ["--" + flag.replace("_", "-"), f"{getattr(args, flag):g}"]
    argv += ["--out", str(args.out)]
    model = args.model if getattr(args, "model", "tiny") not in (None, "tiny") else ""
    profile = build_trace_profile(read, shlex.join(argv), model=model, note=getattr(args, "note", "") or "",
                                  log_check=check)
    save_profile(args.out, profile)
    err = sys.stderr
    print(f"{read.source}: {len(read.steps)} forwards ({read.device}; loop: {read.loop or 'unknown'}; "
          f"Python stacks: {'yes' if read.with_stack else 'no'})", file=err)
    print(f"  {'kind':7s} {'batch':>16s} {'steps':>5s} {'forward ms':>11s} {'schedule+launch+process ms':>27s}",
          file=err)
    for kind, point, n, fwd_ms, host_ms in summary_rows(read):
        print(f"  {kind:7s} {point:>16s} {n:5d} {fwd_ms:11.3f} {host_ms:27.3f}", file=err)
    if check is not None:
        if check["median_abs_rel_diff"] is None:
            print(f"server log: {check['matched']} of the trace's decode steps matched a 'Decode batch' line; no "
                  "period to compare (run the server with --decode-log-interval 1)", file=err)
        else:
            print(f"server log: {check['matched']} decode steps matched; step period from 'gen throughput' "
                  f"{check['period_log_median_s'] * 1e3:.3f} ms against the trace's "
                  f"{check['period_trace_median_s'] * 1e3:.3f} ms (median |difference| "
                  f"{check['median_abs_rel_diff'] * 100:.1f}%)", file=err)
        if check["profiler_slowdown"] is not None:
            print(f"server log: outside the profiled window the same batches took "
                  f"{check['period_unprofiled_median_s'] * 1e3:.3f} ms a step: the profiler slowed the server "
                  f"x{check['profiler_slowdown']:.2f} (the host phases are measured slowed, and the forward on a "
                  "CPU engine, or on a GPU when its kernels wait for their launches)", file=err)
    print(f"profile written to {args.out}")
    return 0
