"""Leaping over steady decode runs of vLLM's loops: several engine-core iterations (and the worker's
steps they send) at once, with the same answer as the SimPy processes give step by step.

Between two events that change what vLLM's scheduler does, every step schedules one token for each
running request, in the same order, and nothing else moves but each request's counters. Over such
a run :class:`Leap` performs each iteration's phases as the float operations the processes of
:mod:`sim.engines.vllm.loops` perform (the engine core's ``add_requests``, ``schedule``,
``dispatch``, the wait and ``update``; the worker's ``prepare``, forward, ``roundtrip`` or pickup,
``sample`` and ``collect``; the API server's ``egress``), in the same order and with the same
jitter draws per generator, without the per-request walks of the policy: the requests' counters,
blocks and delivery times are brought up to date once at the end, and the steps reach the
recorder as the same rows and ITL samples in the same order. The engine core's clock then goes to
the run's end through SimPy, which lands on the same float (checked before each iteration is
taken).

A run is taken only from the top of an engine-core iteration where:

- the worker waits for an RPC (its last step's sampling is done) and, under async scheduling, the
  step in flight is a decode of every running request whose output is back in the engine core;
- no request waits (or the running batch is at ``max_num_seqs``, so the WAITING pass admits
  none) and nothing is in the input queue by the iteration's start (requests that finished in
  the last update do not stop it: the run's first ``schedule`` hands their ids to the worker,
  which prices nothing by them);
- every running request decodes one token a step: no prefill chunk, no speculative decoding or
  grammar, no preempted request's stale output, its blocks exactly covering its computed tokens;

and it ends with the first iteration whose update finishes requests, or stops before one it does
not carry; it stops before an iteration that would run out of KV blocks (preemption), find the
worker still busy when the next step is sent (pickup), or start at or after the earliest time a
request can reach the input queue (:meth:`Leap._bound`: the input queue's next entry, the API
server's :meth:`~sim.engines.vllm.frontend.ApiServer.earliest_enqueue_s`, the open loop's next
send). The other SimPy processes' events may fall inside a run (since 5 December 2026; a run
used to end before the next one): while the engine core and the worker are the leap's, those
are the arrival process's and the API server's input side, which touch only their own state and
the input queue, whose entries come no sooner than that bound. The loop then waits for the run's
last update's start and for the update in two steps, as the processes do (its event made at the
same time as theirs). **Exactness**: the same order of same-instant SimPy events as the processes
everywhere except where independently computed float times coincide to the last bit: an API
server event at exactly the last update's start that makes another at exactly the run's end, or
(async scheduling, a carried arrival) the engine core's next RPC sent at exactly the instant the
worker ends sampling the step the leap ran (SimPy orders same-instant events by when they were
made, and the leap makes some of its waits earlier than the processes do); none has been seen,
and the tests hold every output byte for byte.

**A finish is carried** (since 5 December 2026): the synchronous loop's every finish (a stop token,
``max_tokens``, ``max_model_len``: the request is in the step, its update stops it); under async
scheduling a finish at ``max_tokens`` or ``max_model_len``, whose next step already leaves the
request out (``_schedule_running``, l.668: that iteration's step is priced at the smaller batch,
the update at the step in flight's), while others stay running. A stop token's finish under async
scheduling (the next step still holds the request: its token is the overshoot) stops the run
before it, as does a finish that empties the batch. The run's last iteration is computed up to
its update's start; the loop yields to that time (so that the finished clients' next requests
are sent at the processes' ``env.now``) and calls :meth:`Leap.update`, which records the ITL
samples, finishes the stopped requests through the policy's own ``finish_stopped`` (freed,
recorded, their clients told), records the step, and returns the update's duration for the loop
to wait, in the order ``update_from_output`` and ``EngineCore.update`` make them. Not leapt: vLLM's CPU platform (the forward blocks the worker),
speculative decoding, structured output. ``leap=False`` (``--no-leap``) runs every iteration
through the processes; ``tests/test_vllm_leap.py`` holds both to byte-identical outputs.

**An arrival is carried** (since 5 December 2026), one iteration at a time, by
:mod:`sim.engines.vllm.leap.arrival` (:meth:`Leap._arrival`), with the finishes of that
iteration a run would carry.

The running requests' checks and sums (their common last delivery, the next stop, the blocks
each iteration allocates, the summed context) are kept across the leap's own iterations by
:class:`sim.engines.vllm.leap.steady.SteadyRunning`, by quantities lockstep decoding does not move;
an iteration through the processes drops them, and they are summed again at the next loop top.

Without jitter, a stretch of :data:`sim.engines.vllm.leap.runs.MIN_RUN` or more iterations whose
next event is not nearer than that many iterations at the run's pace so far goes to numpy
(:func:`sim.engines.vllm.leap.runs.numpy_steps`: the same floats, cut where its closed form
stops holding); the loop below goes on from where it stops. The reach counters (steps priced
beyond the profile's data) count the run's steps once at its end.
"""

