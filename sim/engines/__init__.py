"""What the simulator knows of each serving engine, one sub-package per engine: its server
configuration, scheduling policy, event loops and release rules (:mod:`sim.engines.sglang`,
:mod:`sim.engines.vllm`).

An engine builds on the engine-neutral core (:mod:`sim.model`, :mod:`sim.trace`) and never on
another engine; :mod:`sim.simulate` wires an engine's loops with the core.
"""
