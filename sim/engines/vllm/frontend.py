"""The API server process in front of the engine core (vLLM 0.32.0): where a request waits before
the engine sees it, and where a token waits after the engine core has produced it.

The OpenAI server (``vllm/entrypoints/openai/api_server.py``) runs one asyncio event loop with
``AsyncLLM`` (``vllm/v1/engine/async_llm.py``): a request's HTTP handling,
``OpenAIServingCompletion.create_completion``, the input processor and ``add_request`` (the
ZMQ send to the engine core's input thread) run on it; so does ``output_handler``, which takes
each step's outputs from the engine core (``get_output_async``), runs
``OutputProcessor.process_outputs`` and hands each request's tokens to its streaming response.

Modelled (:class:`ApiServer`), from what the calibration measured (``vllm.frontend_in``,
``vllm.frontend_out``, :func:`calibrate.real.vllm.trace.frontend_samples`):

- **in**: a request's handler takes a fixed latency ``L`` plus its share of the event loop: the
  handlers of requests sent together interleave at their ``await`` points, so they are served
  side by side (processor sharing) with ``w`` seconds of work each. They then reach the engine
  core **one at a time**, ``w`` apart: the renderer tokenizes prompts on a pool of
  ``renderer_num_workers`` threads, one by default (``BaseRenderer.__init__``,
  ``vllm/renderers/base.py``, ``ModelConfig.renderer_num_workers``), so the handlers leave the
  API server in turn. Measured in nearly every burst of the calibration and validation
  sessions (bursts of 2 to 16 requests sent to an idle server): the first request reaches
  ``EngineCore.add_request`` alone, 5-37 ms after the send, and the engine core prefills it
  alone; the others arrive during that prefill and are added together at the next step
  boundary (c8-len: 1 request of 128 tokens, then 7 of 128 with it decoding). The exceptions
  seen: a load's very first burst, now and then, all added at once. So the first of
  a burst of n reaches the input queue ``L + n w`` after the send, the i-th ``(i - 1) w`` after
  the first. ``L`` and ``w`` are the line through the measured latencies of a lone request
  (``frontend_in(1) = L + w``) and of the first of the largest measured burst
  (``frontend_in(n) = L + n w``); the spacing of the others is not measured on its own (the
  engine core adds them at a step boundary, which hides when each arrived): ``w`` is an
  assumption, and what it moves (whether a burst's tail joins the second prefill step or a
  later one) depends only on its being shorter than the first request's prefill step.
- **out**: a step's tokens reach the clients ``frontend_out(num_reqs)`` after its
  ``update_from_output`` ends when the API server is free; of that, ``frontend_work(num_reqs)``
  (``OutputProcessor.process_outputs``, timed by the tracer in the API server) is the event
  loop's own work, which the steps' outputs take one after the other (FIFO), and the rest a
  latency they pass through side by side (the ZMQ trip, the wait for the event loop, the HTTP
  stream). A step's outputs are done at ``max(update end + latency, the previous step's done)
  + work``. Measured on 4 December 2026: ``process_outputs`` 0.1-0.7 ms a step, against
  ``frontend_out`` 1.5-3.6 ms (one worker) and 3-21 ms (two tensor-parallel workers on the same
  two cores, the API server starved): taken whole in turn, that latency capped the simulated
  server at one step per ``frontend_out``, which the real one was not. A profile without
  ``frontend_work`` takes all of ``frontend_out`` in turn (the model before the curve). The work
  of a step of more than 128 requests is that of its slices (``AsyncLLM.output_handler`` calls
  ``process_outputs`` once per ``VLLM_V1_OUTPUT_PROC_CHUNK_SIZE`` = 128 outputs, yielding the
  event loop between them: :data:`sim.engines.vllm.costs.OUTPUT_CHUNK`).
  Beyond the largest step the output curves were measured at, a step's outputs are priced as
  that largest step's (:meth:`sim.engines.vllm.costs.VllmProfileCosts.frontend_s`), not by
  extending the edge segment: the composed H200 profile's ``frontend_out`` was kept only to 4
  requests until 6 December 2026 (three points, an artifact of the load's client: docs/vllm.md),
  and its edge segments, 0.43 ms a request under ``sync`` and 0.08 under ``async``, put a step of
  256 requests at 112 and 23 ms, a bottleneck of the API server that differed between the
  settings by the noise of three points and made async scheduling look 4-5x better at high
  concurrency (public A/B runs on H100 and A100 measure 1.1-1.3x); its host file now measures the
  output side to 256 requests. Such steps count as priced beyond the data (:mod:`sim.model.reach`,
  the verdict's extrapolated and far shares), so the answer says it rests on them.

  Beyond the largest burst ``frontend_in`` was measured at (``n``), a pool of more requests
  extends the line ``L + k w`` past its data: :class:`ApiServer` counts the requests that enter
  a pool of more than ``n`` and the largest pool, and the run warns of them
  (``frontend_in_beyond``, ``frontend_in_pool`` in its summary; the steps' reach does not count
  them: they are requests, not steps). A closed loop of more clients than ``n`` starts with such
  a burst, its first sends.

Simplifications, stated: the two directions do not slow each other (one event loop in the real
server); the latencies are measured end to end from the client, so they include the trips
through ZMQ and the loopback HTTP connection; the API server shares a core with the engine core
on the CPU build (vLLM pins the worker to one core, the rest float), and that contention is in
the engine core's measured phases, not added here. A profile without these curves (calibrated
before they existed) gives a front end of zero cost: a request reaches the input queue when it
is sent, a token the client when ``update_from_output`` ends.
"""

from __future__ import annotations

from typing import Callable

import simpy

EPS_S = 1e-12  # work left below this is done (float sums)


