"""The worker process's phases (vLLM 0.32.0: ``WorkerProc.worker_busy_loop``,
``v1/executor/multiproc_executor.py:1037``; the model runner's ``execute_model`` and
``sample_tokens``, ``v1/worker/gpu_model_runner.py:3940``/``4304``, which the CPU runner subclasses).

The worker runs the RPCs of the engine core in order, on its own core:

- ``execute_model``: input preparation (``_update_states``, ``_prepare_inputs``: :meth:`Worker.prepare`),
  then the model forward (:meth:`Worker.forward`). On the CPU platform the forward is the worker's
  own compute (``server.device: cpu``): the call returns when it ends. On a GPU the forward is
  enqueued on the device stream and the call returns at once; the device runs it in order.
- ``sample_tokens`` (:meth:`Worker.sample`): synchronously it is a second RPC that the engine core
  sends when ``execute_model``'s None reply reaches it (``vllm.roundtrip`` later); under async
  scheduling it was sent right behind ``execute_model`` and the worker takes it from its queue
  (``vllm.pickup``, as it takes a next step's ``execute_model`` that was queued before it was
  free: :meth:`Worker.pickup`). Its output is ready when its CPU part has
  ended and (on a GPU) the forward has ended; it is back in the engine core ``vllm.collect`` later.
- A step with no scheduled token only updates the worker's state (``execute_model`` returns
  ``EMPTY_MODEL_RUNNER_OUTPUT``; no forward, no ``sample_tokens``).

Costs from the cost model (:mod:`sim.engines.vllm.costs`), times per-step jitter.
"""

from __future__ import annotations

from sim.engines.vllm.speculative import draft_passes_s
from sim.model.batch import Batch
from sim.model.costs import DECODE, Jitter
from sim.model.device import DeviceStream


