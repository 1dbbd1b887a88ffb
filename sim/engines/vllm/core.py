"""The engine core process's phases, as the loops call them (vLLM 0.32.0, ``vllm/v1/engine/core.py``).

Each phase applies its effect to the scheduler state, stamps the step's timeline and returns how
long the engine core's thread is busy with it (seconds); the loop yields that time to SimPy.

- :meth:`EngineCore.add_requests`: ``_process_input_queue`` (l.1573) draining the requests that
  arrived into ``Scheduler.add_request``; a prompt of ``max_model_len`` tokens or more is
  rejected before it reaches the engine (the API server's ``get_max_tokens``,
  ``entrypoints/serve/utils/api_utils.py:169``), which also caps ``max_tokens`` at
  ``max_model_len - prompt``.
- :meth:`EngineCore.schedule`: ``Scheduler.schedule`` (:mod:`sim.engines.vllm.policy.scheduler`).
- :meth:`EngineCore.dispatch`: the ``execute_model`` RPC to the worker (and, under async
  scheduling, ``sample_tokens`` right behind it); the step reaches the worker when it ends.
- :meth:`EngineCore.send` / :meth:`EngineCore.result`: the RPC handed to the worker process, and
  ``future.result()``: an event whose value is when the worker's output is back.
- :meth:`EngineCore.update`: ``Scheduler.update_from_output``; tokens reach clients when the API
  server has handled the step's outputs (:mod:`sim.engines.vllm.frontend`), and requests reach the
  input queue when it has handled them.

Timeline columns of a step (:mod:`sim.trace.recorder`): ``recv_start`` the input drain,
``schedule_*`` ``Scheduler.schedule``, ``launch_*`` the dispatch, ``forward_*`` the model forward
(the worker, or the GPU), ``sync_start`` when the engine core began to wait for the output,
``process_*`` ``update_from_output``. The worker's own ``prepare`` and ``sample`` are not columns:
they show as the gap between forwards. Steps with no scheduled token (sent to the worker all the
same) are not recorded: they run no forward.
"""

from __future__ import annotations

import math

import simpy

from sim.engines.vllm.frontend import ApiServer
from sim.engines.vllm.policy.request import Request
from sim.engines.vllm.policy.scheduler import Scheduler
from sim.model.batch import Batch
from sim.model.costs import Jitter
from sim.model.workload import RequestSpecs

# Arrivals within this of the drain time count as arrived (phase times are float sums).
TIME_EPS_S = 1e-9


