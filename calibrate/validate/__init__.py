"""``overlap-sim validate``: score the simulator against the ground-truth harness.

Modules: :mod:`calibrate.validate.grid` (the configurations and how each is calibrated),
:mod:`calibrate.validate.gil_params` (the thread-era loop's GIL parameters, measured),
:mod:`calibrate.validate.runner` (calibrate, run the harness, simulate, compare; resumable),
:mod:`calibrate.validate.report` (errors, table, CSV, plot, JSON), :mod:`calibrate.validate.cli`.
"""
