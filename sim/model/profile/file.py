"""The calibration profile file as the simulator reads it: schema, validation, loading, curves.

One JSON object::

    {"format": "overlap-sim calibration profile", "schema_version": 1,
     "metadata": {backend, device, device_name, host_cpu, libraries, model, dtype, date, grid,
                  repeats, warmup, ...},
     "samples": [{"curve": "forward.decode", "point": {"num_reqs": 8, "ctx": 512},
                  "times_s": [...]}, ...],
     "curves": {"forward.decode": {"axes": [...], "grid": [[...], [...]], "values_s": [[...]],
                                   "spread_rel": ..., "r2": ..., "max_rel_residual": ...,
                                   "loo_max_rel_error": ..., "linear": {...}}, ...}}

A profile measured under several event loops may hold, besides ``curves``, the curves that differ
by loop: ``"setting_curves": {"overlap": {"launch.decode": {...}, ...}}`` (the real SGLang
scheduler's launch costs twice as much under ``event_loop_overlap``, which resolves the
FutureMap); their samples carry ``"setting"``. A simulation of that setting uses them in place of
the base curves (:func:`profile_curves`).

Curves (see :data:`CURVE_AXES`): the device time of a forward (``forward.decode`` over batch
size x context per request; ``forward.extend`` over new tokens x cached prefix per request),
and the CPU time of each scheduler phase the simulator charges (``recv``, ``schedule.*``,
``launch.*``, ``process.*``), and optionally (:data:`OPTIONAL_CURVE_AXES`) how long the host
is blocked in the submission of a step (``submit.*``, MLX). Calibration builds and saves
profiles (:mod:`calibrate.profile`); this module, which imports no torch or MLX, reads them
(what a profile measured against what a scenario asks: :mod:`sim.model.profile.measured`).

Those are SGLang's curves (:data:`SGLANG_CURVES`, the default). Another engine's profile holds
that engine's curves, named by ``metadata.engine`` (``"vllm"``: :data:`sim.engines.vllm.profile.VLLM_CURVES`,
defined and documented by that engine); the same file format, samples and ``setting_curves``
apply, and the readers take the engine's :class:`CurveTable`. A profile without
``metadata.engine`` is an SGLang profile.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from sim.errors import ProfileError, shown
from sim.jsonio import DuplicateKeyError, duplicate_key_path, is_number, unique_keys
from sim.model.curve import Curve

FORMAT = "overlap-sim calibration profile"
SCHEMA_VERSION = 1
# curve name -> axis names (what the simulator evaluates it at)
CURVE_AXES: dict[str, tuple[str, ...]] = {
    "forward.decode": ("num_reqs", "ctx"),
    "forward.extend": ("num_tokens", "prefix"),
    "recv": ("num_reqs",),
    "schedule.extend": ("num_reqs",),
    "schedule.decode": ("num_reqs",),
    "launch.extend": ("num_tokens",),
    "launch.decode": ("num_reqs",),
    "process.extend": ("num_reqs",),
    "process.decode": ("num_reqs",),
}
# structured output (sim.engines.sglang.structured): update_regex_vocab_mask at num_reqs
# constrained requests, and process_batch_result of a decode whose every request is constrained
GRAMMAR_CURVE_AXES: dict[str, tuple[str, ...]] = {"grammar.mask": ("num_reqs",), "grammar.process": ("num_reqs",)}
# and, on SGLang's CPU engine, the masked sampler's extra time on the scheduler's thread
GRAMMAR_SAMPLE_AXES: dict[str, tuple[str, ...]] = {"grammar.sample": ("num_reqs",)}
# curves a profile may have (the simulator uses them when present)
OPTIONAL_CURVE_AXES: dict[str, tuple[str, ...]] = {
    # host time blocked inside the submission call when the device was idle: MLX's
    # mx.async_eval dispatches the graph on the calling thread and waits while more than
    # MAX_ACTIVE_TASKS tasks are outstanding (mlx/transforms.cpp), so it returns only when the
    # device is within the last of them
    "submit.decode": ("num_reqs", "ctx"),
    "submit.extend": ("num_tokens", "prefix"),
    # the part of launch.extend that a composed profile took from its device calibration: that
    # harness's own model launched eagerly, standing in for the engine's (calibrate.host.compose);
    # launch.extend includes it; the simulator reads it for the share of the launch the device runs as it
    # is queued (ProfileCostModel.eager_share) and where costs.cpu.extend_launch_device_scale moves it
    "device_launch.extend": ("num_tokens",),
    **GRAMMAR_CURVE_AXES,
    **GRAMMAR_SAMPLE_AXES,
}
ALL_CURVE_AXES = {**CURVE_AXES, **OPTIONAL_CURVE_AXES}


@dataclass(frozen=True)
class CurveTable:
    """The curves of one engine's profiles: ``required`` and ``optional`` (curve name -> axis
    names), and which of them are ``forward`` (device) times, which must be at least
    :data:`MIN_FORWARD_S`. ``engine`` is the profile's ``metadata.engine``."""

    engine: str
    required: dict
    optional: dict
    forward: tuple

    @property
    def all(self) -> dict:
        return {**self.required, **self.optional}


