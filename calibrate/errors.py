"""Errors of calibration: bad requests (one line, exit 2 from the CLI). An unusable profile file is
:class:`sim.errors.ProfileError` (the simulator reads profiles)."""

from __future__ import annotations

from sim.errors import UserInputError


class CalibrationInputError(UserInputError):
    """A calibration request that cannot run: unknown model or backend, a device that is not
    there, a bad grid, a sidecar file written for another calibration."""
