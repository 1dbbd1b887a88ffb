"""vLLM V1 (release 0.32.0): its engine as the simulator models it, a sibling of
:mod:`sim.engines.sglang`.

:mod:`~sim.engines.vllm.server` (the scenario's ``server`` section with ``engine: vllm``: engine
arguments and the settings ``sync`` / ``async``), :mod:`~sim.engines.vllm.policy` (the V1
scheduler's policy as plain code: ``Scheduler.schedule``, KV blocks, preemption,
``update_from_output``), :mod:`~sim.engines.vllm.core` (the engine core process's phases),
:mod:`~sim.engines.vllm.worker` (the worker process's phases), :mod:`~sim.engines.vllm.loops`
(``EngineCore.step`` and ``step_with_batch_queue`` as SimPy processes, and the worker's),
:mod:`~sim.engines.vllm.costs` (the vLLM profile's curves and the cost models),
:mod:`~sim.engines.vllm.run` (one run wired together), :mod:`sim.engines.vllm.rules` (where async
scheduling is forced off or refused, per release, and ``overlap-sim advise --engine vllm``).
Facts and sources: docs/vllm.md.
"""
