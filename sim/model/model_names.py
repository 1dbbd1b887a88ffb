"""Whether the model a launch command serves is the model a calibration profile measured.

A profile names its model in ``metadata.model.name``: the shape the calibration built (e.g.
``llama-3.2-1b``, its layers and widths, ``calibrate/config.py``) or, for a profile read from a
server's traces, the name the user gave. A launch command names a Hugging Face id or a local
path (``meta-llama/Llama-3.2-1B-Instruct``, ``/models/llama-3.2-1b/``). The two are compared
by their words, not as strings (:func:`same_model`): a heuristic, stated where it is used; it
errs towards saying "another model" when the words differ (e.g. a size written ``1.1b`` against
``1b``), which costs a warning, never a silent answer on another model's costs.
"""

from __future__ import annotations

import re

# words a name carries that do not change the model's shape: the publisher's prefix ("Meta-Llama"),
# the tuning ("Instruct", "chat", "it"), the packaging ("hf")
_NEUTRAL = frozenset({"meta", "instruct", "chat", "it", "hf", "base"})


def model_words(name: str) -> frozenset[str]:
    """The words of a model name or path, lower case: its last path component (a Hugging Face id's
    repository, a folder's name) split at ``-``, ``_``, spaces and ``/``, less the words that do not
    change the model's shape (:data:`_NEUTRAL`). ``Meta-Llama-3.1-8B-Instruct`` -> {llama, 3.1, 8b}."""
    last = name.strip().rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]
    return frozenset(w for w in re.split(r"[-_\s]+", last.lower()) if w and w not in _NEUTRAL)


def same_model(launch_model: str, profile_model: str) -> bool:
    """Whether the model a launch command names (``launch_model``) is, by its words, the one a
    profile measured (``profile_model``): every word of the profile's name is one of the
    command's (the command may say more: a version, ``v0.1``), and neither name is empty.

    >>> same_model("meta-llama/Llama-3.2-1B-Instruct", "llama-3.2-1b")
    True
    >>> same_model("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-8b")
    False
    """
    mine, theirs = model_words(launch_model), model_words(profile_model)
    return bool(mine) and bool(theirs) and theirs <= mine


def profile_model(meta: dict | None) -> str | None:
    """The model a profile's metadata names (``metadata.model.name``, or ``metadata.model`` given as
    text), None where it names none or its value is not text."""
    if not isinstance(meta, dict):
        return None
    model = meta.get("model")
    name = model.get("name") if isinstance(model, dict) else model
    return name if isinstance(name, str) and name.strip() and name != "unknown" else None


def model_caveat(flag: str, launch_model: str, meta: dict | None, brief: bool = False) -> str | None:
    """What a run's answer rests on where the launch command's model (``launch_model``, given by
    ``flag``) is not the one the profile (metadata ``meta``) measured: a clause naming both (a
    warning's; ``brief``: the verdict's), or None where they are the same by :func:`same_model`.
    ``meta`` None: inline costs, which name no model (the scenario's own terms): None."""
    if meta is None:
        return None
    measured = profile_model(meta)
    if measured is not None and same_model(launch_model, measured):
        return None
    if brief:
        return (f"on another model's costs ({flag} {launch_model}; the profile measured "
                f"{measured or 'a model it does not name'})")
    if measured is None:
        return (f"{flag} {launch_model}: the profile does not name the model it measured: whether its costs are "
                "this model's is not known")
    return (f"{flag} {launch_model}: the costs are the profile's, measured on {measured}, another model (by "
            "name): its forward and host phases stand in for this one's (calibrate this model: "
            "docs/calibration.md)")
