"""vLLM's release rules: whether async scheduling is on for a launch command, where it is forced
off or refused, per release (read from vLLM 0.32.0's source).

:mod:`~sim.engines.vllm.rules.launch_args` (launch commands and versions),
:mod:`~sim.engines.vllm.rules.async_rules` (the rules and their resolution),
:mod:`~sim.engines.vllm.rules.advise` (``overlap-sim advise --engine vllm``).
"""
