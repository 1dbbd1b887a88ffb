"""Speculative decoding in vLLM V1 (0.32.0): the scenario's ``server.speculative`` section, the
accepted-token draws, and what drafting costs on the device.

What vLLM does (source, 0.32.0):

- **Scheduling** (``Scheduler.schedule``, ``v1/core/sched/scheduler.py:703``): a running request
  is given ``num_tokens_with_spec + num_output_placeholders - num_computed_tokens`` tokens, where
  ``num_tokens_with_spec`` adds its draft tokens (``spec_token_ids``): 1 + k in a decode step (the
  last sampled token and k drafts to verify); the drafts scheduled are those past its known
  tokens (l.861). The KV blocks cover k lookahead slots more (``VllmConfig.num_lookahead_tokens``,
  ``config/vllm.py:615``: the drafter writes KV beyond the target's query range).
- **Drafts.** Synchronously the worker proposes after sampling and the engine core fetches them
  in ``post_step`` with one more RPC (``take_draft_token_ids``, ``v1/engine/core.py:693``), then
  ``update_draft_token_ids`` (l.2550) gives each running request its k drafts. Under async
  scheduling the drafts stay in the worker; ``AsyncScheduler._update_after_schedule``
  (``async_scheduler.py``) gives each scheduled request k placeholder drafts at once and counts
  ``1 + k`` output placeholders (the step's bonus token and its k drafts).
- **Results** (``update_from_output``, l.2110): the step returns ``1 + a`` tokens per request (a
  of its k drafts accepted); the rejected ``k - a`` roll ``num_computed_tokens`` (and, async,
  the placeholders) back; the tokens are appended one by one with the stop check after each
  (``_update_request_with_output``, l.2493): tokens past a stop are dropped.
- **Drafting cost** (``SpecDecodeBaseProposer.propose``, ``v1/spec_decode/llm_base_proposer.py``):
  one draft-model pass over the step's tokens (l.600), then ``k - 1`` passes of one token per
  sampling request (l.689), on the device after the target's verify forward.

What the simulator takes as given, and how (stated on every run, :meth:`Speculative.caveats`):

- the accepted drafts per request-step: drawn, seeded, from ``accepted_histogram`` (P(a) for a =
  0..k) or from ``acceptance_rate`` (each draft accepted with that probability, independently,
  up to the first rejection: P(a) = r^a (1 - r) for a < k, r^k for a = k); the same law for every
  request and step (real acceptance depends on the text and the position in it);
- a draft pass costs ``draft_cost_ratio`` times the target's forward of the same shape (1.0: the
  target model drafting for itself; an EAGLE head over an L-layer target is of the order of 1/L);
- the synchronous ``take_draft_token_ids`` round trip is priced as the profile's ``vllm.roundtrip``
  (another engine-core-to-worker RPC round trip; not timed on its own);
- the rejection sampler is inside the profile's ``vllm.sample`` (timed without speculation);
- the drafter's host work per step (its input preparation and attention metadata, around its
  passes) is not priced: measured on vLLM's CPU server with a draft model (4 December 2026), the
  worker's ``sample_tokens`` with drafting took 1.5-5 ms a step more than ``vllm.sample`` plus the
  passes priced here, which left the predicted throughput 36% high and TPOT 29% low (medians over
  three loads and both settings; docs/vllm.md).

Methods modelled: those whose drafts come from a model on the device and are k per step
(``draft_model``, ``eagle``, ``eagle3``, ``mtp``). N-gram and suffix proposers (drafts found in the
text, often fewer than k, proposed on the CPU) and parallel drafters (DFlash, P-EAGLE) are not.
"""

from __future__ import annotations

import math
from typing import Literal, Optional

import numpy as np
from pydantic import Field, model_validator

from sim.model.schema import StrictModel

MODELLED_METHODS = ("draft_model", "eagle", "eagle3", "mtp")
MAX_SPEC_TOKENS = 64
HISTOGRAM_TOLERANCE = 1e-6


