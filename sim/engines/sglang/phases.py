"""The CPU phases of one scheduler iteration, as the event loops call them.

Each phase applies its effect to the scheduler state, stamps the batch's timeline and returns
how long the CPU is busy with it (seconds); the loop then yields that time to SimPy. Phase costs
come from the cost model, times seeded per-step jitter.
"""

from __future__ import annotations

import math

import simpy

from sim.engines.sglang.policy.scheduler import Scheduler, ServerDied
from sim.model.batch import Batch
from sim.model.costs import DECODE, EXTEND, CostModel, Jitter
from sim.model.device import DeviceStream
from sim.model.workload import PulledArrivals
from sim.trace.recorder import TraceRecorder


AFTER_WAIT_MIN_S = 1.0e-6  # a shorter wait (float ties included) leaves the CPU's state as it was


def launch_return(launch_s: float, submit_s: float, forward_start: float, forward_s: float,
                  launch_start: float) -> float:
    """How long a launch of ``launch_s`` seconds of CPU started at ``launch_start`` holds the
    thread: that, or where the cost model has a submission block ``submit_s`` > 0 (MLX's
    ``mx.async_eval`` back-pressure), until ``min(submit_s, forward_s)`` after the forward starts
    at ``forward_start``, if later (seconds; :meth:`Phases.launch`, and the leap's iterations)."""
    if submit_s > 0.0:
        return max(launch_s, forward_start + min(submit_s, forward_s) - launch_start)
    return launch_s


