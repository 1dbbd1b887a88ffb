"""Preemption by recompute: ``Scheduler._preempt_request`` (vLLM 0.32.0,
``vllm/v1/core/sched/scheduler.py:1571``).

When a running request cannot get the KV blocks for its next tokens, ``schedule`` pops the last
request of ``running`` (FCFS: the most recently admitted, l.802) and preempts it, retrying until
the allocation succeeds or the victim is the request itself. A preempted request frees all its
blocks, forgets its computed tokens (``num_computed_tokens = 0``: it will recompute its prompt
and the output tokens it has so far) and goes to the FRONT of the waiting queue
(``waiting.prepend_request``, l.1613). Under async scheduling the output of its steps still in
flight is marked stale: it is delivered when it arrives, but must not touch the reset counters
(``num_stale_output_tokens = num_in_flight_tokens``; placeholders reset to 0; its drafts dropped). No waiting request
is admitted in a step that preempted (l.900).
"""

from __future__ import annotations

from collections import deque

from sim.engines.vllm.policy.kv_blocks import BlockPool
from sim.engines.vllm.policy.request import PREEMPTED, RUNNING, Request


def preempt_request(req: Request, kv: BlockPool, waiting: deque) -> None:
    """Preempt a running request (already removed from ``running``) into the front of
    ``waiting``.

    Raises:
        ValueError: ``req`` is not running (vLLM asserts "Only running requests can be preempted").
    """
    if req.status != RUNNING:
        raise ValueError(f"only running requests can be preempted (request {req.rid} has status {req.status})")
    kv.free(req)
    req.status = PREEMPTED
    req.num_computed_tokens = 0
    req.num_stale_output_tokens = req.num_in_flight_tokens
    req.num_output_placeholders = 0
    req.num_spec_tokens = 0  # spec_token_ids = []
    req.is_prefill_chunk = False
    req.num_preemptions += 1
    waiting.appendleft(req)
