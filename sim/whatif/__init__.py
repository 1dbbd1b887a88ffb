"""What-if analysis over many runs: parameter sweeps (:mod:`~sim.whatif.sweeps`), run-to-run
variance (:mod:`~sim.whatif.variance`), their plots and the plots of logs and traces
(:mod:`~sim.whatif.plots`), and the subcommands ``sweep`` (:mod:`~sim.whatif.sweep_cli`),
``trace``, ``gaps``, ``log`` and ``plots`` (:mod:`~sim.whatif.cli`).
"""