SGLANG_CURVES = CurveTable("sglang", CURVE_AXES, OPTIONAL_CURVE_AXES, ("forward.decode", "forward.extend"))
# a host-costs file (``metadata.kind == "host"``): SGLang's host curves only, no forward
# (calibrate --engine sglang --host-only writes one; overlap-sim compose joins it to a device's)
SGLANG_HOST_CURVES = CurveTable("sglang", {}, {**{k: v for k, v in CURVE_AXES.items() if not k.startswith("forward")},
                                               **GRAMMAR_CURVE_AXES}, ())
REQUIRED_METADATA = ("backend", "device", "device_name", "host_cpu", "libraries", "model", "date",
                     "grid", "repeats")
# the second axis of forward.extend (and submit.extend), named "prefix" in the curve
# (sim.model.profile_costs): "prefix" (the default: cached tokens per request; the curve times
# one request's extend, each request's cached prefix added to its own share) or "attended" (the
# KV tokens each new token attends on average, sum_i q_i (p_i + q_i) / sum_i q_i: profiles from a
# server's trace, calibrate.real.from_trace.forms)
EXTEND_AXES = ("prefix", "attended")
# optional metadata times the simulator reads (seconds)
TIME_METADATA = ("sync_latency_s", "device_gap_s")
MAX_STEP_S = 3600.0  # no phase or forward of one step takes an hour: a larger time is a corrupt value
MAX_STATED_U = 1000.0  # a stated relative uncertainty above this is not a bound but a corrupt value (a transfer's
# method spread can state 20x: the range is then simulated over it, factors (1 + u) and 1 / (1 + u))
# where a profile states an uncertainty the verdict's range is simulated over (sim.whatif.stated_range)
STATED_UNCERTAINTIES = (("composed", "move", "uncertainty_rel"), ("trace", "slowdown", "uncertainty_rel"),
                        ("transfer", "uncertainty_rel"))
MIN_FORWARD_S = 1.0e-9  # a forward takes at least this long (else simulated time would not advance)
# a curve's or a sample's coordinate (requests, tokens of a step or a context) is at most the
# largest KV pool a scenario may give (sim.model.schema.MAX_POOL_TOKENS): a larger one is a
# corrupt value (10**400 would not even convert to a float)
MAX_COORDINATE = 10**12


_READ_ONLY: dict[tuple, dict] = {}  # load_profile_read_only's profiles, by file version
READ_ONLY_KEPT = 4  # how many file versions it keeps


