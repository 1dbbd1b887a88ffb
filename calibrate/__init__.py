"""Calibration: time a real model and the scheduler's real bookkeeping on this device, fit cost
curves and write the profile the simulator reads (``costs.profile``).

Modules: :mod:`calibrate.shapes` (model sizes), :mod:`calibrate.torch_model` /
:mod:`calibrate.mlx_model` (the decoder), :mod:`calibrate.radix`, :mod:`calibrate.kv_pool`,
:mod:`calibrate.requests`, :mod:`calibrate.bookkeeping` (the scheduler's per-step work),
:mod:`calibrate.torch_backend` / :mod:`calibrate.mlx_backend` and
:mod:`calibrate.bench_bookkeeping` (timing), :mod:`calibrate.measure` (the run, resumable),
:mod:`calibrate.fit` and :mod:`calibrate.profile` (fitting the curves, building and saving the
profile; the simulator reads it with :mod:`sim.model.profile`), :mod:`calibrate.cli`
(``overlap-sim calibrate``).
Importing this package imports nothing heavy.
"""
