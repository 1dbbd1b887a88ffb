"""Leaping over steady decode runs: several iterations of ``event_loop_normal``,
``event_loop_overlap`` or ``event_loop_overlap_mlx`` (the MLX chain) at once, with the same answer
as step by step.

Between two events that can change what the scheduler does, consecutive decode iterations differ
only in their batch's contexts and, when requests finish, in its size: no request is waiting or
arriving, no chunk is pending, the KV check passes. Over such a run each iteration's phases are
the same sequence of float operations as the loops in :mod:`sim.engines.sglang.loops` perform
through :class:`~sim.engines.sglang.phases.Phases` and the scheduler's policy; :class:`Leap`
performs them in one tight loop over the scheduler's aggregates, without building a
:class:`~sim.model.batch.Batch` per step (the batch still in flight when the run ends is built),
and feeds the recorder the same rows, ITL samples and finished requests in the same order. The
jitter streams are drawn in the step-by-step order, so noisy runs give the same answers too. A
run's first iteration may merge the last prefill into the running batch (its requests are that
decode's fresh members) and process the batch the loop had in flight through the policy's own
path; finishes by length (left out of the next batch by v0.5.22's ``_reqs_finishing_inflight``)
and overshoot members (an EOS finish, or a policy before v0.5.22) are carried. Long runs over an
unchanging batch are computed with numpy (:mod:`sim.engines.sglang.leap_runs`).

The MLX chain (:meth:`Leap.mlx`) is the overlap loop's run with the chain's own clock: each
phase's time is added to the iteration's ``t`` (the result wait as a duration) and the clock
advanced by ``t``, as :func:`sim.engines.sglang.loops.overlap_mlx_loop` does; it runs only while
the chain holds (the batch in flight a decode, nothing finished in the last processed batch, no
request waiting) and stops before an iteration whose processed batch finishes requests (the
chain breaks after it). A cost model with a submission block (``submit.*`` of an MLX profile:
the launch returns once the device is near the forward's end, :meth:`Phases.launch`) is priced
in each iteration as the launch does; the normal loop's and the chain's numpy runs carry it, the
overlap loop's runs take it here.

Where no SimPy process but the loop's submits requests (an open loop whose arrivals the loop
pulls, ``Phases.pull_arrivals``; a closed loop, whose clients send from the scheduler's
callbacks), a new request does not end a run of the normal or overlap loop (it ends the MLX
chain's): at the next arrival (``Phases.horizon``) the run submits what is due
(``Phases.catch_up``'s pull), and with a request in the inbox it runs the loop's own iteration:
recv, the admission's batch (a prefill, or the policy's decode where none is admitted) and its
launch through :class:`Phases`; under ``overlap``, the wait for and the processing of the leap's
decode in flight are then the leap's own (the same floats and calls as for any of its
decodes), where a decode the policy may schedule passes ``check_decode_mem`` (so no retraction
reads the batch in flight), else the whole iteration is
:func:`sim.engines.sglang.loops.overlap_iteration` with that decode built as the batch object the
loop holds (:func:`~sim.engines.sglang.loops.normal_iteration` for the normal loop). The run goes
on from the state the iteration leaves unless the leap would not take it on entry (a chunk
pending, a prefill that finished its requests, nothing to run).

A run stops (and the loop goes on step by step) before an iteration that would:

- (the MLX chain) start at or after the next open-loop arrival (``Phases.horizon``) or find a
  request in the inbox;
- schedule a prefill or try to (a chunk, a retraction's re-prefill, a request that finished at
  its prefill, requests waiting while admission is open: a run goes on with requests waiting
  only while ``batch_is_full`` latches admission shut or the running batch is at
  ``max_running_requests``, a saturated server, and stops before the iteration after a request
  leaves, whose admission pass may take one);
- fail ``check_decode_mem`` (retraction, v0.5.22's skipped step) or leave the batch empty;
- (the MLX chain) process a batch in which requests finish.

Not leapt at all (step by step throughout): the ``thread_overlap`` loop, SGLang's CPU engine
(``blocking_forward``: the forward runs in the launch), a release fault that kills the server,
structured output (a grammar's mask and accept each step, :mod:`sim.engines.sglang.structured`);
vLLM's loops have their own
(:mod:`sim.engines.vllm.leap`). ``--no-leap``
(:func:`sim.simulate.simulate`'s ``leap=False``) runs every iteration step by step; the tests
hold both paths to byte-identical outputs (``tests/test_leap.py``).
"""

