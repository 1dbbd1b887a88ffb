"""An engine server's own command-line flags, as its argument parser accepts them.

Each engine package ships the flag list of the release it was read from
(``sim/engines/<engine>/rules/flags-<version>.json``, written by ``python -m realengines.flags``
in the engine's environment from the engine's own parser). :meth:`KnownFlags.resolve` accepts a
flag as Python's ``argparse`` does (both engines' launchers use it with its default
``allow_abbrev=True``): the exact option, or an unambiguous prefix of one long option (``--tp``
for SGLang's ``--tp-size``). A flag it does not resolve is one the engine's server refuses to
start with ("unrecognized arguments").
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path


# words a user may put after a switch meaning its value; argparse takes them as a stray argument
# and refuses the command ("unrecognized arguments"), so each engine's parser refuses them there
SWITCH_VALUES = frozenset({"true", "false", "yes", "no", "on", "off", "0", "1"})

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's ``_negative_number_matcher`` (Python 3.11)


def is_option(token: str) -> bool:
    """Whether ``argparse`` reads ``token`` as an option rather than as a value
    (``ArgumentParser._parse_optional``, Python 3.11, which both engines' launchers use): it starts
    with ``-`` and is not ``-`` alone, a negative number or a string with a space. An option that
    takes a value and is followed by such a token (or by nothing) is refused by the engine's
    server: "expected one argument". A token of ``--=`` and anything after it is an option too,
    spaces or not: argparse splits at ``=`` first, and the empty long name before it is a prefix
    of every long option (an abbreviation, or an ambiguous one: refused either way)."""
    if token.startswith("--="):
        return True
    return (len(token) > 1 and token[0] == "-" and not _NEGATIVE_NUMBER.match(token) and " " not in token)


def value_after(tokens: list[str], i: int, flag: str, source: str, server: str) -> str:
    """The value of ``flag`` (an option that takes one), ``tokens[i]``.

    Raises:
        UserInputError: nothing follows ``flag``, or an option does (:func:`is_option`:
            ``--model-path --tp 2``): the engine's server (``server``, its command in words)
            refuses the command, argparse's "expected one argument".
    """
    if i >= len(tokens) or is_option(tokens[i]):
        from sim.errors import UserInputError

        raise UserInputError(source, flag, f"expected a value after {flag} ({server} refuses it: expected one "
                             "argument)")
    return tokens[i]


@dataclass(frozen=True)
class KnownFlags:
    """``flags``: option -> whether it takes a value; ``engine`` and ``version``: whose list;
    ``choices``: option -> the values its parser accepts (untyped flags with choices only)."""

    engine: str
    version: str
    flags: dict
    choices: dict = field(default_factory=dict)

    def refuses(self, option: str, raw: str | None) -> tuple[str, ...] | None:
        """The choices of ``option`` (a resolved option) when ``raw``, its value as given, is not
        one of them (the engine's parser refuses it: "invalid choice"), else None."""
        allowed = self.choices.get(option)
        return tuple(allowed) if allowed is not None and raw is not None and raw not in allowed else None

    def gives_switch_a_value(self, flag: str, token: str) -> bool:
        """Whether ``token``, after ``flag`` (as given, no ``=value``), is a value a switch cannot
        take (:data:`SWITCH_VALUES` after a flag that takes none)."""
        known = self.resolve(flag) if flag.startswith("--") and "=" not in flag else None
        return known is not None and not known[1] and token.lower() in SWITCH_VALUES

    def resolve(self, name: str) -> tuple[str, bool] | None:
        """``(option, takes a value)`` for ``name`` (``--flag``, no ``=value``), or None when the
        parser would refuse it (unknown, or a prefix of several options)."""
        if name in self.flags:
            return name, self.flags[name]
        if not name.startswith("--") or len(name) < 3:
            return None
        hits = [opt for opt in self.flags if opt.startswith(name) and opt.startswith("--")]
        return (hits[0], self.flags[hits[0]]) if len(hits) == 1 else None


@functools.lru_cache(maxsize=None)
def load(path: str) -> KnownFlags:
    """The flag list in ``path`` (a ``realengines/flags.py`` output)."""
    data = json.loads(Path(path).read_text())
    return KnownFlags(data["engine"], data["version"], {k: bool(v["value"]) for k, v in data["flags"].items()},
                      {k: tuple(v["choices"]) for k, v in data["flags"].items() if "choices" in v})


def render_flags(flags, console) -> None:
    """Print the per-flag statuses of a launch command (``(flag as given, status)`` pairs) for
    people: ``modelled``, ``refused: not modelled (...)`` or ``no effect on the loop``."""
    from rich.markup import escape

    if not flags:
        return
    width = min(max(len(f) for f, _ in flags), 40)
    console.print("  flags:")
    for flag, status in flags:
        style = "bold red" if status.startswith("refused") else ("green" if status == "modelled" else "dim")
        console.print(f"    {escape(flag):{width}s}  [{style}]{escape(status)}[/]")
    if any(status.startswith("refused") for _, status in flags):
        console.print("  [bold red]the simulator refuses this command[/] (overlap-sim run gives no answer for it): "
                      "what it runs is not modelled")
