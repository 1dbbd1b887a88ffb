"""Registers ``overlap-sim calibrate`` with the simulator's command line (:mod:`sim.cli`)."""

from __future__ import annotations

from calibrate.cli import HELP, add_arguments, run
from sim.commands import command

command("calibrate", HELP, add_arguments)(run)
