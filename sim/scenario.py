"""A scenario: the workload, an engine's server and the step costs; loading it from YAML files,
dicts and ``--set`` overrides.

A scenario says what load arrives (``workload``, :mod:`sim.model.schema`), how the server is
configured (``server``: SGLang's, :mod:`sim.engines.sglang.server`, or with ``engine: vllm``
vLLM's, :mod:`sim.engines.vllm.server`) and what each step costs (``costs``,
:mod:`sim.model.schema`). Every field is validated; unknown keys are errors (a failed
validation is told in one line by :mod:`sim.scenario_errors`). Times are seconds.
"""

from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path
from typing import Annotated, Any, Optional, Union

import yaml
from pydantic import BaseModel, Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from sim.engines.sglang.server import Server
from sim.engines.vllm.server import VllmServer
from sim.errors import ProfileError, ScenarioError, UserInputError, shown_override
from sim.scenario_errors import explain
from sim.model.schema import MAX_SEED, Costs, StrictModel, Workload, length_bounds

# scenario fields that hold a file path: relative to the scenario file's folder when written in
# the file, to the working directory when given on the command line (--set, --grid)
PATH_KEYS = ("costs.profile", "workload.trace")
ENGINES = {"sglang": Server, "vllm": VllmServer}  # server.engine -> its server section


def _unique_keys(base: type) -> type:
    """``base`` (a PyYAML safe loader) refusing a mapping that repeats a key: PyYAML keeps the
    last value silently, and a scenario that says ``name`` twice has one of them ignored."""

    class UniqueKeys(base):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}",
                            key_node.start_mark)
                    seen.add(key)
                except TypeError:  # an unhashable key: the base constructor says so
                    break
            return super().construct_mapping(node, deep)

    return UniqueKeys


_FAST_LOADER = _unique_keys(yaml.CSafeLoader) if hasattr(yaml, "CSafeLoader") else None
_LOADER = _unique_keys(yaml.SafeLoader)


def _load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, parsed by libyaml where PyYAML has it (the same safe constructor;
    about 20x faster on a scenario file), refusing a repeated key. Text that libyaml rejects is
    parsed again by PyYAML's own parser, so a bad document gives the same value or error (and
    message) as ever.

    Raises:
        yaml.YAMLError: not valid YAML, a mapping that repeats a key, (:class:`NumberTooLong`)
            an integer of more digits than Python converts (``sys.get_int_max_str_digits``), or
            (:class:`NestedTooDeep`) lists or mappings nested deeper than the parser recurses."""
    try:
        if _FAST_LOADER is not None:
            try:
                return yaml.load(text, Loader=_FAST_LOADER)
            except yaml.YAMLError:
                pass
        return yaml.load(text, Loader=_LOADER)
    except ValueError as err:  # int("9" * 5000): Python's limit on converting long digit strings
        raise NumberTooLong(f"a number too long to read ({err})") from None
    except RecursionError:  # (libyaml, from PyYAML 6.0.4, refuses deep nesting; PyYAML's own parser recurses)
        raise NestedTooDeep("lists or mappings nested too deep to read") from None


class NumberTooLong(yaml.YAMLError):
    """An integer in the YAML text has more digits than Python converts."""


class NestedTooDeep(yaml.YAMLError):
    """Lists or mappings in the YAML text nested deeper than the parser can follow."""


def _engine_of(value) -> str | None:
    """The engine a ``server`` section is for (``engine``, default sglang); None: an unknown one."""
    engine = value.get("engine", "sglang") if isinstance(value, dict) else getattr(value, "engine", "sglang")
    return engine if isinstance(engine, str) and engine in ENGINES else None


_SERVER_UNION = Union[Annotated[Server, Tag("sglang")], Annotated[VllmServer, Tag("vllm")]]
ServerSection = Annotated[
    _SERVER_UNION,
    Discriminator(_engine_of, custom_error_type="unknown_engine",
                  custom_error_message=f"expected one of {', '.join(ENGINES)}"),
]


@functools.cache
def _default_costs() -> Costs:
    """The costs section with every field at its default (built once)."""
    return Costs()


class Scenario(StrictModel):
    """A validated scenario. ``source`` is the file it came from (for messages), ``base_dir``
    the folder that relative paths in it (trace, profile) are resolved against."""

    name: str = Field(min_length=1)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    workload: Workload = Workload()
    server: ServerSection = Server()
    costs: Costs = Costs()
    source: str = Field(default="<dict>", exclude=True)
    base_dir: str = Field(default=".", exclude=True)

    def resolve_path(self, relative: str) -> Path:
        """A path from the scenario, resolved against the scenario file's folder."""
        p = Path(relative).expanduser()
        return p if p.is_absolute() else Path(self.base_dir) / p

    @field_validator("name")
    @classmethod
    def _a_folder_name(cls, name: str) -> str:
        # the default results folder is results/<name>/: a plain folder name, no path in it
        if name in (".", "..") or any(c in name for c in "/\\\x00"):
            raise ValueError(f"a plain name, no path (it names the folder results/<name>/; got {name!r})")
        if not name.isprintable() or name != name.strip():
            raise ValueError(f"a plain name without control characters or surrounding spaces (it names the folder "
                             f"results/<name>/; got {name!r})")
        return name

    @model_validator(mode="after")
    def _costs_the_engine_reads(self):
        """A cost field the scenario's engine does not read (its server's ``UNREAD_COSTS``) is
        refused when given another value than its default: it would change nothing."""
        defaults = _default_costs()
        for key in getattr(self.server, "UNREAD_COSTS", ()):
            given, default = self.costs, defaults
            for part in key.split("."):
                given, default = getattr(given, part), getattr(default, part)
            if isinstance(given, BaseModel):  # a section (gil): the first of its fields given
                key, given, default = next(((f"{key}.{name}", getattr(given, name), getattr(default, name))
                                            for name in type(given).model_fields
                                            if getattr(given, name) != getattr(default, name)), (key, None, None))
            if given != default:
                raise ValueError(f"costs.{key}: a cost of another engine's loops, which {self.server.engine}'s do not "
                                 f"read (given {given!r}; leave it at its default {default!r})")
        return self

    @model_validator(mode="after")
    def _fits_the_pool(self):
        w, srv = self.workload, self.server
        if not w.trace:
            shortest = max(1, length_bounds(w.input_len)[0])
            _check_prompt_fits(srv, shortest, "the shortest prompt (input_len)")
        return self

    def with_overrides(self, overrides: list[str], flag: str = "--set") -> "Scenario":
        """A new scenario with ``key.path=value`` overrides applied (value parsed as YAML; a
        relative path in ``costs.profile`` or ``workload.trace`` is taken from the working
        directory). ``flag`` names the overrides in error messages (``--set``, ``--grid``)."""
        raw = self.model_dump(mode="json")
        # the server fields the scenario gave (its defaults are not: an override's launch_args may set them)
        raw["server"] = self.server.model_dump(mode="json", exclude_unset=True)
        for key in self.server._from_launch_args:  # re-derived from launch_args on validation
            raw["server"].pop(key, None)
        base = copy.deepcopy(raw)
        apply_overrides(raw, overrides, flag)
        return _validate_overridden(raw, base, overrides, flag, self.source, self.base_dir)


