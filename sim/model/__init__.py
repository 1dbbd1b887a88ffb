"""The engine-neutral core of the model: what every engine's simulation is made of.

:mod:`~sim.model.schema` (the scenario's workload and costs sections), :mod:`~sim.model.workload`
(request lengths, arrivals, closed-loop clients), :mod:`~sim.model.batch` (requests and batches
as plain data), :mod:`~sim.model.costs` (cost models and jitter), the calibration profile as
the simulator reads it (:mod:`~sim.model.profile`, its curves :mod:`~sim.model.curve`, and the
cost model priced from it :mod:`~sim.model.profile_costs`; building profiles is calibration's),
:mod:`~sim.model.device` (the device stream). Nothing here knows an engine: engines
(:mod:`sim.engines`) build on it.
"""