class Worker:
    """The worker's phases over the device stream.

    Args:
        costs: a vLLM cost model.
        stream: the in-order device stream the forwards run on (the worker's core on CPU).
        gpu_jitter, cpu_jitter: per-step multiplicative noise of the forward and of the CPU phases.
        blocking_forward: the forward occupies the worker (the CPU platform).
        async_scheduling: ``sample_tokens`` follows ``execute_model`` without a round trip.
        shared_prefix_block_size: the KV block size when the workload's cached prefixes are one
            shared prefix (``prefix_sharing: shared``); 0: each request's own.
        speculative: the server's :class:`sim.engines.vllm.speculative.Speculative` (None: plain
            decoding): each forward that samples is followed by the drafts' passes.
    """

    def __init__(self, costs, stream: DeviceStream, gpu_jitter: Jitter, cpu_jitter: Jitter,
                 blocking_forward: bool, async_scheduling: bool, shared_prefix_block_size: int = 0,
                 speculative=None):
        self.costs = costs
        self.spec = speculative
        # a shared prefix is priced only when the workload's prefixes are shared and the profile
        # measured a saving; then the block size turns hit blocks into tokens
        self.shared_block_size = shared_prefix_block_size if costs.shared_prefix_saving else 0
        self.split_mixed = costs.mixed_sum_of_parts  # a mixed step is priced by its parts
        self.stream = stream
        self.gpu_jitter = gpu_jitter
        self.cpu_jitter = cpu_jitter
        self.blocking_forward = blocking_forward
        self.async_scheduling = async_scheduling
        self.waiting = False  # waiting for the engine core's next RPC (worker_loop; the leap reads it)

    def prepare(self, step: Batch) -> float:
        """CPU time of ``execute_model`` before the forward (the whole call for an empty step)."""
        return self.costs.phase_s("prepare", step.num_reqs) * self.cpu_jitter()

    def forward(self, step: Batch, at: float) -> float:
        """Start the model forward at ``at`` (sets ``forward_start``/``forward_end``). Returns how
        long the worker is held: the forward itself on the CPU platform, 0 on a GPU."""
        shared = self.shared_kv(step) if self.shared_block_size and step.kind == DECODE else 0
        decode_reqs = decode_sum_ctx = decode_tokens = 0
        if self.split_mixed and step.kind != DECODE:  # the requests that run one token plus their drafts
            for entry in step.chunks:  # (req, new, computed, samples, drafts)
                if entry[1] == 1 + entry[4]:
                    decode_reqs += 1
                    decode_tokens += entry[1]
                    decode_sum_ctx += entry[2] + entry[1]
        verify = self.spec is not None and step.kind == DECODE  # every request: one token plus its drafts
        dur = self.costs.forward_s(step.kind, step.num_reqs, step.num_tokens, step.sum_ctx, shared,
                                   decode_reqs, decode_sum_ctx, decode_tokens, verify=verify)
        if self.spec is not None:
            dur += self.draft_s(step, dur)
        dur *= self.gpu_jitter()
        self.stream.enqueue(step, at, dur)
        return step.forward_end - at if self.blocking_forward else 0.0

    def draft_s(self, step: Batch, verify_s: float) -> float:
        """Device time of the drafts after a forward of ``verify_s`` seconds
        (:func:`sim.engines.vllm.speculative.draft_passes_s`): the first pass of the step's shape,
        then k - 1 one-token passes over its sampling requests at their contexts; 0 when none
        samples."""
        m = ctx = 0
        for entry in step.chunks:
            if entry[3]:
                m += 1
                ctx += entry[2] + entry[1]
        if not m:
            return 0.0
        one_pass = self.costs.forward_s(DECODE, m, m, ctx, count=False) if self.spec.num_speculative_tokens > 1 \
            else 0.0
        return draft_passes_s(self.spec.num_speculative_tokens, self.spec.draft_cost_ratio, verify_s, one_pass)

    def pickup(self, step: Batch, queued: bool) -> float:
        """Async scheduling: the worker taking ``step``'s ``execute_model`` RPC when it was already
        queued (``queued``; one that arrives while the worker waits is inside ``dispatch``)."""
        return self._pickup_s(step) if self.async_scheduling and queued else 0.0

    def _pickup_s(self, step: Batch) -> float:
        return self.costs.pickup_s(step.num_reqs) * self.cpu_jitter()

    def shared_kv(self, step: Batch) -> int:
        """Tokens of ``step``'s contexts that repeat the shared prefix another of its requests
        holds: (m - 1) p for the m requests with a prefix-cache hit, p the smallest hit (tokens).
        Used for decode steps only: the saving was measured on decode steps, and a prefill's
        queries reuse what they read of the prefix anyway."""
        return self.shared_of([entry[0].num_hit_blocks for entry in step.chunks if entry[0].num_hit_blocks])

    def shared_of(self, hits: list[int]) -> int:
        """:meth:`shared_kv` of a decode step whose requests with a prefix-cache hit hold ``hits``
        blocks each (tokens; 0 unless prefixes are shared and two requests hit)."""
        return (len(hits) - 1) * min(hits) * self.shared_block_size if len(hits) > 1 and self.shared_block_size else 0

    def roundtrip(self, step: Batch) -> float:
        """Between ``execute_model`` and ``sample_tokens``: synchronously the None reply's round
        trip to the engine core (``vllm.roundtrip``); under async scheduling the pickup of the
        ``sample_tokens`` RPC queued behind it (``vllm.pickup``)."""
        if self.async_scheduling:
            return self._pickup_s(step)
        return self.costs.phase_s("roundtrip", step.num_reqs) * self.cpu_jitter()

    def sample(self, step: Batch) -> float:
        """CPU time of ``sample_tokens``; with speculative decoding, when a request of the step
        samples, the drafter's host work too (``propose_draft_token_ids`` runs inside it after
        sampling, ``gpu_model_runner.py:4395``; its passes are in :meth:`draft_s`)."""
        t = self.costs.phase_s("sample", step.num_reqs)
        if step.num_grammar:  # apply_grammar_bitmask before sampling
            t += self.costs.grammar.apply_s(step.num_grammar)
        if self.spec is not None and any(entry[3] for entry in step.chunks):
            t += self.costs.draft_host_s(step.num_reqs, self.spec.num_speculative_tokens)
        return t * self.cpu_jitter()

    def output_back_s(self, step: Batch, at: float) -> float:
        """When the output of ``step``, whose ``sample_tokens`` (or empty ``execute_model``) ended
        at ``at``, is back in the engine core (s): after the forward, plus ``vllm.collect``."""
        ready = max(at, step.forward_end) if step.num_reqs else at
        return ready + self.costs.phase_s("collect", step.num_reqs) * self.cpu_jitter()
