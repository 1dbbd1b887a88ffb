"""SGLang's release rules: which event loop a launch command selects, whether overlap is on, and
the known faults and hazards of that path, per release.

:mod:`~sim.engines.sglang.rules.launch_args` (launch commands and versions),
:mod:`~sim.engines.sglang.rules.loop_rules` (evaluating the rules table ``sglang_rules.yaml``,
shipped beside them), :mod:`~sim.engines.sglang.rules.advise` (``overlap-sim advise``).
"""
