"""vLLM V1's engine loops as SimPy processes: the engine core (one process, its own core) and the
worker (another process, its own core), joined by the RPC queue (vLLM 0.32.0).

``sync`` (``EngineCore.step``, ``v1/engine/core.py:657``): drain inputs -> schedule k -> send k ->
wait for k's output -> update k. The worker idles while the engine core schedules and updates; the
engine core idles while the worker runs: step = T_core + T_worker (+ the RPC latencies).

``async`` (``--async-scheduling``: ``EngineCore.step_with_batch_queue``, l.698, batch queue of 2,
``AsyncScheduler``): drain inputs -> schedule k+1 (placeholders stand for k's token, still in
flight) -> send k+1 -> wait for k's output -> update k. The worker runs k+1 right after k, so the
engine core's work hides behind the worker's: step = max(T_core, T_worker) plus a residue. A
request's tokens are processed one step late; a request that stops on a stop token has one more
step scheduled for it, whose token is dropped (``max_tokens`` stops are foreseen).

With structured output (:mod:`sim.engines.vllm.structured`) the engine core fills the step's
grammar bitmask after sending ``execute_model`` and the worker's ``sample_tokens`` waits for it;
under async scheduling a step whose constrained requests have a token in flight defers its
``sample_tokens`` until the previous step's output is back and updated (l.737-810). The worker
then takes the RPC a round trip (sync) or a pickup (async) after both the forward and the bitmask
are done (a simplification: the RPC's own latency after a late bitmask is not priced apart).

With speculative decoding (:mod:`sim.engines.vllm.speculative`) the synchronous loop fetches the
step's drafts from the worker after ``update_from_output`` (``post_step``, l.693: one more RPC
round trip); under async scheduling the drafts stay in the worker.

``run_busy_loop`` (l.1547) wraps each: ``_process_input_queue`` blocks while there is no work, and
a call that ran no model while requests remain sleeps 1 ms (``_process_engine_step``, l.1617).
Where such a step finds no request running and none in flight, nothing can change what the
waiting queue's head needs (the KV cache is as empty as it gets; an arrival joins behind the head):
the loop would sleep and try again forever, so the run stops at such a step's scheduling with a
:class:`~sim.errors.SimulationStalled` (:func:`stalled`), as the run reports a simulation that
ends with requests left.
"""

from __future__ import annotations

from collections import deque

import simpy

from sim.engines.vllm.core import EngineCore
from sim.engines.vllm.worker import Worker
from sim.errors import SimulationStalled

EMPTY_STEP_SLEEP_S = 0.001  # time.sleep(0.001) in EngineCore._process_engine_step
BATCH_QUEUE_SIZE = 2  # VllmConfig.max_concurrent_batches with async scheduling, pp_size 1


def sync_core_loop(env: simpy.Environment, core: EngineCore, rpcs: simpy.Store):
    """The engine core under ``EngineCore.step``."""
    sched = core.scheduler
    while not core.all_done:
        if not sched.has_requests():
            yield core.idle()  # _process_input_queue: block until a request arrives
        if core.leap is not None:  # a run of steady decode iterations at once (sim.engines.vllm.leap)
            end, _, leapt = core.leap.run(env.now, None)
            if leapt:
                for wait in core.leap.waits(end, env.now):
                    yield env.timeout(wait)
                if core.leap.pending is not None:  # its last update, from its start (requests stop, or
                    yield env.timeout(core.leap.update())  # the API server's events fell inside the run)
                continue
        t = core.add_requests(env.now)
        if not sched.has_requests():
            yield env.timeout(t)
            continue
        step, s = core.schedule(env.now + t)
        if not step.num_reqs and sched.waiting and not sched.running:
            raise stalled(env, core)  # nothing runs or is in flight: every later try is this one again
        t += s + core.dispatch(step, env.now + t + s)
        yield env.timeout(t)
        core.send(step, rpcs)
        yield from core.grammar_bitmask(step)  # behind the worker's forward
        back = yield core.result(step)  # future.result(), then the blocking sample_tokens RPC
        yield env.timeout(max(0.0, back - env.now))
        yield env.timeout(core.update(step, env.now))
        if sched.num_spec_tokens and step.num_reqs:  # post_step: take_draft_token_ids, one more RPC
            yield env.timeout(core.take_drafts(step))
        if not step.num_reqs and sched.has_requests():
            yield env.timeout(EMPTY_STEP_SLEEP_S)


