"""Leaping over steady decode runs: several iterations of ``event_loop_normal`` or
``event_loop_overlap`` at once, with the same answer as step by step.

Between two events that can change what the scheduler does, consecutive decode iterations differ
only in their batch's contexts and, when requests finish by length, in its size: no request is
waiting or arriving, no prefill is being merged, every member had its previous token from the
previous decode, the KV check passes. Over such a run each iteration's phases are the same
sequence of float operations as the loops in :mod:`sim.engines.sglang.loops` perform through
:class:`~sim.engines.sglang.phases.Phases` and the scheduler's policy; :class:`Leap` performs
them in one tight loop over the scheduler's aggregates, without building a
:class:`~sim.model.batch.Batch` per step (the batch still in flight when the run ends is built),
and feeds the recorder the same rows, ITL samples and finished requests in the same order.
The jitter streams are drawn in the step-by-step order, so noisy runs give the same answers too.

A run stops (and the loop goes on step by step) before an iteration that would:

- start at or after the next open-loop arrival (``Phases.horizon``) or find a request in the inbox
  (a closed-loop client sent one when its request finished);
- schedule anything but a plain decode: a prefill (requests waiting, a chunk, a retraction's
  re-prefill), a decode with members fresh from a prefill, or one whose composition includes a
  request finishing in the batch still in flight that is not left out by v0.5.22's
  ``_reqs_finishing_inflight`` (an overshoot slot, or a stop token the scheduler learns of later);
- fail ``check_decode_mem`` (retraction, v0.5.22's skipped step) or leave the batch empty.

Not leapt at all (step by step throughout): the MLX chain and ``thread_overlap`` loops, SGLang's
CPU engine (``blocking_forward``: the forward runs in the launch), a cost model with a submission
block (MLX profiles), a release fault that kills the server, and vLLM's loops. ``--no-leap``
(:func:`sim.simulate.simulate`'s ``leap=False``) runs every iteration step by step; the tests
hold both paths to byte-identical outputs (``tests/test_leap.py``).
"""

from __future__ import annotations

from sim.engines.sglang.phases import AFTER_WAIT_MIN_S, Phases
from sim.engines.sglang.policy.decode import DECODE_LOG_INTERVAL
from sim.model.batch import Batch
from sim.model.costs import DECODE


