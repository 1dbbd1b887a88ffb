"""The registry of ``overlap-sim``'s subcommands: a module registers ``run(args)`` with
:func:`command` when it is imported; :mod:`sim.cli` imports the modules of
:data:`sim.cli.COMMAND_MODULES` and builds its parser from :data:`COMMANDS`.

It lives apart from :mod:`sim.cli` so that a command module anywhere in the tree (an engine's
``advise``, the what-if tools, calibration) registers without importing the command line.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Callable, NoReturn

# "0" in the environment: every sim.simulate.simulate steps through its event loop (--no-leap)
LEAP_ENV = "OVERLAP_SIM_LEAP"

# name -> (help, add_arguments(parser), run(args) -> exit status)
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


# engine -> run(args) of ``overlap-sim advise --engine ENGINE`` for an engine other than SGLang
# (whose rules module registers it with :func:`advisor`; SGLang's ``advise`` dispatches to it)
ADVISORS: dict[str, Callable[[argparse.Namespace], int]] = {}


# engine -> ask(card, meta, load) of ``overlap-sim ask --engine ENGINE``: the engine's own defaults
# for a server of that model on that card (registered by sim.engines.<engine>.ask with :func:`asker`)
ASKERS: dict[str, Callable] = {}


def _registrar(table: dict, key: str):
    """A decorator that puts its function into ``table[key]`` and returns it unchanged."""
    def wrap(fn):
        table[key] = fn
        return fn
    return wrap


def asker(engine: str):
    """Decorator: register an engine's server defaults for ``overlap-sim ask`` (:data:`ASKERS`)."""
    return _registrar(ASKERS, engine)


# engine -> refusal(card) -> a reason the engine has no platform for that card, or None (registered
# by sim.engines.<engine>.ask with :func:`card_refusal`; ``ask`` and ``transfer`` both read it)
CARD_REFUSALS: dict[str, Callable] = {}


def card_refusal(engine: str):
    """Decorator: register which cards an engine does not run on (:data:`CARD_REFUSALS`)."""
    return _registrar(CARD_REFUSALS, engine)


# the model shapes `overlap-sim calibrate --model` knows by name (registered by calibrate.command
# when the command line loads it; empty where calibration is not installed): `ask` writes a
# calibration recipe for a model without a shipped profile from it
CALIBRATE_SHAPES: list[str] = []


def advisor(engine: str):
    """Decorator: register ``run(args) -> exit status`` as ``overlap-sim advise --engine engine``."""
    return _registrar(ADVISORS, engine)


def command(name: str, help_text: str, arguments: Callable[[argparse.ArgumentParser], None]):
    """Decorator: register ``run(args) -> exit status`` as subcommand ``name``."""
    def wrap(run):
        COMMANDS[name] = (help_text, arguments, run)
        return run
    return wrap


class UsageError(Exception):
    """A command line that argparse rejects (unknown flag, bad choice, missing argument), as one line."""


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage block) raised as :class:`UsageError`,
    so the command line prints them like every other bad input and returns exit status 2."""

    def error(self, message: str) -> NoReturn:
        text = " ".join(message.split())
        raise UsageError(f"{self.prog}: error: {text} (see {self.prog} --help)")

    def parse_args(self, args=None, namespace=None):
        """As ``ArgumentParser.parse_args``; flags left over name the subcommand's help (the top
        parser finds them after its subcommand parsed what it knows)."""
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(namespace, "command", None)
            helped = f"{self.prog} {command}" if command else self.prog
            raise UsageError(f"{self.prog}: error: unrecognized arguments: {' '.join(extras)} (see {helped} --help)")
        return namespace


def stdout_console(width: int | None = None):
    """A rich ``Console`` on standard output whose reader going away (``| head``) raises
    ``BrokenPipeError``, which the command line ends with exit status 0 and no traceback, as it
    does for plain prints (rich's own handling exits with status 1)."""
    return _stdout_console_class()(width=width)


@functools.cache
def _stdout_console_class():
    """:func:`stdout_console`'s class, made on first use (rich is imported then, not with this module)."""
    from rich.console import Console

    class StdoutConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return StdoutConsole


def add_no_leap_argument(p: argparse.ArgumentParser) -> None:
    """``--no-leap``: every simulated step through the event loop (see :func:`apply_no_leap`)."""
    p.add_argument("--no-leap", action="store_true",
                   help="run every step through the event loop instead of leaping over runs of steady decodes "
                        "(the same answer, slower; for checking and debugging)")


def add_plots_arguments(p: argparse.ArgumentParser) -> None:
    """``--plots`` (draw the run's three PNG plots) and ``--no-plots`` (the default since
    5 December 2026, kept for scripts written before): ``args.no_plots`` is True unless
    ``--plots`` is given. The plots cost about a second of CPU whatever the run's length
    (matplotlib's import and three figures: docs/speed.md), as much as a 10,000-request run."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--plots", dest="no_plots", action="store_false",
                       help="draw gaps.png, metrics.png and timeline.png (about a second of CPU; `overlap-sim plots "
                            "FOLDER` draws them later from the saved tables)")
    group.add_argument("--no-plots", dest="no_plots", action="store_true",
                       help="no PNG plots (the default)")
    p.set_defaults(no_plots=True)


def apply_no_leap(args: argparse.Namespace) -> None:
    """With ``--no-leap``, set ``OVERLAP_SIM_LEAP=0`` for this process and the workers it starts
    (:data:`LEAP_ENV`: every :func:`sim.simulate.simulate` then steps)."""
    if getattr(args, "no_leap", False):
        import os

        os.environ[LEAP_ENV] = "0"


def output_path(value: str) -> Path:
    """The ``type`` of a command's output path argument (``--out``, ``--work``): refuses an empty
    one, which ``Path`` would read as the current folder (a command would fill it, and a rerun
    clean its run files there).

    Raises:
        argparse.ArgumentTypeError: ``value`` is empty or blank (argparse names the flag).
    """
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty path (it would be the current folder); name a file or folder")
    return Path(value)