def stalled(env: simpy.Environment, core: EngineCore) -> SimulationStalled:
    """The error of a step that scheduled nothing with requests waiting, none running and none in
    flight: the waiting queue's head does not fit an idle engine (a modelling bug: before 6
    December 2026 speculative decoding's lookahead slots were not capped at max_model_len, and a
    request near it in a cache of one such request was tried again every millisecond, forever)."""
    sched = core.scheduler
    head = sched.waiting[0]
    return SimulationStalled(f"simulation stalled at t={env.now:.6f}s: request {head.rid} ({head.num_tokens} tokens) "
                             f"waits and cannot be scheduled on an idle engine ({sched.kv.num_free_blocks} KV blocks "
                             f"free); {sched.num_done} requests done (a modelling bug: please report it with the "
                             "scenario)")


def async_core_loop(env: simpy.Environment, core: EngineCore, rpcs: simpy.Store):
    """The engine core under ``EngineCore.step_with_batch_queue`` (batch queue of 2)."""
    sched = core.scheduler
    queue: deque = deque()
    while not core.all_done or queue:
        if not (sched.has_requests() or queue):
            yield core.idle()
        if core.leap is not None and len(queue) == 1:  # sim.engines.vllm.leap: the step in flight goes on
            end, queue[0], leapt = core.leap.run(env.now, queue[0])
            if leapt:
                for wait in core.leap.waits(end, env.now):
                    yield env.timeout(wait)
                if core.leap.pending is not None:  # its last update, from its start (requests stop, or
                    yield env.timeout(core.leap.update())  # the API server's events fell inside the run)
                continue
        t = core.add_requests(env.now)
        executed = False
        deferred = None
        if sched.has_requests():  # schedule k+1 and send it before waiting for k
            step, s = core.schedule(env.now + t)
            if not step.num_reqs and sched.waiting and not sched.running and not any(b.num_reqs for b in queue):
                raise stalled(env, core)  # nothing runs, and the steps in flight are empty ones
            t += s + core.dispatch(step, env.now + t + s)
            yield env.timeout(t)
            core.send(step, rpcs)
            executed = step.num_reqs > 0
            if step.grammar_pending and queue:  # its grammars need k's tokens: sample_tokens after k's update
                deferred = step
            else:
                yield from core.grammar_bitmask(step)
                queue.appendleft(step)
                if len(queue) < BATCH_QUEUE_SIZE and (executed or sched.has_requests()):
                    if not executed:
                        yield env.timeout(EMPTY_STEP_SLEEP_S)
                    continue  # the queue is not full: schedule again before blocking
        else:
            yield env.timeout(t)
        if queue:
            oldest = queue.pop()
            back = yield core.result(oldest)
            yield env.timeout(max(0.0, back - env.now))
            yield env.timeout(core.update(oldest, env.now))
        if deferred is not None:
            yield from core.grammar_bitmask(deferred)
            queue.appendleft(deferred)
        if not executed and sched.has_requests():
            yield env.timeout(EMPTY_STEP_SLEEP_S)


def worker_loop(env: simpy.Environment, worker: Worker, rpcs: simpy.Store):
    """The worker process: each step's ``execute_model`` then ``sample_tokens``, in order."""
    while True:
        queued = bool(rpcs.items)
        worker.waiting = True
        step, done = yield rpcs.get()
        worker.waiting = False
        if step is None:  # the leap ran a step here (sim.engines.vllm.leap): held until its sampling ends,
            for wait in done:  # by that step's timeouts
                yield env.timeout(wait)
            continue
        yield env.timeout(worker.pickup(step, queued) + worker.prepare(step))
        if step.num_reqs:
            yield env.timeout(worker.forward(step, env.now))
            if step.mask_ready is not None:  # sample_tokens carries the engine core's bitmask
                yield step.mask_ready
            yield env.timeout(worker.roundtrip(step))
            yield env.timeout(worker.sample(step))
        done.succeed(worker.output_back_s(step, env.now))


LOOPS = {"sync": sync_core_loop, "async": async_core_loop}
