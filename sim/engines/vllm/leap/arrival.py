"""Carrying an arrival: the iteration of vLLM's loops at whose top requests arrived, while the running
ones decode steadily, computed by :class:`sim.engines.vllm.leap.loop.Leap` in one go.

**An arrival is carried** (since 5 December 2026), one iteration at a time (:func:`carry`):
an iteration at whose top requests arrived, while the running requests decode steadily, runs the
processes' own ``add_requests`` and WAITING pass (``_schedule_waiting``, ``_update_after_schedule``
over the admitted), the RUNNING pass's one token each as the leap's iterations take them, and the
engine core's and the worker's phases through their own methods (the forward enqueued on the
device by ``Worker.forward``, every entry of the step given to it), computed up to the update's
start; the loop waits for that time and for :meth:`Leap.update`. Synchronously that is the new
step's update (``update_from_output`` over the admitted: first tokens, a request that stops at
its first). Under async scheduling it is the update of the step in flight, and the new step goes
on in flight; the next iteration, whose step in flight holds the requests just admitted
(complete prompts whose first token does not stop them), is carried the same way (their first
decode token in the RUNNING pass, their first token through ``update_from_output``), whether
requests arrive then or not. Where the worker would still be sampling the new step when the loop
goes on, the worker process is held until then (an RPC of no step,
:func:`sim.engines.vllm.loops.worker_loop`), so the next RPC finds it busy, as the processes have
it.

**With a finish** (since 5 December 2026, second session): running requests may stop in the
same iteration, where the leap carries that finish in a run (:mod:`sim.engines.vllm.leap.loop`):
synchronously the step holds their last tokens and its update finishes them; under async
scheduling (a finish at ``max_tokens`` or ``max_model_len``) the RUNNING pass leaves them out of
the new step (``_schedule_running``, l.668: no token, no block, not in the WAITING pass's token
budget; still counted by its ``max_num_seqs`` check, since they leave ``running`` in the
update) and the update of the step in flight finishes them, not one that would leave the new
step with no request. Either way the update gives the running requests' ITL samples, their
tokens, the finishes through the policy's ``finish_stopped``, then ``update_from_output`` over
the admitted: ``update_from_output``'s order. The running requests are checked and summed by
:class:`sim.engines.vllm.leap.steady.SteadyRunning` (kept across the leap's iterations: only the
requests admitted since are walked).
"""

from __future__ import annotations

from functools import partial

from sim.model.batch import Batch
from sim.model.costs import DECODE


