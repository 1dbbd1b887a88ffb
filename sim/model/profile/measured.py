"""What a calibration profile measured, against what a scenario asks of it: the tensor-parallel
size it was measured at (:func:`measured_size`) and how an engine prices tensor parallelism
through it (:class:`ParallelPricing`), and whether the model it measured is the one a launch
command serves (:func:`same_model`, :func:`model_caveat`). The profile file itself (format,
validation, loading, curves) is :mod:`sim.model.profile.file`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sim.errors import ProfileError, ScenarioError, shown

MAX_PARALLEL_SIZE = 1024  # a profile's tensor-parallel size: at most the largest a scenario may ask for


def measured_size(profile: dict, key: str, source: str = "") -> int:
    """A parallel size a profile was measured at, ``metadata[key]`` (vLLM's
    ``tensor_parallel_size``, SGLang's ``tp_size``): 1 where the metadata does not say; a whole
    number written as a float (``2.0``) is that number.

    Raises:
        ProfileError: naming ``metadata.<key>`` of ``source`` when the value is not a whole
            number from 1 to :data:`MAX_PARALLEL_SIZE` (a string, a bool, 0, 1.5: a profile that
            cannot say which size it was measured at is not taken as TP 1; 10**400: corrupt).
    """
    metadata = profile.get("metadata", {})
    size = metadata.get(key, 1) if isinstance(metadata, dict) else 1
    if isinstance(size, float) and size.is_integer():
        size = int(size)
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_PARALLEL_SIZE:
        raise ProfileError(source, f"metadata.{key}", f"a positive whole number up to {MAX_PARALLEL_SIZE}, the "
                                                      f"tensor-parallel size it was measured at (got {shown(size)})")
    return size


@dataclass(frozen=True)
class ParallelPricing:
    """How an engine prices tensor parallelism through a profile measured at that size: its
    engine's name (the calibrate command's ``--engine``), the profile's metadata key, the
    scenario's field, and in words what the measured phases carry at TP N (``carries``, e.g.
    "its receive and forward carry that many ranks' broadcast and all-reduces"), what inline
    costs stand for (``given``), and how far the model was held against the real server
    (``validated``)."""

    engine: str
    key: str
    field: str
    carries: str
    given: str
    validated: str

    def check(self, profile: dict, want: int, source: str, scenario_source: str, device: str) -> None:
        """Refuse a scenario at TP ``want`` priced by a ``profile`` measured at another size
        (:func:`measured_size`): a TP size is not extrapolated from another.

        Raises:
            ScenarioError: naming :attr:`field`. ProfileError: the profile's size is not a
                positive whole number.
        """
        measured = measured_size(profile, self.key, source)
        if want == measured:
            return
        fix = (f"calibrate the TP-{want} server: overlap-sim calibrate --engine {self.engine} --tensor-parallel-size "
               f"{want}, or give the costs inline" if device == "cpu" else
               f"no card profile can be measured at another TP yet (the TP calibration runs {self.server_name}'s CPU "
               "server): give the TP server's costs inline")
        raise ScenarioError(scenario_source, self.field, f"{want}, but the profile {source} was measured at tensor "
                                                         f"parallel size {measured}: {self.carries} ({fix})")

    @property
    def server_name(self) -> str:
        return {"sglang": "SGLang", "vllm": "vLLM"}.get(self.engine, self.engine)

    def caveat(self, size: int, measured: bool) -> str | None:
        """The run's warning at TP ``size`` (None at 1): the inline costs taken as given, or the
        profile's phases as measured with what is not simulated apart."""
        if size <= 1:
            return None
        name = f"{self.field.rsplit('.', 1)[-1]} {size}"
        if not measured:
            return (f"{name}: the inline costs are taken as those of the TP-{size} server as given ({self.given}); "
                    "none of it measured")
        return (f"{name}: priced by the profile measured at that size (rank 0's phases, which wait for the other "
                f"ranks); the ranks' lockstep is not simulated apart, and {self.validated}")


# --- the model a profile measured, against the one a launch command serves ----------------------
# Whether the model a launch command serves is the model a calibration profile measured.
#
# A profile names its model in ``metadata.model.name``: the shape the calibration built (e.g.
# ``llama-3.2-1b``, its layers and widths, ``calibrate/config.py``) or, for a profile read from a
# server's traces, the name the user gave. A launch command names a Hugging Face id or a local
# path (``meta-llama/Llama-3.2-1B-Instruct``, ``/models/llama-3.2-1b/``). The two are compared
# by their words, not as strings (:func:`same_model`): a heuristic, stated where it is used; it
# errs towards saying "another model" when the words differ (e.g. a size written ``1.1b`` against
# ``1b``), which costs a warning, never a silent answer on another model's costs.

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
