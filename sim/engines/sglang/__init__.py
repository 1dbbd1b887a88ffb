"""SGLang: its scheduler as the simulator models it.

:mod:`~sim.engines.sglang.server` (the scenario's ``server`` section: SGLang's flags and the
modelled event loops), :mod:`~sim.engines.sglang.policy.scheduler` (scheduling policy and state: what
goes into the next batch; no SimPy), :mod:`~sim.engines.sglang.policy.kvpool` (the KV pool in pages),
:mod:`~sim.engines.sglang.policy.retraction` (decode retraction under KV pressure),
:mod:`~sim.engines.sglang.policy.results` (``process_batch_result``), :mod:`~sim.engines.sglang.phases`
(the CPU phases of one iteration), :mod:`~sim.engines.sglang.loops` (the event loops),
:mod:`~sim.engines.sglang.thread_loop` and :mod:`~sim.engines.sglang.gil` (the thread-era overlap
loop and CPython's GIL), :mod:`~sim.engines.sglang.server_log` (reading SGLang's scheduler log),
:mod:`sim.engines.sglang.rules` (which loop a launch command selects, per release).
"""
