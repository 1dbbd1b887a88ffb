"""One request as vLLM V1's scheduler sees it (plain data, no SimPy).

The counters are vLLM's own (``vllm/v1/request.py``, 0.32.0): ``num_computed_tokens`` (tokens
whose KV is written or scheduled to be: it counts in-flight steps optimistically),
``num_output_placeholders`` (async scheduling: tokens sampled by steps whose output is not
processed yet), ``num_in_flight_tokens`` (tokens of steps not yet processed),
``num_stale_output_tokens`` (in-flight tokens of a request preempted under async scheduling:
their output is still delivered but must not touch the reset counters). Token ids are not
kept: a request's ``num_tokens`` is its prompt plus the output tokens delivered so far.

Where a request stops is known up front (the workload's ``output_len``): if that is its
``max_tokens`` the scheduler can foresee it (``check_stop``'s length branch, and the async
scheduler's look-ahead); otherwise its ``output_len``-th token is a stop token (EOS) that the
scheduler learns of only from the step's output.

The attribute names the trace recorder reads (``input_len``, ``output_done``, ``retractions``,
``status`` with :data:`sim.model.batch.FINISHED`) are provided as aliases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.model.batch import FAILED, FINISHED, RUNNING, WAITING

PREEMPTED = 4  # RequestStatus.PREEMPTED: back in the waiting queue, its KV freed
__all__ = ["Request", "WAITING", "RUNNING", "FINISHED", "FAILED", "PREEMPTED"]


@dataclass(slots=True, eq=False)
class Request:
    """A request's scheduling state. Lengths in tokens, times in seconds.

    Args:
        rid: request id (arrival order).
        arrival_s: when it reached the engine core.
        num_prompt_tokens: prompt length.
        cached_len: prompt tokens the workload says are in the prefix cache.
        output_len: the output token at which it stops (at most ``max_tokens``).
        max_tokens: ``SamplingParams.max_tokens`` after the server's cap
            (``min(requested, max_model_len - prompt)``).
        warmup: excluded from the metrics.
    """

    rid: int
    arrival_s: float
    num_prompt_tokens: int
    cached_len: int
    output_len: int
    max_tokens: int
    warmup: bool
    status: int = WAITING
    num_output_tokens: int = 0
    num_computed_tokens: int = 0
    num_output_placeholders: int = 0
    num_in_flight_tokens: int = 0
    num_stale_output_tokens: int = 0
    num_spec_tokens: int = 0  # len(spec_token_ids): drafts (or async placeholders) to verify next
    grammar: bool = False  # structured output: sampled under a grammar (use_structured_output)
    num_preemptions: int = 0
    is_prefill_chunk: bool = False
    num_blocks: int = 0  # KV blocks held, prefix-cache hits included
    num_hit_blocks: int = 0  # of which prefix-cache hits (resident, not taken from the free pool)
    first_token_s: float = math.nan
    last_token_s: float = math.nan
    finish_s: float = math.nan
    failure: str = ""

    @property
    def num_tokens(self) -> int:
        """Prompt plus delivered output tokens (``Request.num_tokens``)."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_tokens_with_spec(self) -> int:
        """``num_tokens`` plus the drafts waiting to be verified (``Request.num_tokens_with_spec``)."""
        return self.num_prompt_tokens + self.num_output_tokens + self.num_spec_tokens

    @property
    def stops_by_length(self) -> bool:
        """Whether it stops at ``max_tokens`` (foreseeable), not on a stop token."""
        return self.output_len >= self.max_tokens

    @property
    def is_finished(self) -> bool:
        return self.status in (FINISHED, FAILED)

    # --- the names the trace recorder reads (sim.trace.recorder.TraceRecorder.request) ---
    @property
    def input_len(self) -> int:
        return self.num_prompt_tokens

    @property
    def output_done(self) -> int:
        return self.num_output_tokens

    @property
    def retractions(self) -> int:
        return self.num_preemptions
