"""The engine-neutral core of the model: what every engine's simulation is made of.

:mod:`~sim.model.schema` (the scenario's workload and costs sections), :mod:`~sim.model.workload`
(request lengths, arrivals, closed-loop clients), :mod:`~sim.model.batch` (requests and batches
as plain data), :mod:`~sim.model.costs` (cost models and jitter), :mod:`~sim.model.device` (the
device stream). Nothing here knows an engine: engines (:mod:`sim.engines`) build on it.
"""
