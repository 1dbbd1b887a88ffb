"""overlap-sim: a discrete-event model of LLM serving event loops (SGLang's overlap scheduler
against the synchronous loop), fed by measured costs.

Python API: :func:`load_scenario`, :func:`simulate`, :func:`compare`, :class:`Result`,
:func:`sweep` (a grid of scenario variants, every setting, repeats: one tidy DataFrame).
"""

try:
    from sim.scenario import Scenario, load_scenario
    from sim.simulate import Result, compare, simulate
    from sim.whatif.sweeps import sweep
except ModuleNotFoundError as _err:
    # A calibration host (a GPU box with torch, numpy, rich) may lack the simulator's own
    # dependencies; what calibration imports of sim (sim.errors, sim.atomic, sim.model.profile,
    # sim.output.report) must still import there.
    if _err.name not in ("pydantic", "yaml", "simpy"):
        raise

__all__ = ["Scenario", "Result", "load_scenario", "simulate", "compare", "sweep"]