class ApiServer:
    """The API server's event loop: requests in (processor sharing, then one at a time through
    the renderer), step outputs out (FIFO).

    Args:
        env: the SimPy environment.
        costs: a vLLM cost model with ``frontend_s(kind, num_reqs)`` (seconds; ``kind`` "in" or
            "out"), ``frontend_in_line()`` -> ``(L, w)`` seconds and ``frontend_in_edge()`` -> the
            largest burst measured (requests; None: none).
        enqueue: ``enqueue(rid, at_engine_s, sent_s)``, called when a request reaches the engine
            core's input queue.
    """

    def __init__(self, env: simpy.Environment, costs, enqueue: Callable[[int, float, float], None]):
        self.env, self.costs, self.enqueue = env, costs, enqueue
        self.latency_s, self.work_s = costs.frontend_in_line()
        edge = costs.frontend_in_edge()
        self.measured_to = edge if edge is not None else float("inf")  # the largest burst measured (requests)
        self.most_in_pool = 0  # the most requests the pool held at once
        self.entered_beyond = 0  # requests that entered a pool of more than measured_to
        self.free_s = 0.0  # when the output side has finished every step charged so far (s)
        self._left_s = -float("inf")  # when the last request left the API server (s)
        self._jobs: dict[int, list[float]] = {}  # rid -> [work left s, sent s]
        self._entering: dict[int, float] = {}  # rid -> when it enters the pool (s), for the requests on their way
        self._last_s = 0.0
        self._changed: simpy.Event | None = None
        if self.work_s > 0:
            env.process(self._serve_requests())

    # --- in ------------------------------------------------------------------------------
    def ingress(self, rid: int, send_s: float) -> None:
        """A client sends request ``rid`` at ``send_s`` (now or later): it reaches the engine
        core's input queue after ``L`` and its share of the event loop."""
        if self.work_s <= 0:
            self.enqueue(rid, send_s + self.latency_s, send_s)
            return
        self.env.process(self._arrive(rid, send_s))

    def _arrive(self, rid: int, send_s: float):
        enter = self._entering[rid] = send_s + self.latency_s
        if enter > self.env.now:
            yield self.env.timeout(enter - self.env.now)
        del self._entering[rid]
        self._advance()
        self._jobs[rid] = [self.work_s, send_s]
        held = len(self._jobs)
        if held > self.most_in_pool:
            self.most_in_pool = held
        if held > self.measured_to:  # its handler shares the loop with more than were measured
            self.entered_beyond += 1
        self._poke()

    def earliest_enqueue_s(self) -> float:
        """A time (s) before which the API server hands no request it holds to the engine core's
        input queue: each request on its way enters at its time and needs its work at least
        (processor sharing finishes none sooner), each in the pool its work left from the last
        change; inf when it holds none (or has no work: a request is in the input queue from its
        send). The leap of :mod:`sim.engines.vllm.leap` runs the engine core's iterations up to it."""
        if self.work_s <= 0:
            return float("inf")
        bound = min(self._entering.values()) + self.work_s if self._entering else float("inf")
        if self._jobs:
            bound = min(bound, self._last_s + min(job[0] for job in self._jobs.values()))
        return bound

    def _advance(self) -> None:
        """Every job in the pool got an equal share of the time since the last change."""
        now = self.env.now
        if self._jobs:
            share = (now - self._last_s) / len(self._jobs)
            for job in self._jobs.values():
                job[0] -= share
        self._last_s = now

    def _poke(self) -> None:
        if self._changed is not None and not self._changed.triggered:
            self._changed.succeed()

    def _serve_requests(self):
        while True:
            self._changed = self.env.event()
            if not self._jobs:
                yield self._changed
                continue
            left = min(job[0] for job in self._jobs.values())
            yield self._changed | self.env.timeout(max(left, 0.0) * len(self._jobs))
            self._advance()
            for rid in [r for r, job in self._jobs.items() if job[0] <= EPS_S]:
                _, sent = self._jobs.pop(rid)
                self._left_s = max(self.env.now, self._left_s + self.work_s)  # one at a time
                self.enqueue(rid, self._left_s, sent)

    # --- out -----------------------------------------------------------------------------
    def egress(self, update_end_s: float, num_reqs: int) -> float:
        """A step's outputs for ``num_reqs`` requests, out of ``update_from_output`` at
        ``update_end_s``: when its tokens reach the clients (s). Charged in call order (steps
        end in order); a step of no cost passes at once."""
        deliver, self.free_s = self.egress_time(update_end_s, num_reqs, self.free_s)
        return deliver

    def egress_time(self, update_end_s: float, num_reqs: int, free_s: float) -> tuple[float, float]:
        """:meth:`egress` with the output side free at ``free_s``, changing nothing: (when the
        step's tokens reach the clients, when the output side is free after it), seconds."""
        return self.egress_after(self.egress_terms(num_reqs), update_end_s, free_s)

    @staticmethod
    def egress_after(terms: tuple[float, float] | None, update_end_s: float, free_s: float) -> tuple[float, float]:
        """:meth:`egress_time` of a step whose :meth:`egress_terms` are ``terms`` (the leap keeps
        them for a run's batch size): (when its tokens reach the clients, when the output side is
        free after it), seconds."""
        if terms is None:
            return update_end_s, free_s
        wait, work = terms
        free_s = max(update_end_s + wait, free_s) + work
        return free_s, free_s

    def egress_terms(self, num_reqs: int) -> tuple[float, float] | None:
        """A step's output for ``num_reqs`` requests: (the latency before the event loop's own
        work on it, that work), seconds; None when the output costs nothing (it passes at once)."""
        cost = self.costs.frontend_s("out", num_reqs)
        if cost <= 0.0:
            return None
        work = min(self.costs.frontend_s("work", num_reqs), cost)
        return cost - work, work
