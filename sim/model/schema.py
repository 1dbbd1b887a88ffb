"""The engine-neutral sections of a scenario (pydantic): the workload and the step costs.

``workload`` says what load arrives (request lengths, arrival process); ``costs`` what each
step costs (inline linear terms or a calibration profile, jitter, the GIL model). The
``server`` section is an engine's (SGLang's: :mod:`sim.engines.sglang.server`);
:mod:`sim.scenario` composes the three and loads them. Every field is validated; unknown keys
are errors. Times are seconds.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

NonNegFloat = Annotated[float, Field(ge=0.0)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- lengths ---------------------------------------------------------------------------


class UniformLength(StrictModel):
    """Integer lengths uniform on [low, high]."""

    dist: Literal["uniform"]
    low: int = Field(ge=0)
    high: int = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self):
        if self.high < self.low:
            raise ValueError("high must be >= low")
        return self


class NormalLength(StrictModel):
    """Normal lengths, rounded and clipped to [min, max]."""

    dist: Literal["normal"]
    mean: float = Field(gt=0)
    std: float = Field(ge=0)
    min: int = Field(default=1, ge=0)
    max: Optional[int] = Field(default=None, ge=1)


class LognormalLength(StrictModel):
    """Lognormal lengths with arithmetic mean ``mean`` and log-space std ``sigma`` (ShareGPT-like)."""

    dist: Literal["lognormal"]
    mean: float = Field(gt=0)
    sigma: float = Field(ge=0)
    min: int = Field(default=1, ge=0)
    max: Optional[int] = Field(default=None, ge=1)


class ChoiceLength(StrictModel):
    """Lengths drawn from ``values`` with optional ``weights``."""

    dist: Literal["choice"]
    values: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)
    weights: Optional[list[Annotated[float, Field(ge=0)]]] = None

    @model_validator(mode="after")
    def _same_length(self):
        if self.weights is not None and (len(self.weights) != len(self.values) or sum(self.weights) <= 0):
            raise ValueError("weights must have one non-negative entry per value and a positive sum")
        return self


LengthDist = Annotated[
    Union[UniformLength, NormalLength, LognormalLength, ChoiceLength], Field(discriminator="dist")
]
Length = Union[Annotated[int, Field(ge=0)], LengthDist]


class Workload(StrictModel):
    """The requests that reach the server.

    ``output_len`` is where a request stops; ``max_new_tokens`` is the cap the client sends (a
    request whose output reaches it finishes by length, which the scheduler foresees) and
    ``ignore_eos`` whether the client asked the server to ignore EOS (bench_serving does by
    default; SGLang's admission reserves such requests' whole remaining output). With
    ``arrival: closed_loop`` a ``trace`` file supplies the requests' lengths in order (its
    ``arrival_s`` ignored) and ``num_requests`` is its length."""

    arrival: Literal["closed_loop", "poisson", "trace"] = "closed_loop"
    concurrency: int = Field(default=8, ge=1)
    rate_per_s: float = Field(default=4.0, gt=0)
    trace: Optional[str] = None
    num_requests: int = Field(default=64, ge=1)
    warmup_requests: int = Field(default=0, ge=0)
    input_len: Length = 512
    cached_len: Length = 0
    output_len: Length = 256
    finish: Literal["length", "eos"] = "length"
    # what the client sends: SamplingParams.max_new_tokens (None: output_len for finish: length,
    # 4096 for eos, SGLang's estimate for an unknown output) and ignore_eos (None: finish == length)
    max_new_tokens: Optional[Length] = None
    ignore_eos: Optional[bool] = None
    # bench_serving: the warm-up requests run (concurrently) and finish before the benchmark starts
    warmup_before_benchmark: bool = False

    @model_validator(mode="after")
    def _consistent(self):
        if self.warmup_requests >= self.num_requests and not self.trace:
            raise ValueError("warmup_requests must be smaller than num_requests")
        if self.arrival == "trace" and not self.trace:
            raise ValueError("arrival: trace needs a trace file (workload.trace)")
        if self.trace and self.arrival == "poisson":
            raise ValueError("a trace gives arrival times (arrival: trace) or, closed-loop, lengths only; not poisson")
        return self


class CostTerm(StrictModel):
    """A linear cost in seconds: base + per_req*reqs + per_token*tokens + per_ctx_token*sum(context)."""

    base: NonNegFloat = 0.0
    per_req: NonNegFloat = 0.0
    per_token: NonNegFloat = 0.0
    per_ctx_token: NonNegFloat = 0.0


class GpuCosts(StrictModel):
    """Device costs. ``sync_latency``: seconds from the end of a forward until the host can read
    its results (the device-to-host copy's completion reaching the waiting thread); None: the
    calibration profile's measured value, or 0 without one."""

    decode: CostTerm = CostTerm(base=0.004, per_req=2.0e-5, per_ctx_token=1.0e-9)
    prefill: CostTerm = CostTerm(base=0.002, per_token=1.0e-6)
    overlap_residue: NonNegFloat = 2.0e-5
    sync_latency: Optional[NonNegFloat] = None
    scale: float = Field(default=1.0, gt=0)


class CpuCosts(StrictModel):
    recv: CostTerm = CostTerm(base=2.0e-5, per_req=1.0e-5)
    schedule: CostTerm = CostTerm(base=1.5e-4, per_req=4.0e-6)
    launch: CostTerm = CostTerm(base=3.0e-4)
    process: CostTerm = CostTerm(base=8.0e-5, per_req=1.2e-5)
    scale: float = Field(default=1.0, gt=0)


class Noise(StrictModel):
    """Multiplicative jitter (lognormal, mean 1) with these coefficients of variation.

    ``gpu_cv``/``cpu_cv`` draw a new factor for every step (independent per step, so they
    average out over a long run). ``run_gpu_cv``/``run_cpu_cv`` draw one factor per run and
    setting that scales every step of that run (clock, thermal or host-load state that differs
    between two separately started servers; not shared between the settings of a comparison).
    """

    gpu_cv: NonNegFloat = 0.0
    cpu_cv: NonNegFloat = 0.0
    run_gpu_cv: NonNegFloat = 0.0
    run_cpu_cv: NonNegFloat = 0.0


class GilCosts(StrictModel):
    """The GIL model of the ``thread_overlap`` loop (a forward thread beside the scheduler thread).

    ``switch_interval``: CPython's ``sys.getswitchinterval()`` (s): a thread waiting that long
    for the GIL forces the holder to drop it. ``ops_per_forward``: GIL acquisitions the forward
    thread needs per forward (ops that release the GIL between their Python and device/compute
    parts; the launch cost is split evenly over them); the default 7 fits DESIGN.md sec. 6 (an
    eager CPU forward slowed from 4 ms to 38 ms beside a spinning Python thread:
    (38 - 4) / 5 ms = 7 waits of one switch interval). ``sample_launch``: Python time (s) of the
    forward thread after the forward (future-map store, D2H copy launch, output queue put).
    ``sample_compute``: the sampling op the forward thread runs right after ``launch_done``, with
    the GIL released (the scheduler, woken by ``launch_done``, may take the GIL meanwhile; the
    thread's ``sample_launch`` then waits for it). ``wake_latency``: how long a blocked thread
    takes to run again once woken (a futex wake-up: the GIL handed to a waiting thread, a queue
    or event it waits on); 0 = at once. ``wait_launch_done``: the scheduler waits for the current batch's launch before processing
    the previous result (``resolve_last_batch_result(launch_done)``, SGLang 0.5.3); False models
    a loop that processes k-1 while the forward thread runs k (threads contend for the GIL).
    """

    switch_interval: float = Field(default=0.005, gt=0)
    ops_per_forward: int = Field(default=7, ge=1)
    sample_launch: NonNegFloat = 5.0e-5
    sample_compute: NonNegFloat = 0.0
    wake_latency: NonNegFloat = 0.0
    wait_launch_done: bool = True


class Costs(StrictModel):
    """Step costs. With ``profile`` (a calibration profile, path relative to the scenario file)
    the forward and CPU phase times come from the profile and the inline ``gpu.decode``,
    ``gpu.prefill`` and ``cpu.*`` terms are not used; ``scale``, ``overlap_residue``, ``noise``
    and ``gil`` apply either way (see :mod:`sim.model.profile_costs`). ``profile_statistic``:
    each step priced at the ``median`` of the profile's samples at a point (its curves) or at
    their ``mean`` (the expected cost: what time averages such as throughput follow)."""

    profile: Optional[str] = None
    profile_statistic: Literal["median", "mean"] = "median"
    gpu: GpuCosts = GpuCosts()
    cpu: CpuCosts = CpuCosts()
    noise: Noise = Noise()
    gil: GilCosts = GilCosts()