from __future__ import annotations

import math

from sim.engines.sglang.leap_runs import MIN_RUN, mlx_run, normal_run, overlap_run
from sim.engines.sglang.loops import normal_iteration, overlap_iteration
from sim.engines.sglang.phases import AFTER_WAIT_MIN_S, Phases, launch_return
from sim.engines.sglang.policy.decode import DECODE_LOG_INTERVAL
from sim.model.batch import Batch
from sim.model.costs import DECODE


MAX_RUN = 8192  # iterations one numpy run computes at most (memory: about 30 arrays of this length)


class Leap:
    """Runs of steady decode iterations for one run's :class:`Phases` (see the module docstring)."""

    def __init__(self, p: Phases):
        self.p = p
        self.s = p.scheduler
        self.leapt = 0  # iterations taken by the leap so far (the run's stats: leapt_steps)
        self.finished_last = False  # the MLX chain: the last run's last processed batch finished requests
        self.decode_costs: dict = {}  # a numpy run's decode costs by (n, first context, length): leap_runs._decode_costs
        self.step_s = 0.0  # the last leapt iteration's length (s): a numpy run's reach before the next arrival
        self.idle = False  # the normal loop's run ended in an arrival's iteration with nothing to run (normal())

    @classmethod
    def for_run(cls, p: Phases, setting: str) -> "Leap | None":
        """The leap for ``setting``'s loop, or None where that loop is run step by step only."""
        if setting not in ("normal", "overlap", "overlap_mlx") or p.blocking_forward or p._die_fault is not None:
            return None
        if p.grammar is not None:  # structured output: the masks and accepts go step by step
            return None
        if not hasattr(p.costs, "decode_s") or not hasattr(p.costs, "decode_submits"):
            return None
        return cls(p)

    def overlap(self, now: float, last: Batch | None) -> tuple[float, Batch | None, int]:
        """Iterations of :func:`sim.engines.sglang.loops.overlap_loop` from ``now`` with ``last`` in
        flight: schedule and launch decode g, wait for the batch before it, process it. Returns (the
        CPU clock after them, the batch then in flight, iterations leapt; 0: none, nothing changed)."""
        if not self._leaps_on(last, True):
            return now, last, 0
        return self._run(now, last)

    def normal(self, now: float) -> tuple[float, int, bool]:
        """Iterations of :func:`sim.engines.sglang.loops.normal_loop` from ``now``: schedule decode
        g, launch it, wait for it, process it. Returns (the CPU clock after them, iterations leapt,
        0: none, nothing changed; whether they ended in an arrival's iteration with nothing to
        run, after which the loop waits for the next arrival)."""
        if not self._leaps_on(None, False):
            return now, 0, False
        now, _, leapt = self._run(now, None)
        idle, self.idle = self.idle, False
        return now, leapt, idle

    def mlx(self, now: float, inflight: Batch | None, finished_last: bool) -> tuple[float, Batch | None, int]:
        """Iterations of :func:`sim.engines.sglang.loops.overlap_mlx_loop` from ``now`` while the
        chain holds (``inflight`` a decode, nothing finished in the last processed batch, no
        request waiting): schedule and launch decode g on g-1's lazy tokens, block on g-1, process
        it, each phase's time added to the iteration's ``t`` and the clock advanced by ``t``, as
        the loop does. A run stops before an iteration whose processed batch finishes requests
        (the chain breaks after it). Returns (the clock after them, the batch then in flight,
        iterations leapt; 0: none, nothing changed); :attr:`finished_last` then says whether the
        last processed batch finished requests (the loop's ``finished_last``)."""
        s = self.s
        if (finished_last or s.waiting or inflight is None or inflight.kind != DECODE
                or not self._leaps_on(inflight, True)):
            return now, inflight, 0
        self.finished_last = False
        return self._run(now, inflight, chain=True)

    def _run(self, now: float, last: Batch | None, chain: bool = False) -> tuple[float, Batch | None, int]:
        """The leap of the three loops; ``last`` (overlap, the MLX chain: ``chain``) is the batch in
        flight, None for the normal loop, which processes each batch in its own iteration."""
        s, p = self.s, self.p
        if s.inbox or now >= p.horizon or not (s.n_running or s.pending_merge):
            return now, last, 0  # a request to receive or nothing to run: step by step (the callers
            # tested the rest, _leaps_on)
        deferred = last is not None
        costs, stream, rec, kv = p.costs, p.stream, p.recorder, s.kv
        itl = s.recorder.itl  # (deliver_decode's ITL sample of the members that go on)
        cpu_j = p.cpu_jitter if p._cpu_noisy else None
        gpu_j = p.gpu_jitter if p._gpu_noisy else None
        lat, extra, wait_scale = costs.sync_latency_s, p.forward_extra_s, p.after_wait_scale
        recv0, decode_s = costs.recv_s(0), costs.decode_s
        total, page, counts, finishing_at = kv.total_pages, kv.page_size, s.demand._count, s.finishing_at
        # the batch in flight: the loop's own (processed by the policy's own path), then the leap's
        # decode g-1 as ``prev``: (its row up to num_warmup and overshoot, members, warm-up
        # members, fresh members, its row from after_idle to its forward's end, overshoot
        # members), with its process cost ``prev_proc`` and forward end ``prev_fe``
        prev = None
        if deferred:
            prev_fe, prev_proc = last.forward_end, costs.process_s(last.kind, last.num_reqs, last.num_tokens, last.sum_ctx)
        cold = p._cold
        leapt = 0
        # long runs of an unchanging batch go to numpy (sim.engines.sglang.leap_runs), which gives
        # the same floats: no jitter, no after-wait scale, costs priced over arrays
        submits = costs.decode_submits  # MLX: a decode's launch blocks until near its forward's end
        submit_s = costs.submit_s
        vector = (cpu_j is None and gpu_j is None and wait_scale == 1.0 and hasattr(costs, "decode_arrays")
                  and not (submits and deferred and not chain))  # (overlap's runs have no submission block)
        vector_after, step_s = 0, self.step_s  # (a run's first attempt at numpy guesses its reach by the last one's)
        queued = len(s.waiting)  # the steps' num_queued (no arrival, retraction or admission in a run)
        # where no SimPy process but the loop's submits requests (an open loop's arrivals pulled by
        # the loop, Phases.pull_arrivals; a closed loop's clients, which send from its callbacks),
        # an arrival's iteration is the loop's own (sim.engines.sglang.loops), run from here
        pulled = p.pulled if not chain else None
        carry = not chain and (pulled is not None or p._external is None)
        while True:
            if now >= p.horizon:
                if pulled is None:
                    break
                pulled.advance(now - pulled.clock)  # (Phases.catch_up)
            if s.inbox:  # an arrival (or a request the closed loop sent): its iteration
                if not carry:
                    break
                p._cold = cold
                g = s.next_decode_seq
                if prev is None or counts[(-g) % page] > total - kv.used_pages:
                    # the loop's own iteration, with the batch in flight as the loop holds it
                    if deferred:
                        if prev is not None:
                            last, prev = self._in_flight(prev[0] + (0,) + prev[4], prev[3], prev[5]), None
                        now, last, idle = overlap_iteration(p, s.server, now, last)
                    else:
                        now, idle = normal_iteration(p, now)
                    cold = p._cold
                    if idle or not self._leaps_on(last, deferred):
                        self.idle = idle  # (nothing to run: the loop waits for an arrival)
                        break
                    if deferred:
                        prev_fe = last.forward_end
                        prev_proc = costs.process_s(last.kind, last.num_reqs, last.num_tokens, last.sum_ctx)
                    queued, vector_after = len(s.waiting), 0  # (as on entry: numpy may take the next run)
                    continue
                # --- the loop's iteration with the leap's decode g-1 in flight, where a decode the
                # policy may schedule passes check_decode_mem (no retraction reads the batch in
                # flight): recv, the admission's batch and its launch here, then g-1 waited for and
                # processed below as for the leap's own decode
                batch, t = p.recv_and_schedule(now)
                after = now + t
                if batch is not None:
                    after += p.launch(batch, after)
                cold = p._cold
                overshoot_pages, carried = 0, True
            else:
                carried = False
                if not (s.n_running or s.pending_merge):
                    break
                if queued:  # requests wait: a decode only while admission is shut (get_next_batch_to_run)
                    if s.pending_merge:
                        s._merge_prefilled()
                    if not self._admission_shut():
                        break  # an admission pass (a prefill, or a request that does not fit): step by step
                g = s.next_decode_seq
                if vector and g >= vector_after and not s.pending_merge and not s.fresh and (
                        not deferred or (prev is not None and not prev[3] and not prev[5])):
                    # (_vector's first test without the call: too few steps before the next arrival)
                    near = step_s > 0.0 and (p.horizon - now) / step_s * 1.25 < MIN_RUN - 8
                    run = None if near else self._vector(now, g, prev, prev_proc if deferred else 0.0, step_s, chain)
                    if run is not None:
                        k, k_max, now, prev, prev_proc, prev_fe = run
                        leapt += k
                        if k < k_max:
                            vector_after = s.next_decode_seq + MIN_RUN
                        continue
                    vector_after = g + MIN_RUN
                # --- recv + get_next_batch_to_run: merge the last prefill, then a decode -----------
                if s.pending_merge:
                    s._merge_prefilled()
                n, warm = s.n_running, s.n_running_warmup
                if n == 0:
                    break
                ctx = s.ctx_offset + n * g
                leaving = finishing_at.get(g - 1) if s.last_processed_decode < g - 1 else None
                need = counts[(-g) % page]
                overshoot = excluded = ()
                if leaving:  # _compose_decode: requests finishing in the batch in flight
                    if chain:  # (the MLX chain: processing g-1 finishes requests, the chain breaks after it:
                        break  # step by step)
                    if s.exclude_length_finishes:  # v0.5.22: those finishing by length are left out of this batch
                        excluded = [r for r in leaving if r.finish_by_length]
                        n -= len(excluded)
                        if n == 0:
                            break
                        overshoot = [r for r in leaving if not r.finish_by_length] if excluded else leaving
                        residue = (-g) % page  # (DecodePageDemand.member_needs)
                        for r in excluded:
                            warm -= r.warmup
                            ctx -= r.input_len + r.output_done + g - r.join_seq  # Req.ctx_at_join() + g - join
                            if (r.kv_base - r.join_seq) % page == residue:
                                need -= 1
                    else:
                        overshoot = leaving
                used = kv.used_pages
                if need > total - used:
                    break  # check_decode_mem fails: retraction or a skipped step, step by step
                if excluded:
                    s.batch_is_full = False
                if s.new_token_ratio > s.min_ratio:
                    s.new_token_ratio = max(s.new_token_ratio - s.ratio_decay, s.min_ratio)
                kv.used_pages = used = used + need  # KVPool.alloc
                if used > kv.peak_pages:
                    kv.peak_pages = used
                if g % DECODE_LOG_INTERVAL == 0:
                    s.last_logged_usage = used / total
                s.next_decode_seq = g + 1
                seq = s.next_step_seq
                s.next_step_seq = seq + 1
                s._idle_calls = 0
                s.now = now
                fresh = s.fresh
                if fresh:
                    s.fresh = []
                num_running = s.n_running
                recv_s = recv0
                if cpu_j is not None:
                    recv_s *= cpu_j()
                recv_s = recv_s * cold
                sched_s, launch_s, forward, proc_s = decode_s(n, ctx)
                if cpu_j is not None:
                    sched_s *= cpu_j()
                sched_s *= cold
                schedule_start = now + recv_s
                after_idle = p._was_idle
                p._was_idle = False
                # --- launch decode g -------------------------------------------------------------
                launch_start = now + (recv_s + sched_s)
                if cpu_j is not None:
                    launch_s *= cpu_j()
                launch_s *= cold
                cold = 1.0
                if gpu_j is not None:
                    forward *= gpu_j()
                forward += extra
                launch_end = launch_start + launch_s
                busy = stream.busy_until
                forward_start = launch_end if launch_end > busy else busy
                stream.busy_until = forward_end = forward_start + forward
                # what Phases.launch returns: the CPU part, or the submission's block
                launch_ret = launch_return(launch_s, submit_s(DECODE, n, n, ctx), forward_start, forward,
                                           launch_start) if submits else launch_s
                if chain:  # the MLX chain adds each phase to the iteration's t: its own float order
                    t = (recv_s + sched_s) + launch_ret
                    after = now + t
                else:  # (launch_end when nothing blocks: the same sum)
                    after = launch_start + launch_ret
                overshoot_pages = sum(s.needs_page(r, g) for r in overshoot) if overshoot else 0
                head = (seq, DECODE, n, n, ctx, warm, len(overshoot))
                mid = (after_idle, used * page, num_running, queued, now, schedule_start, schedule_start + sched_s,
                       launch_start, launch_end, forward_start, forward_end)
            # --- wait for the batch whose results come now (overlap: g-1; normal: g), process it
            ready = (prev_fe if deferred else forward_end) + lat
            if ready > after:
                if ready - after >= AFTER_WAIT_MIN_S:
                    cold = wait_scale
                process_start = ready
            else:
                process_start = after
            if chain:  # Phases.sync's wait as a duration, added to t
                t += process_start - after
                process_start = now + t
            process_s = prev_proc if deferred else proc_s
            if cpu_j is not None:
                process_s *= cpu_j()
            process_s *= cold
            done = process_start + process_s
            # (deliver_decode's common path, every member going on, is taken without the call in both
            # branches below: one written out per branch, as a shared block costs its tuple a step)
            if not deferred:
                if fresh or g in finishing_at:
                    finished = s.deliver_decode(g, n, warm, fresh, (), (), done)
                else:
                    if n > warm:
                        itl(done - s.last_decode_delivery_s, n - warm)
                    s.last_processed_decode, s.last_decode_delivery_s, finished = g, done, 0
                rec.decode_row(head, finished, mid, after, process_start, done)
            elif prev is None:  # the batch the loop had in flight (a prefill, fresh members): the policy's own path
                last.sync_start, last.process_start, last.process_end = after, process_start, done
                s.process_batch_result(last, done)
                rec.step(last)
                finished = last.finished
            else:
                if prev[3] or prev[5] or g - 1 in finishing_at:
                    finished = s.deliver_decode(g - 1, prev[1], prev[2], prev[3], prev[5], (), done)
                else:
                    if prev[1] > prev[2]:
                        itl(done - s.last_decode_delivery_s, prev[1] - prev[2])
                    s.last_processed_decode, s.last_decode_delivery_s, finished = g - 1, done, 0
                rec.decode_row(prev[0], finished, prev[4], after, process_start, done)
            if overshoot_pages:  # _process_decode of g-1 releases the slots its finishers took in g
                kv.used_pages -= overshoot_pages
            if chain:
                step_s = t + process_s
                now = now + step_s
            else:
                step_s = done - now
                now = done
            if carried:
                if batch is not None and batch.kind == DECODE and batch.overshoot_pages:
                    kv.free(batch.overshoot_pages)  # (_process_decode of g-1: the slots its finishers took in g)
                    batch.overshoot_pages = 0
                last, prev = batch, None
                if not self._leaps_on(last, deferred):
                    break
                prev_fe = last.forward_end
                prev_proc = costs.process_s(last.kind, last.num_reqs, last.num_tokens, last.sum_ctx)
                queued, vector_after = len(s.waiting), 0  # (as on entry: numpy may take the next run)
                continue
            if deferred:
                prev = (head, n, warm, fresh, mid, overshoot)
                prev_proc, prev_fe = proc_s, forward_end
            leapt += 1
            if chain and finished:  # (not foreseen by finishing_at: the chain breaks, step by step from here)
                self.finished_last = True
                break
        p._cold = cold
        self.step_s = step_s
        if leapt == 0:
            return now, last, 0
        self.leapt += leapt
        if prev is not None:
            last = self._in_flight(prev[0] + (0,) + prev[4], prev[3], prev[5])
        return now, last, leapt

    def _leaps_on(self, last: Batch | None, deferred: bool) -> bool:
        """Whether the leap takes the scheduler's state on (on entry, and after an arrival's
        iteration inside a run): a batch in flight (``deferred``: overlap, the MLX chain), no chunk
        pending, no prefill that finished its requests, the decodes processed in order."""
        s = self.s
        if s.chunked_req is not None or s._chunk_in_last_prefill or s.unmerged_finishers:
            return False
        if deferred:
            return last is not None and (last.kind != DECODE or last.decode_seq == s.next_decode_seq - 1)
        return s.last_processed_decode == s.next_decode_seq - 1

    def _admission_shut(self) -> bool:
        """With requests waiting, whether ``_new_prefill_batch`` schedules nothing at this
        iteration's top: admission latched shut (``batch_is_full``), or the running batch at
        ``max_running_requests``, which latches it (as that function does, here too). False: it
        would run an admission pass (:mod:`sim.engines.sglang.policy.admission`)."""
        s = self.s
        if s.n_running == 0:
            return False  # an empty running batch opens the latch
        if s.batch_is_full:
            return True
        if s.n_running + len(s.unmerged_finishers) >= s.server.max_running_requests:
            s.batch_is_full = True
            return True
        return False

    def _vector(self, now: float, g: int, prev, prev_proc: float, step_s: float, chain: bool):
        """A numpy run (:mod:`sim.engines.sglang.leap_runs`) from decode ``g`` up to the next
        finish, the next arrival (by the last step's length ``step_s``) and :data:`MAX_RUN`; None
        if too short or not taken. ``prev``: the overlap loop's batch in flight as :meth:`_run`
        keeps it (or the MLX chain's, ``chain``), its process cost ``prev_proc`` (None: the normal
        loop). Returns (iterations, the most asked for, the clock, the batch then in flight, its
        process cost, its forward end)."""
        s, p = self.s, self.p
        deferred = prev is not None
        k_max = MAX_RUN
        if step_s > 0.0 and p.horizon < math.inf:  # about as many steps as fit before the next arrival
            k_max = min(k_max, int((p.horizon - now) / step_s * 1.25) + 8)
            if k_max < MIN_RUN:  # (asked first: the common case of an open loop, and the cheaper test)
                return None
        k_max = min(min(s.finishing_at, default=g + MAX_RUN) - g + deferred, k_max)
        if k_max < MIN_RUN:
            return None
        if not deferred:
            run = normal_run(self, now, k_max)
            return None if run is None else (run[0], k_max, run[1], None, 0.0, 0.0)
        head, _n, _warm, _fresh, mid, _overshoot = prev
        run = (mlx_run if chain else overlap_run)(self, now, k_max, p.stream.busy_until, prev_proc, head + (0,) + mid)
        if run is None:
            return None
        k, now, fe, proc, row = run
        return k, k_max, now, (row[:7], row[2], row[5], [], row[8:], ()), proc, fe

    def _in_flight(self, row: tuple, fresh: list, overshoot) -> Batch:
        """The decode batch scheduled last (its row up to its forward's end, its fresh and
        overshoot members), as the batch object the loop goes on with."""
        s = self.s
        (seq, _kind, n, _tok, ctx, warm, _over, _fin, after_idle, kv_used, num_running, num_queued, recv_start,
         schedule_start, schedule_end, launch_start, launch_end, forward_start, forward_end) = row
        b = Batch(seq, DECODE, n, n, ctx, decode_seq=s.next_decode_seq - 1, num_warmup=warm, fresh=fresh,
                  overshoot=list(overshoot))
        b.kv_used_after_alloc, b.num_running, b.num_queued, b.after_idle = kv_used, num_running, num_queued, after_idle
        b.recv_start, b.schedule_start, b.schedule_end = recv_start, schedule_start, schedule_end
        b.launch_start, b.launch_end, b.forward_start, b.forward_end = launch_start, launch_end, forward_start, forward_end
        s.inflight_decode = b
        return b