class Leap:
    """Runs of steady decode iterations for one run's :class:`Phases` (see the module docstring)."""

    def __init__(self, p: Phases):
        self.p = p
        self.s = p.scheduler

    @classmethod
    def for_run(cls, p: Phases, setting: str) -> "Leap | None":
        """The leap for ``setting``'s loop, or None where that loop is run step by step only."""
        if setting not in ("normal", "overlap") or p.blocking_forward or p._die_fault is not None:
            return None
        if getattr(p.costs, "decode_submits", True) or not hasattr(p.costs, "decode_s"):
            return None
        return cls(p)

    def _steady(self, now: float) -> bool:
        """The scheduler can only run a plain decode next (nothing waiting, arriving or merging)."""
        s = self.s
        return not (s.waiting or s.chunked_req is not None or s.pending_merge or s._chunk_in_last_prefill
                    or s.unmerged_finishers or s.inbox or s.fresh or s.n_running == 0 or now >= self.p.horizon)

    # --- event_loop_overlap ----------------------------------------------------------------
    def overlap(self, now: float, last: Batch | None) -> tuple[float, Batch | None, int]:
        """Iterations of :func:`sim.engines.sglang.loops.overlap_loop` from ``now`` with ``last``
        (decode g-1) in flight: schedule and launch decode g, wait for g-1, process it. Returns
        (the CPU clock after them, the batch then in flight, iterations leapt; 0: none, nothing
        changed)."""
        s, p = self.s, self.p
        if (last is None or last.kind != DECODE or not self._steady(now) or last.decode_seq != s.next_decode_seq - 1
                or s.last_processed_decode != last.decode_seq - 1):
            return now, last, 0
        costs, stream, rec, kv = p.costs, p.stream, p.recorder, s.kv
        cpu_j = p.cpu_jitter if p._cpu_noisy else None
        gpu_j = p.gpu_jitter if p._gpu_noisy else None
        lat, extra, wait_scale = costs.sync_latency_s, p.forward_extra_s, p.after_wait_scale
        recv0, decode_s = costs.recv_s(0), costs.decode_s
        total, page, counts, finishing_at = kv.total_pages, kv.page_size, s.demand._count, s.finishing_at
        prev_n, prev_warm, prev_fe = 0, 0, last.forward_end
        prev_proc = costs.process_s(DECODE, last.num_reqs, last.num_reqs, last.sum_ctx)
        prev_row = None  # decode g-1's row but for finished (index 7) and what its processing stamps
        cold = p._cold
        leapt = 0
        while not s.inbox and now < p.horizon:
            g = s.next_decode_seq
            n, warm = s.n_running, s.n_running_warmup
            ctx = s.ctx_offset + n * g
            leaving = finishing_at.get(g - 1)  # requests finishing in the batch in flight
            if leaving:
                if not s.exclude_length_finishes or not all(r.finish_by_length for r in leaving):
                    break  # an overshoot slot: step by step
                for r in leaving:  # _compose_decode: left out of this batch
                    n -= 1
                    warm -= r.warmup
                    ctx -= r.ctx_at_join() + g - r.join_seq
                if n == 0:
                    break
                need = counts[(-g) % page] - sum(s.needs_page(r, g) for r in leaving)
            else:
                need = counts[(-g) % page]
            if need > total - kv.used_pages:
                break  # check_decode_mem fails: retraction or a skipped step, step by step
            # --- recv + get_next_batch_to_run: a plain decode of the running batch -----------
            if leaving:
                s.batch_is_full = False
            if s.new_token_ratio > s.min_ratio:
                s.new_token_ratio = max(s.new_token_ratio - s.ratio_decay, s.min_ratio)
            kv.alloc(need)
            if g % DECODE_LOG_INTERVAL == 0:
                s.last_logged_usage = kv.usage()
            kv_used = kv.used_pages * page
            s.next_decode_seq = g + 1
            seq = s.next_step_seq
            s.next_step_seq = seq + 1
            s._idle_calls = 0
            s.now = recv_start = now
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
            t = recv_s + sched_s
            # --- launch decode g ---------------------------------------------------------------
            launch_start = now + t
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
            t += launch_s
            # --- wait for decode g-1, process it -------------------------------------------
            sync_start = now + t
            ready = prev_fe + lat
            wait = ready - sync_start if ready > sync_start else 0.0
            if wait >= AFTER_WAIT_MIN_S:
                cold = wait_scale
            t += wait
            process_start = now + t
            process_s = prev_proc
            if cpu_j is not None:
                process_s *= cpu_j()
            process_s *= cold
            done = process_start + process_s
            if prev_row is None:  # the batch the loop had in flight (fresh members and all): the policy's own path
                last.sync_start, last.process_start, last.process_end = sync_start, process_start, done
                s.process_batch_result(last, done)
                rec.step(last)
            else:
                finished = self._process(g - 1, prev_n, prev_warm, done)
                rec.step_row(prev_row[:7] + (finished,) + prev_row[8:] + (sync_start, process_start, done))
            t += process_s
            now += t
            prev_n, prev_proc, prev_warm, prev_fe = n, proc_s, warm, forward_end
            prev_row = (seq, DECODE, n, n, ctx, warm, 0, 0, after_idle, kv_used, num_running, 0, recv_start,
                        schedule_start, schedule_start + sched_s, launch_start, launch_end, forward_start, forward_end)
            leapt += 1
        p._cold = cold
        if leapt == 0:
            return now, last, 0
        return now, self._in_flight(prev_row), leapt

    # --- event_loop_normal -----------------------------------------------------------------
    def normal(self, now: float) -> tuple[float, int]:
        """Iterations of :func:`sim.engines.sglang.loops.normal_loop` from ``now``: schedule decode
        g, launch it, wait for it, process it. Returns (the CPU clock after them, iterations
        leapt; 0: none, nothing changed)."""
        s, p = self.s, self.p
        if not self._steady(now) or s.last_processed_decode != s.next_decode_seq - 1:
            return now, 0
        costs, stream, rec, kv = p.costs, p.stream, p.recorder, s.kv
        cpu_j = p.cpu_jitter if p._cpu_noisy else None
        gpu_j = p.gpu_jitter if p._gpu_noisy else None
        lat, extra, wait_scale = costs.sync_latency_s, p.forward_extra_s, p.after_wait_scale
        recv0, decode_s = costs.recv_s(0), costs.decode_s
        total, page, counts, finishing_at = kv.total_pages, kv.page_size, s.demand._count, s.finishing_at
        cold = p._cold
        leapt = 0
        while not s.inbox and now < p.horizon and s.n_running:
            g = s.next_decode_seq
            n, warm = s.n_running, s.n_running_warmup
            ctx = s.ctx_offset + n * g
            need = counts[(-g) % page]
            if need > total - kv.used_pages:
                break
            if s.new_token_ratio > s.min_ratio:
                s.new_token_ratio = max(s.new_token_ratio - s.ratio_decay, s.min_ratio)
            kv.alloc(need)
            if g % DECODE_LOG_INTERVAL == 0:
                s.last_logged_usage = kv.usage()
            kv_used = kv.used_pages * page
            s.next_decode_seq = g + 1
            seq = s.next_step_seq
            s.next_step_seq = seq + 1
            s._idle_calls = 0
            s.now = recv_start = now
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
            t = recv_s + sched_s
            launch_start = now + t
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
            t += launch_s
            sync_start = now + t
            ready = forward_end + lat
            wait = ready - sync_start if ready > sync_start else 0.0
            if wait >= AFTER_WAIT_MIN_S:
                cold = wait_scale
            t += wait
            process_start = now + t
            process_s = proc_s
            if cpu_j is not None:
                process_s *= cpu_j()
            process_s *= cold
            done = process_start + process_s
            finished = self._process(g, n, warm, done)
            rec.step_row((seq, DECODE, n, n, ctx, warm, 0, finished, after_idle, kv_used, n, 0, now,
                          schedule_start, schedule_start + sched_s, launch_start, launch_end, forward_start,
                          forward_end, sync_start, process_start, done))
            t += process_s
            now += t
            leapt += 1
        p._cold = cold
        return now, leapt

    # --- shared ---------------------------------------------------------------------------------
    def _process(self, g: int, n: int, warm: int, t: float) -> int:
        """``process_batch_result_decode`` of the plain decode batch ``g`` (``n`` members, ``warm``
        of them warm-up) at ``t``, as :meth:`ResultsMixin._process_decode` does it for a batch
        without fresh, overshoot or dropped members. Returns how many finished."""
        s = self.s
        finished = s.finishing_at.pop(g, None)
        if finished:
            s.leave_decoded(finished, g, t)
        measured = n - warm
        if measured > 0:
            s.recorder.itl(t - s.last_decode_delivery_s, measured)
        s.last_processed_decode = g
        s.last_decode_delivery_s = t
        return len(finished) if finished else 0

    def _in_flight(self, row: tuple) -> Batch:
        """The decode batch scheduled last, as the batch object the loop goes on with."""
        s = self.s
        (seq, _kind, n, _tok, ctx, warm, _over, _fin, after_idle, kv_used, num_running, num_queued, recv_start,
         schedule_start, schedule_end, launch_start, launch_end, forward_start, forward_end) = row
        fresh, s.fresh = s.fresh, []
        b = Batch(seq, DECODE, n, n, ctx, decode_seq=s.next_decode_seq - 1, num_warmup=warm, fresh=fresh)
        b.kv_used_after_alloc, b.num_running, b.num_queued, b.after_idle = kv_used, num_running, num_queued, after_idle
        b.recv_start, b.schedule_start, b.schedule_end = recv_start, schedule_start, schedule_end
        b.launch_start, b.launch_end, b.forward_start, b.forward_end = launch_start, launch_end, forward_start, forward_end
        s.inflight_decode = b
        return b
