"""overlap-sim: a discrete-event model of LLM serving event loops (SGLang's overlap scheduler
against the synchronous loop), fed by measured costs.

Python API: :func:`load_scenario`, :func:`simulate`, :func:`compare`, :class:`Result`,
:func:`sweep` (a grid of scenario variants, every setting, repeats: one tidy DataFrame).
"""

from sim.scenario import Scenario, load_scenario
from sim.simulate import Result, compare, simulate
from sim.sweeps import sweep

__all__ = ["Scenario", "Result", "load_scenario", "simulate", "compare", "sweep"]
