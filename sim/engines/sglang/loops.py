"""The scheduler's event loops, as SimPy generator functions over :class:`sim.engines.sglang.phases.Phases`.

Each loop reads as the timeline it produces; the loops differ only in which batch's results
are processed after a launch. One iteration's phases run back to back on the CPU thread and are
yielded to SimPy once, and only once another process may act (``Phases.catch_up``; where the loop
pulls an open loop's arrivals, not even then): ``normal`` and ``overlap`` carry the thread's clock
``at`` from phase to phase (a wait for a result sets it to when the result is ready), the MLX chain
accumulates the iteration's CPU time ``t``, blocking waits included.
Sources: SGLang ``Scheduler.event_loop_normal``, ``event_loop_overlap`` (two CUDA streams in
one thread since PR #11210, Oct 2025) and ``event_loop_overlap_mlx`` (2026), as described in
DESIGN.md section 2; ``thread_overlap``
(the pre-October-2025 forward thread sharing the GIL) lives in :mod:`sim.engines.sglang.thread_loop`.
"""

from __future__ import annotations

from sim.engines.sglang.phases import Phases
from sim.engines.sglang.thread_loop import thread_overlap_loop
from sim.model.batch import Batch
from sim.model.costs import DECODE, EXTEND


def normal_loop(env, p: Phases, server):
    """``event_loop_normal``: recv -> schedule k -> launch k -> wait for k -> process k.
    The device idles during every CPU phase: step = T_cpu + T_gpu."""
    sched = p.scheduler
    now = env.now  # the CPU thread's clock; SimPy catches up when another process may act
    leap = p.leap
    while not sched.all_done:
        if leap is not None:  # a run of steady decodes at once (sim.engines.sglang.leap), the same timeline
            now, leapt, idle = leap.normal(now)
            if leapt:
                if idle:  # it ended in an arrival's iteration with nothing to run
                    now = yield from p.idle_until(now)
                elif now >= p.horizon:
                    yield from p.catch_up(now)
                continue
        now, idle = normal_iteration(p, now)
        if idle:  # nothing to run: wait for an arrival
            now = yield from p.idle_until(now)
            continue
        if now >= p.horizon:  # another process may submit a request by now: let it (Phases.catch_up)
            yield from p.catch_up(now)
    yield from p.end(now)  # SimPy's clock ends where the CPU thread's did


def normal_iteration(p: Phases, now: float) -> tuple[float, bool]:
    """One iteration of :func:`normal_loop` from the CPU clock ``now``: recv, schedule a batch,
    launch it, wait for it, process it. Returns (the clock after it, False), or (the clock after
    recv and schedule, True) when there was nothing to run (the loop then waits for an arrival).
    (The leap runs it too, for an arrival's iteration: :mod:`sim.engines.sglang.leap`.)"""
    batch, t = p.recv_and_schedule(now)
    at = now + t
    if batch is None:
        return at, True
    at += p.launch(batch, at)
    at = p.wait(batch, at)
    return at + p.process(batch, at), False


def overlap_loop(env, p: Phases, server):
    """``event_loop_overlap``: recv -> schedule k (state as of k-2) -> launch k -> wait for k-1
    -> process k-1 while the device runs k. Batch k reads k-1's sampled tokens on the device
    (FutureMap), so the CPU never waits for them before launching.

    With ``disable_consecutive_prefill_overlap`` (``SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP``),
    a prefill that follows a prefill waits for the previous result first. A batch with a grammar
    samples only after k-1 is processed (``launch_batch_sample_if_needed``: the mask needs k-1's
    tokens in the grammars, :mod:`sim.engines.sglang.structured`).
    """
    sched = p.scheduler
    last = None
    now = env.now
    leap = p.leap
    while not sched.all_done or last is not None:
        if leap is not None:  # a run of steady decodes at once (sim.engines.sglang.leap), the same timeline
            now, last, leapt = leap.overlap(now, last)
            if leapt:
                if now >= p.horizon:
                    yield from p.catch_up(now)
                continue
        now, last, idle = overlap_iteration(p, server, now, last)
        if idle:  # nothing to run and nothing in flight: wait for an arrival
            now = yield from p.idle_until(now)
            continue
        if now >= p.horizon:  # another process may submit a request by now: let it (Phases.catch_up)
            yield from p.catch_up(now)
    yield from p.end(now)  # SimPy's clock ends where the CPU thread's did


def overlap_iteration(p: Phases, server, now: float, last: Batch | None) -> tuple[float, Batch | None, bool]:
    """One iteration of :func:`overlap_loop` from the CPU clock ``now`` with ``last`` in flight:
    recv, schedule batch k, launch it, wait for ``last`` (k-1) and process it. Returns (the clock
    after it, the batch then in flight, False), or (the clock after recv and schedule, None, True)
    when there was nothing to run and nothing in flight (the loop then waits for an arrival).
    (The leap runs it too, for an arrival's iteration: :mod:`sim.engines.sglang.leap`.)"""
    batch, t = p.recv_and_schedule(now)
    at = now + t
    if server.disable_consecutive_prefill_overlap and last is not None and batch is not None and (
            batch.kind == EXTEND and last.kind == EXTEND):  # SGLang is_disable_overlap_for_batch
        at = p.wait(last, at)
        at += p.process(last, at)
        last = None
    if batch is not None:
        at += p.launch(batch, at)
    if last is not None:
        at = p.wait(last, at)
        at += p.process(last, at)
    elif batch is None:
        return at, None, True
    if batch is not None and batch.num_grammar:  # a grammar: its sampling waits for k-1's tokens
        at += p.sample(batch, at)
    return at, batch, False


def overlap_mlx_loop(env, p: Phases, server):
    """``event_loop_overlap_mlx``: keep two decode steps in flight with ``mx.async_eval``.

    While the step in flight is a pure decode, no request is waiting and none finished in the
    last processed step, the next decode is built on the in-flight step's lazy tokens and
    queued before the CPU blocks on the in-flight one. Otherwise the chain breaks: the CPU
    blocks on the queued step, processes it (a request that finished one step earlier has its
    chained token discarded), then schedules and builds a fresh step while the device idles.
    """
    sched = p.scheduler
    inflight = None
    finished_last = False
    now = env.now
    leap = p.leap
    while not sched.all_done or inflight is not None:
        if leap is not None and inflight is not None:  # a run of chained decodes at once (sim.engines.sglang.leap)
            now, inflight, leapt = leap.mlx(now, inflight, finished_last)
            if leapt:
                finished_last = leap.finished_last
                if now >= p.horizon:
                    yield from p.catch_up(now)
                continue
        t = p.recv(now)
        chain = (inflight is not None and inflight.kind == DECODE and not finished_last
                 and not sched.has_queued_work)
        batch = None
        if inflight is None or chain:
            batch, sched_s = p.schedule(now + t)
            t += sched_s
        if batch is not None:
            t += p.launch(batch, now + t)
        if inflight is not None:  # block on the queued step (chained: while the next one runs)
            t += p.sync(inflight, now + t)
            t += p.process(inflight, now + t)
            finished_last = batch is not None and inflight.finished > 0
        elif batch is None:
            now = yield from p.idle_until(now + t)
            continue
        inflight = batch
        now += t
        if now >= p.horizon:  # another process may submit a request by now: let it (Phases.catch_up)
            yield from p.catch_up(now)
    yield from p.end(now)  # SimPy's clock ends where the CPU thread's did


LOOPS = {"normal": normal_loop, "overlap": overlap_loop, "overlap_mlx": overlap_mlx_loop,
         "thread_overlap": thread_overlap_loop}
