"""Registers ``overlap-sim calibrate`` with the simulator's command line (:mod:`sim.cli`)."""

from __future__ import annotations

from calibrate.cli import HELP, add_arguments, run
from calibrate.shapes import NAMED_SHAPES
from sim.commands import CALIBRATE_SHAPES, command

command("calibrate", HELP, add_arguments)(run)
CALIBRATE_SHAPES[:] = list(NAMED_SHAPES)  # (ask's recipe for a model without a shipped profile)

from calibrate.host import compose  # noqa: E402

command("compose", "build a device profile from parts: a device's forward curves and a real engine's host costs",
        compose.add_arguments)(compose.run)