def _check_prompt_fits(srv, prompt: int, what: str) -> None:
    """A prompt of ``prompt`` tokens can be served by the scenario's server (see
    :func:`_check_fits`; vLLM: the API server rejects a prompt of ``max_model_len`` tokens or
    more, ``get_max_tokens`` in vLLM 0.32.0's ``entrypoints/serve/utils/api_utils.py``)."""
    if isinstance(srv, VllmServer):
        if prompt >= srv.max_model_len:
            raise ValueError(f"server.max_model_len: {srv.max_model_len} tokens leaves no room for {what}: "
                             f"{prompt} tokens and one output token; every request would fail")
        return
    _check_fits(prompt, srv.kv_pool_tokens, srv.page_size, what)


def _check_fits(prompt: int, pool_tokens: int, page_size: int, what: str) -> None:
    """The scheduler aborts a request whose prompt the KV pool cannot hold (SGLang's
    ``max_req_input_len``: pool - 6) or that leaves no room for one output token (its
    ``max_new_tokens`` is clipped to ``pool - ceil_p(prompt) - page - 1``; a longer output only
    stops early): a pool too small for every prompt would fail them all."""
    cap = pool_tokens // page_size * page_size
    if prompt >= cap - 6 or cap - (-(-prompt // page_size) * page_size) - page_size - 1 < 1:
        raise ValueError(f"server.kv_pool_tokens: the KV pool ({pool_tokens} tokens) is too small for {what}: "
                         f"{prompt} tokens; every request would fail")


def apply_overrides(raw: dict, overrides: list[str], flag: str = "--set") -> None:
    """Set ``a.b.c=value`` entries into ``raw`` in place; values are parsed as YAML scalars/lists.
    A relative path given to one of :data:`PATH_KEYS` is made absolute from the working directory.

    Raises:
        ScenarioError: an override without ``=``, a key given twice (one would silently win), or
            a path through a non-mapping (blamed on ``flag``, e.g. ``--set``).
    """
    seen: set[str] = set()
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ScenarioError(shown_override(flag, item), "", "expected KEY.PATH=VALUE")
        if key in seen:
            raise ScenarioError(shown_override(flag, item), key, f"given twice (each {flag} key once)")
        seen.add(key)
        try:
            value = _load_yaml(text)
        except NumberTooLong:
            raise ScenarioError(f"{flag} {key}", key, f"a number of more than {sys.get_int_max_str_digits():,} "
                                "digits") from None
        except yaml.YAMLError:
            value = text
        if key in PATH_KEYS and isinstance(value, str) and value:
            value = str(Path.cwd() / Path(value).expanduser())
        node = raw
        parts = key.split(".")
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                field = ".".join(parts[: depth + 1])
                raise ScenarioError(shown_override(flag, item), field,
                                    "is not a mapping; cannot set a key inside it")
            node = child
        node[parts[-1]] = value


def _known_keys(loc: tuple, engine: str = "sglang") -> list[str]:
    """The keys of the section at ``loc`` (field names of the model there; the ``server`` section
    of ``engine``), for suggestions."""
    model: Any = Scenario
    for part in loc:
        field = model.model_fields.get(str(part)) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return []
        model = field.annotation
        if model == _SERVER_UNION:  # the server section of the scenario's engine
            model = ENGINES.get(engine, Server)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return [name for name, f in model.model_fields.items() if not f.exclude]
    return []


def field_for_flag(flag: str) -> str | None:
    """The scenario field a command-line flag like ``--max-running-requests`` most likely meant
    (``server.max_running_requests``): a key of a section (:func:`_known_keys`: ``workload``, either
    engine's ``server``, ``costs``) or a top-level field (``name``, ``seed``; not a whole section)
    whose name is the flag's, dashes read as underscores; None when no field or more than one
    section has it."""
    name = flag.lstrip("-").replace("-", "_")
    top = _known_keys(())
    found = {f"{section}.{name}" for section in top for engine in ENGINES if name in _known_keys((section,), engine)}
    if name in top and not _known_keys((name,)):
        found.add(name)
    return found.pop() if len(found) == 1 else None


def _validate(raw: Any, source: str, base_dir: str) -> Scenario:
    """Validate a raw scenario and check the files it names.

    Raises:
        ScenarioError: the first problem (its field path, what was expected, what was given).
        UserInputError: a trace or calibration profile it names is unusable (names that file).
    """
    if not isinstance(raw, dict):
        raise ScenarioError(source, "", "expected a mapping at the top level of the scenario")
    data = dict(raw)
    data["source"] = source
    data["base_dir"] = base_dir
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as err:
        raise explain(err, source, ENGINES, _engine_of(data.get("server") or {}) or "sglang", _known_keys) from None
    _check_files(scenario)
    return scenario


def _validate_overridden(raw: dict, base: dict, overrides: list[str], flag: str, source: str,
                         base_dir: str) -> Scenario:
    """:func:`_validate` of a scenario with overrides applied; a problem is blamed on the override
    that set the field, or on the overrides when the scenario without them is valid."""
    try:
        return _validate(raw, source, base_dir)
    except ScenarioError as err:
        if err.source != source or not overrides:
            raise
        keys = [item.partition("=")[0].strip() for item in overrides]
        field = err.field
        if field:
            # the last override that set the field or a section holding it (a later one replaces what an
            # earlier one set inside it), else the first that set something inside the field
            setting = [item for item, key in zip(overrides, keys) if field == key or field.startswith(key + ".")]
            inside = [item for item, key in zip(overrides, keys) if key.startswith(field + ".")]
            if setting or inside:
                blamed = setting[-1] if setting else inside[0]
                raise ScenarioError(shown_override(flag, blamed), field, err.expected) from None
        try:
            _validate(base, source, base_dir)
        except UserInputError:
            raise err from None  # the scenario itself is bad
        blamed = " ".join(shown_override(flag, item) for item in overrides)
        raise ScenarioError(f"{source} with {blamed}", field, err.expected) from None


def load_scenario(path_or_dict: Union[str, Path, dict, Scenario], overrides: Optional[list[str]] = None) -> Scenario:
    """Load and validate a scenario from a YAML file path or a dict.

    Args:
        path_or_dict: a path to a YAML file, a mapping with the scenario's keys, or a Scenario.
        overrides: ``KEY.PATH=VALUE`` strings applied before validation (the CLI's ``--set``).

    Returns:
        The validated, immutable :class:`Scenario`.

    Raises:
        ScenarioError: missing or unreadable file, bad YAML, unknown key, wrong type or range;
            the message names the file and the field; ``path_or_dict`` or ``overrides`` of
            another type.
    """
    given, bad = overrides, isinstance(overrides, (str, bytes))
    if not bad:
        try:
            overrides = list(overrides or [])  # an iterator once: checked and used as a list
        except TypeError:
            bad = True
    if bad or not all(isinstance(o, str) for o in overrides):
        raise ScenarioError("overrides", "", f"a list of KEY.PATH=VALUE strings (got {given!r})")
    if not isinstance(path_or_dict, (str, Path, dict, Scenario)):
        raise ScenarioError(repr(path_or_dict)[:60], "", "a scenario: a YAML file's path, a dict or a Scenario "
                                                         f"(got a {type(path_or_dict).__name__})")
    if isinstance(path_or_dict, Scenario):
        return path_or_dict.with_overrides(overrides) if overrides else path_or_dict
    if isinstance(path_or_dict, dict):
        raw, source, base_dir = copy.deepcopy(path_or_dict), "<dict>", "."
    else:
        path = Path(path_or_dict)
        source, base_dir = str(path), str(path.parent)
        if path.is_dir():
            raise ScenarioError(source, "", "a folder; expected a scenario file (YAML)")
        if not path.is_file():
            raise ScenarioError(source, "", "no such scenario file" if not path.exists() else
                                "not a regular file (a pipe or a device?); expected a scenario file (YAML)")
        try:
            raw = _load_yaml(path.read_text())
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f"line {mark.line + 1}" if mark else "YAML"
            raise ScenarioError(source, "", f"not valid YAML ({where}: {getattr(err, 'problem', err)})") from None
        except (OSError, UnicodeDecodeError) as err:
            raise ScenarioError(source, "", f"cannot read the file ({err})") from None
    if isinstance(raw, dict) and overrides:
        base = copy.deepcopy(raw)
        apply_overrides(raw, overrides)
        return _validate_overridden(raw, base, overrides, "--set", source, base_dir)
    return _validate(raw, source, base_dir)


def _check_files(scenario: Scenario) -> None:
    """The trace and the calibration profile the scenario names exist and are usable (read and
    checked now, before anything runs), and a trace's requests agree with the rest."""
    from sim.model.profile import load_profile_read_only
    from sim.model.workload import read_trace

    w, srv = scenario.workload, scenario.server
    if w.trace:
        path = scenario.resolve_path(w.trace)
        if not path.is_file():
            what = "a folder, not a trace file" if path.is_dir() else "no such file"
            raise ScenarioError(scenario.source, "workload.trace", f"{what}: {path}{_read_from(scenario, w.trace)}")
        specs = read_trace(path, by_length=w.finish == "length")
        if w.warmup_requests >= len(specs):
            raise ScenarioError(scenario.source, "workload.warmup_requests",
                                f"must be smaller than the trace's {len(specs)} requests (got {w.warmup_requests})")
        try:
            shortest = int(specs.input_len.min())
            _check_prompt_fits(srv, shortest, f"the shortest prompt of {path}")
        except ValueError as err:
            raise ScenarioError(scenario.source, *str(err).split(": ", 1)) from None
    profile = scenario.costs.profile
    if profile:
        path = scenario.resolve_path(profile)
        if not path.is_file():
            what = ("a folder, not a calibration profile" if Path(path).is_dir() else
                    "not a regular file, not a calibration profile" if Path(path).exists() else
                    "no such calibration profile")
            raise ScenarioError(scenario.source, "costs.profile", f"{what}: {path}{_read_from(scenario, profile)}")
        try:
            if isinstance(srv, VllmServer):
                from sim.engines.vllm.profile import load_vllm_profile

                load_vllm_profile(path, read_only=True)  # the run's cost models reuse it
            else:
                load_profile_read_only(path)
        except ProfileError as err:
            if err.field != "metadata.engine":
                raise
            # another engine's profile: the scenario's engine is what to look at (an absent server.engine is sglang)
            import json

            try:
                other = f"a {json.loads(Path(path).read_text())['metadata'].get('engine', 'sglang')} profile"
            except (OSError, ValueError, KeyError, AttributeError):
                other = "another engine's profile"
            default = "" if "engine" in srv.model_fields_set else " (the default: the server section names none)"
            raise ScenarioError(scenario.source, "server.engine", f"is {srv.engine}{default}, but costs.profile {path} "
                                f"is {other}: set server.engine to the profile's engine") from None


def _read_from(scenario: Scenario, given: str) -> str:
    """Where a relative path the scenario gives was looked for, for a message ("" for an absolute
    one): the scenario file's folder (a scenario given as a dict: the working directory)."""
    if Path(given).expanduser().is_absolute():
        return ""
    return f" (a relative path is read from the scenario file's folder, {Path(scenario.base_dir).resolve()})"
