"""A scenario: the workload, an engine's server and the step costs; loading it from YAML files,
dicts and ``--set`` overrides.

A scenario says what load arrives (``workload``, :mod:`sim.model.schema`), how the server is
configured (``server``: SGLang's, :mod:`sim.engines.sglang.server`) and what each step costs
(``costs``, :mod:`sim.model.schema`). Every field is validated; unknown keys are errors. Times
are seconds.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Optional, Union

import yaml
from pydantic import Field, ValidationError

from sim.engines.sglang.server import Server
from sim.errors import ScenarioError
from sim.model.schema import Costs, StrictModel, Workload


class Scenario(StrictModel):
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
