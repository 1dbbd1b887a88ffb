"""The ground-truth harness: a small but real serving loop under each schedule, recorded in the
simulator's trace schema (:mod:`sim.trace.recorder`), so :func:`sim.trace.metrics.summarize` reads both.

Modules (data flows down the list):
:mod:`calibrate.harness.config` (what one run serves: model, workload, server knobs, and the
matching simulator scenario), :mod:`calibrate.harness.workload` (prompts of real text, stop
strings, closed-loop clients, the model's EOS script), :mod:`calibrate.harness.serving` (the
scheduler's state and phases over :class:`calibrate.bookkeeping.bookkeeper.Bookkeeper`, with the
simulator's policy), :mod:`calibrate.harness.trace` (the timeline recorder),
:mod:`calibrate.harness.torch_device` (torch on a CPU: a separate device process),
:mod:`calibrate.harness.mlx_device` (MLX lazy evaluation), :mod:`calibrate.harness.cuda_device`
(torch on CUDA: two streams), :mod:`calibrate.harness.loops` (``normal``, ``overlap``,
``overlap_mlx``), :mod:`calibrate.harness.thread_loop` (``thread_overlap``: a forward thread),
:mod:`calibrate.harness.run` (:func:`run_harness`). torch and MLX are imported only by the
device modules.
"""
