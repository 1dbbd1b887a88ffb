"""Run one scenario under one scheduling setting, or all of its settings side by side."""

from __future__ import annotations

import math
import time
import zlib
from functools import partial
from typing import TYPE_CHECKING, Callable, Union

import numpy as np
import simpy

from sim.engines.sglang.loops import LOOPS
from sim.engines.sglang.phases import Phases
from sim.engines.sglang.rules.loop_rules import setting_faults
from sim.engines.sglang.policy.scheduler import Scheduler, ServerDied
from sim.engines.vllm.server import SETTINGS as VLLM_SETTINGS, VllmServer
from sim.model.costs import Jitter, make_cost_model
from sim.model.device import DeviceStream
from sim.model.reach import reach_outcome
from sim.model.workload import ClosedLoopClients, make_requests, open_loop_arrivals
from sim.scenario import Scenario, load_scenario
from sim.trace.metrics import summarize
from sim.trace.recorder import FAILURE_KINDS, STEP_COLUMNS, TraceRecorder
from sim.trace.streaming import StreamingRecorder

if TYPE_CHECKING:  # pandas is imported when a table is built (a streamed run may build none)
    import pandas as pd

# a table, or what builds it on first use (a streamed run's empty tables: no pandas until read)
Table = Union["pd.DataFrame", Callable[[], "pd.DataFrame"]]


class Result:
    """The outcome of one simulated run.

    Attributes:
        scenario: the scenario that ran; setting: the event loop ('normal', 'overlap', ...).
        steps, requests, itl: trace tables (schema in :mod:`sim.trace.recorder`), times in seconds;
            a streamed run's empty tables are built when first read (pandas is not imported
            before).
        outcome: {'status': 'ok'|'server_died', 'reason': str, 'time_s': float,
            'peak_token_usage': fraction of the KV pool, 'token_usage_at_failure': fraction,
            'retraction_steps', 'retractions' (requests retracted), 'reprefill_tokens',
            'skipped_decodes': ints, 'faults': ids of the release faults that applied,
            'extrapolated_steps', 'far_steps': steps priced beyond the calibration profile's data and
            beyond sim.model.reach.FAR of it, 'max_extrapolation': the largest distance}.
        metrics: the streamed metrics (tables 'summary'/'none'); None: computed from the tables.
        stats: {'sim_time_s', 'wall_s': seconds, 'steps', 'decode_steps': counts}.
    """

    def __init__(self, scenario: Scenario, setting: str, steps: Table, requests: Table, itl: Table,
                 outcome: dict | None = None, metrics: dict | None = None, stats: dict | None = None):
        self.scenario = scenario
        self.setting = setting
        self._tables = {"steps": steps, "requests": requests, "itl": itl}
        self.outcome = {} if outcome is None else outcome
        self.metrics = metrics
        self.stats = {} if stats is None else stats

    def _table(self, name: str) -> pd.DataFrame:
        table = self._tables[name]
        if callable(table):  # built on first use
            table = self._tables[name] = table()
        return table

    @property
    def steps(self) -> pd.DataFrame:
        return self._table("steps")

    @property
    def requests(self) -> pd.DataFrame:
        return self._table("requests")

    @property
    def itl(self) -> pd.DataFrame:
        return self._table("itl")

    def summary(self) -> dict:
        """bench_serving-style metrics (see :mod:`sim.trace.metrics`) plus the run's outcome."""
        out = dict(self.metrics) if self.metrics is not None else summarize(self.steps, self.requests, self.itl)
        o = self.outcome
        out["peak_token_usage"] = o.get("peak_token_usage", math.nan)
        if self.metrics is None:
            measured = self.requests[~self.requests["warmup"].astype(bool)]
            for kind in FAILURE_KINDS:
                out[kind] = int((measured["failure"] == kind).sum())
        for key in ("retractions", "retraction_steps", "reprefill_tokens", "skipped_decodes", "extrapolated_steps",
                    "far_steps"):
            out[key] = int(o.get(key, 0))
        out["max_extrapolation"] = float(o.get("max_extrapolation", 1.0))
        out["outcome"] = o.get("status", "ok")
        if o.get("status") != "ok":
            out["outcome_reason"] = o.get("reason", "")
            out["outcome_time_s"] = o.get("time_s", math.nan)
            out["outcome_token_usage"] = o.get("token_usage_at_failure", math.nan)
            out["outcome_last_logged_usage"] = o.get("last_logged_token_usage", math.nan)
        return out