def load_profile_read_only(path: str | Path, curves: CurveTable = SGLANG_CURVES) -> dict:
    """:func:`load_profile`, once per file version in a process: the same validated dict for the
    same path, size, modification time and engine, which callers must not change (the cost
    models and the scenario check only read it). A run of two settings loaded a profile three
    times (the vLLM one: 113,000 samples, 0.11 s each). Keeps the latest
    :data:`READ_ONLY_KEPT` versions.

    Raises:
        ProfileError: as :func:`load_profile`.
    """
    version = _file_version(path)
    if version is None:
        return load_profile(path, curves)  # says why
    key = (*version, curves.engine)
    if key not in _READ_ONLY:
        profile = load_profile(path, curves)
        while len(_READ_ONLY) >= READ_ONLY_KEPT:
            del _READ_ONLY[next(iter(_READ_ONLY))]
        _READ_ONLY[key] = profile
    return _READ_ONLY[key]


def loaded_metadata(path: str | Path) -> dict | None:
    """The ``metadata`` of the profile at ``path`` as :func:`load_profile_read_only` holds it for
    the file's current version (any engine's), None where it holds none. For labels read after
    the run (the table's title, the warnings, the verdict): parsing a profile again for them cost a
    10-request run about 40 ms (a shipped H200 profile is 1 MB of JSON, read twice). The caller
    must not change it."""
    version = _file_version(path)
    return next((profile["metadata"] for key, profile in _READ_ONLY.items() if key[:3] == version), None)


def _file_version(path: str | Path) -> tuple | None:
    """``(resolved path, size, modification time in ns)`` of the file at ``path``: the read-only
    cache's key less the engine; None where it cannot be read."""
    try:
        st = Path(path).stat()
        return str(Path(path).resolve()), st.st_size, st.st_mtime_ns
    except OSError:
        return None


