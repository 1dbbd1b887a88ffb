"""Requests and batches as the scheduler sees them (plain data, no SimPy)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

WAITING, RUNNING, FINISHED, FAILED = 0, 1, 2, 3


@dataclass(slots=True, eq=False)
class Req:
    """One request (SGLang ``Req``). Lengths in tokens, times in seconds.

    Decode progress is not counted per step: a running request that joined the running batch
    before decode batch ``join_seq`` gets one token in every decode batch up to ``finish_seq``,
    so its progress at any step follows from the decode sequence number.
    """

    rid: int
    arrival_s: float
    input_len: int
    cached_len: int
    output_len: int
    finish_by_length: bool
    warmup: bool
    status: int = WAITING
    output_done: int = 0  # tokens produced before the current stint in the running batch
    prefix_len: int = 0  # tokens of the (re)prefill already in the KV cache, cached prefix included
    prefill_target: int = 0  # tokens the current prefill must cover (input, plus output after a retraction)
    kv_base: int = 0  # private KV slots held when joining the running batch
    join_seq: int = -1
    finish_seq: int = -1
    shared_len: int = 0  # prefix tokens shared through the radix cache (page-aligned), not private KV
    delivered: int = 0  # output tokens delivered by processed prefills (decode progress follows from seqs)
    first_token_s: float = math.nan
    last_token_s: float = math.nan
    finish_s: float = math.nan
    retractions: int = 0
    max_new_tokens: int = 0  # the output budget the scheduler knows (SamplingParams.max_new_tokens, clipped)
    ignore_eos: bool = True  # reserved at ratio 1.0 by the admission from 0.5.22 on
    kv_held: int = 0  # private KV tokens allocated to the current (re)prefill, cached prefix excluded
    order: int = 0  # position in the running batch (retraction breaks ties by it)
    failure: str = ""  # why it failed: 'cut_off', 'could_not_connect', 'aborted', 'too_long'
    grammar: bool = False  # structured output: sampled under a grammar (SGLang's req.grammar)

    def ctx_at_join(self) -> int:
        """Context length (tokens attended) in its first decode batch of this stint."""
        return self.input_len + self.output_done


@dataclass(slots=True, eq=False)
class Batch:
    """One step: a prefill (EXTEND) or a decode (DECODE) batch and, once run, its timeline.

    Prefill batches list ``chunks`` as (req, new_tokens, is_last_chunk, finishes,
    retractions of req at launch). Decode batches keep only aggregates: ``num_reqs`` members,
    ``fresh`` (members whose previous token did not come from the previous decode batch),
    ``overshoot`` (members that finished in the previous, still unprocessed decode batch:
    their token is discarded, SGLang's overlap "extra slot"; ``overshoot_pages`` KV pages they
    took), ``dropped`` (members retracted or aborted while the batch was in flight).
    """

    seq: int
    kind: int
    num_reqs: int
    num_tokens: int
    sum_ctx: int
    decode_seq: int = -1
    num_warmup: int = 0
    chunks: list = field(default_factory=list)
    fresh: list = field(default_factory=list)
    overshoot: list = field(default_factory=list)
    overshoot_pages: int = 0
    dropped: list = field(default_factory=list)
    attn_pairs: int = 0  # a prefill's sum over chunks of new x (prefix + new) tokens (attention work)
    after_idle: bool = False
    kv_used_after_alloc: int = 0
    num_running: int = 0  # requests in the running batch when this batch was scheduled
    num_queued: int = 0  # waiting queue length (incl. a chunked prefill) after scheduling it
    # structured output: sampling requests under a grammar (SGLang: the mask's rows); vLLM: a
    # grammar request's token in flight (async: sample_tokens deferred), the event the worker's
    # sampling waits for (the bitmask); SGLang: when the CPU finished the mask (s), before which
    # the batch's sampling cannot end (0.0: no mask)
    num_grammar: int = 0
    grammar_pending: bool = False
    mask_ready: object = None
    mask_end: float = 0.0
    # timeline, filled in by the event loop (seconds)
    recv_start: float = math.nan
    schedule_start: float = math.nan
    schedule_end: float = math.nan
    launch_start: float = math.nan
    launch_end: float = math.nan
    forward_start: float = math.nan
    forward_end: float = math.nan
    sync_start: float = math.nan
    process_start: float = math.nan
    process_end: float = math.nan
    finished: int = 0
