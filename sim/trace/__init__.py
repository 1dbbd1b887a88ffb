"""The event trace of a run and the metrics read from it, for simulated and measured runs alike.

:mod:`~sim.trace.recorder` (the trace schema: steps, requests and ITL tables, and the recorder
that keeps them), :mod:`~sim.trace.streaming` (a recorder that streams the metrics instead of
keeping tables; each metric a :mod:`~sim.trace.sketch`), :mod:`~sim.trace.metrics` (SGLang ``bench_serving``'s metrics of a trace). The
ground-truth harness (:mod:`calibrate.harness`) writes the same schema, so one metrics function
reads both.
"""