def load_profile(path: str | Path, curves: CurveTable = SGLANG_CURVES) -> dict:
    """Read and validate a profile file of the engine whose curves ``curves`` lists (SGLang's by
    default).

    Raises:
        ProfileError: missing or unreadable file, not JSON, not a profile, a newer schema, a
            missing curve or metadata key, a malformed curve, NaN/infinite/negative times, a
            profile of another engine. The message names the file and the offending field.
    """
    path = Path(path)
    source = str(path)
    if path.is_dir():
        raise ProfileError(source, "", "a folder; expected a profile file (JSON)")
    if not path.is_file():
        raise ProfileError(source, "", "no such profile file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ProfileError(source, "", f"cannot read the file ({err})") from None
    try:
        data = json.loads(text, object_pairs_hook=unique_keys)
    except DuplicateKeyError as err:
        raise ProfileError(source, duplicate_key_path(text, err.key), "given twice in one JSON object (JSON "
                           "would keep the last in silence): the file is corrupt or hand-merged") from None
    except json.JSONDecodeError as err:
        raise ProfileError(source, "", f"not valid JSON (line {err.lineno}: {err.msg}); "
                           "the file is corrupt or truncated") from None
    except ValueError as err:  # an integer of more than 4,300 digits (int_max_str_digits)
        raise ProfileError(source, "", f"not readable JSON ({err}); the file is corrupt") from None
    except RecursionError:
        raise ProfileError(source, "", "JSON nested too deeply to read: not a profile") from None
    validate_profile(data, source, curves)
    return data


def validate_profile(data, source: str, curves: CurveTable = SGLANG_CURVES) -> None:
    """Check a parsed profile of ``curves``' engine; raise :class:`ProfileError` naming the first
    bad field. Every forward curve it holds (required, optional, per setting) is refused below
    :data:`MIN_FORWARD_S` (a forward that takes no time would not advance simulated time)."""
    table, known = curves, curves.all
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = f"a JSON {type(data).__name__}" if not isinstance(data, dict) else shown(data.get("format"))
        raise ProfileError(source, "format", f"expected {FORMAT!r}: this is not an overlap-sim calibration profile "
                                             f"(got {got})")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ProfileError(source, "schema_version", f"a positive integer (got {shown(version)})")
    if version > SCHEMA_VERSION:
        raise ProfileError(source, "schema_version", f"at most {SCHEMA_VERSION} (got {shown(version)}): the profile "
                           "was written by a newer overlap-sim; upgrade to read it")
    meta = data.get("metadata")
    if not isinstance(meta, dict):
        raise ProfileError(source, "metadata", "an object")
    for key in REQUIRED_METADATA:
        if key not in meta:
            raise ProfileError(source, f"metadata.{key}", "missing")
    for key in ("backend", "device", "device_name", "host_cpu"):  # (printed in every title and note)
        if not isinstance(meta[key], str):
            raise ProfileError(source, f"metadata.{key}", f"a string (got {shown(meta[key])})")
    model = meta["model"]
    if not isinstance(model, dict) or not isinstance(model.get("name"), str):
        raise ProfileError(source, "metadata.model", f"an object with the model's name (got {shown(model)})")
    for key in TIME_METADATA:
        if key in meta:
            _check_time(meta[key], source, f"metadata.{key}")
    _check_finite(meta, source, "metadata")
    for path in STATED_UNCERTAINTIES:
        _check_stated(meta, path, source)
    if meta.get("extend_axis", EXTEND_AXES[0]) not in EXTEND_AXES:
        raise ProfileError(source, "metadata.extend_axis", f"one of {', '.join(EXTEND_AXES)} "
                           f"(got {meta['extend_axis']!r})")
    engine = meta.get("engine", "sglang")
    if engine != table.engine:
        raise ProfileError(source, "metadata.engine", f"{table.engine!r}: a profile of {table.engine}'s curves is "
                           f"needed here (got a profile of engine {engine!r})")
    curves = data.get("curves")
    if not isinstance(curves, dict):
        raise ProfileError(source, "curves", "an object with one curve per forward kind and phase")
    for name, axes in table.required.items():
        if name not in curves:
            raise ProfileError(source, f"curves.{name}", "missing: a profile needs a curve for every forward "
                               f"kind and phase ({', '.join(table.required)})")
        _check_curve(curves[name], axes, source, f"curves.{name}")
        _check_forward(curves[name], name, table, source, f"curves.{name}")
    for name, axes in table.optional.items():
        if name in curves:
            _check_curve(curves[name], axes, source, f"curves.{name}")
            _check_forward(curves[name], name, table, source, f"curves.{name}")
    by_setting = data.get("setting_curves", {})
    if not isinstance(by_setting, dict):
        raise ProfileError(source, "setting_curves", "an object: setting -> curves that differ under it")
    for setting, named in by_setting.items():
        if not isinstance(named, dict):
            raise ProfileError(source, f"setting_curves.{setting}", "an object of curves")
        for name, c in named.items():
            if name not in known:
                raise ProfileError(source, f"setting_curves.{setting}.{name}", "a known curve name")
            _check_curve(c, known[name], source, f"setting_curves.{setting}.{name}")
            _check_forward(c, name, table, source, f"setting_curves.{setting}.{name}")
    samples = data.get("samples")
    if not isinstance(samples, list):
        raise ProfileError(source, "samples", "a list of raw timing samples")
    check_samples(samples, known, source)


def check_samples(samples: list, known: dict, source: str, field: str = "samples") -> None:
    """Raw timing samples as a profile (and a calibration's sidecar) holds them: each an object
    with a known ``curve`` (``known``: curve name -> its axes), a ``point`` giving each axis a number
    and ``times_s``, each time a number from 0 to :data:`MAX_STEP_S`.

    Raises:
        ProfileError: naming ``field[k]`` (and the key) of ``source``.
    """
    for k, s in enumerate(samples):
        where = f"{field}[{k}]"
        if not isinstance(s, dict) or s.get("curve") not in known or not isinstance(s.get("point"), dict) \
                or not isinstance(s.get("times_s"), list):
            raise ProfileError(source, where, "an object with curve (a known curve), point and times_s")
        if not isinstance(s.get("setting", ""), str):
            raise ProfileError(source, f"{where}.setting", "a setting name")
        for axis in known[s["curve"]]:
            if not is_number(s["point"].get(axis), 0, MAX_COORDINATE):
                raise ProfileError(source, f"{where}.point.{axis}",
                                   f"a number from 0 to {MAX_COORDINATE:.0e} (got {shown(s['point'].get(axis))})")
        times = s["times_s"]
        if not _times_ok(times):  # find the first bad one, for its message
            for i, t in enumerate(times):
                _check_time(t, source, f"{where}.times_s[{i}]")


def _check_forward(c: dict, name: str, table: CurveTable, source: str, where: str) -> None:
    """Refuse a forward curve of ``table`` (a checked curve) with a time below :data:`MIN_FORWARD_S`."""
    if name not in table.forward:
        return
    values = c["values_s"]
    flat = values if len(c["axes"]) == 1 else [t for row in values for t in row]
    if min(flat) < MIN_FORWARD_S:
        raise ProfileError(source, f"{where}.values_s", f"times >= {MIN_FORWARD_S:g} s: a forward "
                           f"takes time (got {min(flat)!r})")


def _times_ok(times: list) -> bool:
    """Whether every entry of ``times`` is a finite int or float (not a bool) from 0 to
    :data:`MAX_STEP_S`: the check of :func:`_check_time` on a whole list at once (a profile holds
    up to some 100,000 samples), without naming the bad one. The bounds come before the sum: an
    integer too large for a float fails them (compared exactly) before its sum could overflow;
    a NaN fails them or the sum."""
    if not times:
        return True
    return (set(map(type, times)) <= {float, int} and min(times) >= 0 and max(times) <= MAX_STEP_S
            and math.isfinite(sum(times)))


def _check_finite(value, source: str, field: str) -> None:
    """No NaN or infinity anywhere in ``value`` (a JSON value: the metadata's objects and lists,
    walked), which strict JSON cannot write back (``transfer``, ``compose``) and no field means.

    Raises:
        ProfileError: naming the first such field.
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise ProfileError(source, field, f"a finite number or another JSON value (got {shown(value)}): NaN and "
                           "infinity are not JSON")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, source, f"{field}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_finite(item, source, f"{field}[{i}]")


def _check_stated(meta: dict, path: tuple, source: str) -> None:
    """A stated uncertainty at ``metadata.<path>``, where its objects are there: None (not known)
    or a number from 0 (none: a profile moved to its own card) to :data:`MAX_STATED_U` (a
    relative size; the verdict's range is simulated over it).

    Raises:
        ProfileError: naming the field.
    """
    node = meta
    for key in path[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    if not isinstance(node, dict) or path[-1] not in node:
        return
    u = node[path[-1]]
    if u is None:  # (stated as unknown: no range is simulated over it)
        return
    if not is_number(u, 0.0, MAX_STATED_U):
        raise ProfileError(source, "metadata." + ".".join(path), f"a relative uncertainty from 0 to "
                           f"{MAX_STATED_U:g} (0.42 for ±42%; got {shown(u)})")


def _check_time(t, source: str, field: str) -> None:
    # the range first: NaN fails it, and an integer too large for a float is compared exactly
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= MAX_STEP_S or not math.isfinite(t):
        raise ProfileError(source, field, f"a finite time in seconds >= 0 and <= {MAX_STEP_S:g} (got {shown(t)})")


def _check_curve(c, axes: tuple[str, ...], source: str, where: str) -> None:
    if not isinstance(c, dict):
        raise ProfileError(source, where, "an object with axes, grid and values_s")
    if c.get("axes") != list(axes):
        raise ProfileError(source, f"{where}.axes", f"{list(axes)} (got {c.get('axes')!r})")
    grid = c.get("grid")
    if not isinstance(grid, list) or len(grid) != len(axes):
        raise ProfileError(source, f"{where}.grid", f"{len(axes)} list(s) of node coordinates")
    for d, nodes in enumerate(grid):
        ok = isinstance(nodes, list) and nodes and all(is_number(v, 0, MAX_COORDINATE) for v in nodes)
        if not ok or any(b <= a for a, b in zip(nodes, nodes[1:])):
            raise ProfileError(source, f"{where}.grid[{d}]", "a non-empty, strictly increasing list of numbers "
                               f"from 0 to {MAX_COORDINATE:.0e}")
    values = c.get("values_s")
    if len(axes) == 1:
        if not isinstance(values, list) or len(values) != len(grid[0]):
            raise ProfileError(source, f"{where}.values_s", f"a list of {len(grid[0])} times (one per grid node)")
        for i, t in enumerate(values):
            _check_time(t, source, f"{where}.values_s[{i}]")
    else:
        if not isinstance(values, list) or len(values) != len(grid[0]) or any(
                not isinstance(r, list) or len(r) != len(grid[1]) for r in values):
            raise ProfileError(source, f"{where}.values_s",
                               f"{len(grid[0])} rows of {len(grid[1])} times (one per grid node)")
        for i, row in enumerate(values):
            for j, t in enumerate(row):
                _check_time(t, source, f"{where}.values_s[{i}][{j}]")


STATISTICS = ("median", "mean")


def profile_curves(profile: dict, statistic: str = "median", setting: str | None = None,
                   curves: CurveTable = SGLANG_CURVES, source: str = "<profile>") -> dict[str, Curve]:
    """The evaluable :class:`Curve` of every curve of ``curves``' engine in a validated profile.

    ``statistic``: ``median`` (the stored curves: the median of each point's samples, robust to
    interference while calibrating) or ``mean`` (each point's raw samples averaged: the expected
    cost of a step, which time averages such as throughput follow when the costs are skewed;
    a point without raw samples keeps its median). ``setting``: the event loop simulated; its
    ``setting_curves`` (if any) replace the base curves of the same name.

    Raises:
        ProfileError: naming ``samples[k].times_s`` of ``source`` when the mean of a forward
            point's samples is below :data:`MIN_FORWARD_S` (the rule :func:`validate_profile`
            holds the stored curves to, applied to the statistic the run uses: samples of 0 s
            would price a forward at no time).
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS} (got {statistic!r})")
    known = curves.all
    stored = {name: (c, "") for name, c in profile["curves"].items() if name in known}
    for name, c in profile.get("setting_curves", {}).get(setting, {}).items():
        stored[name] = (c, setting)
    means: dict[tuple, float] = {}
    if statistic == "mean":
        for k, smp in enumerate(profile.get("samples", [])):
            axes = known.get(smp["curve"])
            if axes and smp["times_s"]:
                key = (smp.get("setting", ""), smp["curve"], *(float(smp["point"][a]) for a in axes))
                means[key] = mean = sum(smp["times_s"]) / len(smp["times_s"])
                if mean < MIN_FORWARD_S and smp["curve"] in curves.forward and _at_node(stored, key):
                    raise ProfileError(source, f"samples[{k}].times_s", f"a mean >= {MIN_FORWARD_S:g} s "
                                       f"(costs.profile_statistic mean): a forward takes time (got {mean!r})")
    out = {}
    for name, (c, where) in stored.items():
        grid, values = c["grid"], c["values_s"]
        if means:
            if len(grid) == 1:
                values = [means.get((where, name, float(x)), v) for x, v in zip(grid[0], values)]
            else:
                values = [[means.get((where, name, float(x), float(y)), v) for y, v in zip(grid[1], row)]
                          for x, row in zip(grid[0], values)]
        out[name] = Curve(c["axes"], grid, values)
    return out


def _at_node(stored: dict, key: tuple) -> bool:
    """Whether the sample point ``key`` (setting, curve, coordinates...) is a node of the curve
    :func:`profile_curves` uses for it (the mean of a point elsewhere prices nothing)."""
    setting, name, *point = key
    c, where = stored.get(name, (None, None))
    return c is not None and where == setting and all(x in map(float, nodes) for x, nodes in zip(point, c["grid"]))
