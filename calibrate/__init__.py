"""Calibration: time a real model and the scheduler's real bookkeeping on this device, fit cost
curves and write the profile the simulator reads (``costs.profile``).

Packages: :mod:`calibrate.forward` (the decoder in torch and MLX, random weights, and timing
its forwards), :mod:`calibrate.bookkeeping` (the scheduler's per-step CPU work over a radix
cache, KV allocators and tokenized requests, and timing it), :mod:`calibrate.harness` (the
ground-truth serving loop), :mod:`calibrate.validate` (the harness against the simulator).
Modules: :mod:`calibrate.shapes` (model sizes), :mod:`calibrate.config` (what a calibration
measures), :mod:`calibrate.measure` (the run, resumable), :mod:`calibrate.fit` and
:mod:`calibrate.profile` (fitting the curves, building and saving the profile; the simulator
reads it with :mod:`sim.model.profile`), :mod:`calibrate.cli` and :mod:`calibrate.command`
(``overlap-sim calibrate``), :mod:`calibrate.errors`.

Imports run one way: calibrate imports sim (the trace schema, metrics, profile reading, the
simulator itself for validation), sim never imports calibrate. Importing this package imports
nothing heavy; torch and MLX are imported only by the backends that use them.
"""
