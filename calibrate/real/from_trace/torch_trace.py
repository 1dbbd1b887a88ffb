"""Reading an SGLang server's own ``torch.profiler`` trace (``/start_profile``) into its steps
and the scheduler's host phases (:func:`read_trace`).

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
  tokens, and ``c_sqsk`` = the sum over requests of new x (prefix + new) tokens, the attention
  pairs (``_agg``). Those give the profile's coordinates: decode (num_reqs, ctx = g_sk / bs);
  extend (num_tokens = toks, prefix = (c_sk - c_sq) / bs, the mean cached prefix per request,
  and its pairs for the prefill's form, :mod:`calibrate.real.from_trace.forms`).
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

The profile built from what is read, its simplifications, the server-log check and the command:
:mod:`calibrate.real.from_trace.profile`.
"""

from __future__ import annotations

import math
import re
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
    attn_pairs: Optional[int] = None  # a prefill's sum over requests of new x KV tokens (c_sqsk), else None
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

    @property
    def attended(self) -> Optional[float]:
        """A prefill's KV tokens attended per new token: ``c_sqsk / c_sq`` where the span has
        them, else the requests taken as equal shares, ``P + N / n``; None without token counts."""
        point = self.point
        if point is None:
            return None
        if self.attn_pairs is not None and self.num_tokens > 0:
            return self.attn_pairs / self.num_tokens
        return point[1] + point[0] / self.num_reqs


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
        pairs = None
        if kind == "decode":
            tokens, sum_ctx = kv.get("g_sq", bs), kv.get("g_sk")
        else:
            tokens = int(m.group("toks") or kv.get("c_sq", 0))
            sum_ctx = kv.get("c_sk")
            pairs = kv.get("c_sqsk")
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
        step = TraceStep(e["name"], kind, bs, tokens, sum_ctx, span, fwd, how, attn_pairs=pairs)
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

    from sim.jsonio import loads_top_level
    from sim.output.real_trace import read_trace_events

    try:
        raw = path.read_bytes()
        data, repeated = loads_top_level(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        events = data.get("traceEvents") if isinstance(data, dict) else data
        if not isinstance(events, list) or "traceEvents" in repeated:
            raise ValueError("no event list, or two")
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
