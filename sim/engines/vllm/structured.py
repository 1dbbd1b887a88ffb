"""Structured output (a grammar, e.g. a JSON schema, per request) in vLLM V1 (0.32.0): the
scenario's ``server.structured_output`` section, which requests carry a grammar, and what the
grammar costs each step.

What vLLM does (source, 0.32.0):

- **The bitmask** (``Scheduler.get_grammar_bitmask``, ``v1/core/sched/scheduler.py:1995``, calling
  ``StructuredOutputManager.grammar_bitmask``, ``v1/structured_output/__init__.py:330``): the engine
  core fills one row of allowed tokens per scheduled request that has a grammar and samples in the
  step (not a prefill chunk). Synchronously (``EngineCore.step``, ``v1/engine/core.py:657``) it
  runs after ``execute_model`` is sent and before ``future.result()``: behind the worker's
  forward; ``sample_tokens`` carries the bitmask, so it is sent when both are done.
- **Async scheduling** (``step_with_batch_queue``, l.698): when a request with a grammar has a
  token still in flight (``AsyncScheduler._update_after_schedule`` sets
  ``pending_structured_output_tokens``, ``async_scheduler.py``), the step's ``sample_tokens`` is
  deferred: the engine core sends ``execute_model``, then waits for the previous step's output,
  runs its ``update_from_output`` (which advances the grammars), fills the bitmask and only then
  sends ``sample_tokens``. The worker's sampling waits for the engine core's update and bitmask:
  what async scheduling hides shrinks to the forward.
- **Applying it** (``apply_grammar_bitmask``, ``v1/structured_output/utils.py:101``, from
  ``GPUModelRunner.sample_tokens``, ``gpu_model_runner.py:4335``): in the worker, before sampling.
- **Accepting tokens** (``StructuredOutputManager.accept_tokens``, ``__init__.py:462``, from
  ``update_from_output``, ``scheduler.py:2186``): in the engine core, per request per step.

What the simulator takes, and from where (stated on every run, :func:`caveats`):

- ``share``: the share of requests with a grammar (drawn per request, seeded, the same requests
  under every setting); ``kind`` (``json_schema``, ``regex``, ``grammar``, ``choice``) names what
  the costs were measured with;
- the three costs: the profile's ``vllm.grammar_bitmask`` (the engine core's fill),
  ``vllm.grammar_sample`` and ``vllm.grammar_update`` (``sample_tokens`` and ``update_from_output``
  with every request constrained), measured on the real server
  (:mod:`calibrate.real.vllm.structured`); a step with g of its requests constrained pays
  ``grammar_bitmask(g)`` and the excess of the other two over their plain curves at g. Without
  them: the section's given per-request times (``bitmask_us_per_request``,
  ``apply_us_per_request``, ``accept_us_per_request``), linear in g; with neither the scenario is
  refused.

Not modelled (stated): grammar compilation (``grammar_init`` compiles in a thread pool and the
scheduler skips the request until it is ready; xgrammar caches a compiled schema, so only a
schema's first request waits); a grammar that terminates early (its request then runs
unconstrained); speculative decoding with a grammar (refused: the drafts' validation is not
modelled); the bitmask's thread pool above 128 constrained requests.
"""

from __future__ import annotations

from typing import ClassVar, Optional

from pydantic import Field

from sim.model.workload import GrammarShare


class StructuredOutput(GrammarShare):
    """``server.structured_output`` of a vLLM scenario.

    Fields: ``share`` and ``kind`` (:class:`sim.model.workload.GrammarShare`), and the
    optional given costs per constrained request in the step, microseconds:
    ``bitmask_us_per_request`` (the engine core's fill), ``apply_us_per_request`` (the worker's
    mask before sampling), ``accept_us_per_request`` (the engine core advancing the grammar).

    Raises (pydantic ValidationError, as ValueError): a share outside [0, 1], an unknown kind,
    a negative or non-finite cost.
    """

    bitmask_us_per_request: Optional[float] = Field(default=None, ge=0.0, le=1e6, allow_inf_nan=False)
    apply_us_per_request: Optional[float] = Field(default=None, ge=0.0, le=1e6, allow_inf_nan=False)
    accept_us_per_request: Optional[float] = Field(default=None, ge=0.0, le=1e6, allow_inf_nan=False)

    @property
    def given(self) -> bool:
        """The section gives all three per-request costs."""
        return None not in (self.bitmask_us_per_request, self.apply_us_per_request, self.accept_us_per_request)

    COSTS: ClassVar[str] = "the engine core's bitmask, the worker's mask, the grammar's accept"
    CHECKED: ClassVar[str] = ("checked against vLLM 0.32's CPU server on a 2-core host: median error 6-11% "
                              "throughput, 12-14% TPOT; the async/sync ratio off by 15-16 points (one window "
                              "each way), within that host's swing between windows: not validated on a host "
                              "with a core per process (docs/real-engines.md)")

    def given_costs(self) -> str:
        return (f"{self.bitmask_us_per_request:g}/{self.apply_us_per_request:g}/{self.accept_us_per_request:g} us per "
                "constrained request (bitmask/apply/accept)")


class GrammarCosts:
    """What a step's grammars cost (s), from a profile's curves or the section's given terms.

    Args:
        section: the scenario's :class:`StructuredOutput`.
        curves: the profile's curves for the setting (``name -> callable(num_reqs)``), or None
            (inline costs); the grammar's sample and update are the excess of its curves over
            the plain ``vllm.sample`` and ``vllm.update``.
        cpu_scale: the scenario's ``costs.cpu.scale``.

    Raises:
        ValueError: neither the profile's three grammar curves nor the section's given costs.
    """

    CURVES = ("vllm.grammar_bitmask", "vllm.grammar_sample", "vllm.grammar_update")

    def __init__(self, section: StructuredOutput, curves: dict | None, cpu_scale: float):
        self.scale = cpu_scale
        self.measured = curves is not None and all(c in curves for c in self.CURVES)
        if self.measured:
            self._bitmask, self._sample, self._update = (curves[c] for c in self.CURVES)
            self._plain_sample, self._plain_update = curves["vllm.sample"], curves["vllm.update"]
        elif section.given:
            self._per = (section.bitmask_us_per_request * 1e-6, section.apply_us_per_request * 1e-6,
                         section.accept_us_per_request * 1e-6)
        else:
            missing = [n for n in ("bitmask_us_per_request", "apply_us_per_request", "accept_us_per_request")
                       if getattr(section, n) is None]
            raise ValueError("the grammar's costs are unknown: calibrate a CPU profile "
                             "with --structured-output (vllm.grammar_* curves) or give " + ", ".join(missing))

    def bitmask_s(self, n: int) -> float:
        """The engine core's fill for ``n`` constrained requests (0 for none)."""
        if n <= 0:
            return 0.0
        return (self._bitmask(n) if self.measured else n * self._per[0]) * self.scale

    def apply_s(self, n: int) -> float:
        """The worker's extra ``sample_tokens`` time for ``n`` constrained requests."""
        if n <= 0:
            return 0.0
        return (max(0.0, self._sample(n) - self._plain_sample(n)) if self.measured else n * self._per[1]) * self.scale

    def accept_s(self, n: int) -> float:
        """The engine core's extra ``update_from_output`` time for ``n`` constrained requests."""
        if n <= 0:
            return 0.0
        return (max(0.0, self._update(n) - self._plain_update(n)) if self.measured else n * self._per[2]) * self.scale
