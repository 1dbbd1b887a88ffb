"""A run's outputs and the files they are read back from: summaries side by side and results
folders (:mod:`~sim.output.report`), the saved tables (:mod:`~sim.output.run_tables`), plots
(:mod:`~sim.output.plots`), Chrome traces (:mod:`~sim.output.chrome_trace`), and measured GPU gaps
from a real profiler trace (:mod:`~sim.output.real_trace`). Nothing here simulates or knows an
engine: outputs read the trace schema (:mod:`sim.trace`).
"""
