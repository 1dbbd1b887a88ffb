"""Building a calibration profile from timing samples and saving it.

The file's schema, validation and reading are the simulator's (:mod:`sim.model.profile`):
calibration writes what the simulator reads.
"""

from __future__ import annotations

import json
from pathlib import Path

from calibrate.fit import fit_curve
from sim.errors import ProfileError
from sim.model.profile import FORMAT, SCHEMA_VERSION, SGLANG_CURVES, CurveTable, validate_profile


def build_profile(metadata: dict, samples: list[dict], curves: CurveTable = SGLANG_CURVES) -> dict:
    """Fit every curve of ``curves`` that has samples (all of ``curves.required`` must) to
    ``samples`` and assemble a profile.

    Args:
        metadata: the ``metadata`` object (keys of :data:`sim.model.profile.file.REQUIRED_METADATA` and more).
        samples: ``{"curve", "point": {axis: value}, "times_s": [...]}`` records; a record with
            ``"setting"`` was measured under that event loop only and goes into the profile's
            ``setting_curves`` (:mod:`sim.model.profile`).
        curves: the engine's curves (SGLang's by default; vLLM's: ``sim.engines.vllm.profile.VLLM_CURVES``).

    Raises:
        ProfileError: a curve has no samples or its samples do not cover a full grid.
    """
    table = curves
    fitted = _fit([s for s in samples if not s.get("setting")], "curves", table)
    by_setting: dict[str, dict] = {}
    for setting in sorted({s["setting"] for s in samples if s.get("setting")}):
        mine = [s for s in samples if s.get("setting") == setting]
        by_setting[setting] = _fit(mine, f"setting_curves.{setting}", table, required=())
    profile = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "metadata": metadata,
               "samples": samples, "curves": fitted}
    if by_setting:
        profile["setting_curves"] = by_setting
    validate_profile(profile, "<built profile>", table)
    return profile


def _fit(samples: list[dict], where: str, table: CurveTable, required=None) -> dict:
    """Curves of ``table`` fitted to ``samples``; every curve of ``table.required`` is required
    unless ``required`` lists which are."""
    curves = {}
    for name, axes in table.all.items():
        pts = [([s["point"][a] for a in axes], s["times_s"]) for s in samples if s["curve"] == name]
        must = name in table.required if required is None else name in required
        if not pts and not must:
            continue
        try:
            curves[name] = fit_curve(axes, pts)
        except ValueError as err:
            raise ProfileError("calibration samples", f"{where}.{name}", str(err)) from None
    return curves


def profile_text(profile: dict) -> str:
    """The profile as JSON text (strict: no NaN or infinity)."""
    return json.dumps(profile, indent=1, allow_nan=False) + "\n"


def save_profile(path: str | Path, profile: dict) -> None:
    """Write ``profile`` to ``path`` atomically (temporary file + rename, usual permissions)."""
    from sim.atomic import atomic_path

    with atomic_path(path) as tmp:
        tmp.write_text(profile_text(profile))
