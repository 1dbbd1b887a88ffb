"""Run one scenario under one scheduling setting, or all of its settings side by side."""

from __future__ import annotations

import math
import os
import time
import zlib
from functools import partial
from typing import TYPE_CHECKING, Callable, Union

import numpy as np

from sim.commands import LEAP_ENV
from sim.model.costs import Jitter
from sim.model.workload import make_requests
from sim.scenario import Scenario, load_scenario
from sim.trace.columns import Columns, matches, values_of
from sim.trace.metrics import probe_times, summarize
from sim.trace.recorder import FAILURE_KINDS, STEP_COLUMNS, TraceRecorder, rows_to_columns
from sim.trace.streaming import StreamingRecorder

if TYPE_CHECKING:  # pandas is imported when a table is built (a streamed run may build none)
    import pandas as pd

# a table: a DataFrame, the recorder's columns (a DataFrame of the same arrays is built when first
# read), or what builds the DataFrame on first use (a streamed run's empty tables); pandas is not
# imported before a DataFrame is asked for
Table = Union["pd.DataFrame", Columns, Callable[[], Union["pd.DataFrame", Columns]]]


class Result:
    """The outcome of one simulated run.

    Attributes:
        scenario: the scenario that ran; setting: the event loop ('normal', 'overlap', ...).
        steps, requests, itl: trace tables (DataFrames, schema in :mod:`sim.trace.recorder`), times
            in seconds, built when first read (pandas is not imported before);
            :meth:`columns` gives the same tables as numpy columns without pandas.
        outcome: {'status': 'ok'|'server_died', 'reason': str, 'time_s': float,
            'peak_token_usage': fraction of the KV pool, 'token_usage_at_failure': fraction,
            'retraction_steps', 'retractions' (requests retracted), 'reprefill_tokens',
            'skipped_decodes': ints, 'faults': ids of the release faults that applied,
            'extrapolated_steps', 'far_steps': steps priced beyond the calibration profile's data and
            beyond sim.model.reach.FAR of it, 'max_extrapolation': the largest distance,
            'max_extrapolation_at': the curve and axis that put the farthest step there ('' inside);
            'bounded_steps': steps priced below the data's contexts within sim.model.reach.BOUNDED_MAX
            of the price there (not counted as extrapolated), 'max_bounded_share': the largest such
            bound, 'max_bounded_at': where it lay ('' for none);
            'spec_accept_length': with speculative decoding, tokens per verify step per request;
            'summary_extra': an engine's own summary keys, numbers (vLLM's ``frontend_in_beyond``,
            ``frontend_in_pool``, ``frontend_in_measured_to``: :mod:`sim.engines.vllm.frontend`)}.
        metrics: the streamed metrics (tables 'summary'/'none'); None: computed from the tables.
        stats: {'sim_time_s', 'wall_s': seconds, 'steps', 'decode_steps': counts; SGLang runs also
            'leapt_steps': the steps taken by the leap over steady decode runs}.
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
        table = self.columns(name)
        if isinstance(table, Columns):  # the same arrays, as a DataFrame
            table = self._tables[name] = table.to_frame()
        return table

    def columns(self, name: str) -> Union[Columns, "pd.DataFrame"]:
        """Table ``name`` ('steps', 'requests' or 'itl') as the recorder gave it (:class:`Columns`)
        when no DataFrame of it was built yet, else that DataFrame: what
        :func:`sim.trace.metrics.summarize` and :func:`sim.output.run_files.write_tables` read
        (either), without importing pandas for a table nobody asked as a DataFrame."""
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
        failures = {}  # the streamed metrics count them; from the tables, here
        if self.metrics is None:
            requests = self.columns("requests")
            out = summarize(self.columns("steps"), requests, self.columns("itl"))
            measured = ~values_of(requests, "warmup").astype(bool)
            failures = {kind: int((measured & matches(requests, "failure", kind)).sum()) for kind in FAILURE_KINDS}
        else:
            out = dict(self.metrics)
        o = self.outcome
        out["peak_token_usage"] = o.get("peak_token_usage", math.nan)
        out.update(failures)
        for key in ("retractions", "retraction_steps", "reprefill_tokens", "skipped_decodes", "extrapolated_steps",
                    "far_steps", "bounded_steps"):
            out[key] = int(o.get(key, 0))
        out["max_extrapolation"] = float(o.get("max_extrapolation", 1.0))
        out["max_extrapolation_at"] = str(o.get("max_extrapolation_at", ""))  # the curve and axis (sim.model.reach)
        out["max_bounded_share"] = float(o.get("max_bounded_share", 0.0))  # below the data's contexts, bounded
        out["max_bounded_at"] = str(o.get("max_bounded_at", ""))
        if self.scenario.workload.arrival == "closed_loop":  # its clients send as answers come: no queue to grow
            out["ttft_growth"] = out["in_server_mid"] = out["in_server_last"] = math.nan
        # every step of the run, warm-up and tail included: what extrapolated_steps counts over
        out["run_steps"] = int(self.stats.get("steps", 0))
        if "spec_accept_length" in o:  # speculative decoding: tokens per verify step per request, as drawn
            out["spec_accept_length"] = float(o["spec_accept_length"])
        out.update(o.get("summary_extra", {}))  # an engine's own counts (vLLM: frontend_in beyond its data)
        out["outcome"] = o.get("status", "ok")
        if o.get("status") != "ok":
            out["outcome_reason"] = o.get("reason", "")
            out["outcome_time_s"] = o.get("time_s", math.nan)
            out["outcome_token_usage"] = o.get("token_usage_at_failure", math.nan)
            out["outcome_last_logged_usage"] = o.get("last_logged_token_usage", math.nan)
        return out


TABLES = ("steps", "summary", "none")


# server.engine -> "module:function" that runs one setting of a scenario of that engine:
# ``run(scenario, setting, specs, warmup, recorder, leap) -> (outcome, stats)``, raising ValueError for a
# setting the engine does not run. The engine's modules are imported for its scenarios only; a
# third engine registers here and keeps everything else in its own package.
RUNNERS = {"sglang": "sim.engines.sglang.run:run_sglang", "vllm": "sim.engines.vllm.run:run_vllm"}
# server.engine -> "module:function" that makes the checks its runner makes before the first step
# (the cost model from the profile, and what the profile must say for the scenario's server):
# ``check(scenario, setting) -> None``, raising as the runner would; a sweep checks every point so.
CHECKS = {"sglang": "sim.engines.sglang.run:check_sglang", "vllm": "sim.engines.vllm.run:check_vllm"}
# server.engine -> "module:function" that makes the cost model a run of a setting prices its steps
# with: ``costs(scenario, setting)``, whose ``forward_s(kind, num_reqs, num_tokens, sum_ctx)`` is a
# forward's seconds (what a note on the run reads of the profile, :func:`cost_model`).
COST_MODELS = {"sglang": "sim.model.costs:make_cost_model", "vllm": "sim.engines.vllm.costs:make_vllm_costs"}


def cost_model(scenario: Scenario, setting: str):
    """The cost model ``scenario``'s engine prices ``setting``'s steps with (:data:`COST_MODELS`).

    Raises:
        ProfileError, ScenarioError: as the engine's runner would.
    """
    return _registered(COST_MODELS, scenario.server.engine)(scenario, setting)


def check(scenario: Scenario, setting: str) -> None:
    """Raise what :func:`simulate` of ``scenario`` under ``setting`` would raise before its first
    step (a profile measured at another TP size, structured output without its costs, an unusable
    profile), without running it (:data:`CHECKS`).

    Raises:
        ScenarioError, ProfileError: as :func:`simulate`; ValueError: an unknown setting.
    """
    _registered(CHECKS, scenario.server.engine)(scenario, setting)


def simulate(scenario: Scenario | str | dict, setting: str, tables: str = "steps", leap: bool | None = None) -> Result:
    """Simulate ``scenario`` under the event loop ``setting``.

    Deterministic for a given scenario (its seed included). The settings of one scenario share
    request lengths, arrival times and jitter streams (common random numbers). The engine's own
    package runs it (:data:`RUNNERS`: :func:`sim.engines.sglang.run.run_sglang`,
    :func:`sim.engines.vllm.run.run_vllm`).

    Args:
        tables: ``steps`` keeps the per-step, per-request and ITL tables (exact metrics);
            ``summary`` keeps only the per-request table and streams the metrics; ``none`` keeps
            no table (memory: the requests in flight and the workload drawn up front). A streamed
            quantile is within 0.5% of the sample at its rank (DDSketch), where the tables' interpolates
            between the two samples around it (far apart on a small or two-humped sample); counts are
            exact, means and the idle fraction to their last digit (sums in another order).
        leap: let the engine take runs of steady decode steps at once where it can (SGLang's
            ``normal`` and ``overlap`` loops, :mod:`sim.engines.sglang.leap`; vLLM's ``sync`` and
            ``async``, :mod:`sim.engines.vllm.leap`): the same answer,
            byte for byte, in less time; False runs every step through the loop; None (default):
            True unless the environment sets ``OVERLAP_SIM_LEAP`` to 0, false, no or off (``--no-leap`` sets 0).

    Raises:
        ScenarioError: bad scenario; ValueError: unknown setting or tables mode, a ``leap`` that is
            not True, False or None.
    """
    scenario = load_scenario(scenario)
    run = _registered(RUNNERS, scenario.server.engine)
    if not isinstance(setting, str):
        raise ValueError(f"setting must be one setting's name, a string (got {setting!r})")
    if not isinstance(tables, str) or tables not in TABLES:
        raise ValueError(f"unknown tables mode {tables!r}; expected one of {TABLES}")
    if leap is not None and not isinstance(leap, bool):
        raise ValueError(f"leap must be True, False or None (got {leap!r})")
    if leap is None:
        leap = os.environ.get(LEAP_ENV, "1").strip().lower() not in ("0", "false", "no", "off")
    wall0 = time.perf_counter()
    specs = make_requests(scenario)
    warmup = min(scenario.workload.warmup_requests, len(specs) - 1)
    open_loop = specs.arrival_s is not None
    recorder = TraceRecorder() if tables == "steps" else StreamingRecorder(
        warmup, keep_requests=tables == "summary", open_loop=open_loop,
        probes_s=probe_times(specs.arrival_s[warmup:]) if open_loop else (math.nan, math.nan))
    outcome, stats = run(_run_noise_applied(scenario, setting), setting, specs, warmup, recorder, leap)
    stats["wall_s"] = time.perf_counter() - wall0
    return _result(scenario, setting, recorder, tables, outcome, stats)


def _registered(table: dict[str, str], engine: str):
    """The function ``table`` (:data:`RUNNERS`, :data:`CHECKS`) registers for ``engine`` (its
    module imported now)."""
    import importlib

    module, name = table[engine].split(":")
    return getattr(importlib.import_module(module), name)


def _result(scenario: Scenario, setting: str, recorder, tables: str, outcome: dict, stats: dict) -> Result:
    """The :class:`Result` of a finished run: the recorder's tables (``tables == "steps"``), or
    its streamed summary with the tables built only if read."""
    if tables == "steps":
        return Result(scenario, setting, recorder.step_columns(), recorder.request_columns(), recorder.itl_columns(),
                      outcome, stats=stats)
    recorder.finish()
    return Result(scenario, setting, partial(rows_to_columns, [], STEP_COLUMNS),
                  recorder.request_columns() if tables == "summary" else recorder.request_columns,
                  partial(rows_to_columns, [], ITL_COLUMNS), outcome, metrics=recorder.summary(), stats=stats)


ITL_COLUMNS = ["itl_s", "weight"]


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


def compare(scenario: Scenario | str | dict) -> pd.DataFrame:
    """Simulate every setting of ``scenario.server.settings``; one summary row per setting
    (index: setting name)."""
    import pandas as pd

    scenario = load_scenario(scenario)
    rows = {s: simulate(scenario, s).summary() for s in scenario.server.settings}
    return pd.DataFrame.from_dict(rows, orient="index")
