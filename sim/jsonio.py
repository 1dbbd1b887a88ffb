"""Reading JSON a user may have written or merged by hand: a key given twice in one object, which
``json.loads`` resolves in silence by keeping the last value, is found.

- :func:`unique_keys`: the ``object_pairs_hook`` that refuses it anywhere (a profile, a trace line);
  :func:`duplicate_key_path` names where, reading the text again only when one was found;
- :func:`loads_top_level`: the top-level object's repeated keys only (a Chrome trace, whose
  events may repeat keys harmlessly);
- :func:`is_number`: a value read from JSON is a number in a range (not a bool, and an integer too
  large for a float compared exactly instead of raising).
"""

from __future__ import annotations

import json


class DuplicateKeyError(ValueError):
    """A JSON object that gives one key twice (:func:`unique_keys`); ``key`` is that key."""

    def __init__(self, key: str):
        super().__init__(f"key {key!r} given twice in one object")
        self.key = key


def _repeats(pairs: list) -> list[str]:
    """The keys of ``pairs`` that an earlier pair already gave, in order (a key given n times: n - 1)."""
    seen: set = set()
    out = []
    for key, _ in pairs:
        if key in seen:
            out.append(key)
        seen.add(key)
    return out


def unique_keys(pairs: list) -> dict:
    """``object_pairs_hook`` of :func:`json.loads` that refuses an object giving one key twice.
    Cheap: one ``dict`` of the pairs, as ``json.loads`` builds anyway, and a length comparison.

    Raises:
        DuplicateKeyError: naming the first key given twice.
    """
    out = dict(pairs)
    if len(out) != len(pairs):
        raise DuplicateKeyError(_repeats(pairs)[0])
    return out


def duplicate_key_path(text: str, key: str) -> str:
    """The dotted path (``metadata.date``, ``samples[3].point.ctx``) of the first key given twice
    in one object of the JSON ``text`` (read again, only when :func:`unique_keys` refused it);
    ``key`` alone when it cannot be found."""

    class Marked(dict):
        twice = None

    def mark(pairs):
        out = Marked(pairs)
        if len(out) != len(pairs):
            out.twice = _repeats(pairs)[0]
        return out

    try:
        stack = [("", json.loads(text, object_pairs_hook=mark))]
    except (ValueError, RecursionError):  # unreadable past the key: the key alone
        return key
    while stack:  # depth first, in document order
        path, node = stack.pop()
        if isinstance(node, dict):
            if node.twice is not None:
                return f"{path}.{node.twice}" if path else node.twice
            stack.extend((f"{path}.{k}" if path else k, v) for k, v in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(node))))
    return key


def loads_top_level(raw: bytes) -> tuple[object, list[str]]:
    """``json.loads(raw)`` and the keys repeated in its top-level object (``[]`` when the top
    level is not an object; a key given n times is listed n - 1 times). Objects inside are read
    as ``json.loads`` reads them: the hook sees every object, and the top level's is the last.

    Raises:
        ValueError, UnicodeDecodeError, RecursionError: as ``json.loads`` does.
    """
    last: list = [None]

    def hook(pairs):
        out = dict(pairs)
        last[0] = pairs if len(out) != len(pairs) else None
        return out

    data = json.loads(raw, object_pairs_hook=hook)
    return data, (_repeats(last[0]) if isinstance(data, dict) and last[0] is not None else [])


def is_number(v, low: float, high: float, above: bool = False) -> bool:
    """Whether ``v`` is an int or float (not a bool) from ``low`` to ``high`` (above ``low`` with
    ``above``). The comparisons do it all: NaN fails them, and an integer too large for a float
    (``10**400``, which ``math.isfinite`` refuses with OverflowError) is compared exactly."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return (low < v if above else low <= v) and v <= high
