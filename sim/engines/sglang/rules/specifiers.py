"""Release ranges of the rules table (``versions: ">=0.5.10,<0.5.17"``), matched as PEP 440's
``SpecifierSet(spec).contains(version, prereleases=True)`` does (``packaging`` 26), for the
operators the table uses: ``>=``, ``<=``, ``>``, ``<``, ``==`` and ``!=`` (no wildcards, no
``~=``, no ``===``).

Why not ``packaging.specifiers``: it imports ``packaging.tags`` (logging, subprocess,
sysconfig), about 20-30 ms of CPU on every ``overlap-sim run``, for a table of a dozen simple
ranges. Versions stay ``packaging.version.Version`` (PEP 440 ordering of pre-, post-, dev- and
local releases); ``tests/test_loop_rules.py`` checks every range of the table, and generated
ranges and versions, against ``SpecifierSet``.
"""

from __future__ import annotations

from functools import lru_cache

from packaging.version import Version

OPERATORS = (">=", "<=", "==", "!=", ">", "<")  # two-character ones first: ">=" is not ">"


@lru_cache(maxsize=None)
def parse_specifiers(spec: str) -> tuple[tuple[str, Version], ...]:
    """``">=0.5.10,<0.5.17"`` -> ``((">=", Version("0.5.10")), ("<", Version("0.5.17")))``;
    ``""`` -> ``()`` (every release).

    Raises:
        ValueError: an operator outside :data:`OPERATORS`, or a bound that is not a plain
            release (a wildcard, a pre-, post-, dev- or local label: the table uses none).
    """
    clauses = []
    for clause in (c.strip() for c in spec.split(",")):
        if not clause:
            continue
        op = next((o for o in OPERATORS if clause.startswith(o)), None)
        text = clause[len(op):].strip() if op else ""
        bound = Version(text) if text and text[0].isdigit() and "*" not in text else None
        if op is None or bound is None or bound.pre or bound.post is not None or bound.dev is not None or bound.local:
            raise ValueError(f"unsupported version range {clause!r} in {spec!r} (expected one of "
                             f"{', '.join(OPERATORS)} and a plain release, e.g. '>=0.5.10')")
        clauses.append((op, bound))
    return tuple(clauses)


def version_in(spec: str, version: Version) -> bool:
    """Whether ``version`` lies in the range ``spec`` (pre-releases included), as
    ``SpecifierSet(spec).contains(version, prereleases=True)``.

    PEP 440's rules that a plain comparison misses (bounds are plain releases V): ``<V``
    excludes V's own pre- and dev-releases, ``>V`` excludes V's post-releases and local
    versions, and every other operator compares the public version (a local label is dropped).

    Raises:
        ValueError: see :func:`parse_specifiers`.
    """
    return all(_holds(op, bound, version) for op, bound in parse_specifiers(spec))


def _holds(op: str, bound: Version, v: Version) -> bool:
    public = Version(v.public) if v.local else v
    if op == ">=":
        return public >= bound
    if op == "<=":
        return public <= bound
    if op == "==":
        return public == bound
    if op == "!=":
        return public != bound
    if op == "<":  # not a pre-release of the bound itself (from its first dev release on)
        return v < bound and not (v.is_prerelease and v >= Version(f"{bound}.dev0"))
    # ">": not a post-release of the bound, nor the bound with a local label
    return v > bound and not (v.is_postrelease and _post_base(v) == bound) and public != bound


def _post_base(v: Version) -> Version:
    """The release ``v`` is a post-release of: 1.0.post1 -> 1.0, 1.0a1.post2 -> 1.0a1."""
    pre = "".join(map(str, v.pre)) if v.pre else ""
    return Version(f"{v.epoch}!{'.'.join(map(str, v.release))}{pre}")
