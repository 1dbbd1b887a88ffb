"""Read what the SGLang tracer wrote (:mod:`realengines.sglang.tracer`) into loop iterations and
steps.

The records of one scheduler process come in the order their calls *ended*, so a nested call
(``process_input`` in ``recv``, ``forward``/``sample`` in ``run_batch``, ``retract`` in
``schedule``) precedes the call around it. An iteration of the event loop starts with its
``recv``; in the in-process driver an ``iter`` record (from inside the receive) marks it too.

Phases as the simulator charges them (seconds of the scheduler thread's CPU time, or of wall
time with ``clock="wall"``):

- ``recv``: ``ingest_requests`` (less the driver's own ``hook_s``);
- ``schedule``: ``get_next_batch_to_run``;
- ``forward``: ``ModelRunner.forward`` + ``ModelRunner.sample`` (on the CPU engine the forward
  runs on the scheduler's thread, inside ``run_batch``);
- ``launch``: the rest of ``run_batch`` (``ForwardBatch`` building, the FutureMap under overlap);
- ``process``: ``process_batch_result`` (under overlap, of the previous batch).
- ``other``: the iteration's wall time not in any phase (the loop itself, the tracer, idle
  housekeeping) is reported by :func:`iterations`; calibration adds it to ``recv``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from calibrate.errors import CalibrationInputError


@dataclass
class Step:
    """One batch SGLang ran. ``iter``: its ``forward_iter``; ``mode``: EXTEND, DECODE, MIXED, IDLE;
    ``rids``; ``ext``/``pre``: new tokens and cached prefix per request (extend); ``ctx``: summed
    context; phase times in seconds; ``k``: the loop iteration that scheduled it."""

    iter: int
    mode: str
    rids: list
    ctx: int
    ext: list = field(default_factory=list)
    pre: list = field(default_factory=list)
    k: int = -1
    running: int = 0
    waiting: int = 0
    kv_free: int | None = None
    t_schedule: float = 0.0  # wall start of the get_next_batch_to_run that made it
    schedule: float = 0.0
    launch: float = 0.0
    forward: float = 0.0
    process: float = float("nan")
    forward_start: float = 0.0  # wall clock (perf_counter) of the forward's start
    forward_end: float = 0.0
    process_start: float = float("nan")
    process_end: float = float("nan")
    retracted: list = field(default_factory=list)

    @property
    def kind(self) -> str:
        return "decode" if self.mode == "DECODE" else "extend"

    @property
    def num_reqs(self) -> int:
        return len(self.rids)

    @property
    def num_tokens(self) -> int:
        return sum(self.ext) if self.ext else len(self.rids)


@dataclass
class Iteration:
    """One pass of the event loop: ``k``; ``sent`` request ids handed over in its receive;
    ``recv`` (s); ``t0``/``t1`` wall start and end; ``step``: the batch it launched (or None);
    ``other``: wall seconds of the iteration outside every phase; ``control``: its receive also
    handled control messages (a server session's cache flush between loads, the profiler's
    requests: their cost is not the receive's)."""

    k: int
    t0: float
    sent: list = field(default_factory=list)
    recv: float = 0.0
    n_new: int = 0
    step: Step | None = None
    t1: float = 0.0
    other: float = 0.0
    control: bool = False


def read_records(path: Path) -> tuple[dict | None, list[dict], list[dict]]:
    """(meta record or None, phase records, request records) of a driver or tracer JSONL file.

    Raises:
        CalibrationInputError: unreadable, or a line that is not JSON.
    """
    meta, recs, reqs = None, [], []
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise CalibrationInputError(str(path), "", f"cannot read the trace ({err})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            raise CalibrationInputError(str(path), f"line {n}", "not JSON: the trace is corrupt or truncated") from None
        kind = rec.get("kind")
        if kind == "meta":
            meta = rec
        elif kind == "req":
            reqs.append(rec)
        elif "ph" in rec:
            recs.append(rec)
    return meta, recs, reqs


def rank_zero(paths: list[Path]) -> list[Path]:
    """The trace files, of one server session's processes, that are its rank-0 scheduler's (or
    any other process's, which hold no ``schedule`` record): under tensor parallelism every
    rank runs the scheduler in lockstep and its tracer writes its own file; rank 0 receives the
    requests and broadcasts them, and its phases are what the simulator prices. A file whose
    ``init`` record names no rank (a trace of an older tracer) counts as rank 0.

    Raises:
        CalibrationInputError: several scheduler files and none of rank 0.
    """
    keep, schedulers, zero = [], 0, 0
    for path in paths:
        _, recs, _ = read_records(path)
        if not any(r["ph"] == "schedule" for r in recs):
            keep.append(path)
            continue
        schedulers += 1
        ranks = {r.get("tp_rank", 0) for r in recs if r["ph"] == "init"}
        if not ranks or 0 in ranks:
            keep.append(path)
            zero += 1
    if schedulers and not zero:
        raise CalibrationInputError(str(paths[0].parent), "", "several schedulers' traces and none of TP rank 0")
    return keep


def iterations(records: list[dict], clock: str = "cpu") -> list[Iteration]:
    """The loop iterations of one scheduler, with their steps and phase times.

    ``clock``: ``cpu`` (the thread's CPU time: what the work costs) or ``wall``.
    """
    key = "cpu" if clock == "cpu" else "dur"
    its: list[Iteration] = []
    by_iter: dict[int, Step] = {}
    pending: list[dict] = []  # nested records waiting for the call around them
    cur: Iteration | None = None
    for rec in records:
        ph = rec["ph"]
        if ph == "iter":
            pending.append(rec)  # folded into the recv that contains it
            continue
        if ph == "recv":
            hook = sum(r.get("hook_s", 0.0) for r in pending if r["ph"] == "iter")
            sent = [rid for r in pending if r["ph"] == "iter" for rid in r.get("sent", [])]
            k = next((r["k"] for r in pending if r["ph"] == "iter"), len(its))
            if cur is not None:
                cur.t1 = rec["t0"]
            cur = Iteration(k=k, t0=rec["t0"], sent=sent, recv=max(rec[key] - hook, 0.0), n_new=int(rec.get("n", 0)),
                            control=bool(rec.get("other")))
            its.append(cur)
            pending = []
            continue
        if cur is None:
            continue
        if ph in ("process_input", "forward", "sample", "retract"):
            pending.append(rec)
        elif ph == "schedule":
            retracted = [rid for r in pending if r["ph"] == "retract" for rid in r.get("rids", [])]
            pending = [r for r in pending if r["ph"] != "retract"]
            b = rec.get("batch")
            if b is not None:
                step = Step(iter=-1, mode=b["mode"], rids=list(b["rids"]), ctx=int(b.get("ctx", 0)),
                            ext=list(b.get("ext", [])), pre=list(b.get("pre", [])), k=cur.k,
                            running=int(rec.get("running", 0)), waiting=int(rec.get("waiting", 0)),
                            kv_free=rec.get("kv_free"), t_schedule=rec["t0"], schedule=rec[key], retracted=retracted)
                cur.step = step
        elif ph == "run_batch":
            inner = [r for r in pending if r["ph"] in ("forward", "sample")]
            pending = [r for r in pending if r["ph"] not in ("forward", "sample")]
            step = cur.step
            if step is None:
                continue
            step.iter = int(rec["batch"]["iter"])
            step.forward = sum(r[key] for r in inner)
            step.launch = max(rec[key] - step.forward, 0.0)
            fwd = [r for r in inner if r["ph"] == "forward"]
            step.forward_start = fwd[0]["t0"] if fwd else rec["t0"]
            step.forward_end = max((r["t0"] + r["dur"] for r in inner), default=rec["t0"] + rec["dur"])
            by_iter[step.iter] = step
        elif ph == "process":
            step = by_iter.get(int(rec["batch"]["iter"]))
            if step is not None:
                step.process = rec[key]
                step.process_start, step.process_end = rec["t0"], rec["t0"] + rec["dur"]
    for a, b in zip(its, its[1:]):
        a.t1 = a.t1 or b.t0
    _other(records, its)
    return its


def _other(records: list[dict], its: list[Iteration]) -> None:
    """Each iteration's wall time outside its top-level phases (loop overhead, tracer, idle work)."""
    top = ("recv", "schedule", "run_batch", "process", "idle")
    spans = sorted((r["t0"], r["t0"] + r["dur"]) for r in records if r["ph"] in top)
    j = 0
    for it in its:
        if not it.t1:
            continue
        busy = 0.0
        while j < len(spans) and spans[j][0] < it.t1:
            s, e = spans[j]
            if s >= it.t0:
                busy += min(e, it.t1) - s
            j += 1
        it.other = max(it.t1 - it.t0 - busy, 0.0)


def steps(its: list[Iteration]) -> list[Step]:
    """The steps of ``its`` in launch order."""
    return sorted((it.step for it in its if it.step is not None and it.step.iter >= 0), key=lambda s: s.iter)