TABLES = ("steps", "summary", "none")


def simulate(scenario: Scenario | str | dict, setting: str, tables: str = "steps") -> Result:
    """Simulate ``scenario`` under the event loop ``setting``.

    Deterministic for a given scenario (its seed included). The settings of one scenario share
    request lengths, arrival times and jitter streams (common random numbers).

    Args:
        tables: ``steps`` keeps the per-step, per-request and ITL tables (exact metrics);
            ``summary`` keeps only the per-request table and streams the metrics; ``none`` keeps
            no table (memory bounded by the requests in flight). Streamed quantiles are within
            0.5% (DDSketch); counts, means and the idle fraction are exact.

    Raises:
        ScenarioError: bad scenario; ValueError: unknown setting or tables mode.
    """
    scenario = load_scenario(scenario)
    if isinstance(scenario.server, VllmServer):
        return _simulate_vllm(scenario, setting, tables)
    if setting not in LOOPS:
        raise ValueError(f"unknown setting {setting!r}; expected one of {sorted(LOOPS)}")
    if tables not in TABLES:
        raise ValueError(f"unknown tables mode {tables!r}; expected one of {TABLES}")
    wall0 = time.perf_counter()
    w, srv = scenario.workload, scenario.server
    specs = make_requests(scenario)
    env = simpy.Environment()
    costs = make_cost_model(_run_noise_applied(scenario, setting), setting)
    warmup = min(w.warmup_requests, len(specs) - 1)
    recorder = TraceRecorder() if tables == "steps" else StreamingRecorder(warmup, keep_requests=tables == "summary")
    clients = None
    if w.arrival == "closed_loop":
        clients = ClosedLoopClients(len(specs), w.concurrency, lambda rid, t: phases.submit(rid, t),
                                    warmup if w.warmup_before_benchmark else 0)
        on_finish = clients.on_finish
    else:
        on_finish = _ignore
    scheduler = Scheduler(specs, srv, warmup, w.finish == "length", recorder, on_finish,
                          lookahead_policy=setting != "overlap_mlx",
                          deferred_results=setting in ("overlap", "thread_overlap"))
    faults = setting_faults(srv.device, setting, srv.version)
    phases = Phases(
        env, scheduler, DeviceStream(), costs,
        Jitter(scenario.costs.noise.gpu_cv, np.random.default_rng([scenario.seed, 2])),
        Jitter(scenario.costs.noise.cpu_cv, np.random.default_rng([scenario.seed, 3])),
        recorder, forward_extra_s=costs.overlap_residue_s if setting == "overlap" and not srv.blocking_forward else 0.0,
        faults=faults, external_arrival_s=None if clients is not None else specs.arrival_s,
        blocking_forward=srv.blocking_forward, after_wait_scale=scenario.costs.cpu.after_wait_scale,
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
                   faults=[f.id for f in faults], **reach_outcome(costs))
    stats = {"sim_time_s": env.now, "steps": scheduler.next_step_seq, "decode_steps": scheduler.next_decode_seq,
             "wall_s": time.perf_counter() - wall0}
    return _result(scenario, setting, recorder, tables, outcome, stats)


