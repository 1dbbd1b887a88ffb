"""The engine-neutral sections of a scenario (pydantic): the workload and the step costs.

``workload`` says what load arrives (request lengths, arrival process); ``costs`` what each
step costs (inline linear terms or a calibration profile, jitter, the GIL model). The
``server`` section is an engine's (SGLang's: :mod:`sim.engines.sglang.server`);
:mod:`sim.scenario` composes the three and loads them. Every field is validated; unknown keys
are errors. Times are seconds.
"""

from __future__ import annotations

import typing
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sim.model.profile import MAX_STEP_S, MIN_FORWARD_S

# Upper bounds: far above any real server, low enough that every time and count the simulator
# derives from them stays finite and exact (int64 lengths, float seconds).
MAX_TOKENS = 10**9  # a request's length, a chunk, a page
MAX_POOL_TOKENS = 10**12  # the KV pool
MAX_REQUESTS = 10**8  # requests of a run, clients, running requests
MAX_SEED = 2**63 - 1
MAX_SCALE, MIN_SCALE = 1.0e6, 1.0e-6  # costs.{gpu,cpu}.scale
MAX_CV = 100.0  # coefficients of variation of the per-step jitter
MAX_RUN_CV = 1.0  # a run-to-run CV is a fraction: above 1 (100%) it is a percentage given by mistake

Seconds = Annotated[float, Field(ge=0.0, le=MAX_STEP_S)]  # a cost in seconds
Tokens = Annotated[int, Field(ge=0, le=MAX_TOKENS)]