class EngineCore:
    """The engine core's thread: inbox, scheduler, and its phases' costs.

    Args:
        env: the SimPy environment.
        scheduler: the policy and state.
        specs: the requests' lengths (``max_new_tokens``: the client's cap; None: ``output_len``).
        warmup_requests: ids below this are warm-up.
        costs: a vLLM cost model (:mod:`sim.engines.vllm.costs`).
        cpu_jitter: per-phase multiplicative noise.
        recorder: receives the recorded steps.
        grammar: which requests carry a grammar (bool per request id; None: none).
    """

    def __init__(self, env: simpy.Environment, scheduler: Scheduler, specs: RequestSpecs, warmup_requests: int,
                 costs, cpu_jitter: Jitter, recorder, grammar=None):
        self.env = env
        self.scheduler = scheduler
        self.specs = specs
        self.warmup_requests = warmup_requests
        self.costs = costs
        self.cpu_jitter = cpu_jitter
        self.recorder = recorder
        self.frontend = ApiServer(env, costs, self._enqueue)
        self.inbox: list[tuple[float, int, float]] = []  # (at the engine s, rid, sent s), in submission order
        self._head = 0
        self._wakeup: simpy.Event | None = None
        self._was_idle = False
        self._drain_start = math.nan
        self._results: dict[int, simpy.Event] = {}
        self.num_requests = len(specs)
        self.grammar = grammar
        self.leap = None  # the run's sim.engines.vllm.leap.Leap (run_vllm sets it), or None: step by step
        self.open_loop_arrival_s = None  # the open loop's send times, in request order (run_vllm sets them)
        self._sent = 0  # requests sent so far

    # --- input ---------------------------------------------------------------------------
    def submit(self, rid: int, arrival_s: float) -> None:
        """A client sends a request at ``arrival_s`` (now or later); it reaches the engine core's
        input queue when the API server has handled it (:meth:`ApiServer.ingress`)."""
        self._sent += 1
        self.recorder.arrival(rid, arrival_s)
        self.frontend.ingress(rid, arrival_s)

    def next_send_s(self) -> float:
        """When the next request not yet sent is sent (s): the open loop's next arrival; inf in a
        closed loop (a client sends when its request finishes, in the engine core's update)."""
        arrivals = self.open_loop_arrival_s
        return float(arrivals[self._sent]) if arrivals is not None and self._sent < len(arrivals) else float("inf")

    def _enqueue(self, rid: int, at_engine_s: float, sent_s: float) -> None:
        """Request ``rid`` (sent at ``sent_s``) reaches the input queue at ``at_engine_s``
        (now or later; in order); wakes an idle core."""
        self.inbox.append((at_engine_s, rid, sent_s))
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    @property
    def all_done(self) -> bool:
        return self.scheduler.num_done >= self.num_requests

    def idle(self) -> simpy.Event:
        """Nothing to do (``_process_input_queue`` blocks on the input queue): an event that fires
        when the next request arrives."""
        self._was_idle = True
        if self._head < len(self.inbox):
            return self.env.timeout(max(0.0, self.inbox[self._head][0] - self.env.now))
        self._wakeup = self.env.event()
        return self._wakeup

    def add_requests(self, at: float) -> float:
        """Drain the requests that arrived by ``at`` into the scheduler. Returns the CPU time."""
        self._drain_start = at
        n = 0
        s, sched = self.specs, self.scheduler
        while self._head < len(self.inbox) and self.inbox[self._head][0] <= at + TIME_EPS_S:
            _, rid, arrival = self.inbox[self._head]
            self._head += 1
            prompt, output = int(s.input_len[rid]), int(s.output_len[rid])
            asked = int(s.max_new_tokens[rid]) if s.max_new_tokens is not None else output
            max_tokens = min(asked, sched.max_model_len - prompt)
            req = Request(rid, arrival, prompt, int(s.cached_len[rid]), min(output, max(max_tokens, 1)),
                          max_tokens, rid < self.warmup_requests)
            req.grammar = self.grammar is not None and bool(self.grammar[rid])
            if max_tokens < 1:
                sched.fail(req, arrival, "too_long")
                continue
            sched.add_request(req)
            n += 1
        return self.costs.phase_s("add_request", n) * self.cpu_jitter() if n else 0.0

    # --- a step --------------------------------------------------------------------------
    def schedule(self, at: float) -> tuple[Batch, float]:
        """``Scheduler.schedule`` from ``at`` (after :meth:`add_requests`). Returns (step, CPU time)."""
        step = self.scheduler.schedule()
        return step, self.stamp_schedule(step, at)

    def stamp_schedule(self, step: Batch, at: float) -> float:
        """``schedule``'s CPU time for ``step`` (drawn), its times from ``at`` stamped on it."""
        dur = self.costs.phase_s("schedule", step.num_reqs) * self.cpu_jitter()
        step.recv_start = self._drain_start
        step.schedule_start = at
        step.schedule_end = at + dur
        step.after_idle = self._was_idle
        self._was_idle = False
        return dur

    def dispatch(self, step: Batch, at: float) -> float:
        """The ``execute_model`` RPC from ``at``; the worker may start the step when it ends."""
        dur = self.costs.phase_s("dispatch", step.num_reqs) * self.cpu_jitter()
        step.launch_start = at
        step.launch_end = at + dur
        return dur

    def send(self, step: Batch, rpcs: simpy.Store) -> None:
        """Hand ``step`` to the worker process (its RPC has arrived there)."""
        done = self._results[step.seq] = self.env.event()
        if step.num_grammar:  # its sample_tokens waits for the bitmask (grammar_bitmask)
            step.mask_ready = self.env.event()
        rpcs.put((step, done))

    def result(self, step: Batch) -> simpy.Event:
        """``future.result()`` from now: an event whose value is the time (s) the worker's output
        for ``step`` is back in the engine core."""
        step.sync_start = self.env.now
        return self._results.pop(step.seq)

    def update(self, step: Batch, at: float) -> float:
        """``Scheduler.update_from_output`` from ``at``: tokens reach the clients when the API
        server has handled the step's outputs (:meth:`ApiServer.egress`). Returns the CPU time."""
        dur = self.update_s(step)
        self.apply_update(step, at, dur)
        return dur

    def update_s(self, step: Batch) -> float:
        """``update_from_output``'s CPU time for ``step`` (drawn)."""
        dur = self.costs.phase_s("update", step.num_reqs)
        if step.num_grammar:  # accept_tokens advancing each constrained request's grammar
            dur += self.costs.grammar.accept_s(step.num_grammar)
        return dur * self.cpu_jitter()

    def apply_update(self, step: Batch, at: float, dur: float, before=None, outputs: bool = True) -> None:
        """The update of ``step`` from ``at``, lasting ``dur`` (s): the API server's output side,
        ``update_from_output`` (``before(deliver_s)`` first, for what the leap brings up to date
        by itself, returning how many requests it finished; ``outputs`` False: nothing else to
        update, the leap's ``before`` did it all), the step recorded with every request finished."""
        step.process_start = at
        step.process_end = at + dur
        deliver = self.frontend.egress(at + dur, step.num_reqs)
        if before is not None:
            finished = before(deliver)
            if outputs:
                finished += self.scheduler.update_from_output(step, deliver)
            step.finished = finished
        elif outputs:
            self.scheduler.update_from_output(step, deliver)
        if step.num_reqs:
            self.recorder.step(step)

    def grammar_bitmask(self, step: Batch):
        """``Scheduler.get_grammar_bitmask`` for ``step`` from now (``scheduler.py:1995``), for a
        loop to ``yield from``: the engine core's CPU time, then the step's ``mask_ready`` (made
        when the step was sent) fires (the worker's ``sample_tokens`` carries the bitmask).
        Nothing for a step with no constrained request."""
        if step.num_grammar:
            yield self.env.timeout(self.costs.grammar.bitmask_s(step.num_grammar) * self.cpu_jitter())
            step.mask_ready.succeed()

    def take_drafts(self, step: Batch) -> float:
        """Synchronous speculative decoding's ``post_step`` (``core.py:693``): the
        ``take_draft_token_ids`` RPC to the worker and ``update_draft_token_ids``. Returns the
        engine core's time: the profile's ``vllm.take_drafts`` where it was measured, else its
        ``vllm.roundtrip`` (another RPC round trip to the idle worker; stated by the scenario's
        warning)."""
        self.scheduler.take_draft_token_ids(step)
        return self.costs.take_drafts_s(step.num_reqs) * self.cpu_jitter()