def _simulate_vllm(scenario: Scenario, setting: str, tables: str) -> Result:
    """:func:`simulate` for ``server.engine: vllm`` (the engine core and worker of
    :mod:`sim.engines.vllm`)."""
    if setting not in VLLM_SETTINGS:
        raise ValueError(f"unknown setting {setting!r} for a vLLM scenario; expected one of {sorted(VLLM_SETTINGS)}")
    if tables not in TABLES:
        raise ValueError(f"unknown tables mode {tables!r}; expected one of {TABLES}")
    from sim.engines.vllm.run import run_vllm  # vLLM's engine modules: imported for a vLLM scenario only

    wall0 = time.perf_counter()
    specs = make_requests(scenario)
    warmup = min(scenario.workload.warmup_requests, len(specs) - 1)
    recorder = TraceRecorder() if tables == "steps" else StreamingRecorder(warmup, keep_requests=tables == "summary")
    outcome, stats = run_vllm(_run_noise_applied(scenario, setting), setting, specs, warmup, recorder)
    stats["wall_s"] = time.perf_counter() - wall0
    return _result(scenario, setting, recorder, tables, outcome, stats)


def _result(scenario: Scenario, setting: str, recorder, tables: str, outcome: dict, stats: dict) -> Result:
    """The :class:`Result` of a finished run: the recorder's tables (``tables == "steps"``), or
    its streamed summary with the tables built only if read."""
    if tables == "steps":
        return Result(scenario, setting, recorder.steps_frame(), recorder.requests_frame(), recorder.itl_frame(),
                      outcome, stats=stats)
    recorder.finish()
    return Result(scenario, setting, partial(_empty_frame, STEP_COLUMNS),
                  recorder.requests_frame() if tables == "summary" else recorder.requests_frame,
                  partial(_empty_frame, ITL_COLUMNS), outcome, metrics=recorder.summary(), stats=stats)


ITL_COLUMNS = ["itl_s", "weight"]


def _empty_frame(columns: list[str]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(columns=columns)


def _run_noise_applied(scenario: Scenario, setting: str) -> Scenario:
    """The scenario with this run's factors from ``costs.noise.run_gpu_cv``/``run_cpu_cv`` folded
    into ``costs.gpu.scale``/``costs.cpu.scale``; drawn from (seed, setting), so each setting of
    a comparison is a separately started server."""
    noise = scenario.costs.noise
    if noise.run_gpu_cv == 0 and noise.run_cpu_cv == 0:
        return scenario
    rng = np.random.default_rng([scenario.seed, 4, zlib.crc32(setting.encode())])  # stable per name
    factors = [Jitter(cv, rng)() for cv in (noise.run_gpu_cv, noise.run_cpu_cv)]
    gpu = scenario.costs.gpu.model_copy(update={"scale": scenario.costs.gpu.scale * factors[0]})
    cpu = scenario.costs.cpu.model_copy(update={"scale": scenario.costs.cpu.scale * factors[1]})
    return scenario.model_copy(update={"costs": scenario.costs.model_copy(update={"gpu": gpu, "cpu": cpu})})


def _ignore(_rid: int, _t: float) -> None:
    pass


def _serve(env, loop, phases: Phases, server, outcome: dict):
    """Run the event loop; if the server dies, fail what it holds and refuse later arrivals."""
    sched = phases.scheduler
    try:
        yield from loop(env, phases, server)
    except ServerDied as err:
        if err.time_s is not None and err.time_s > env.now:
            yield env.timeout(err.time_s - env.now)  # the iteration ran up to the failure
        outcome.update(status="server_died", reason=err.reason, time_s=env.now)
        sched.fail_all(env.now)
        while not sched.all_done:
            sched.reject_arrivals(env.now)
            if not sched.all_done:
                yield phases.idle()


def compare(scenario: Scenario | str | dict) -> pd.DataFrame:
    """Simulate every setting of ``scenario.server.settings``; one summary row per setting
    (index: setting name)."""
    import pandas as pd

    scenario = load_scenario(scenario)
    rows = {s: simulate(scenario, s).summary() for s in scenario.server.settings}
    return pd.DataFrame.from_dict(rows, orient="index")
