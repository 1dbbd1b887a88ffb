"""One simulated run of an SGLang scenario under one event loop: the workload, the scheduler, the
CPU phases and the device stream wired together (:func:`run_sglang`); :func:`sim.simulate.simulate`
calls it for ``server.engine: sglang`` (the default) and turns what it returns into a
:class:`sim.simulate.Result`.
"""

from __future__ import annotations

import math

import simpy

from sim.engines.sglang.leap import Leap
from sim.engines.sglang.loops import LOOPS
from sim.engines.sglang.phases import Phases
from sim.engines.sglang.server import TP_PRICING
from sim.engines.sglang.policy.scheduler import Scheduler, ServerDied
from sim.engines.sglang.rules.loop_rules import setting_faults
from sim.engines.sglang.structured import GrammarCosts
from sim.errors import ScenarioError, SimulationStalled
from sim.model.costs import Jitter, SeededGenerator, make_cost_model
from sim.model.device import DeviceStream
from sim.model.reach import reach_outcome
from sim.model.workload import ClosedLoopClients, RequestSpecs, open_loop_arrivals

SETTINGS = frozenset(LOOPS)


def run_sglang(scenario, setting: str, specs: RequestSpecs, warmup: int, recorder,
               leap: bool = True) -> tuple[dict, dict]:
    """Simulate ``scenario`` (an SGLang scenario, run noise already folded into its scales) under
    the event loop ``setting`` (:data:`sim.engines.sglang.loops.LOOPS`) for the requests ``specs``
    (ids below ``warmup`` are warm-up), feeding ``recorder``; ``leap``: let the loop take runs of
    steady decodes at once (:mod:`sim.engines.sglang.leap`, the same answer), False: step by step.

    Returns:
        (outcome, stats): outcome as :class:`sim.simulate.Result` documents it (status, KV peak,
        retractions, release faults that applied, extrapolated steps), stats (simulated time,
        steps, decode steps; wall time is the caller's).

    Raises:
        ValueError: an unknown setting. ProfileError: an unusable profile.
        SimulationStalled: the simulation stalled (a modelling bug; a RuntimeError).
    """
    costs, grammar = _prepare(scenario, setting)
    w, srv = scenario.workload, scenario.server
    env = simpy.Environment()
    clients = None
    if w.arrival == "closed_loop":
        clients = ClosedLoopClients(len(specs), w.concurrency, lambda rid, t: phases.submit(rid, t),
                                    warmup if w.warmup_before_benchmark else 0,
                                    submit_range=lambda first, count, t: phases.submit_range(first, count, t))
        on_finish, on_finish_all = clients.on_finish, clients.on_finish_all
    else:
        on_finish, on_finish_all = _ignore, _ignore
    scheduler = Scheduler(specs, srv, warmup, w.finish == "length", recorder, on_finish,
                          lookahead_policy=setting != "overlap_mlx",
                          deferred_results=setting in ("overlap", "thread_overlap"),
                          grammar=None if grammar is None else srv.grammar.draw(len(specs), scenario.seed),
                          on_finish_all=on_finish_all)
    faults = setting_faults(srv.device, setting, srv.version)
    phases = Phases(
        env, scheduler, DeviceStream(), costs,
        Jitter(scenario.costs.noise.gpu_cv, SeededGenerator([scenario.seed, 2])),
        Jitter(scenario.costs.noise.cpu_cv, SeededGenerator([scenario.seed, 3])),
        recorder, forward_extra_s=costs.overlap_residue_s if setting == "overlap" and not srv.blocking_forward else 0.0,
        faults=faults, external_arrival_s=None if clients is not None else specs.arrival_s,
        blocking_forward=srv.blocking_forward, after_wait_scale=scenario.costs.cpu.after_wait_scale,
        grammar=grammar, delay_sample=setting == "overlap",
    )
    if leap:
        phases.leap = Leap.for_run(phases, setting)
    outcome = {"status": "ok", "reason": "", "time_s": math.nan}
    if clients is not None:
        clients.start()
    elif phases.leap is not None:  # the loop pulls them: no SimPy event per arrival (the same order)
        phases.pull_arrivals()
    else:
        env.process(open_loop_arrivals(env, specs.arrival_s, phases.submit))
    env.process(_serve(env, LOOPS[setting], phases, srv, outcome))
    env.run()
    if not scheduler.all_done:
        raise SimulationStalled(f"simulation stalled at t={env.now:.6f}s with {scheduler.num_done}/{len(specs)} "
                           "requests done (a modelling bug: please report it with the scenario)")
    outcome["peak_token_usage"] = scheduler.kv_peak / srv.kv_pool_tokens
    if outcome["status"] != "ok":
        outcome["token_usage_at_failure"] = scheduler.usage_at_failure
        outcome["last_logged_token_usage"] = scheduler.last_logged_usage
    outcome.update(retractions=scheduler.retracted_reqs, retraction_steps=scheduler.retraction_events,
                   reprefill_tokens=scheduler.reprefill_tokens, skipped_decodes=scheduler.skipped_decodes,
                   faults=[f.id for f in faults], **reach_outcome(costs))
    stats = {"sim_time_s": env.now, "steps": scheduler.next_step_seq, "decode_steps": scheduler.next_decode_seq,
             "leapt_steps": phases.leap.leapt if phases.leap is not None else 0}
    return outcome, stats


