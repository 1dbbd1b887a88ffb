"""overlap-sim: a discrete-event model of LLM serving event loops (SGLang's overlap scheduler
and vLLM's async scheduling against their synchronous loops), fed by measured costs.

Python API: :func:`load_scenario`, :func:`simulate`, :func:`compare`, :class:`Result`,
:func:`sweep` (a grid of scenario variants, every setting, repeats: one tidy DataFrame).

Layout. Imports run one way, from each line to the lines above it that it names, never back
and never between two engines (``tests/test_layout.py`` checks it)::

    base            sim.errors, sim.atomic, sim.commands, sim.jsonio: user
                    errors, atomic writes, the subcommand registry, JSON
                    read with its repeated keys found
    sim.model       the engine-neutral core: the scenario's workload and   <- base
                    costs sections, request lengths and arrivals, requests
                    and batches, cost models, calibration profiles (read),
                    an engine server's own flag list (known_flags),
                    the device stream
    sim.trace       the event trace, its recorders, its metrics           <- model, base
    sim.engines.X   one package per engine (sim.engines.sglang, .vllm):    <- trace, model, base
                    server section, scheduling policy, phases, loops, rules
    sim.output      reports, results folders, plots, Chrome traces         <- trace, model, base
    sim.scenario    the composition root: a scenario (workload + an        <- engines, trace, model, base
    sim.simulate    engine's server + costs) and a run of it; its
    sim.scenario_errors   validation error told in one line
    sim.whatif      sweeps, variance, their plots and subcommands          <- all of the above
    sim.cli, sim    the command line and this API                          <- everything

Calibration (the ``calibrate`` package) imports sim; sim never imports calibrate (the command
line names calibration's subcommand modules in :data:`sim.cli.COMMAND_MODULES` and loads them
only to build its parser).
"""

import os as _os
import sys as _sys

# numpy's bundled OpenBLAS starts a thread per core when it loads, and each idle thread spins
# for about 0.1 s of CPU before it sleeps. The simulator does no linear algebra, so in the
# command-line process (the ``overlap-sim`` script, or ``python -m sim.<module>``, whose argv[0]
# is still "-m" while its package imports), when no thread count was chosen, numpy loads with
# one BLAS thread (the variable is removed again at once: child processes do not inherit it). A
# program or notebook that imports sim keeps numpy's own choice.
_BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
# the simulator's own dependencies (pyproject.toml) that calibration does not need: a host without
# them still imports sim's light modules (below); _api_missing keeps the error for the API names
_SIMULATOR_ONLY = ("pydantic", "yaml", "simpy", "ddsketch", "pandas", "matplotlib", "scipy", "pyarrow", "packaging")
_api_missing = None
_COMMAND_LINE = bool(_sys.argv) and (_sys.argv[0] == "-m" or _os.path.basename(_sys.argv[0]) == "overlap-sim")
# A Ctrl-C while the libraries load (a command's first few tenths of a second) ends the command
# line as one later does: one line, exit 130. The import machinery does not always let the
# KeyboardInterrupt through (numpy turns one inside its C import into an ImportError, an import
# lock's callback swallows one), so the command line notes the signal itself while it imports.
_interrupted = False
if _COMMAND_LINE:
    import signal as _signal

    def _note_interrupt(_signum, _frame):
        global _interrupted
        _interrupted = True
        raise KeyboardInterrupt

    if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
        _signal.signal(_signal.SIGINT, _note_interrupt)
try:
    if _COMMAND_LINE and "numpy" not in _sys.modules and not any(v in _os.environ for v in _BLAS_THREAD_VARS):
        _os.environ["OPENBLAS_NUM_THREADS"] = "1"
        try:
            import numpy as _numpy  # noqa: F401
        except ModuleNotFoundError:
            pass
        finally:
            del _os.environ["OPENBLAS_NUM_THREADS"]

    try:
        from sim.scenario import Scenario, load_scenario
        from sim.simulate import Result, compare, simulate
    except ImportError as _err:
        # A calibration host (a GPU box with torch, numpy, tokenizers, rich) may lack the
        # simulator's own dependencies; what calibration imports of sim (sim.errors, sim.atomic,
        # sim.commands, sim.model.profile, sim.model.curve, sim.model.cards, sim.model.transfer)
        # must still import there. The API names then raise this error when asked for.
        if (_err.name or "").partition(".")[0] not in _SIMULATOR_ONLY:
            raise
        _api_missing = _err
    if _COMMAND_LINE and _sys.argv[0] != "-m":  # (python -m runs its module itself: not imported twice)
        import sim.cli  # the overlap-sim script's module, under the same guard
except (KeyboardInterrupt, ImportError):
    if not _interrupted:  # a program or notebook gets the interrupt; a broken install its error
        raise
if _COMMAND_LINE:
    if _signal.getsignal(_signal.SIGINT) is _note_interrupt:
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    if _interrupted:  # raised above, or swallowed on the way
        from sim.errors import EXIT_INTERRUPTED

        print("overlap-sim: interrupted", file=_sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED)

__all__ = ["Scenario", "Result", "load_scenario", "simulate", "compare", "sweep"]


def __getattr__(name: str):
    """:func:`sweep`, imported on first use (PEP 562): the sweep module brings pandas, which a
    plain ``overlap-sim run`` does not need at start-up.

    Raises:
        ModuleNotFoundError: an API name asked for where the simulator's own dependencies are
            missing (a calibration host: ``python -m calibrate.cli``), naming the missing one.
        AttributeError: ``name`` is not part of the API.
    """
    if name in ("Scenario", "Result", "load_scenario", "simulate", "compare") and _api_missing is not None:
        raise ModuleNotFoundError(f"sim.{name} needs {_api_missing.name}, which is not installed here "
                                  f"(pip install overlap-sim's dependencies): {_api_missing}",
                                  name=_api_missing.name) from _api_missing
    if name == "sweep":
        from sim.whatif.sweeps import sweep
        globals()["sweep"] = sweep
        return sweep
    raise AttributeError(f"module 'sim' has no attribute {name!r}")