from __future__ import annotations

from functools import partial

from sim.engines.vllm.core import TIME_EPS_S
from sim.engines.vllm.leap.arrival import advance, carry, fresh_req, left_out
from sim.engines.vllm.leap.runs import MIN_RUN as NUMPY_MIN_RUN, numpy_steps, step_phases
from sim.engines.vllm.leap.steady import SteadyRunning
from sim.model.batch import Batch
from sim.model.costs import DECODE

MIN_RUN = 3  # a shorter run (and no finish to carry) is left to the processes (1 measured no faster)
RETRY_AFTER = 1  # step numbers after a refused run before the next try (2 measured 7-13% slower on the open
# loop and at 64 synchronous clients, when each try walked the running requests: docs/speed.md)


class Leap:
    """Runs of steady decode iterations of one vLLM run (see the module docstring).

    Args:
        env: the run's SimPy environment.
        core: its :class:`sim.engines.vllm.core.EngineCore` (scheduler, costs, API server).
        worker: its :class:`sim.engines.vllm.worker.Worker`.
        rpcs: the RPC store between them.
        async_scheduling: the ``async`` setting's loop (a step in flight at each iteration's top).
    """

    def __init__(self, env, core, worker, rpcs, async_scheduling: bool):
        self.env, self.core, self.worker, self.rpcs = env, core, worker, rpcs
        self.async_scheduling = async_scheduling
        # no jitter on any phase: long stretches may go to numpy (each draw is the loop's to make)
        self.vector = core.cpu_jitter.cv == 0 and worker.cpu_jitter.cv == 0 and worker.gpu_jitter.cv == 0
        self.leapt = 0  # iterations taken so far (the run's stats: leapt_steps)
        self._retry_at = 0  # the step sequence number before which no run is tried again
        self.pending = None  # the last iteration's update, done at its start (a callable: update())
        self.steps = None  # a carried arrival's waits up to its update's start (waits())
        self.run_arrays: dict = {}  # a numpy run's constant arrays by its constants (runs._run_arrays)
        sched = core.scheduler
        self._steady = SteadyRunning(sched.kv.block_size, sched.max_model_len, async_scheduling)

    @classmethod
    def for_run(cls, env, core, worker, rpcs, setting: str, leap: bool) -> "Leap | None":
        """The leap of a run, or None where its loop runs step by step only."""
        sched = core.scheduler
        if not leap or worker.blocking_forward or sched.num_spec_tokens or core.grammar is not None:
            return None
        return cls(env, core, worker, rpcs, setting == "async")

    def run(self, now: float, prev: Batch | None) -> tuple[float, Batch | None, int]:
        """Iterations of the engine core from its loop's top at ``now`` (``prev``: async
        scheduling's step in flight; None for the synchronous loop): a run (:meth:`_run`), or an
        iteration where requests arrive (:meth:`_arrival`). Returns (when the last one ends, or
        where :attr:`pending` is set its update's start, for the loop to wait until with
        :meth:`waits` and then call :meth:`update`; the step then in flight; iterations leapt,
        0: none, nothing changed)."""
        sched = self.core.scheduler
        if sched.next_step_seq < self._retry_at:
            return now, prev, 0
        ready = self._ready(now, prev)
        if ready is None:
            core = self.core
            arrived = core._head < len(core.inbox) and core.inbox[core._head][0] <= now + TIME_EPS_S
            if arrived or (prev is not None and prev.chunks and fresh_req(prev.chunks[-1][0])):  # requests arrived,
                carried = self._arrival(now, prev)  # or the step in flight admitted some: carried alone
                if carried is not None:
                    return carried
            self._retry_at = sched.next_step_seq + RETRY_AFTER
            return now, prev, 0
        return self._run(now, prev, *ready)

    def waits(self, end: float, now: float) -> tuple[float, ...]:
        """The timeouts from ``now`` that take the loop to ``end`` (s), which :meth:`run` returned:
        ``end - now`` (a run checks that it lands there), or after a carried arrival the engine
        core's own waits of that iteration (:func:`sim.engines.vllm.leap.arrival.carry`), each
        landing where the processes' do."""
        steps, self.steps = self.steps, None
        return steps if steps is not None else (end - now,)

    # --- where a run may start ---------------------------------------------------------------
    def _ready(self, now: float, prev: Batch | None):
        """The run's constants if one may start at ``now`` (module docstring), else None:
        (running requests, the step's sum_ctx at its first iteration, warm-up members, measured
        members, their common last delivery, the most iterations, block allocations by residue,
        the shared prefix tokens of each forward, the in-flight step's output time)."""
        core, sched, worker = self.core, self.core.scheduler, self.worker
        running = sched.running
        n = len(running)
        if (not n or (sched.waiting and n < sched.max_num_seqs) or core._was_idle
                or not worker.waiting or self.rpcs.items or n > sched.max_num_scheduled_tokens):
            return None  # (requests may wait while the running batch is full: the WAITING pass takes none)
        inbox_next = core.inbox[core._head][0] if core._head < len(core.inbox) else float("inf")
        if inbox_next <= now + TIME_EPS_S:
            return None
        got = self._back_and_walk(prev, running, n)
        if got is None:
            return None
        back_prev, (last, k_max, finishing, hist, ctx, warm, hits) = got
        if finishing is None or (self.async_scheduling and len(finishing) == n):  # (an empty step: step by step)
            finishing = ()
            if k_max < MIN_RUN:
                return None  # a run too short for its walks, and no finish to carry
        return running, ctx, warm, n - warm, last, k_max, hist, worker.shared_of(hits), back_prev, finishing

    def _back(self, prev: Batch | None, running, decode: bool = True) -> float | None:
        """Async scheduling: when the step in flight's output is back (s), if its entries are the
        running requests, in order, it is a decode of them all (``decode``; else it may hold
        prefill entries), and back by now; None otherwise. The synchronous loop (nothing in
        flight): -inf, or None if ``prev`` is a step."""
        if not self.async_scheduling:
            return -float("inf") if prev is None else None
        n = len(running)
        if prev is None or len(prev.chunks) != n or (decode and (prev.kind != DECODE or prev.num_reqs != n)):
            return None
        done = self.core._results.get(prev.seq)
        if done is None or done.callbacks is not None:  # its output is not back yet
            return None
        if [entry[0] for entry in prev.chunks] != running:  # (a request's == is identity)
            return None
        return done.value

    def _back_and_walk(self, prev: Batch | None, running, upto: int, decode: bool = True):
        """:meth:`_back` of the step in flight, then ``running[:upto]``, each checked to decode
        one token a step (module docstring) and summed
        (:meth:`sim.engines.vllm.leap.steady.SteadyRunning.summary`, kept across the leap's own
        iterations): (the step in flight's output time, (their common last delivery, the
        iterations before the first that stops one (k_max), those it stops, in order, or None
        where that is not a finish the leap carries, block allocations by iteration modulo the
        block size, the summed context of the next step, warm-up members, prefix-cache hit
        blocks)); None where the step in flight is not back or one does not decode steadily."""
        back = self._back(prev, running, decode)
        if back is None:
            return None
        walked = self._steady.summary(running, upto, self.core.scheduler.next_step_seq)
        return None if walked is None else (back, walked)

    # --- the run --------------------------------------------------------------------------------
    def _run(self, now: float, prev, running, ctx0, warm, measured, last, k_max, hist, shared, back_prev, finishing):
        env, core, worker = self.env, self.core, self.worker
        sched, costs, frontend, rec = core.scheduler, core.costs, core.frontend, core.recorder
        kv, stream = sched.kv, worker.stream
        n, bs = len(running), kv.block_size
        forward_at = costs.decode_forward_at(n, shared)
        cj, wj, gj = core.cpu_jitter, worker.cpu_jitter, worker.gpu_jitter
        async_scheduling = self.async_scheduling
        # each phase's cost at this batch size, the same at every iteration (times its jitter)
        ph_s, ph_d, ph_p, ph_rt, ph_sm, ph_cc, ph_u = step_phases(costs, n, async_scheduling)
        egress, egress_after = frontend.egress_terms(n), frontend.egress_after  # (the update's: the step in flight's
        # batch size, n at every iteration)
        horizon = env.peek()  # (the next SimPy event: a numpy run ends before it; see _bound)
        inbox_next = core.inbox[core._head][0] if core._head < len(core.inbox) else float("inf")
        inbox_next = min(inbox_next, self._bound())  # no iteration starts at or after a request can arrive
        seq0 = sched.next_step_seq
        queued = len(sched.waiting)  # the steps' num_queued (nothing arrives, leaves or is admitted in a run)
        free, peak, usable = kv.num_free_blocks, kv.peak_used_blocks, kv.num_usable_blocks
        free_s, busy = frontend.free_s, stream.busy_until
        c, w3_prev, k = now, -float("inf"), 0
        finished = False  # the run ends with a carried finish
        head = None  # async: the row of the step in flight, up to its forward's end
        vector, short = self.vector, 0
        jittered = not self.vector  # (a phase's jitter: without it every draw is 1.0, and x * 1.0 is x)
        k_end = k_max + 1 if finishing else k_max  # (the synchronous loop: iteration k_max finishes requests)
        while k < k_end and c + TIME_EPS_S < inbox_next:
            if (vector and k and k_max - k >= NUMPY_MIN_RUN  # a long stretch: numpy (sim.engines.vllm.leap.runs)
                    and min(horizon, inbox_next) - c >= NUMPY_MIN_RUN * (c - now) / k):  # (the next event not
                # nearer than that many iterations of the pace so far)
                got = numpy_steps(self, prev, (n, bs, hist, ctx0, shared, warm, measured, seq0, usable, horizon,
                                               inbox_next, now, async_scheduling, queued),
                                  k, k_max, (c, w3_prev, back_prev, busy, free, peak, free_s, last, head))
                vector = False
                if got is not None:
                    taken, (c, w3_prev, back_prev, busy, free, peak, free_s, last, head) = got
                    k += taken
                    short += taken < NUMPY_MIN_RUN  # cut early (the first iterations in another regime, as
                    vector = short < 3  # a run's start can be): tried again from there, a few times at most
                    continue
            stops = k == k_max  # (its update finishes requests: it happens at a2, through the loop)
            need, ctx, nk, warmk = hist[k % bs], ctx0 + k * n, n, warm
            if stops and async_scheduling:  # its step leaves out the requests whose last token is in flight
                nk, warmk = n - len(finishing), warm - sum(r.warmup for r in finishing)
                need -= sum((-r.num_computed_tokens) % bs == k % bs for r in finishing)
                ctx -= sum(r.num_computed_tokens + 1 + k for r in finishing)
                ph_s, ph_d, ph_p, ph_rt, ph_sm, ph_cc, _ = step_phases(costs, nk, True)  # (its update: the step
                # in flight's, at n)
                gone = {r.rid for r in finishing}
                staying = [r for r in running if r.rid not in gone]
                shared_k = worker.shared_of([r.num_hit_blocks for r in staying if r.num_hit_blocks])
                forward_at = costs.decode_forward_at(nk, shared_k)
            if need > free:
                break  # allocate_slots fails: preemption, step by step
            # the engine core: add_requests (nothing arrived), schedule, dispatch
            if jittered:
                js, jd = cj(), cj()
                s, d = ph_s * js, ph_d * jd
            else:
                s, d = ph_s, ph_d
            start = c + 0.0
            launch = start + s
            a1 = c + (0.0 + (s + d))
            if not a1 > w3_prev:  # the worker would find the RPC queued (pickup) or a tie: step by step
                if jittered:
                    cj.give_back([js, jd])
                break
            # the worker: execute_model's preparation and forward, sample_tokens, the output back
            if jittered:
                jp = wj()
                jg = gj()
                jr = wj()
                jm = wj()
                jc = wj()
                p, fwd, rt, sm, cc = ph_p * jp, forward_at(ctx) * jg, ph_rt * jr, ph_sm * jm, ph_cc * jc
            else:
                p, fwd, rt, sm, cc = ph_p, forward_at(ctx), ph_rt, ph_sm, ph_cc
            w1 = a1 + (0.0 + p)
            fs = w1 if w1 > busy else busy
            fe = fs + fwd
            w3 = (w1 + 0.0 + rt) + sm
            back = (w3 if w3 >= fe else fe) + cc
            # the engine core: wait for the step in flight (async: the one before), update it
            if async_scheduling:
                r, wait = a1, back_prev - a1
            else:
                r, wait = w3, back - w3
            a2 = r + (wait if wait > 0.0 else 0.0)  # (max(0.0, wait), as the loop's timeout)
            if jittered:
                ju = cj()
                update_s = ph_u * ju
            else:
                update_s = ph_u
            end = a2 + update_s
            deliver, new_free_s = egress_after(egress, end, free_s)
            if not (now + (end - now) == end and (not async_scheduling or w3 < end)
                    and (end < horizon and not stops or now + (a2 - now) == a2)):  # (yields land on the clock)
                if jittered:
                    cj.give_back([js, jd, ju])
                    wj.give_back([jp, jr, jm, jc])
                    gj.give_back([jg])
                break
            # taken: its effects, in the order the processes make them
            free -= need
            used = usable - free
            if used > peak:
                peak = used
            busy = fe
            free_s = new_free_s
            if not async_scheduling and not stops:  # (the common case: its row whole, at once)
                rec.step_row((seq0 + k, DECODE, n, n, ctx, warm, 0, 0, False, used * bs, n, queued, c, start,
                              start + s, launch, launch + d, fs, fe, a1, a2, end))
            else:
                row = (seq0 + k, DECODE, nk, nk, ctx, warmk, 0, 0, False, used * bs, n, queued, c, start, start + s,
                       launch, launch + d, fs, fe)
                if not async_scheduling:  # the update at a2 (finish): the ITL samples, the finishes, then the step
                    self.pending = partial(self._finish, finishing,
                                           row[:7] + (len(finishing),) + row[8:] + (a1, a2, end),
                                           deliver, deliver - last, measured, update_s)
                    last, c = deliver, a2
                    k += 1
                    finished = True
                    break
                if stops:  # the update at a2 finishes the step in flight's last tokens (_finish, by update())
                    if head is None:  # (the loop's own step)
                        prev.sync_start, prev.process_start, prev.process_end = a1, a2, end
                        core._results.pop(prev.seq)
                        done_step = prev
                    else:
                        done_step = head[:7] + (len(finishing),) + head[8:] + (a1, a2, end)
                    self.pending = partial(self._finish, finishing, done_step, deliver, deliver - last, measured,
                                           update_s)
                    head, last, back_prev, c = row, deliver, back, a2
                    k += 1
                    finished = True
                    break
                if head is None:  # the step in flight at the run's start: its own object
                    prev.sync_start, prev.process_start, prev.process_end, prev.finished = a1, a2, end, 0
                    core._results.pop(prev.seq)
                    rec.step(prev)
                else:
                    rec.step_row(head + (a1, a2, end))
                head = row
                w3_prev = w3  # (async: the next RPC is queued unless it comes after w3)
            if measured:
                rec.itl(deliver - last, measured)
            last = deliver
            back_prev, c = back, end
            a2_last, update_last = a2, update_s  # (the last iteration taken)
            k += 1
        if k == 0:
            self._retry_at = sched.next_step_seq + RETRY_AFTER
            return now, prev, 0
        carried = async_scheduling and finished  # (its last step left the finishing requests out)
        if self.pending is None and c >= horizon:  # SimPy events fall inside the run (the API server's): the
            # loop waits for the last update's start, then for the update, as the processes do
            self.pending, c = partial(_duration, update_last), a2_last
        costs.count_decode_steps(n, ctx0, k - carried, shared)  # the reach counters, as forward_s counts each step
        if carried:
            costs.count_decode_steps(nk, ctx, 1, shared_k)
        if finished:  # the members that stop leave the steady sums (finish_stopped, at the update)
            self._steady.finish(running, k_max, seq0)
        self._commit(running, k, last, free, peak, free_s, busy)
        self._steady.seq = sched.next_step_seq  # (every member took the run's k tokens: sums kept)
        self.leapt += k
        if async_scheduling:
            if carried:
                left_out(finishing, bs)  # not in the last step: their last token comes with the update (_finish)
                running = staying
            prev = self._in_flight(head, running, back_prev)
        return c, prev, k

    def update(self) -> float:
        """The last iteration's update, at its start (the loop has yielded to it): what it does
        (:meth:`_finish`, or nothing left to do), and its duration (s), which the loop waits as
        the processes do."""
        pending, self.pending = self.pending, None
        return pending()

    def _finish(self, finishing, step, deliver: float, gap: float, measured: int, update_s: float) -> float:
        """The update of a run's last iteration, in which requests stop, at its own time (so the
        clients' next requests are sent at the processes' ``env.now``): its ITL samples, the
        stopped requests finished through the policy (``finish_stopped``: freed, recorded, their
        clients told), then the step it processed (a row, or async scheduling's own step in
        flight at the run's start), in ``update_from_output``'s and ``EngineCore.update``'s
        order. Returns the update's duration (s)."""
        core = self.core
        if measured:
            core.recorder.itl(gap, measured)
        core.scheduler.finish_stopped(finishing, deliver)
        if type(step) is tuple:
            core.recorder.step_row(step)
        else:  # (async scheduling: the loop's own step in flight, the run's first)
            step.finished = len(finishing)
            core.recorder.step(step)
        return update_s

    def _commit(self, running, k: int, last: float, free: int, peak: int, free_s: float, busy: float) -> None:
        """The state after ``k`` iterations: each request's counters, blocks and last delivery
        (as ``_update_after_schedule`` and ``update_from_output`` leave them), the KV pool, the
        step numbers, the API server's and the device stream's clocks."""
        sched = self.core.scheduler
        advance(running, k, last, sched.kv.block_size)
        sched.kv.num_free_blocks, sched.kv.peak_used_blocks = free, peak
        sched.next_step_seq += k
        sched.finished_req_ids = set()  # schedule() sends them to the worker with its first step
        self.core.frontend.free_s = free_s
        self.worker.stream.busy_until = busy

    def _in_flight(self, head: tuple, running, back: float) -> Batch:
        """Async scheduling: the run's last step, in flight, as the loop goes on with it (its
        entries as ``schedule`` made them, its output back at ``back``)."""
        (seq, _kind, n, _tokens, ctx, warm, _over, _fin, _idle, kv_used, num_running, num_queued, recv_start,
         schedule_start, schedule_end, launch_start, launch_end, forward_start, forward_end) = head
        step = Batch(seq, DECODE, n, n, ctx, num_warmup=warm,
                     chunks=[[r, 1, r.num_computed_tokens - 1, True, 0] for r in running])
        step.kv_used_after_alloc, step.num_running, step.num_queued = kv_used, num_running, num_queued
        step.recv_start, step.schedule_start, step.schedule_end = recv_start, schedule_start, schedule_end
        step.launch_start, step.launch_end = launch_start, launch_end
        step.forward_start, step.forward_end = forward_start, forward_end
        self.output_back(seq, back)
        return step

    def output_back(self, seq: int, back: float) -> None:
        """Step ``seq``'s output, which the leap computed, is back in the engine core at ``back``
        (s): its result event, already processed, for the loop's ``result`` to find."""
        done = self.env.event()
        done.succeed(back)
        self.core._results[seq] = done

    # --- an arrival ----------------------------------------------------------------------------
    def _arrival(self, now: float, prev: Batch | None):
        """The iteration at ``now`` where requests arrived, or whose step in flight admitted some,
        carried alone (:func:`sim.engines.vllm.leap.arrival.carry`); None: not carried."""
        return carry(self, now, prev)

    def _bound(self) -> float:
        """When a request can next reach the engine core's input queue, at the earliest (s): the
        API server's bound and the open loop's next send (the SimPy events before it, the API
        server's own, change nothing an iteration reads: a run's iterations start before it)."""
        return min(self.core.frontend.earliest_enqueue_s(), self.core.next_send_s())



def _duration(update_s: float) -> float:
    """A run's last update with nothing left to do at its start: its duration (s)."""
    return update_s

