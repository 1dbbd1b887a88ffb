"""A scenario's validation error as one line: the field as the user wrote it, what was expected,
what was given.

pydantic reports every problem of a failed validation, with the branches of a union it tried
and their internal names in the field's path; :func:`explain` keeps the problem a user can act
on (the first of those that match the input's shape), names its field by the scenario's own
keys, suggests the closest key for an unknown one, and puts the given value in the message.
:mod:`sim.scenario` raises what it returns; which keys a section has comes from there (the
scenario's model), passed in as ``known_keys``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Container
from typing import Any

from pydantic import ValidationError

from sim.errors import ScenarioError, shown

# a check across fields names the field it blames: "Value error, field: text"
_FIELD_PREFIX = re.compile(r"Value error, ([A-Za-z_][A-Za-z0-9_.]*): (.*)$", re.S)


def explain(err: ValidationError, source: str, engines: Container[str], engine: str,
            known_keys: Callable[[tuple, str], list[str]]) -> ScenarioError:
    """The one-line error for a failed validation of the scenario from ``source``.

    Args:
        err: pydantic's error.
        source: where the scenario came from (a file, ``<dict>``), for the message.
        engines: the server sections' engine names (the union's tags, left out of a field's path).
        engine: the scenario's engine (the keys an unknown ``server`` key is compared with).
        known_keys: ``known_keys(loc, engine)``, the keys of the section at ``loc``.
    """
    errors = _relevant(err.errors(include_url=False))
    first = errors[0]
    field = _format_loc(tuple(first["loc"]), engines)
    got = first.get("input")
    msg = first["msg"]
    prefixed = _FIELD_PREFIX.match(msg) if first["type"] == "value_error" else None
    if first["type"] == "unknown_engine":
        field, msg = "server.engine", f"{msg} (got {shown(got.get('engine'))})"
    elif first["type"] == "extra_forbidden":
        msg = _unknown_key_message(tuple(field.split(".")), known_keys, engine)
    elif prefixed:
        field = f"{field}.{prefixed[1]}" if field else prefixed[1]
        msg = prefixed[2]
    elif first["type"] == "value_error":
        msg = msg.removeprefix("Value error, ")
    elif isinstance(got, dict) and got and all(":" in str(k) and v is None for k, v in got.items()):
        # {dist:lognormal,mean:300}: YAML's flow mapping needs a space after each colon, else
        # every "key:value" is one key with no value
        spaced = ", ".join(": ".join(str(k).split(":", 1)) for k in got)  # what was meant, from what was written
        msg = (f"a mapping; YAML read {', '.join(map(repr, got))} as keys with no values: put a space after each "
               f"colon ({{{spaced}}})")
    elif first["type"] in ("model_type", "dict_type", "model_attributes_type"):  # pydantic's "a valid
        msg = f"expected a mapping of keys (a section), got {shown(got)}"  # dictionary or instance of ..."
    elif first["type"] == "union_tag_not_found":  # a mapping without the key that says which kind it is
        tag = str((first.get("ctx") or {}).get("discriminator", "")).strip("'")
        kinds = " (a length: dist: uniform, normal, lognormal or choice; docs/scenarios.md)" if tag == "dist" else ""
        msg = f"a mapping here needs a {tag!r} key saying which kind it is{kinds}"
    elif not isinstance(got, (dict, list)):
        msg = f"{msg} (got {shown(got)})"
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return ScenarioError(source, field, msg + more)


def _format_loc(loc: tuple, engines: Container[str]) -> str:
    # pydantic puts union branch names into loc ('constrained-int', 'tagged-union[...]' followed
    # by the tag value); keep the user's field names only.
    names, skip_tag = [], False
    for i, part in enumerate(loc):
        text = str(part)
        if skip_tag:
            skip_tag = False
            continue
        if i == 1 and loc[0] == "server" and text in engines:  # the server section's engine tag
            continue
        if text.startswith("tagged-union["):
            skip_tag = True
            continue
        if text in ("int", "constrained-int") or text.startswith("function-after["):
            continue
        names.append(text)
    return ".".join(names)


def _unknown_key_message(loc: tuple, known_keys: Callable[[tuple, str], list[str]], engine: str) -> str:
    names = known_keys(tuple(p for p in loc[:-1]), engine)
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
    if close:
        return f"unknown key (did you mean {close[0]!r}?)"
    return f"unknown key (expected one of: {', '.join(names)})" if names else "unknown key"


def _relevant(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop the errors of union branches that do not match the input's shape (an int branch
    for a mapping, a mapping branch for a scalar)."""
    kept = [e for e in errors
            if not (e["type"] == "int_type" and isinstance(e.get("input"), dict))
            and not (e["type"] == "model_attributes_type" and not isinstance(e.get("input"), dict))]
    return kept or errors
