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

- the accepted drafts per request-step: drawn, seeded, from the law the scenario gives (vLLM's
  logged per-position acceptance, exactly; or its average acceptance rate, spread over positions
  as the law "each draft accepted with one probability up to the first rejection"; or a
  histogram); the same law for every request and step (real acceptance depends on the text);
- a draft pass costs ``draft_cost_ratio`` times the target's forward of the same shape (1.0: the
  target model drafting for itself; an EAGLE head over an L-layer target is of the order of 1/L);
- the synchronous ``take_draft_token_ids`` round trip: the profile's ``vllm.take_drafts``, else
  its ``vllm.roundtrip`` (another engine-core-to-worker RPC round trip);
- the drafter's host work per step (its input preparation, attention metadata and draft
  sampling, around its passes) and the rejection sampler: the profile's ``vllm.draft_host`` and
  ``vllm.spec_sample`` (with ``vllm.spec_schedule``/``spec_prepare``/``spec_update``), measured
  on the real server drafting (:mod:`calibrate.real.vllm.speculative`) at one method and k; at
  another k the host work is scaled by k over the measured k (stated). A profile without them
  prices the rejection sampler as ``vllm.sample`` and no drafter host work: measured on vLLM's
  CPU server with a draft model (4 December 2026), that left the steps 1.5-5 ms short, the
  predicted throughput 36% high and TPOT 29% low (medians over three loads and both settings;
  docs/vllm.md).