def _prepare(scenario, setting: str):
    """The run's cost model and grammar costs, after the checks made before its first step.

    Raises:
        ValueError: an unknown setting. ScenarioError, ProfileError: as :func:`check_tp_size`,
            :func:`grammar_costs` and the cost model's profile say.
    """
    if setting not in LOOPS:
        raise ValueError(f"unknown setting {setting!r}; expected one of {sorted(LOOPS)}")
    costs = make_cost_model(scenario, setting)
    check_tp_size(scenario, costs)
    return costs, grammar_costs(scenario, costs)


def check_sglang(scenario, setting: str) -> None:
    """What :func:`run_sglang` checks before its first step, without running
    (:data:`sim.simulate.CHECKS`)."""
    _prepare(scenario, setting)


def check_tp_size(scenario, costs) -> None:
    """Refuse a scenario whose ``server.tp_size`` is not the tensor-parallel size its profile was
    measured at (``metadata.tp_size``, 1 where it does not say): rank 0's phases at TP N carry
    that many ranks' broadcast and all-reduces, which the simulator takes as measured, not from a
    model of them. Inline costs pass (taken as the TP server's, said on every run).

    Raises:
        ScenarioError: naming ``server.tp_size`` (:data:`sim.engines.sglang.server.TP_PRICING`).
        ProfileError: the profile's size is not a positive whole number.
    """
    profile = getattr(costs, "profile", None)
    if isinstance(profile, dict):
        TP_PRICING.check(profile, scenario.server.tp_size, getattr(costs, "source", ""), scenario.source,
                         scenario.server.device)


def grammar_costs(scenario, costs) -> GrammarCosts | None:
    """Structured output's costs for ``scenario`` priced by ``costs`` (its profile's grammar curves,
    else the section's given terms); None when no request carries a grammar.

    Raises:
        ScenarioError: neither gives them (``server.structured_output``).
    """
    section = scenario.server.grammar
    if section is None:
        return None
    try:
        return GrammarCosts(section, getattr(costs, "curves", None), scenario.costs.cpu.scale)
    except ValueError as err:
        raise ScenarioError(scenario.source, "server.structured_output", str(err)) from None


def _ignore(_rid: int, _t: float) -> None:
    pass


def _serve(env, loop, phases: Phases, server, outcome: dict):
    """Run the event loop; if the server dies, fail what it holds and refuse later arrivals."""
    sched = phases.scheduler
    try:
        yield from loop(env, phases, server)
    except ServerDied as err:
        if err.time_s is not None and err.time_s > phases.sim_now:
            yield from phases.catch_up(err.time_s)  # the iteration ran up to the failure
        outcome.update(status="server_died", reason=err.reason, time_s=phases.sim_now)
        sched.fail_all(phases.sim_now)
        while not sched.all_done:
            sched.reject_arrivals(phases.sim_now)
            if not sched.all_done:
                yield from phases.wait_arrival()
        if phases.pulled is not None:
            yield from phases.land()  # SimPy's clock where the pulled arrivals left it