def carry(leap, now: float, prev: Batch | None):
    """The iteration at ``now`` where requests arrived, while the running ones decode steadily
    (under async scheduling: the step in flight a decode of them all, its output back) and
    none stops in it: the processes' ``add_requests`` and the WAITING pass
    (``_schedule_waiting``, ``_update_after_schedule`` over the admitted, the policy's own),
    the RUNNING pass's one token each (its blocks, as the leap's iterations take them), the
    engine core's and the worker's phases priced and the forward enqueued by their own
    methods, computed up to the update's start. The loop waits for that time and then for
    :meth:`Leap.update`: synchronously this step's update (the running requests' tokens, then
    ``update_from_output`` over the admitted: first tokens, a request that stops at its
    first); under async scheduling the update of the decode in flight (the running requests'
    tokens), this step going on in flight with every entry, for the processes to update.
    Returns as :meth:`Leap.run` (that start, the step then in flight, 1), or None (not carried:
    nothing changed)."""
    core, sched, worker = leap.core, leap.core.scheduler, leap.worker
    running, kv = sched.running, sched.kv
    n = len(running)
    if (not n or sched.waiting or core._was_idle or not worker.waiting or leap.rpcs.items
            or n > sched.max_num_scheduled_tokens):
        return None
    fresh = ()  # async: the requests the step in flight admitted (its last entries), their first token
    # in flight: each gets its first decode token in this step (complete prompts only)
    if prev is not None and prev.chunks and fresh_req(prev.chunks[-1][0]):
        n_steady = n - 1
        while n_steady and fresh_req(running[n_steady - 1]):
            n_steady -= 1
        if not n_steady:
            return None
        fresh = running[n_steady:]
        for entry, r in zip(prev.chunks[n_steady:], fresh):
            if (r.is_prefill_chunk or r.num_output_placeholders != 1 or r.num_in_flight_tokens != entry[1]
                    or r.num_output_tokens or r.num_stale_output_tokens or r.num_spec_tokens or r.grammar
                    or r.num_computed_tokens != r.num_prompt_tokens or r.max_tokens < 2 or r.output_len < 2
                    or r.num_prompt_tokens + 1 >= sched.max_model_len):
                return None  # (its first token must not stop it, nor its next step leave it out)
        got = leap._back_and_walk(prev, running, n_steady, decode=False)
    else:
        got = leap._back_and_walk(prev, running, n)
    if got is None:
        return None
    back_prev, (last, k_max, finishing, hist, ctx, warm, _hits) = got
    bs = kv.block_size
    async_scheduling = leap.async_scheduling
    if k_max > 0:
        finishing = ()
    elif k_max < 0 or finishing is None or (async_scheduling and len(finishing) == n):
        return None  # a finish the leap does not carry, or (async) a step left with no request
    left = finishing if async_scheduling else ()  # (async: the RUNNING pass gives them no token, l.668)
    need = hist[0] - sum((-r.num_computed_tokens) % bs == 0 for r in left)
    fresh_need = [r for r in fresh if r.num_computed_tokens + 1 > r.num_blocks * bs]
    if need + len(fresh_need) > kv.num_free_blocks:  # the RUNNING pass preempts
        return None
    steady = running[:n - len(fresh)]
    if finishing:  # they leave the steady sums with their update (finish_stopped)
        leap._steady.finish(running, 0, sched.next_step_seq)
    # --- the iteration, as the processes make it (sim.engines.vllm.loops, the engine core's and worker's)
    t = core.add_requests(now)
    kv.num_free_blocks -= need  # the RUNNING pass: a block for each request whose token needs one
    if kv.num_used_blocks > kv.peak_used_blocks:
        kv.peak_used_blocks = kv.num_used_blocks
    for r in fresh_need:  # (then the fresh ones, after the steady in the running order)
        kv.allocate_slots(r, 1, num_lookahead_tokens=sched.num_lookahead_tokens)
    m = n - len(left)  # the RUNNING pass's entries
    step = Batch(sched.next_step_seq, DECODE, m, m, ctx + sum(r.num_computed_tokens + 1 for r in fresh)
                 - sum(r.num_computed_tokens + 1 for r in left), num_warmup=warm - sum(r.warmup for r in left),
                 chunks=[[r, 1, r.num_computed_tokens, False, 0] for r in fresh])
    sched.next_step_seq += 1
    leap._steady.seq = sched.next_step_seq  # (the steady requests take this step's token: sums kept)
    threshold = sched.long_prefill_token_threshold if n + len(sched.waiting) > 1 else 0
    sched._schedule_waiting(step, sched.max_num_scheduled_tokens - m, threshold)
    admitted = step.chunks  # (the fresh ones' entries and the WAITING pass's)
    sched._update_after_schedule(step)
    sched.finished_req_ids = set()
    s = core.stamp_schedule(step, now + t)
    t += s + core.dispatch(step, now + t + s)
    a1 = now + t
    step.chunks = [[r, 1, r.num_computed_tokens, True, 0] for r in steady if not left or r not in left] + admitted
    # (the forward's entries)
    pp = worker.pickup(step, False) + worker.prepare(step)  # the worker's timeouts, as worker_loop yields them
    w1 = a1 + pp
    held = worker.forward(step, w1)
    rt = worker.roundtrip(step)
    sm = worker.sample(step)
    w3 = ((w1 + held) + rt) + sm
    back = worker.output_back_s(step, w3)
    leap.leapt += 1
    if prev is None:  # synchronous: this step's update, from its output back
        step.chunks = admitted
        step.sync_start = a1
        leap.pending = partial(_update, leap, step, steady, finishing, last, n - warm, True, core.update_s(step))
        leap.steps = (t, pp, held, rt, sm, max(0.0, back - w3))  # (the core waits for the worker's output)
        return w3 + max(0.0, back - w3), None, 1
    leap.output_back(step.seq, back)  # async scheduling: this step in flight, its output back at `back`
    core._results.pop(prev.seq)
    prev.sync_start = a1  # the update of the step in flight, from its output back
    if fresh:
        prev.chunks = prev.chunks[len(steady):]  # (update_from_output over the fresh ones: first tokens)
    update_s = core.update_s(prev)
    a2 = a1 + max(0.0, back_prev - a1)
    if w3 >= a2 + update_s:  # the worker still samples this step when the loop goes on: it is held until
        leap.rpcs.put((None, (t, pp, held, rt, sm)))  # then, by its own timeouts (sim.engines.vllm.loops.worker_loop)
    leap.pending = partial(_update, leap, prev, steady, finishing, last, len(steady) - warm, bool(fresh), update_s)
    leap.steps = (t, max(0.0, back_prev - a1))  # (the core waits for the output of the step before)
    return a2, step, 1


def _update(leap, step: Batch, steady: list, finishing, last: float, measured: int, outputs: bool,
            update_s: float) -> float:
    """:func:`carry`'s update of ``step`` (lasting ``update_s``, drawn), at its start:
    ``EngineCore.update`` with the running requests' tokens brought up to date first (their
    ITL samples, counters, blocks and delivery; ``finishing``, those of them whose token is
    their last, then finished through the policy's ``finish_stopped``), then (``outputs``)
    ``update_from_output`` over the admitted, in ``update_from_output``'s order. Returns its
    duration (s)."""
    core = leap.core

    def running_tokens(deliver: float) -> int:
        if measured:
            core.recorder.itl(deliver - last, measured)
        bs = core.scheduler.kv.block_size
        advance(steady, 1, deliver, bs)
        if finishing:
            if core.scheduler.async_scheduling:  # (this iteration's step left them out)
                left_out(finishing, bs)
            core.scheduler.finish_stopped(finishing, deliver)
        return len(finishing)

    core.apply_update(step, leap.env.now, update_s, running_tokens, outputs)
    return update_s


def advance(running, k: int, last: float, block_size: int) -> None:
    """``k`` decode tokens for each of ``running``, the last delivered at ``last`` (s): their
    counters and blocks as ``_update_after_schedule`` and ``update_from_output`` leave them."""
    for r in running:
        r.num_computed_tokens += k
        r.num_output_tokens += k
        r.num_blocks = -(-r.num_computed_tokens // block_size)
        r.last_token_s = last


def left_out(finishing, block_size: int) -> None:
    """Async scheduling: ``finishing``, advanced by :func:`advance` through a step whose RUNNING
    pass left them out (their in-flight step reaches ``max_tokens``), as ``update_from_output``
    leaves them: no token computed in it, no placeholder or token in flight."""
    for r in finishing:
        r.num_computed_tokens -= 1
        r.num_output_placeholders = r.num_in_flight_tokens = 0
        r.num_blocks = -(-r.num_computed_tokens // block_size)


def fresh_req(req) -> bool:
    """Whether ``req`` has no token yet (its first is in flight, or its prompt is)."""
    return req.first_token_s != req.first_token_s  # NaN
