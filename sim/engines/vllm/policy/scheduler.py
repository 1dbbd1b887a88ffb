"""vLLM V1's scheduling policy: ``Scheduler.schedule`` for the default FCFS policy, step by step
(vLLM 0.32.0, ``vllm/v1/core/sched/scheduler.py:591``; ``AsyncScheduler`` in
``async_scheduler.py``). No SimPy here.

There is no prefill or decode phase: every request has ``num_computed_tokens`` and
``num_tokens``, and each step gives requests tokens so that the first catches up with the second,
within one token budget (``max_num_batched_tokens``; ``max_num_scheduled_tokens`` defaults to it).

1. RUNNING first, in ``running`` order (l.657): ``num_new = num_tokens + placeholders -
   num_computed``, capped by ``long_prefill_token_threshold`` (0 = off; only when more than one
   request is running or waiting, l.645), the budget, and ``max_model_len - num_computed - 1``
   (l.716); 0 -> skip it. Async scheduling: a request whose in-flight step already reaches
   ``max_tokens`` is skipped (l.668). Then ``allocate_slots``; when it fails, preempt the last
   running request and retry (:mod:`.preemption`); if the request preempted itself, stop the pass.
2. WAITING next (l.899), only in a step that preempted nothing: while budget is left and
   ``len(running) < max_num_seqs``: a preempted request whose stale output is still in flight is
   skipped this step (l.934); prefix-cache hit (whole blocks of the cached prefix); ``num_new =
   num_tokens - hit`` (a resumed request recomputes prompt and output), threshold cap; without
   chunked prefill a request that does not fit the budget stops the pass (l.1161); else it gets
   ``min(num_new, budget)``; ``allocate_slots`` with ``full_sequence_must_fit`` (l.1270) or stop.
3. ``_update_after_schedule`` (l.1616): ``num_computed += scheduled``; ``is_prefill_chunk =
   num_computed < num_tokens + placeholders``; async: each request that is not a prefill chunk
   gets one output placeholder (``AsyncScheduler._update_after_schedule``).

The step is a :class:`sim.model.batch.Batch`: ``chunks`` lists ``(request, num_scheduled_tokens,
num_computed_tokens before the step, samples, drafts scheduled)`` per scheduled request
(``samples``: the step ends its known tokens, so the model runner returns a sampled token for
it). ``kind`` is DECODE when every entry is one sampled token (plus its drafts), else EXTEND (a
step with prefill tokens, mixed or not); ``num_tokens`` and ``sum_ctx`` (sum of ``num_computed +
num_scheduled``) are the step's sizes.

Speculative decoding (``server.speculative``, :mod:`sim.engines.vllm.speculative`): a running
request's drafts (``num_spec_tokens``) count in ``num_new`` (``num_tokens_with_spec``), the drafts
scheduled are those past its known tokens (the entry's fifth field), its blocks cover
``num_lookahead_tokens`` = k more, and async scheduling counts ``1 + drafts`` placeholders and
gives it k placeholder drafts. A step whose every entry samples after one token plus its drafts is
a decode step (the verify).

Results (``update_from_output``) are in :mod:`.results`. Simplifications: FCFS only (no priority
policy), speculative decoding as above only, no structured output, LoRA, multimodal inputs, KV
connectors or pipeline parallelism; see :mod:`.kv_blocks` for the KV cache.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import numpy as np

from sim.engines.vllm.policy.kv_blocks import BlockPool
from sim.engines.vllm.policy.preemption import preempt_request
from sim.engines.vllm.policy.request import RUNNING, Request
from sim.engines.vllm.policy.results import ResultsMixin
from sim.engines.vllm.speculative import AcceptanceDraws
from sim.model.batch import Batch
from sim.model.costs import DECODE, EXTEND


class Scheduler(ResultsMixin):
    """The scheduler's state: waiting queue, running list, KV blocks, finished ids to notify.

    Args:
        server: the scenario's vLLM server section (:class:`sim.engines.vllm.server.VllmServer`;
            its resolved ``block_size``, ``kv_blocks``, ``seqs_limit`` and limits are read).
        async_scheduling: ``AsyncScheduler`` (placeholders for in-flight tokens) or ``Scheduler``.
        recorder: receives finished requests and ITL samples (:class:`sim.trace.recorder.TraceRecorder`).
        on_finish: called as ``on_finish(rid, time_s)`` when a request completes or fails.
        accept_rng: the generator of the accepted-draft draws (speculative decoding; default seed 0).
    """

    def __init__(self, server, async_scheduling: bool, recorder, on_finish: Callable[[int, float], None],
                 accept_rng: np.random.Generator | None = None):
        spec = server.speculative
        self.num_spec_tokens = spec.num_speculative_tokens if spec is not None else 0
        self.num_lookahead_tokens = self.num_spec_tokens  # draft_model / EAGLE / MTP (VllmConfig.num_lookahead_tokens)
        self.accept = AcceptanceDraws(spec, accept_rng if accept_rng is not None else np.random.default_rng(0)) \
            if spec is not None else None
        self.kv = BlockPool(server.kv_blocks, server.resolved_block_size, server.max_model_len)
        self.async_scheduling = async_scheduling
        self.max_num_seqs = server.seqs_limit
        self.max_num_scheduled_tokens = server.max_num_batched_tokens
        self.max_model_len = server.max_model_len
        self.long_prefill_token_threshold = server.long_prefill_token_threshold
        self.enable_chunked_prefill = server.enable_chunked_prefill
        self.enable_prefix_caching = server.enable_prefix_caching
        self.recorder = recorder
        self.on_finish = on_finish
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished_req_ids: set[int] = set()  # finished since the last schedule (sent to the worker)
        self.next_step_seq = 0
        self.num_done = 0
        self.preemption_steps = 0  # steps that preempted
        self.preempted_reqs = 0  # preemptions, summed over steps
        self.recompute_tokens = 0  # tokens scheduled again for preempted requests

    # --- state ---------------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        """``Scheduler.add_request``: a new request joins the tail of the waiting queue."""
        self.waiting.append(req)

    def has_requests(self) -> bool:
        """``Scheduler.has_requests``: unfinished requests, or finished ones the worker has not
        been told of (an engine step runs to tell it)."""
        return bool(self.running or self.waiting or self.finished_req_ids)

    # --- schedule -------------------------------------------------------------------------
    def schedule(self) -> Batch:
        """``Scheduler.schedule``: the next step (``num_reqs == 0``: nothing to run, an empty
        step that still goes to the worker)."""
        step = Batch(self.next_step_seq, DECODE, 0, 0, 0)
        self.next_step_seq += 1
        budget = self.max_num_scheduled_tokens
        threshold = self.long_prefill_token_threshold if len(self.running) + len(self.waiting) > 1 else 0
        preempted = self._schedule_running(step, budget, threshold)
        if not preempted:
            self._schedule_waiting(step, budget - step.num_tokens, threshold)
        else:
            self.preemption_steps += 1
            self.preempted_reqs += len(preempted)
        self._update_after_schedule(step)
        self.finished_req_ids = set()
        return step

    def _schedule_running(self, step: Batch, budget: int, threshold: int) -> list[Request]:
        """The RUNNING pass; returns the requests it preempted. (Written for speed: the request's
        ``num_tokens_with_spec`` and :meth:`_add_entry` inline, and ``allocate_slots`` called only
        when the request's blocks do not already hold its new tokens: there it allocates nothing.)"""
        preempted: list[Request] = []
        running, chunks = self.running, step.chunks
        block_size, lookahead, max_len = self.kv.block_size, self.num_lookahead_tokens, self.max_model_len
        async_scheduling = self.async_scheduling
        num_reqs = num_tokens = sum_ctx = 0
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            i += 1
            computed, placeholders = req.num_computed_tokens, req.num_output_placeholders
            if async_scheduling and placeholders > 0 and \
                    computed + 2 - placeholders >= req.num_prompt_tokens + req.max_tokens:
                continue  # the in-flight step already reaches max_tokens
            num_new = req.num_prompt_tokens + req.num_output_tokens + req.num_spec_tokens + placeholders - computed
            if 0 < threshold < num_new:
                num_new = threshold
            if num_new > budget:  # min(num_new, budget, max_model_len - num_computed - 1)
                num_new = budget
            if num_new > max_len - computed - 1:
                num_new = max_len - computed - 1
            if num_new <= 0:
                continue
            slots = computed + num_new + lookahead
            if slots > max_len:  # (the lookahead's slots are capped at max_model_len: BlockPool.allocate_slots)
                slots = max_len
            if slots > req.num_blocks * block_size and not self._allocate(req, num_new, preempted):
                break  # it preempted itself: the pass stops
            spec = 0
            if req.num_spec_tokens:  # the drafts past its known tokens (l.861); new ones come with the output
                spec = min(req.num_spec_tokens, max(0, num_new + computed - req.num_tokens - placeholders))
                req.num_spec_tokens = 0
            chunks.append([req, num_new, computed, False, spec])  # _add_entry
            num_reqs += 1
            num_tokens += num_new
            sum_ctx += computed + num_new
            budget -= num_new
        step.num_reqs += num_reqs
        step.num_tokens += num_tokens
        step.sum_ctx += sum_ctx
        return preempted

    def _allocate(self, req: Request, num_new: int, preempted: list[Request]) -> bool:
        """``allocate_slots`` for a running request, preempting the last running request until it
        succeeds (appending each to ``preempted``); False when the request preempted itself."""
        while not self.kv.allocate_slots(req, num_new, num_lookahead_tokens=self.num_lookahead_tokens):
            victim = self.running.pop()
            preempt_request(victim, self.kv, self.waiting)
            preempted.append(victim)
            if victim is req:
                return False
        return True

    def _schedule_waiting(self, step: Batch, budget: int, threshold: int) -> None:
        """The WAITING pass (FCFS); skipped requests go back to the front in their order."""
        skipped: list[Request] = []
        while budget > 0 and self.waiting and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if req.num_stale_output_tokens:  # its pre-preemption output is still in flight
                skipped.append(self.waiting.popleft())
                continue
            hit = self.kv.prefix_hit_tokens(req) if self.enable_prefix_caching else 0
            num_new = req.num_tokens - hit
            if 0 < threshold < num_new:
                num_new = threshold
            if not self.enable_chunked_prefill and num_new > budget:
                break
            num_new = min(num_new, budget)
            if not self.kv.allocate_slots(req, num_new, hit, full_sequence_must_fit=True,
                                          num_lookahead_tokens=self.num_lookahead_tokens):
                break
            self.waiting.popleft()
            self.running.append(req)
            if req.num_preemptions:
                self.recompute_tokens += req.num_tokens - hit
            req.status = RUNNING
            req.num_computed_tokens = hit
            self._add_entry(step, req, num_new)
            budget -= num_new
        self.waiting.extendleft(reversed(skipped))

    @staticmethod
    def _add_entry(step: Batch, req: Request, num_new: int, spec: int = 0) -> None:
        step.chunks.append([req, num_new, req.num_computed_tokens, False, spec])
        step.num_reqs += 1
        step.num_tokens += num_new
        step.sum_ctx += req.num_computed_tokens + num_new

    def _update_after_schedule(self, step: Batch) -> None:
        """Advance the computed tokens of what was scheduled; mark sampling entries; async:
        one placeholder per request that is past its prefill, plus one per draft scheduled, and
        (speculative decoding) k placeholder drafts; count the sampling requests under a grammar
        and (async) whether one of them has a token in flight (``pending_structured_output_tokens``,
        ``async_scheduler.py``: its ``sample_tokens`` waits for the previous step's update)."""
        decode = step.num_reqs > 0
        k = self.num_spec_tokens
        async_scheduling = self.async_scheduling
        warmup = grammar = 0
        pending = step.grammar_pending
        for entry in step.chunks:
            req, num_new, spec = entry[0], entry[1], entry[4]
            computed = req.num_computed_tokens = req.num_computed_tokens + num_new
            req.num_in_flight_tokens += num_new
            placeholders = req.num_output_placeholders
            chunk = req.is_prefill_chunk = computed < req.num_prompt_tokens + req.num_output_tokens + placeholders
            if chunk:
                decode = False
                warmup += req.warmup
                continue
            entry[3] = True
            if num_new != 1 + spec:
                decode = False
            warmup += req.warmup
            if req.grammar:  # get_grammar_bitmask's rows; AsyncScheduler's pending flag
                grammar += 1
                pending |= async_scheduling and placeholders > 0
            if async_scheduling:
                req.num_output_placeholders = placeholders + 1 + spec
                req.num_spec_tokens = k
        step.num_warmup += warmup
        step.num_grammar += grammar
        step.grammar_pending = pending
        step.kind = DECODE if decode else EXTEND
        step.num_running = len(self.running)
        step.num_queued = len(self.waiting)
        step.kv_used_after_alloc = self.kv.num_used_blocks * self.kv.block_size
