"""Errors of calibration: bad requests and unusable profile files (one line, exit 2 from the CLI)."""

from __future__ import annotations

from sim.errors import UserInputError


class CalibrationInputError(UserInputError):
    """A calibration request that cannot run: unknown model or backend, a device that is not
    there, a bad grid, a sidecar file written for another calibration."""


class ProfileError(UserInputError):
    """A calibration profile that cannot be used: unreadable, corrupt, from a newer schema,
    missing a curve, or holding NaN or negative times. ``source`` is the profile's path."""