Methods modelled: those whose drafts come from a model on the device and are k per step
(``draft_model``, ``eagle``, ``eagle3``, ``mtp``). N-gram and suffix proposers (drafts found in the
text, often fewer than k, proposed on the CPU) and parallel drafters (DFlash, P-EAGLE) are not.
"""

from __future__ import annotations

import math
from typing import Literal, Optional

import numpy as np
from pydantic import Field, field_validator, model_validator

from sim.model.schema import StrictModel

MODELLED_METHODS = ("draft_model", "eagle", "eagle3", "mtp")
MAX_SPEC_TOKENS = 64
HISTOGRAM_TOLERANCE = 1e-6


class Speculative(StrictModel):
    """``server.speculative`` of a vLLM scenario: vLLM's ``--speculative-config`` (``method``,
    ``num_speculative_tokens``) and what the simulator must be told about it.

    Fields: ``method`` (one of :data:`MODELLED_METHODS`), ``num_speculative_tokens`` (k, 1-64);
    the accepted drafts, exactly one of (each read off vLLM's own ``SpecDecoding metrics`` log
    line, ``SpecDecodingLogging.log``, ``v1/spec_decode/metrics.py``):

    - ``per_position_acceptance``: the log's "Per-position acceptance rate", k shares of drafts
      whose i-th token was accepted (non-increasing: a draft token counts only after the ones
      before it); P(a accepted) = r_a - r_(a+1), r_0 = 1, r_(k+1) = 0: exact;
    - ``acceptance_rate``: the log's "Avg Draft acceptance rate" as a fraction (accepted drafts
      over drafts proposed: mean accepted / k); the simulator draws from the law in which each
      draft is accepted with one probability q up to the first rejection, q chosen so that the
      mean matches (an assumption about the shape, stated on every run);
    - ``accepted_histogram``: k + 1 probabilities of accepting 0..k drafts, summing to 1;

    ``draft_cost_ratio`` (>= 0, a draft pass against the target's forward of the same shape).

    Raises (pydantic ValidationError, as ValueError): a method that is not modelled (named);
    none or several acceptance fields; a list of the wrong length, out of [0, 1], increasing
    (per position) or not summing to 1 (histogram).
    """

    method: Literal["draft_model", "eagle", "eagle3", "mtp"]
    num_speculative_tokens: int = Field(ge=1, le=MAX_SPEC_TOKENS)
    per_position_acceptance: Optional[list[float]] = None
    acceptance_rate: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    accepted_histogram: Optional[list[float]] = None
    draft_cost_ratio: float = Field(ge=0.0, le=100.0)

    @field_validator("method", mode="before")
    @classmethod
    def _modelled(cls, value):
        if isinstance(value, str) and value not in MODELLED_METHODS:
            raise ValueError(f"{value!r} is not modelled (proposals found in the text or on the CPU, or parallel "
                             f"drafters); modelled: {', '.join(MODELLED_METHODS)}")
        return value

    @model_validator(mode="after")
    def _one_law(self):
        given = [n for n in LAWS if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of per_position_acceptance (the vLLM log's 'Per-position acceptance "
                             "rate', k values), acceptance_rate (its 'Avg Draft acceptance rate' as a fraction) and "
                             "accepted_histogram (the probabilities of accepting 0..k drafts)"
                             + (f" (got {', '.join(given)})" if given else ""))
        k = self.num_speculative_tokens
        for name, want in (("per_position_acceptance", k), ("accepted_histogram", k + 1)):
            values = getattr(self, name)
            if values is None:
                continue
            if len(values) != want:
                raise ValueError(f"{name}: needs {want} values for k = {k}, got {len(values)}")
            if any(not 0.0 <= v <= 1.0 for v in values):
                raise ValueError(f"{name}: values from 0 to 1")
        r = self.per_position_acceptance
        if r is not None and any(b > a + HISTOGRAM_TOLERANCE for a, b in zip(r, r[1:])):
            raise ValueError("per_position_acceptance: must not increase (a later draft token is accepted only "
                             f"after the earlier ones), got {r}")
        h = self.accepted_histogram
        if h is not None and abs(sum(h) - 1.0) > HISTOGRAM_TOLERANCE:
            raise ValueError(f"accepted_histogram: probabilities summing to 1 (sum {sum(h):.6g})")
        return self

    def probabilities(self) -> np.ndarray:
        """P(a drafts accepted) for a = 0..k, shape (k + 1,), summing to 1."""
        k = self.num_speculative_tokens
        if self.accepted_histogram is not None:
            p = np.asarray(self.accepted_histogram, dtype=float)
        elif self.per_position_acceptance is not None:
            r = np.concatenate([[1.0], np.minimum.accumulate(self.per_position_acceptance), [0.0]])
            p = np.maximum(r[:-1] - r[1:], 0.0)
        else:
            q = geometric_q(self.acceptance_rate * k, k)
            p = np.array([q ** a * (1.0 - q) for a in range(k)] + [q ** k])
        return p / p.sum()

    def mean_accepted(self) -> float:
        """The expected accepted drafts per request-step (tokens per step = 1 + this)."""
        p = self.probabilities()
        return float(np.dot(np.arange(len(p)), p))

    def caveats(self, measured: dict | None = None) -> list[str]:
        """The warning lines every run of this scenario carries: what rests on given values.
        ``measured``: the profile's ``metadata.speculative`` when it has the speculative host
        curves (:mod:`calibrate.real.vllm.speculative`), else None."""
        k = self.num_speculative_tokens
        if self.acceptance_rate is not None:
            q = geometric_q(self.acceptance_rate * k, k)
            law = (f"acceptance_rate {self.acceptance_rate:g} (spread over positions as if each draft were "
                   f"accepted with probability {q:.3f} up to the first rejection: give per_position_acceptance "
                   "for the measured shape)")
        else:
            name = "per_position_acceptance" if self.per_position_acceptance is not None else "accepted_histogram"
            law = f"{name} {getattr(self, name)}"
        head = (f"warning: server.speculative: {self.method} with k={k}: the accepted drafts are drawn from the "
                f"given {law}, expected accept length {1 + self.mean_accepted():.2f} tokens per verify step, the "
                "same law for every request and position (not measured by the simulator); the verify step is priced by "
                "the profile's forward at requests x (1 + k) tokens (its vllm.spec_forward where measured); a draft "
                "pass costs "
                f"draft_cost_ratio {self.draft_cost_ratio:g} x the target's forward of its shape (given); a step's "
                "tokens reach the client together, so ITL is per step and TPOT per token")
        if not measured:
            return [head + "; the synchronous take_draft_token_ids RPC is priced as vllm.roundtrip, the rejection "
                    "sampler as vllm.sample, and the drafter's own host work per "
                    "step (its inputs and metadata) is not modelled, as the profile has no speculative curves: "
                    "against vLLM's CPU server with a draft model that left the steps 1.5-5 ms short, throughput "
                    "36% high and TPOT 29% low (medians; docs/vllm.md); calibrate --engine vllm --speculative "
                    "measures them on vLLM's CPU server, a GPU profile has none yet"]
        k_cal, method = int(measured.get("num_speculative_tokens", k)), measured.get("method")
        tail = (f"; the drafter's host work, the rejection sampler, the synchronous take_draft_token_ids RPC and "
                f"the scheduling and update with drafts are the profile's, measured with {method} k={k_cal}")
        if k_cal != k:
            tail += f", the drafter's host work scaled by k/{k_cal} (an assumption: not measured at k={k})"
        if method != self.method:
            tail += f" (this scenario drafts with {self.method}: its host work is assumed alike)"
        return [head + tail]


LAWS = ("per_position_acceptance", "acceptance_rate", "accepted_histogram")


def geometric_q(mean_accepted: float, k: int) -> float:
    """The per-draft acceptance q (0-1) of the law "each draft accepted with probability q up to
    the first rejection" whose mean accepted count, q + q^2 + ... + q^k, is ``mean_accepted``
    (0 <= mean_accepted <= k; clipped). Bisection to 1e-12."""
    target = min(max(mean_accepted, 0.0), float(k))
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid ** i for i in range(1, k + 1)) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


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


def draft_passes_s(k: int, ratio: float, verify_s: float, decode_pass_s: float) -> float:
    """Device time of drafting after a verify forward (s): ``ratio`` (``draft_cost_ratio``) x (the
    first draft pass, of the verify's shape, ``verify_s``, plus ``k - 1`` one-token passes over
    the sampling requests, ``decode_pass_s`` each; both in seconds of the target's forward)
    (``SpecDecodeBaseProposer.propose``, ``v1/spec_decode/llm_base_proposer.py`` l.600 and l.689)."""
    return ratio * (verify_s + (k - 1) * decode_pass_s)
