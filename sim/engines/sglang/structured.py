"""Structured output (a grammar, e.g. a JSON schema, per request) in SGLang 0.5.23: the scenario's
``server.structured_output`` section, which requests carry a grammar, and what it costs each step.

What SGLang does (source, the 0.5.23 wheel):

- **The mask** (``SamplingBatchInfo.update_regex_vocab_mask``, ``srt/sampling/sampling_batch_info.py``,
  called by ``ModelRunner._preprocess_logits`` from ``ModelRunner.sample``,
  ``srt/model_executor/model_runner.py``): on the scheduler's thread, the grammar backend
  (xgrammar by default) allocates a batch x vocabulary bitmask, fills one row per request whose
  grammar has not ended (``fill_vocab_mask_batched``) and moves it to the device; the sampling
  kernels then apply it. A batch without a grammar request skips it.
- **Where the mask is filled, by loop.** ``event_loop_normal``: inside ``run_batch``
  (``TpModelWorker.forward_batch_generation``, ``srt/managers/tp_worker.py``), right after the
  forward is launched: the device runs the forward while the CPU fills the mask, and the
  sampling waits for the mask. ``event_loop_overlap``: the worker returns the batch's result
  with a ``delay_sample_func`` instead of sampling (``forward_batch_generation``, tp_worker.py:
  ``enable_overlap and grammars is not None``); the loop processes the previous batch first
  (which advances every grammar by its last token) and only then runs
  ``Scheduler.launch_batch_sample_if_needed`` (``scheduler.py``): the mask is filled, the
  sampling launched behind the forward. So under overlap the mask is on the CPU's path between
  processing batch k-1 and scheduling k+1, and the device, having finished forward k, waits for
  it before sampling.
- **Accepting tokens** (``BatchResultProcessor._accept_grammar_tokens`` from
  ``process_batch_result_decode`` and, for a prefill's first token, ``_apply_prefill_grammar``,
  ``srt/managers/scheduler_components/batch_result_processor.py``): each constrained request's
  grammar advances by its new token inside ``process_batch_result``.

What the simulator takes, and from where (stated on every run, :meth:`StructuredOutput.caveats`):

- ``share``/``kind``: :class:`sim.model.workload.GrammarShare` (drawn per request, the same
  requests under every setting);
- the costs: the profile's ``grammar.mask`` (``update_regex_vocab_mask`` at ``num_reqs``
  constrained requests) and ``grammar.process`` (``process_batch_result`` of a decode whose every
  request is constrained), measured on SGLang's real scheduler
  (``overlap-sim calibrate --engine sglang --structured-output``,
  :mod:`calibrate.real.sglang_structured`); a step with g constrained requests pays
  ``grammar.mask(g)`` and, in its processing, the excess of ``grammar.process`` over
  ``process.decode`` at g. On SGLang's CPU engine (the sampler on the scheduler's thread) a
  CPU profile's ``grammar.sample`` adds the masked sampler's extra time after the mask (the mask
  applied over the vocabulary and sampling at temperature 1, against the plain calibration's
  greedy sampler). Without the curves: the section's given ``mask_us_per_request`` and
  ``accept_us_per_request``, linear in g; with neither the scenario is refused.

Simplifications (stated): on a GPU the sampling kernels' device time is the forward curve's
(measured with plain sampling; the masked sampler's extra device time is not measured); a prefill's rows are counted for every constrained request in it, its
accept only for those whose last chunk it is; grammar compilation (``GrammarManager``: a request
waits in the grammar queue until its grammar is compiled; xgrammar caches a schema, so only its
first request waits) and grammars that end early (the request then samples unconstrained) are
not modelled; not under ``overlap_mlx`` or ``thread_overlap`` (refused by :class:`Server`);
speculative decoding is refused for SGLang altogether.
"""

from __future__ import annotations

from typing import ClassVar, Optional

from pydantic import Field

from sim.model.workload import GrammarShare

CURVES = ("grammar.mask", "grammar.process")


class StructuredOutput(GrammarShare):
    """``server.structured_output`` of an SGLang scenario.

    Fields: ``share`` and ``kind`` (:class:`sim.model.workload.GrammarShare`), and the
    optional given costs per constrained request in a step, microseconds: ``mask_us_per_request``
    (``update_regex_vocab_mask``'s fill) and ``accept_us_per_request`` (the grammar's accept in
    ``process_batch_result``).

    Raises (pydantic ValidationError, as ValueError): a share outside [0, 1], an unknown kind,
    a negative or non-finite cost.
    """

    mask_us_per_request: Optional[float] = Field(default=None, ge=0.0, le=1e6, allow_inf_nan=False)
    accept_us_per_request: Optional[float] = Field(default=None, ge=0.0, le=1e6, allow_inf_nan=False)

    @property
    def given(self) -> bool:
        """The section gives both per-request costs."""
        return self.mask_us_per_request is not None and self.accept_us_per_request is not None

    COSTS: ClassVar[str] = "the mask, the grammar's accept"
    CHECKED: ClassVar[str] = ("checked against SGLang 0.5.23's CPU server on a 2-core host: median error 6.9% "
                              "throughput, 9.2% TPOT, the overlap/normal ratio within 3.2 points "
                              "(docs/real-engines.md)")

    def given_costs(self) -> str:
        return f"{self.mask_us_per_request:g}/{self.accept_us_per_request:g} us per constrained request (mask/accept)"


class GrammarCosts:
    """What a step's grammars cost on the scheduler's thread (s), from a profile's curves or the
    section's given terms.

    Args:
        section: the scenario's :class:`StructuredOutput`.
        curves: the profile's curves for the setting (``name -> callable(num_reqs)``), or None
            (inline costs); the accept is the excess of ``grammar.process`` over
            ``process.decode``.
        cpu_scale: the scenario's ``costs.cpu.scale``.

    Raises:
        ValueError: neither the profile's grammar curves nor the section's given costs.
    """

    def __init__(self, section: StructuredOutput, curves: dict | None, cpu_scale: float):
        self.scale = cpu_scale
        self.measured = curves is not None and all(c in curves for c in CURVES)
        self._sample = curves.get("grammar.sample") if self.measured else None
        if self.measured:
            self._mask, self._process = (curves[c] for c in CURVES)
            self._plain_process = curves["process.decode"]
        elif section.given:
            self._per = (section.mask_us_per_request * 1e-6, section.accept_us_per_request * 1e-6)
        else:
            missing = [n for n in ("mask_us_per_request", "accept_us_per_request") if getattr(section, n) is None]
            raise ValueError("the grammar's costs are unknown: calibrate a CPU profile with --structured-output "
                             "(grammar.* curves) or give " + ", ".join(missing))

    def sample_s(self, n: int) -> float:
        """The masked sampler's extra time on the scheduler's thread for ``n`` constrained
        requests (the profile's ``grammar.sample``, measured on SGLang's CPU engine; 0 without
        it: on a GPU the sampler is device work, taken as the forward curve's)."""
        if n <= 0 or self._sample is None:
            return 0.0
        return self._sample(n) * self.scale

    def mask_s(self, n: int) -> float:
        """``update_regex_vocab_mask`` for ``n`` constrained requests (0 for none)."""
        if n <= 0:
            return 0.0
        return (self._mask(n) if self.measured else n * self._per[0]) * self.scale

    def accept_s(self, n: int) -> float:
        """The extra ``process_batch_result`` time of ``n`` constrained requests (0 for none)."""
        if n <= 0:
            return 0.0
        if self.measured:
            return max(0.0, self._process(n) - self._plain_process(n)) * self.scale
        return n * self._per[1] * self.scale
