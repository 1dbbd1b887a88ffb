"""One simulated run of a vLLM scenario under one setting: the workload, the engine core and the
worker wired together (:func:`run_vllm`); :func:`sim.simulate.simulate` calls it for
``server.engine: vllm`` and turns what it returns into a :class:`sim.simulate.Result`.
"""

from __future__ import annotations

import simpy

from sim.engines.vllm.core import EngineCore
from sim.engines.vllm.leap import Leap
from sim.engines.vllm.costs import make_vllm_costs
from sim.engines.vllm.loops import LOOPS, worker_loop
from sim.engines.vllm.policy.scheduler import Scheduler
from sim.engines.vllm.server import SETTINGS
from sim.engines.vllm.worker import Worker
from sim.errors import SimulationStalled
from sim.model.costs import Jitter, SeededGenerator
from sim.model.device import DeviceStream
from sim.model.reach import reach_outcome
from sim.model.workload import ClosedLoopClients, RequestSpecs, open_loop_arrivals


def _prepare(scenario, setting: str):
    """The run's costs (:func:`sim.engines.vllm.costs.make_vllm_costs`, which checks the profile
    against the scenario's server: TP size, structured output's and speculative decoding's costs).

    Raises:
        ValueError: an unknown setting. ScenarioError, ProfileError: as the costs say.
    """
    if setting not in SETTINGS:
        raise ValueError(f"unknown setting {setting!r} for a vLLM scenario; expected one of {sorted(SETTINGS)}")
    return make_vllm_costs(scenario, setting)


def check_vllm(scenario, setting: str) -> None:
    """What :func:`run_vllm` checks before its first step, without running
    (:data:`sim.simulate.CHECKS`)."""
    _prepare(scenario, setting)


def run_vllm(scenario, setting: str, specs: RequestSpecs, warmup: int, recorder,
             leap: bool = True) -> tuple[dict, dict]:
    """Simulate ``scenario`` (a vLLM scenario, run noise already folded into its scales) under
    ``setting`` ('sync' | 'async') for the requests ``specs`` (ids below ``warmup`` are warm-up),
    feeding ``recorder``. ``leap``: take runs of steady decode iterations at once
    (:mod:`sim.engines.vllm.leap`; the same answer), else every iteration through the processes.

    Returns:
        (outcome, stats): outcome as :class:`sim.simulate.Result` documents it (status, KV peak,
        preemptions as retractions, recomputed tokens, extrapolated steps), stats (simulated
        time, steps, wall time is the caller's).

    Raises:
        ValueError: an unknown setting. ProfileError: an unusable profile.
        SimulationStalled: the simulation stalled (a modelling bug; a RuntimeError).
    """
    costs = _prepare(scenario, setting)
    w, srv = scenario.workload, scenario.server
    env = simpy.Environment()
    noise = scenario.costs.noise
    clients = None
    if w.arrival == "closed_loop":
        clients = ClosedLoopClients(len(specs), w.concurrency, lambda rid, t: core.submit(rid, t),
                                    warmup if w.warmup_before_benchmark else 0)
    on_finish = clients.on_finish if clients is not None else (lambda _rid, _t: None)
    scheduler = Scheduler(srv, setting == "async", recorder, on_finish, SeededGenerator([scenario.seed, 7]))
    section = srv.structured_output
    grammar = section.draw(len(specs), scenario.seed) if section is not None and section.share > 0 else None
    core = EngineCore(env, scheduler, specs, warmup, costs, Jitter(noise.cpu_cv, SeededGenerator([scenario.seed, 3])),
                      recorder, grammar)
    worker = Worker(costs, DeviceStream(), Jitter(noise.gpu_cv, SeededGenerator([scenario.seed, 2])),
                    Jitter(noise.cpu_cv, SeededGenerator([scenario.seed, 5])), srv.blocking_forward,
                    setting == "async", srv.resolved_block_size if w.prefix_sharing == "shared" else 0,
                    srv.speculative)
    rpcs = simpy.Store(env)
    core.leap = Leap.for_run(env, core, worker, rpcs, setting, leap)
    if clients is not None:
        clients.start()
    else:
        core.open_loop_arrival_s = specs.arrival_s
        env.process(open_loop_arrivals(env, specs.arrival_s, core.submit))
    env.process(LOOPS[setting](env, core, rpcs))
    env.process(worker_loop(env, worker, rpcs))
    env.run()
    if not core.all_done:
        raise SimulationStalled(f"simulation stalled at t={env.now:.6f}s with {scheduler.num_done}/{len(specs)} "
                           "requests done (a modelling bug: please report it with the scenario)")
    kv = scheduler.kv
    outcome = {"status": "ok", "reason": "", "time_s": float("nan"),
               "peak_token_usage": kv.peak_used_blocks / kv.num_usable_blocks,
               "retractions": scheduler.preempted_reqs, "retraction_steps": scheduler.preemption_steps,
               "reprefill_tokens": scheduler.recompute_tokens, "skipped_decodes": 0, "faults": [],
               **reach_outcome(costs)}
    if scheduler.accept is not None:  # tokens per verify step per request, as drawn
        outcome["spec_accept_length"] = scheduler.accept.mean_accept_length
    front = core.frontend
    if front.entered_beyond:  # requests whose way in extends frontend_in's line past its data
        outcome["summary_extra"] = {"frontend_in_beyond": front.entered_beyond, "frontend_in_pool": front.most_in_pool,
                                    "frontend_in_measured_to": int(front.measured_to)}
    stats = {"sim_time_s": env.now, "steps": scheduler.next_step_seq,
             "leapt_steps": core.leap.leapt if core.leap is not None else 0}
    return outcome, stats
