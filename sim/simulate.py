"""Run one scenario under one scheduling setting, or all of its settings side by side."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import simpy

from sim.costs import Jitter, make_cost_model
from sim.device import DeviceStream
from sim.loop_rules import setting_faults
from sim.loops import LOOPS
from sim.metrics import summarize
from sim.phases import Phases
from sim.policy import Scheduler, ServerDied
from sim.scenario import Scenario, load_scenario
from sim.trace import TraceRecorder
from sim.workload import ClosedLoopClients, make_requests, open_loop_arrivals


FAILURE_KINDS = ("cut_off", "could_not_connect", "aborted")


@dataclass
class Result:
    """The outcome of one simulated run.

    Attributes:
        scenario: the scenario that ran; setting: the event loop ('normal', 'overlap', ...).
        steps, requests, itl: trace tables (schema in :mod:`sim.trace`), times in seconds.
        outcome: {'status': 'ok'|'server_died', 'reason': str, 'time_s': float,
            'peak_token_usage': fraction of the KV pool, 'token_usage_at_failure': fraction,
            'retraction_steps', 'retractions' (requests retracted), 'reprefill_tokens',
            'skipped_decodes': ints, 'faults': ids of the release faults that applied}.
    """

    scenario: Scenario
    setting: str
    steps: pd.DataFrame
    requests: pd.DataFrame
    itl: pd.DataFrame
    outcome: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """bench_serving-style metrics (see :mod:`sim.metrics`) plus the run's outcome."""
        out = summarize(self.steps, self.requests, self.itl)
        o = self.outcome
        out["peak_token_usage"] = o.get("peak_token_usage", math.nan)
        measured = self.requests[~self.requests["warmup"].astype(bool)]
        for kind in FAILURE_KINDS:
            out[kind] = int((measured["failure"] == kind).sum())
        for key in ("retractions", "retraction_steps", "reprefill_tokens", "skipped_decodes"):
            out[key] = int(o.get(key, 0))
        out["outcome"] = o.get("status", "ok")
        if o.get("status") != "ok":
            out["outcome_reason"] = o.get("reason", "")
            out["outcome_time_s"] = o.get("time_s", math.nan)
            out["outcome_token_usage"] = o.get("token_usage_at_failure", math.nan)
            out["outcome_last_logged_usage"] = o.get("last_logged_token_usage", math.nan)
        return out


def simulate(scenario: Scenario | str | dict, setting: str) -> Result:
    """Simulate ``scenario`` under the event loop ``setting``.

    Deterministic for a given scenario (its seed included). The settings of one scenario share
    request lengths, arrival times and jitter streams (common random numbers).

    Raises:
        ScenarioError: bad scenario; ValueError: unknown setting.
    """
    scenario = load_scenario(scenario)
    if setting not in LOOPS:
        raise ValueError(f"unknown setting {setting!r}; expected one of {sorted(LOOPS)}")
    w, srv = scenario.workload, scenario.server
    specs = make_requests(scenario)
    env = simpy.Environment()
    recorder = TraceRecorder()
    costs = make_cost_model(scenario)
    warmup = min(w.warmup_requests, len(specs) - 1)
    clients = None
    if w.arrival == "closed_loop":
        clients = ClosedLoopClients(len(specs), w.concurrency, lambda rid, t: phases.submit(rid, t),
                                    warmup if w.warmup_before_benchmark else 0)
        on_finish = clients.on_finish
    else:
        on_finish = _ignore
    scheduler = Scheduler(specs, srv, warmup, w.finish == "length", recorder, on_finish)
    faults = setting_faults(srv.device, setting, srv.version)
    phases = Phases(
        env, scheduler, DeviceStream(), costs,
        Jitter(scenario.costs.noise.gpu_cv, np.random.default_rng([scenario.seed, 2])),
        Jitter(scenario.costs.noise.cpu_cv, np.random.default_rng([scenario.seed, 3])),
        recorder, forward_extra_s=costs.overlap_residue_s if setting == "overlap" else 0.0,
        faults=faults,
    )
    outcome = {"status": "ok", "reason": "", "time_s": math.nan}
    if clients is not None:
        clients.start()
    else:
        env.process(open_loop_arrivals(env, specs.arrival_s, phases.submit))
    env.process(_serve(env, LOOPS[setting], phases, srv, outcome))
    env.run()
    if not scheduler.all_done:
        raise RuntimeError(f"simulation stalled at t={env.now:.6f}s with {scheduler.num_done}/{len(specs)} "
                           "requests done (a modelling bug: please report it with the scenario)")
    outcome["peak_token_usage"] = scheduler.kv_peak / srv.kv_pool_tokens
    if outcome["status"] != "ok":
        outcome["token_usage_at_failure"] = scheduler.usage_at_failure
        outcome["last_logged_token_usage"] = scheduler.last_logged_usage
    outcome.update(retractions=scheduler.retracted_reqs, retraction_steps=scheduler.retraction_events,
                   reprefill_tokens=scheduler.reprefill_tokens, skipped_decodes=scheduler.skipped_decodes,
                   faults=[f.id for f in faults])
    return Result(scenario, setting, recorder.steps_frame(), recorder.requests_frame(), recorder.itl_frame(), outcome)


def _ignore(_rid: int, _t: float) -> None:
    pass


def _serve(env, loop, phases: Phases, server, outcome: dict):
    """Run the event loop; if the server dies, fail what it holds and refuse later arrivals."""
    sched = phases.scheduler
    try:
        yield from loop(env, phases, server)
    except ServerDied as err:
        outcome.update(status="server_died", reason=err.reason, time_s=env.now)
        sched.fail_all(env.now)
        while not sched.all_done:
            sched.reject_arrivals(env.now)
            if not sched.all_done:
                yield phases.idle()


def compare(scenario: Scenario | str | dict) -> pd.DataFrame:
    """Simulate every setting of ``scenario.server.settings``; one summary row per setting
    (index: setting name)."""
    scenario = load_scenario(scenario)
    rows = {s: simulate(scenario, s).summary() for s in scenario.server.settings}
    return pd.DataFrame.from_dict(rows, orient="index")
