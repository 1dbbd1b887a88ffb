"""Scenario schema (pydantic) and loading from YAML files, dicts and ``--set`` overrides.

A scenario says what load arrives (``workload``), how the server is configured
(``server``) and what each step costs (``costs``). Every field is validated; unknown keys
are errors. Times are seconds.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from sim.errors import ScenarioError

SETTINGS = ("normal", "overlap", "overlap_mlx", "thread_overlap")
Setting = Literal["normal", "overlap", "overlap_mlx", "thread_overlap"]
NonNegFloat = Annotated[float, Field(ge=0.0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- lengths ---------------------------------------------------------------------------


class UniformLength(_Strict):
    """Integer lengths uniform on [low, high]."""

    dist: Literal["uniform"]
    low: int = Field(ge=0)
    high: int = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self):
        if self.high < self.low:
            raise ValueError("high must be >= low")
        return self


class NormalLength(_Strict):
    """Normal lengths, rounded and clipped to [min, max]."""

    dist: Literal["normal"]
    mean: float = Field(gt=0)
    std: float = Field(ge=0)
    min: int = Field(default=1, ge=0)
    max: Optional[int] = Field(default=None, ge=1)


class LognormalLength(_Strict):
    """Lognormal lengths with arithmetic mean ``mean`` and log-space std ``sigma`` (ShareGPT-like)."""

    dist: Literal["lognormal"]
    mean: float = Field(gt=0)
    sigma: float = Field(ge=0)
    min: int = Field(default=1, ge=0)
    max: Optional[int] = Field(default=None, ge=1)


class ChoiceLength(_Strict):
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


class Workload(_Strict):
    """The requests that reach the server."""

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
    # bench_serving: the warm-up requests run (concurrently) and finish before the benchmark starts
    warmup_before_benchmark: bool = False

    @model_validator(mode="after")
    def _consistent(self):
        if self.warmup_requests >= self.num_requests and self.arrival != "trace":
            raise ValueError("warmup_requests must be smaller than num_requests")
        if self.arrival == "trace" and not self.trace:
            raise ValueError("arrival: trace needs a trace file (workload.trace)")
        return self


class Server(_Strict):
    """Server flags that change scheduling (names follow SGLang's ServerArgs).

    ``launch_args`` (an SGLang launch command as a list of strings, ``NAME=VALUE`` environment
    tokens allowed) and ``version`` (the SGLang release) decide, through the rules table
    (:mod:`sim.loop_rules`), which event loop runs: when ``launch_args`` is given and
    ``settings`` is not, ``settings`` becomes that one loop; flags that map onto a field here
    (``--page-size``, ``--max-running-requests``, ``--chunked-prefill-size``,
    ``--max-total-tokens``, ``--schedule-conservativeness``,
    SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP) fill it, and a field given both ways must agree.
    ``device`` is the platform ('mlx' = MPS with SGLANG_USE_MLX). ``version`` (default: the
    seed document's 0.5.22) also decides the release-specific faults the simulator predicts and,
    when ``retraction`` is not given, the retraction policy of that release.
    """

    device: Literal["cuda", "mlx", "mps", "cpu"] = "cuda"
    settings: list[Setting] = Field(default_factory=lambda: ["overlap", "normal"], min_length=1)
    max_running_requests: int = Field(default=64, ge=1)
    chunked_prefill_size: int = Field(default=8192, ge=1)
    kv_pool_tokens: int = Field(default=400_000, ge=1)
    page_size: int = Field(default=1, ge=1)
    init_new_token_ratio: float = Field(default=0.7, ge=0, le=1)
    retraction: Literal["naive", "v0.5.10", "v0.5.22"] = "v0.5.22"
    disable_consecutive_prefill_overlap: bool = False
    launch_args: Optional[list[str]] = None
    version: Optional[str] = None
    _from_launch_args: tuple = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _apply_launch_args(cls, data, handler):
        derived: tuple = ()
        if isinstance(data, dict) and isinstance(data.get("launch_args"), list):
            # YAML reads `--pp-size, 2` as a number: launch arguments are strings
            data = {**data, "launch_args": [a if isinstance(a, str) else str(a) for a in data["launch_args"]]}
            data, derived = _resolve_launch_args(data)
        if isinstance(data, dict) and data.get("version") is not None and "retraction" not in data:
            from sim.errors import UserInputError
            from sim.loop_rules import retraction_policy
            try:
                data = {**data, "retraction": retraction_policy(str(data["version"]))}
                derived = (*derived, "retraction")
            except UserInputError:
                pass  # the version check below reports it
        server = handler(data)
        server._from_launch_args = derived
        return server

    @model_validator(mode="after")
    def _unique(self):
        if len(set(self.settings)) != len(self.settings):
            raise ValueError("settings must not repeat a loop")
        if self.version is not None:
            from sim.launch_args import parse_version
            from sim.errors import UserInputError
            try:
                parse_version(self.version)
            except UserInputError as err:
                raise ValueError(err.expected) from None
        if self.page_size > 1 and self.kv_pool_tokens % self.page_size:
            raise ValueError("kv_pool_tokens must be a multiple of page_size")
        return self


def _resolve_launch_args(data: dict) -> tuple[dict, tuple]:
    """Fill server fields from ``launch_args`` (see :class:`Server`); returns (data, derived keys).

    Raises:
        ValueError: a bad flag, a loop the simulator does not model, or a field set both in
            ``server`` and by a launch argument to different values.
    """
    from sim.errors import UserInputError
    from sim.loop_rules import advise

    args = data["launch_args"]
    if not isinstance(args, list):
        return data, ()
    try:
        adv = advise([str(a) for a in args], str(data.get("device", "cuda")), data.get("version"),
                     source="server.launch_args")
    except UserInputError as err:
        raise ValueError(f"launch_args {err.field}: {err.expected}" if err.field else err.expected) from None
    wanted: dict = dict(adv.config.server)
    wanted["device"] = adv.config.platform
    if "settings" not in data:
        if adv.setting is None:
            raise ValueError(f"launch_args select {adv.loop}, which the simulator does not model")
        wanted["settings"] = [adv.setting]
    derived = []
    for key, value in wanted.items():
        if key in data and data[key] != value:
            raise ValueError(f"{key} is {data[key]!r} but launch_args give {value!r}")
        if key not in data:
            data[key] = value
            derived.append(key)
    return data, tuple(derived)


class CostTerm(_Strict):
    """A linear cost in seconds: base + per_req*reqs + per_token*tokens + per_ctx_token*sum(context)."""

    base: NonNegFloat = 0.0
    per_req: NonNegFloat = 0.0
    per_token: NonNegFloat = 0.0
    per_ctx_token: NonNegFloat = 0.0


class GpuCosts(_Strict):
    """Device costs. ``sync_latency``: seconds from the end of a forward until the host can read
    its results (the device-to-host copy's completion reaching the waiting thread); None: the
    calibration profile's measured value, or 0 without one."""

    decode: CostTerm = CostTerm(base=0.004, per_req=2.0e-5, per_ctx_token=1.0e-9)
    prefill: CostTerm = CostTerm(base=0.002, per_token=1.0e-6)
    overlap_residue: NonNegFloat = 2.0e-5
    sync_latency: Optional[NonNegFloat] = None
    scale: float = Field(default=1.0, gt=0)


class CpuCosts(_Strict):
    recv: CostTerm = CostTerm(base=2.0e-5, per_req=1.0e-5)
    schedule: CostTerm = CostTerm(base=1.5e-4, per_req=4.0e-6)
    launch: CostTerm = CostTerm(base=3.0e-4)
    process: CostTerm = CostTerm(base=8.0e-5, per_req=1.2e-5)
    scale: float = Field(default=1.0, gt=0)


class Noise(_Strict):
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


class GilCosts(_Strict):
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


class Costs(_Strict):
    """Step costs. With ``profile`` (a calibration profile, path relative to the scenario file)
    the forward and CPU phase times come from the profile and the inline ``gpu.decode``,
    ``gpu.prefill`` and ``cpu.*`` terms are not used; ``scale``, ``overlap_residue``, ``noise``
    and ``gil`` apply either way (see :mod:`calibrate.profile_costs`). ``profile_statistic``:
    each step priced at the ``median`` of the profile's samples at a point (its curves) or at
    their ``mean`` (the expected cost: what time averages such as throughput follow)."""

    profile: Optional[str] = None
    profile_statistic: Literal["median", "mean"] = "median"
    gpu: GpuCosts = GpuCosts()
    cpu: CpuCosts = CpuCosts()
    noise: Noise = Noise()
    gil: GilCosts = GilCosts()


class Scenario(_Strict):
    """A validated scenario. ``source`` is the file it came from (for messages), ``base_dir``
    the folder that relative paths in it (trace, profile) are resolved against."""

    name: str = Field(min_length=1)
    seed: int = 0
    workload: Workload = Workload()
    server: Server = Server()
    costs: Costs = Costs()
    source: str = Field(default="<dict>", exclude=True)
    base_dir: str = Field(default=".", exclude=True)

    def resolve_path(self, relative: str) -> Path:
        """A path from the scenario, resolved against the scenario file's folder."""
        p = Path(relative).expanduser()
        return p if p.is_absolute() else Path(self.base_dir) / p

    def with_overrides(self, overrides: list[str]) -> "Scenario":
        """A new scenario with ``key.path=value`` overrides applied (value parsed as YAML)."""
        raw = self.model_dump(mode="json")
        for key in self.server._from_launch_args:  # re-derived from launch_args on validation
            raw["server"].pop(key, None)
        apply_overrides(raw, overrides, self.source)
        return _validate(raw, self.source, self.base_dir)


def apply_overrides(raw: dict, overrides: list[str], source: str) -> None:
    """Set ``a.b.c=value`` entries into ``raw`` in place; values are parsed as YAML scalars/lists.

    Raises:
        ScenarioError: an override without ``=``, or a path through a non-mapping.
    """
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ScenarioError(f"--set {item}", "", "expected KEY.PATH=VALUE")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        node = raw
        parts = key.split(".")
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                field = ".".join(parts[: depth + 1])
                raise ScenarioError(f"{source} (--set {item})", field, "is not a mapping; cannot set a key inside it")
            node = child
        node[parts[-1]] = value


def _format_loc(loc: tuple) -> str:
    # pydantic puts union branch names into loc ('constrained-int', 'tagged-union[...]' followed
    # by the tag value); keep the user's field names only.
    names, skip_tag = [], False
    for part in loc:
        text = str(part)
        if skip_tag:
            skip_tag = False
            continue
        if text.startswith("tagged-union["):
            skip_tag = True
            continue
        if text in ("int", "constrained-int") or text.startswith("function-after["):
            continue
        names.append(text)
    return ".".join(names)


def _relevant(errors: list[dict]) -> list[dict]:
    """Drop the errors of union branches that do not match the input's shape (an int branch
    for a mapping, a mapping branch for a scalar)."""
    kept = [e for e in errors
            if not (e["type"] == "int_type" and isinstance(e.get("input"), dict))
            and not (e["type"] == "model_attributes_type" and not isinstance(e.get("input"), dict))]
    return kept or errors


def _validate(raw: Any, source: str, base_dir: str) -> Scenario:
    if not isinstance(raw, dict):
        raise ScenarioError(source, "", "expected a mapping at the top level of the scenario")
    data = dict(raw)
    data["source"] = source
    data["base_dir"] = base_dir
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        errors = _relevant(err.errors(include_url=False))
        first = errors[0]
        field = _format_loc(first["loc"])
        got = first.get("input")
        msg = first["msg"]
        if first["type"] == "extra_forbidden":
            msg = "unknown key"
        elif not isinstance(got, (dict, list)):
            msg = f"{msg} (got {got!r})"
        more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
        raise ScenarioError(source, field, msg + more) from None


def load_scenario(path_or_dict: Union[str, Path, dict, Scenario], overrides: Optional[list[str]] = None) -> Scenario:
    """Load and validate a scenario from a YAML file path or a dict.

    Args:
        path_or_dict: a path to a YAML file, a mapping with the scenario's keys, or a Scenario.
        overrides: ``KEY.PATH=VALUE`` strings applied before validation (the CLI's ``--set``).

    Returns:
        The validated, immutable :class:`Scenario`.

    Raises:
        ScenarioError: missing or unreadable file, bad YAML, unknown key, wrong type or range;
            the message names the file and the field.
    """
    overrides = list(overrides or [])
    if isinstance(path_or_dict, Scenario):
        return path_or_dict.with_overrides(overrides) if overrides else path_or_dict
    if isinstance(path_or_dict, dict):
        raw, source, base_dir = copy.deepcopy(path_or_dict), "<dict>", "."
    else:
        path = Path(path_or_dict)
        source, base_dir = str(path), str(path.parent)
        if not path.is_file():
            raise ScenarioError(source, "", "no such scenario file")
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f"line {mark.line + 1}" if mark else "YAML"
            raise ScenarioError(source, "", f"not valid YAML ({where}: {getattr(err, 'problem', err)})") from None
        except (OSError, UnicodeDecodeError) as err:
            raise ScenarioError(source, "", f"cannot read the file ({err})") from None
    if isinstance(raw, dict) and overrides:
        apply_overrides(raw, overrides, source)
    scenario = _validate(raw, source, base_dir)
    _check_files(scenario)
    return scenario


def _check_files(scenario: Scenario) -> None:
    w = scenario.workload
    if w.arrival == "trace" and not scenario.resolve_path(w.trace).is_file():
        raise ScenarioError(scenario.source, "workload.trace", f"no such file: {w.trace}")
    profile = scenario.costs.profile
    if profile and not scenario.resolve_path(profile).is_file():
        raise ScenarioError(scenario.source, "costs.profile",
                            f"no such calibration profile: {scenario.resolve_path(profile)}")