class Phases:
    """The scheduler thread's phases (recv, schedule, launch, sync, process) over shared state.

    A loop may run several phases back to back without yielding in between (passing each the
    time it starts, ``at``) and yield their total once: nothing else changes the scheduler
    state inside one CPU iteration (arrivals wait in the inbox until the next ``recv``). It may
    even run several iterations on its own clock, as long as no other process can act before
    its next ``recv``: :attr:`horizon` is the time of the next request that another SimPy
    process (the open-loop arrival process) will submit; past it the loop hands control over
    (:meth:`catch_up`), or, where the loop pulls the arrivals (:meth:`pull_arrivals`, the
    leaping loops), submits what that process would have by then. Closed-loop clients submit
    from inside the loop (at explicit times), so their horizon is infinite.

    Args:
        env: the SimPy environment (its clock is the CPU thread's clock).
        scheduler: policy and state (:class:`sim.engines.sglang.policy.scheduler.Scheduler`).
        stream: the device stream forwards are enqueued on.
        costs: phase and forward durations.
        gpu_jitter, cpu_jitter: per-step multiplicative noise.
        forward_extra_s: device time added to every forward (the FutureMap resolve under
            ``overlap``; 0 otherwise).
        faults: release faults of this path (:func:`sim.engines.sglang.rules.loop_rules.setting_faults`); one with
            ``sim: {die_on_batch_min_reqs: N}`` kills the server when the result of a batch of
            N or more requests is relayed, at the end of its forward.
        blocking_forward: the forward runs on the scheduler's thread (SGLang's CPU engine): the
            launch returns only when it has ended (:attr:`sim.engines.sglang.server.Server.blocking_forward`).
        after_wait_scale: multiplies the CPU phases from a blocking result wait (a :meth:`sync`
            that waited) to the end of the next :meth:`launch` (``costs.cpu.after_wait_scale``:
            a phase right after a wait costs more, measured on SGLang's real scheduler).
        grammar: structured output's costs (:class:`sim.engines.sglang.structured.GrammarCosts`;
            None: no request carries a grammar). ``delay_sample``: the loop fills a batch's mask
            after processing the previous result (:meth:`sample`, ``event_loop_overlap``), else
            inside :meth:`launch`, right after the forward is enqueued.
    """

    def __init__(self, env: simpy.Environment, scheduler: Scheduler, stream: DeviceStream, costs: CostModel,
                 gpu_jitter: Jitter, cpu_jitter: Jitter, recorder: TraceRecorder, forward_extra_s: float = 0.0,
                 faults: tuple = (), external_arrival_s=None, blocking_forward: bool = False,
                 after_wait_scale: float = 1.0, grammar=None, delay_sample: bool = False):
        self.env = env
        self.scheduler = scheduler
        self.stream = stream
        self.costs = costs
        self.gpu_jitter = gpu_jitter
        self.cpu_jitter = cpu_jitter
        # jitter is drawn only where it has a spread (a factor of exactly 1.0 changes nothing):
        # the phases below skip the call otherwise, one of the hot path's savings
        self._gpu_noisy = gpu_jitter.cv > 0
        self._cpu_noisy = cpu_jitter.cv > 0
        self.recorder = recorder
        self.forward_extra_s = forward_extra_s
        self.blocking_forward = blocking_forward
        self.after_wait_scale = after_wait_scale
        self._cold = 1.0  # after_wait_scale from a blocking wait to the end of the next launch, else 1
        self._die_fault = next((f for f in faults if "die_on_batch_min_reqs" in f.sim), None)
        self._wakeup: simpy.Event | None = None
        self._was_idle = False
        self._external = None if external_arrival_s is None else external_arrival_s.tolist()
        self._num_submitted = 0
        self.horizon = self._external[0] if self._external else math.inf
        self.leap = None  # sim.engines.sglang.leap.Leap, set by the run where its loop can leap
        self.pulled: PulledArrivals | None = None  # the open loop's arrivals, where the loop pulls them
        self.grammar = grammar
        self.delay_sample = delay_sample

    # --- handing control to SimPy (or to the pulled arrivals) -----------------------------------
    def pull_arrivals(self) -> None:
        """The open loop's arrivals (``external_arrival_s``) are submitted by the loop itself
        (:class:`sim.model.workload.PulledArrivals`, the same order as their SimPy process), not by
        a process of their own: call instead of starting that process, before the run."""
        self.pulled = PulledArrivals(self._external, self.submit)

    @property
    def sim_now(self) -> float:
        """SimPy's clock (``env.now``), or where the loop's yields would have set it when the
        arrivals are pulled."""
        return self.env.now if self.pulled is None else self.pulled.clock

    def catch_up(self, now: float):
        """Hand control to SimPy up to ``now`` (another process may submit a request by then),
        for ``yield from``; pulled arrivals are submitted instead, and nothing is yielded."""
        if self.pulled is None:
            yield self.env.timeout(now - self.env.now)
        else:
            self.pulled.advance(now - self.pulled.clock)

    def idle_until(self, until: float):
        """Nothing to run: SimPy catches up to ``until``, then the loop waits for the next arrival
        (:meth:`wait_arrival`); for ``yield from``, returning the clock then."""
        if self.pulled is None:
            yield self.env.timeout(until - self.env.now)
            yield self.idle()
            return self.env.now
        self.pulled.advance(until - self.pulled.clock)
        yield from self.wait_arrival()
        return self.pulled.clock

    def wait_arrival(self):
        """Wait for the next arrival (:meth:`idle`'s event), for ``yield from``; with pulled
        arrivals, the clock moves to when that event would have fired."""
        pulled = self.pulled
        if pulled is None:
            yield self.idle()
            return
        self._was_idle = True
        nxt = self.scheduler.next_arrival_s()
        if nxt is not None:  # (idle's timeout)
            pulled.advance(max(0.0, nxt - pulled.clock))
        elif pulled.wait() is None:  # no request left to arrive: the run stalls here, as SimPy's would
            yield from self.land()
            yield self.env.event()

    def end(self, now: float):
        """The loop ends with the CPU thread's clock at ``now``: SimPy's clock goes there (if later),
        for ``yield from``."""
        if self.pulled is None:
            yield self.env.timeout(max(0.0, now - self.env.now))
            return
        self.pulled.advance(max(0.0, now - self.pulled.clock))
        yield from self.land()

    def land(self):
        """SimPy's clock to the pulled arrivals' exactly (a timeout whose delay is nudged by ulps
        until ``env.now + delay`` is that float), for ``yield from``; the run's simulated time and
        anything after the loop read it."""
        env, target = self.env, self.pulled.clock
        delay = target - env.now
        while env.now + delay < target:
            delay = math.nextafter(delay, math.inf)
        while env.now + delay > target:
            delay = math.nextafter(delay, -math.inf)
        yield env.timeout(delay)

    def submit(self, rid: int, arrival_s: float) -> None:
        """A request is sent to the server (workload side); wakes an idle scheduler."""
        self.scheduler.submit(rid, arrival_s)
        self.recorder.arrival(rid, arrival_s)
        self._submitted(1)

    def submit_range(self, first_rid: int, count: int, arrival_s: float) -> None:
        """:meth:`submit` of requests ``first_rid .. first_rid + count - 1``, in order, all sent at
        ``arrival_s`` (a closed loop's clients whose requests finished together)."""
        self.scheduler.submit_range(first_rid, count, arrival_s)
        self.recorder.arrivals(first_rid, count, arrival_s)
        self._submitted(count)

    def _submitted(self, count: int) -> None:
        """``count`` more requests were sent: the open loop's next arrival is the horizon, and an
        idle scheduler wakes."""
        self._num_submitted += count
        if self._external is not None:
            ext = self._external
            self.horizon = ext[self._num_submitted] if self._num_submitted < len(ext) else math.inf
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    def recv(self, at: float | None = None) -> float:
        """``recv_requests`` at ``at`` (default: now): drain arrived requests. Returns the CPU time."""
        at = self.env.now if at is None else at
        n_new = self.scheduler.recv(at)
        self._recv_start = at
        dur = self.costs.recv_s(n_new)
        if self._cpu_noisy:
            dur *= self.cpu_jitter()
        self._recv_s = dur = dur * self._cold
        return dur

    def schedule(self, at: float) -> tuple[Batch | None, float]:
        """``get_next_batch_to_run`` starting at ``at`` (right after :meth:`recv`).
        Returns (batch or None, CPU time)."""
        try:
            batch = self.scheduler.get_next_batch()
        except ServerDied as err:
            err.time_s = at if err.time_s is None else err.time_s
            raise
        if batch is None:
            return None, 0.0
        dur = self.costs.schedule_s(batch.kind, batch.num_reqs, batch.num_tokens, batch.sum_ctx)
        if self._cpu_noisy:
            dur *= self.cpu_jitter()
        dur *= self._cold
        batch.recv_start = self._recv_start
        batch.schedule_start = at
        batch.schedule_end = batch.launch_start = at + dur
        batch.after_idle = self._was_idle
        sched = self.scheduler
        batch.num_running = sched.n_running
        batch.num_queued = len(sched.waiting) + (sched.chunked_req is not None)
        self._was_idle = False
        return batch, dur

    def recv_and_schedule(self, at: float | None = None) -> tuple[Batch | None, float]:
        """:meth:`recv` then :meth:`schedule` from ``at`` (default: now); returns (batch or None,
        their CPU time)."""
        at = self.env.now if at is None else at
        sched = self.scheduler
        if sched.inbox and not self._cpu_noisy and (batch := sched.admit_lone_arrival(at)) is not None:
            # one request admitted whole at an empty queue (the policy's admit_lone_arrival): recv
            # and schedule priced as :meth:`recv` and :meth:`schedule` price them, the same floats
            c, cold = self.costs, self._cold
            self._recv_start = batch.recv_start = at
            self._recv_s = recv_s = c.recv_s(1) * cold
            batch.schedule_start = start = at + recv_s
            sched_s = c.schedule_s(EXTEND, 1, batch.num_tokens, batch.sum_ctx) * cold
            batch.schedule_end = batch.launch_start = start + sched_s
            batch.after_idle = self._was_idle
            batch.num_running = sched.n_running
            batch.num_queued = 0
            self._was_idle = False
            return batch, recv_s + sched_s
        recv_s = self.recv(at)
        batch, sched_s = self.schedule(at + recv_s)
        return batch, recv_s + sched_s

    def launch(self, batch: Batch, at: float) -> float:
        """The CPU part of ``run_batch`` starting at ``at``; the forward is enqueued on the device
        when it ends. Returns the CPU time, plus, where the cost model has a submission block
        (MLX's ``mx.async_eval`` back-pressure, :meth:`sim.model.costs.CostModel.submit_s`), the wait
        until that long after the forward started (``launch_end`` stays at the end of the CPU
        part; the wait shows as a gap before the next phase). Where the forward runs on the
        scheduler's thread (:attr:`blocking_forward`), the launch returns when it has ended."""
        c = self.costs
        k, n, tok, ctx = batch.kind, batch.num_reqs, batch.num_tokens, batch.sum_ctx
        dur = c.launch_s(k, n, tok, ctx)
        if self._cpu_noisy:
            dur *= self.cpu_jitter()
        dur *= self._cold
        self._cold = 1.0
        batch.launch_start = at
        batch.launch_end = at + dur
        forward = c.forward_s(k, n, tok, ctx, batch.attn_pairs)
        if self._gpu_noisy:
            forward *= self.gpu_jitter()
        forward += self.forward_extra_s
        eager = c.eager_share(k, tok)
        if eager > 0.0:  # an eager CUDA prefill: its last `eager` of the launch queues the kernels one by one
            end = at + dur
            self.stream.enqueue_eager(batch, end - dur * eager, end, forward)
        else:
            self.stream.enqueue(batch, at + dur, forward)
        if batch.num_grammar and not self.delay_sample:  # ModelRunner.sample, behind the forward's launch
            end = (batch.forward_end if self.blocking_forward else at + dur) + self._mask_s(batch)
            self.stream.hold(batch, end)
            return end - at
        if self.blocking_forward:  # CPU engine: run_batch returns when the forward is done
            return batch.forward_end - at
        # MLX: the submission returns only once the device is near the end of this forward
        return launch_return(dur, c.submit_s(k, n, tok, ctx), batch.forward_start, forward, at)

    def sample(self, batch: Batch, at: float) -> float:
        """``launch_batch_sample_if_needed`` from ``at`` (``event_loop_overlap`` with a grammar
        in ``batch``): the mask is filled now, after the previous result was processed, and the
        batch's sampling waits for it. Returns the CPU time."""
        dur = self._mask_s(batch)
        self.stream.hold(batch, at + dur)
        return dur

    def _mask_s(self, batch: Batch) -> float:
        """The mask's CPU time and, where the sampler runs on the scheduler's thread (the CPU
        engine), the masked sampler's extra time."""
        dur = self.grammar.mask_s(batch.num_grammar)
        if self.blocking_forward:
            dur += self.grammar.sample_s(batch.num_grammar)
        if self._cpu_noisy:
            dur *= self.cpu_jitter()
        return dur

    def sync(self, batch: Batch, at: float | None = None) -> float:
        """Block on ``batch``'s forward (``copy_done.synchronize()``) from ``at`` (default: now).
        Returns the wait (:meth:`wait` as a duration)."""
        at = self.env.now if at is None else at
        return self.wait(batch, at) - at

    def wait(self, batch: Batch, at: float) -> float:
        """Block on ``batch``'s forward (``copy_done.synchronize()``) from ``at``; returns the CPU
        thread's clock when it returns: when the results are ready (the forward's end plus
        ``sync_latency_s``), or ``at`` if they already were. :meth:`sync` as a clock."""
        batch.sync_start = at
        ready = batch.forward_end if batch.forward_end >= batch.mask_end else batch.mask_end
        ready += self.costs.sync_latency_s
        if ready > at:
            if ready - at >= AFTER_WAIT_MIN_S:
                self._cold = self.after_wait_scale
            return ready
        return at

    def result_wait_s(self, batch: Batch, at: float) -> float:
        """How long a host that waits for ``batch``'s results at ``at`` blocks: until its forward
        ended plus the cost model's ``sync_latency_s`` (s, >= 0)."""
        ready = batch.forward_end + self.costs.sync_latency_s
        return ready - at if ready > at else 0.0

    def process(self, batch: Batch, at: float | None = None) -> float:
        """``process_batch_result`` from ``at`` (default: now): deliver tokens, finish requests,
        free KV. Tokens reach the clients when the phase ends. Returns the CPU time."""
        now = self.env.now if at is None else at
        if self._die_fault is not None:
            self.check_faults(batch, now)
        dur = self.costs.process_s(batch.kind, batch.num_reqs, batch.num_tokens, batch.sum_ctx)
        if batch.num_grammar:  # each constrained request's grammar accepts its token
            dur += self.grammar.accept_s(batch.num_grammar if batch.kind == DECODE else
                                         sum(c[0].grammar for c in batch.chunks if c[2]))
        if self._cpu_noisy:
            dur *= self.cpu_jitter()
        dur *= self._cold
        batch.process_start = now
        batch.process_end = now + dur
        self.scheduler.process_batch_result(batch, now + dur)
        self.recorder.step(batch)
        return dur

    def check_faults(self, batch: Batch, at: float | None = None) -> None:
        """Apply a release fault to a batch whose result is about to be used at ``at``.

        Raises:
            ServerDied: the fault kills the server on this batch (e.g. the MLX FutureMap relay
                in ``event_loop_normal`` at v0.5.22 on a batch of two or more requests).
        """
        f = self._die_fault
        if f is not None and batch.num_reqs >= f.sim["die_on_batch_min_reqs"]:
            grounds = f"; a release rule's prediction: {f.source}" if f.source else ""
            raise ServerDied(f"{f.id}: batch {batch.seq} ({batch.num_reqs} requests): {f.sim.get('message', f.text)}"
                             f"{grounds}", self.env.now if at is None else at)

    def idle(self) -> simpy.Event:
        """Nothing to run: an event that fires when the next request arrives."""
        self._was_idle = True
        nxt = self.scheduler.next_arrival_s()
        if nxt is not None:
            return self.env.timeout(max(0.0, nxt - self.env.now))
        self._wakeup = self.env.event()
        return self._wakeup