class Speculative(StrictModel):
    """``server.speculative`` of a vLLM scenario: vLLM's ``--speculative-config`` (``method``,
    ``num_speculative_tokens``) and what the simulator must be told about it.

    Fields: ``method`` (one of :data:`MODELLED_METHODS`), ``num_speculative_tokens`` (k, 1-64),
    ``acceptance_rate`` (per draft, 0-1) or ``accepted_histogram`` (k + 1 probabilities of
    accepting 0..k drafts, summing to 1), exactly one of them; ``draft_cost_ratio`` (>= 0, a
    draft pass against the target's forward of the same shape).

    Raises (pydantic ValidationError, as ValueError): neither or both acceptance fields; a
    histogram of the wrong length, with a negative entry, or not summing to 1.
    """

    method: Literal["draft_model", "eagle", "eagle3", "mtp"]
    num_speculative_tokens: int = Field(ge=1, le=MAX_SPEC_TOKENS)
    acceptance_rate: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    accepted_histogram: Optional[list[float]] = None
    draft_cost_ratio: float = Field(ge=0.0, le=100.0)

    @model_validator(mode="after")
    def _one_law(self):
        if (self.acceptance_rate is None) == (self.accepted_histogram is None):
            raise ValueError("give exactly one of acceptance_rate (per draft token, 0-1) and accepted_histogram "
                             "(the probabilities of accepting 0..k drafts): the server log's 'Avg Draft acceptance "
                             "rate' or its per-position acceptance gives them")
        if self.accepted_histogram is not None:
            h, k = self.accepted_histogram, self.num_speculative_tokens
            if len(h) != k + 1:
                raise ValueError(f"accepted_histogram: needs k + 1 = {k + 1} probabilities (0..{k} accepted), "
                                 f"got {len(h)}")
            if any(p < 0 for p in h) or abs(sum(h) - 1.0) > HISTOGRAM_TOLERANCE:
                raise ValueError(f"accepted_histogram: probabilities >= 0 summing to 1 (sum {sum(h):.6g})")
        return self

    def probabilities(self) -> np.ndarray:
        """P(a drafts accepted) for a = 0..k, shape (k + 1,), summing to 1."""
        k = self.num_speculative_tokens
        if self.accepted_histogram is not None:
            p = np.asarray(self.accepted_histogram, dtype=float)
            return p / p.sum()
        r = self.acceptance_rate
        p = np.array([r ** a * (1.0 - r) for a in range(k)] + [r ** k])
        return p / p.sum()

    def mean_accepted(self) -> float:
        """The expected accepted drafts per request-step (tokens per step = 1 + this)."""
        p = self.probabilities()
        return float(np.dot(np.arange(len(p)), p))

    def caveats(self) -> list[str]:
        """The warning lines every run of this scenario carries: what rests on given values."""
        law = (f"acceptance_rate {self.acceptance_rate:g}" if self.acceptance_rate is not None
               else f"accepted_histogram {self.accepted_histogram}")
        return [f"warning: server.speculative: {self.method} with k={self.num_speculative_tokens}: the accepted "
                f"drafts are drawn from the given {law} (mean accept length {1 + self.mean_accepted():.2f} tokens "
                "per step, the same for every request and position; not measured by the simulator), a draft pass "
                f"costs draft_cost_ratio {self.draft_cost_ratio:g} x the target's forward of its shape (given), "
                "the synchronous take_draft_token_ids RPC is priced as vllm.roundtrip and the rejection sampler "
                "as part of vllm.sample (neither timed with speculation); the drafter's own host work per step "
                "(its inputs and metadata) is not modelled: against vLLM's CPU server with a draft model the "
                "steps were priced 1.5-5 ms short, throughput 36% high and TPOT 29% low (medians; docs/vllm.md)"]


class AcceptanceDraws:
    """Seeded draws of accepted drafts per request-step from a :class:`Speculative` law.

    Args:
        spec: the law (``probabilities()``).
        rng: a numpy Generator (the run's seed): draws are taken in blocks, in call order.
    """

    BLOCK = 4096

    def __init__(self, spec: Speculative, rng: np.random.Generator):
        self._p = spec.probabilities()
        self._rng = rng
        self._point = int(np.argmax(self._p)) if np.max(self._p) == 1.0 else None  # a fixed accept count
        self._buf = np.empty(0, dtype=np.int64)
        self._i = 0
        self.draws = 0
        self.accepted = 0

    def __call__(self, scheduled: int) -> int:
        """Drafts accepted of ``scheduled`` (>= 0) verified: a draw capped at ``scheduled``."""
        if scheduled <= 0:
            return 0
        if self._point is not None:
            a = self._point
        else:
            if self._i >= len(self._buf):
                self._buf = self._rng.choice(len(self._p), size=self.BLOCK, p=self._p)
                self._i = 0
            a = int(self._buf[self._i])
            self._i += 1
        a = min(a, scheduled)
        self.draws += 1
        self.accepted += a
        return a

    @property
    def mean_accept_length(self) -> float:
        """Tokens per verify step per request over the draws so far (1 + mean accepted); NaN before any."""
        return 1.0 + self.accepted / self.draws if self.draws else math.nan


def draft_forward_s(spec: Speculative, verify_s: float, decode_pass_s: float) -> float:
    """Device time of drafting after a verify forward (s): ``draft_cost_ratio`` x (the first draft
    pass, of the verify's shape, ``verify_s``, plus ``k - 1`` one-token passes over the sampling
    requests, ``decode_pass_s`` each; both in seconds of the target's forward)."""
    return spec.draft_cost_ratio * (verify_s + (spec.num_speculative_tokens - 1) * decode_pass_s)
