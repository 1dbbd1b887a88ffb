"""User-facing errors: bad input that the CLI reports in one line with exit status 2.

Exit statuses of ``overlap-sim``: 0 done; 1 a modelling bug (:class:`SimulationStalled`: one line
asking for the scenario, nothing written); 2 bad input (one line on stderr, nothing written);
3 ``run`` finished but a setting failed: its server died or none of its measured requests
completed (the results are written and the table says which); 4 a real engine (or another
program) the command started failed or timed out (one line on stderr naming its log; the runs
finished before it are kept, a rerun reuses them); 130 interrupted (Ctrl-C: one line; a ``run``
folder keeps the earlier run's files, sweeps and calibrations keep what finished and resume).
"""

from __future__ import annotations

EXIT_OK, EXIT_MODELLING_BUG, EXIT_BAD_INPUT, EXIT_RUN_FAILED, EXIT_EXTERNAL_FAILED = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


class ExternalRunError(RuntimeError):
    """A program the command started (a real engine's server, a calibration module in the
    engine's environment) failed or timed out. The message is one line and names its log."""


class SimulationStalled(RuntimeError):
    """The simulation cannot go on while requests remain: no event is left, or (vLLM) a step finds
    the waiting queue's head unschedulable on an idle engine, so the loop would retry forever. A
    modelling bug, never a user's mistake: the message asks for the scenario."""


class UserInputError(Exception):
    """A mistake in user input (scenario file, override, profile, trace).

    Attributes:
        source: the file (or ``--set``/``<dict>``) the bad value came from.
        field: dotted path of the offending field, or ``""`` when the whole input is bad.
        expected: what was expected, in words.
    """

    def __init__(self, source: str, field: str, expected: str):
        self.source = source
        self.field = field
        self.expected = expected
        where = f"{source}: {field}: " if field else f"{source}: "
        super().__init__(where + expected)

    def __reduce__(self):
        # picklable with its three parts (raised in a sweep's worker process, re-raised here)
        return (self.__class__, (self.source, self.field, self.expected))


class ScenarioError(UserInputError):
    """A scenario (YAML, dict or ``--set`` override) that does not validate."""


class ProfileError(UserInputError):
    """A calibration profile that cannot be used: unreadable, corrupt, from a newer schema,
    missing a curve, or holding NaN or negative times. ``source`` is the profile's path."""


def shown(v) -> str:
    """``repr(v)`` for a message, cut to 40 characters (a 400-digit integer is named, not printed;
    a list nested too deep for ``repr`` is shown to a few levels, by :mod:`reprlib`)."""
    try:
        text = repr(v)
    except RecursionError:
        import reprlib

        text = reprlib.repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def shown_override(flag: str, item: str) -> str:
    """A ``KEY=VALUE`` flag as a message names it (``--set key=value``, ``--grid key=v1,v2``), a
    value longer than 60 characters cut short."""
    key, sep, value = item.partition("=")
    return f"{flag} {key}{sep}{value if len(value) <= 60 else value[:57] + '...'}"