class StrictModel(BaseModel):
    """Unknown keys are errors; values are frozen; floats must be finite (no NaN, no infinity);
    a number is not a bool (YAML's ``true`` for a share or a size is a mistake, not 1), and a
    switch is ``true`` or ``false`` (not ``"no"``, which pydantic would read as false, nor 0 or
    1). A number may come as text: PyYAML reads ``1e3`` as the string "1e3", which pydantic
    converts."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_numbers(cls, data):
        if isinstance(data, dict):
            numeric, switches, numeric_lists = _typed_fields(cls)
            for name, value in data.items():
                if name in numeric and isinstance(value, bool):
                    raise ValueError(f"{name}: a number (got {str(value).lower()})")
                if name in switches and value is not None and not isinstance(value, bool):
                    raise ValueError(f"{name}: true or false (got {value!r})")
                if name in numeric_lists and isinstance(value, (list, tuple)):
                    for i, item in enumerate(value):
                        if isinstance(item, bool):
                            raise ValueError(f"{name}.{i}: a number (got {str(item).lower()})")
        return data


def first_error(err) -> str:
    """The first problem of a pydantic ``ValidationError`` as ``field.path: text`` (the text
    without pydantic's "Value error, " prefix)."""
    first = err.errors()[0]
    text = str(first["msg"]).removeprefix("Value error, ")
    return f"{'.'.join(map(str, first['loc']))}: {text}" if first["loc"] else text


_TYPED: dict[type, tuple[frozenset[str], frozenset[str], frozenset[str]]] = {}


def _kinds(annotation) -> set:
    """The types a field's annotation admits, with ``Annotated[...]`` unwrapped and unions (and
    ``Optional``) flattened, at any depth; a list's annotation stays whole."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _kinds(typing.get_args(annotation)[0])
    if origin is Union:
        return set().union(*(_kinds(a) for a in typing.get_args(annotation)))
    return {annotation}


def _is_numeric(kinds: set) -> bool:
    return bool(kinds & {int, float}) and not kinds & {bool, str}


def _typed_fields(model: type[BaseModel]) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """The fields of ``model`` that take an int or a float (alone or in a union, ``Annotated``
    or not) and no bool or string, those that take a bool and nothing else (None aside), and
    those that take a list of such numbers."""
    if model not in _TYPED:
        numeric, switches, numeric_lists = set(), set(), set()
        for name, field in model.model_fields.items():
            kinds = _kinds(field.annotation)
            if _is_numeric(kinds):
                numeric.add(name)
            if bool in kinds and kinds - {bool, type(None)} == set():
                switches.add(name)
            for kind in kinds:
                if typing.get_origin(kind) in (list, tuple) and _is_numeric(
                        set().union(*(_kinds(a) for a in typing.get_args(kind) if a is not Ellipsis))):
                    numeric_lists.add(name)
        _TYPED[model] = (frozenset(numeric), frozenset(switches), frozenset(numeric_lists))
    return _TYPED[model]


# --- lengths ---------------------------------------------------------------------------


class UniformLength(StrictModel):
    """Integer lengths uniform on [low, high]."""

    dist: Literal["uniform"]
    low: Tokens
    high: Tokens

    @model_validator(mode="after")
    def _ordered(self):
        if self.high < self.low:
            raise ValueError(f"high: must be >= low (got low {self.low}, high {self.high})")
        return self

    @property
    def bounds(self) -> tuple[int, int]:
        return self.low, self.high


def _min_max(spec) -> None:
    if spec.max is not None and spec.max < spec.min:
        raise ValueError(f"max: must be >= min (got min {spec.min}, max {spec.max})")


class NormalLength(StrictModel):
    """Normal lengths, rounded and clipped to [min, max]."""

    dist: Literal["normal"]
    mean: float = Field(gt=0, le=MAX_TOKENS)
    std: float = Field(ge=0, le=MAX_TOKENS)
    min: Tokens = 1
    max: Optional[int] = Field(default=None, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _ordered(self):
        _min_max(self)
        return self

    @property
    def bounds(self) -> tuple[int, int]:
        return self.min, MAX_TOKENS if self.max is None else self.max


class LognormalLength(StrictModel):
    """Lognormal lengths with arithmetic mean ``mean`` and log-space std ``sigma`` (ShareGPT-like)."""

    dist: Literal["lognormal"]
    mean: float = Field(gt=0, le=MAX_TOKENS)
    sigma: float = Field(ge=0, le=10)
    min: Tokens = 1
    max: Optional[int] = Field(default=None, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _ordered(self):
        _min_max(self)
        return self

    @property
    def bounds(self) -> tuple[int, int]:
        return self.min, MAX_TOKENS if self.max is None else self.max


class ChoiceLength(StrictModel):
    """Lengths drawn from ``values`` with optional ``weights``."""

    dist: Literal["choice"]
    values: list[Tokens] = Field(min_length=1)
    weights: Optional[list[Annotated[float, Field(ge=0, le=1e12)]]] = None

    @model_validator(mode="after")
    def _same_length(self):
        if self.weights is not None and (len(self.weights) != len(self.values) or sum(self.weights) <= 0):
            raise ValueError("weights: must have one non-negative entry per value and a positive sum")
        return self

    @property
    def bounds(self) -> tuple[int, int]:
        chosen = self.values if self.weights is None else [v for v, w in zip(self.values, self.weights) if w > 0]
        return min(chosen), max(chosen)


LengthDist = Annotated[
    Union[UniformLength, NormalLength, LognormalLength, ChoiceLength], Field(discriminator="dist")
]
Length = Union[Tokens, LengthDist]


def length_bounds(spec: Length) -> tuple[int, int]:
    """(smallest, largest) length a spec can draw (before the simulator's own floor of 1 for
    input and output lengths; distributions without ``max`` are capped at :data:`MAX_TOKENS`)."""
    return (spec, spec) if isinstance(spec, int) else spec.bounds


class Workload(StrictModel):
    """The requests that reach the server.

    ``output_len`` is where a request stops; ``max_new_tokens`` is the cap the client sends (a
    request whose output reaches it finishes by length, which the scheduler foresees) and
    ``ignore_eos`` whether the client asked the server to ignore EOS (bench_serving does by
    default; SGLang's admission reserves such requests' whole remaining output). With
    ``arrival: closed_loop`` a ``trace`` file supplies the requests' lengths in order (its
    ``arrival_s`` ignored) and ``num_requests`` is its length. ``prefix_sharing``: whether the
    requests' cached prefixes are one prefix they all share (``shared``: a system prompt; the
    requests of a step read the same KV blocks) or each request's own (``private``: e.g. a
    conversation's earlier turns); the vLLM model prices a step's forward by it
    (:mod:`sim.engines.vllm.costs`)."""

    arrival: Literal["closed_loop", "poisson", "trace"] = "closed_loop"
    concurrency: int = Field(default=8, ge=1, le=MAX_REQUESTS)
    rate_per_s: float = Field(default=4.0, ge=1e-6, le=1e9)
    trace: Optional[str] = Field(default=None, min_length=1)
    num_requests: int = Field(default=64, ge=1, le=MAX_REQUESTS)
    warmup_requests: int = Field(default=0, ge=0, le=MAX_REQUESTS)
    input_len: Length = 512
    cached_len: Length = 0
    prefix_sharing: Literal["private", "shared"] = "private"
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
            raise ValueError(f"warmup_requests: must be smaller than num_requests (got {self.warmup_requests} "
                             f"warm-up of {self.num_requests} requests)")
        if self.arrival == "trace" and not self.trace:
            raise ValueError("trace: arrival: trace needs a trace file (workload.trace)")
        if self.trace and self.arrival == "poisson":
            raise ValueError("trace: a trace gives arrival times (arrival: trace) or, closed-loop, lengths only; "
                             "not poisson")
        cached_lo, input_hi = length_bounds(self.cached_len)[0], length_bounds(self.input_len)[1]
        if cached_lo > input_hi:
            raise ValueError(f"cached_len: must be <= input_len (a cached prefix is part of the prompt; got "
                             f"cached_len {cached_lo} > input_len {input_hi})")
        return self


class CostTerm(StrictModel):
    """A linear cost in seconds: base + per_req*reqs + per_token*tokens + per_ctx_token*sum(context)."""

    base: Seconds = 0.0
    per_req: Seconds = 0.0
    per_token: Seconds = 0.0
    per_ctx_token: Seconds = 0.0

    def one_request_s(self) -> float:
        """The term for one request of one token in a context of one token."""
        return self.base + self.per_req + self.per_token + self.per_ctx_token


class GpuCosts(StrictModel):
    """Device costs. ``sync_latency``: seconds from the end of a forward until the host can read
    its results (the device-to-host copy's completion reaching the waiting thread); None: the
    calibration profile's measured value, or 0 without one."""

    decode: CostTerm = CostTerm(base=0.004, per_req=2.0e-5, per_ctx_token=1.0e-9)
    prefill: CostTerm = CostTerm(base=0.002, per_token=1.0e-6)
    overlap_residue: Seconds = 2.0e-5
    sync_latency: Optional[Seconds] = None
    scale: float = Field(default=1.0, ge=MIN_SCALE, le=MAX_SCALE)


class CpuCosts(StrictModel):
    """Scheduler CPU costs. ``after_wait_scale``: how much more the CPU phases cost right after
    the scheduler blocked on a result (from that wait to the end of the next launch: the
    process, then the next recv, schedule and launch); 1 (default) prices every phase the same.
    Measured on SGLang 0.5.23's real scheduler after a 5 ms blocking sleep: 1.12 to 1.78 by phase
    on this project's VM (``benchmarks/sglang_after_wait.py``, docs/real-engines.md)."""

    recv: CostTerm = CostTerm(base=2.0e-5, per_req=1.0e-5)
    schedule: CostTerm = CostTerm(base=1.5e-4, per_req=4.0e-6)
    launch: CostTerm = CostTerm(base=3.0e-4)
    process: CostTerm = CostTerm(base=8.0e-5, per_req=1.2e-5)
    scale: float = Field(default=1.0, ge=MIN_SCALE, le=MAX_SCALE)
    after_wait_scale: float = Field(default=1.0, ge=MIN_SCALE, le=MAX_SCALE)
    # the device part of a prefill's launch (a CUDA torch calibration's own model launched eagerly,
    # standing in for the engine's: sim.model.profile_costs.device_launch_part), times this; 0 leaves
    # the engine's host part alone (sim.whatif.harness simulates that end). A profile without such a
    # part takes only 1.
    extend_launch_device_scale: float = Field(default=1.0, ge=0.0, le=MAX_SCALE)


class Noise(StrictModel):
    """Multiplicative jitter (lognormal, mean 1) with these coefficients of variation.

    ``gpu_cv``/``cpu_cv`` draw a new factor for every step (independent per step, so they
    average out over a long run). ``run_gpu_cv``/``run_cpu_cv`` draw one factor per run and
    setting that scales every step of that run (clock, thermal or host-load state that differs
    between two separately started servers; not shared between the settings of a comparison).
    """

    gpu_cv: float = Field(default=0.0, ge=0, le=MAX_CV)
    cpu_cv: float = Field(default=0.0, ge=0, le=MAX_CV)
    run_gpu_cv: float = Field(default=0.0, ge=0, le=MAX_RUN_CV)
    run_cpu_cv: float = Field(default=0.0, ge=0, le=MAX_RUN_CV)


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

    switch_interval: float = Field(default=0.005, ge=1e-6, le=MAX_STEP_S)  # CPython counts it in microseconds
    ops_per_forward: int = Field(default=7, ge=1, le=10_000)
    sample_launch: Seconds = 5.0e-5
    sample_compute: Seconds = 0.0
    wake_latency: Seconds = 0.0
    wait_launch_done: bool = True


class Costs(StrictModel):
    """Step costs. With ``profile`` (a calibration profile, path relative to the scenario file)
    the forward and CPU phase times come from the profile and the inline ``gpu.decode``,
    ``gpu.prefill`` and ``cpu.*`` terms are not used; ``scale``, ``overlap_residue``, ``noise``
    and ``gil`` apply either way (see :mod:`sim.model.profile_costs`). ``profile_statistic``:
    each step priced at the ``median`` of the profile's samples at a point (its curves) or at
    their ``mean`` (the expected cost: what time averages such as throughput follow)."""

    profile: Optional[str] = Field(default=None, min_length=1)
    profile_statistic: Literal["median", "mean"] = "median"
    gpu: GpuCosts = GpuCosts()
    cpu: CpuCosts = CpuCosts()
    noise: Noise = Noise()
    gil: GilCosts = GilCosts()

    @model_validator(mode="after")
    def _forward_takes_time(self):
        if self.profile is None:
            for kind in ("decode", "prefill"):
                one = getattr(self.gpu, kind).one_request_s() * self.gpu.scale
                if one < MIN_FORWARD_S:
                    raise ValueError(f"gpu.{kind}: a forward must take time: one request costs {one:g} s "
                                     f"(x scale); expected at least {MIN_FORWARD_S:g} s")
        return self
