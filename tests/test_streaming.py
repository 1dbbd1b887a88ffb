"""Streamed metrics (tables 'summary'/'none') against the metrics of the full tables."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim
from sim.trace.metrics import SUMMARY_KEYS, measured_window, step_gaps
from tests.test_invariants import scenarios

QUANTILE_KEYS = {k for k in SUMMARY_KEYS if k.startswith(("median_", "p99_"))}


def samples_ms(res: sim.Result) -> dict[str, np.ndarray]:
    """The samples behind each quantile metric of a full-table run (ms)."""
    req = res.requests[(~res.requests["warmup"]) & (res.requests["status"] == "completed")]
    ttft = (req["first_token_s"] - req["arrival_s"]).to_numpy()
    e2e = (req["finish_s"] - req["arrival_s"]).to_numpy()
    multi = req["output_tokens"].to_numpy() > 1
    tpot = (e2e - ttft)[multi] / (req["output_tokens"].to_numpy()[multi] - 1)
    itl = np.repeat(res.itl["itl_s"].to_numpy(), res.itl["weight"].to_numpy())
    start, end = measured_window(res.requests)
    steps = res.steps
    gaps = step_gaps(steps).to_numpy()
    keep = (steps["forward_start"] >= start).to_numpy() & (steps["forward_start"] < end).to_numpy() \
        & ~steps["after_idle"].to_numpy(dtype=bool) & ~np.isnan(gaps)
    return {"ttft": ttft * 1e3, "e2e_latency": e2e * 1e3, "tpot": tpot * 1e3, "itl": itl * 1e3, "gap": gaps[keep] * 1e3}


def assert_quantiles_bracketed(full: sim.Result, streamed: dict):
    """A sketch quantile lies within 0.5% of the samples on either side of the exact rank."""
    for name, values in samples_ms(full).items():
        values = np.sort(values)
        for prefix, q in (("median", 0.5), ("p99", 0.99)):
            got = streamed[f"{prefix}_{name}_ms"]
            if len(values) == 0:
                assert math.isnan(got), (name, prefix)
                continue
            pos = q * (len(values) - 1)
            lo, hi = values[int(np.floor(pos))], values[int(np.ceil(pos))]
            assert lo * (1 - 0.006) - 1e-9 <= got <= hi * (1 + 0.006) + 1e-9, (name, prefix, lo, got, hi)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from(["normal", "overlap", "overlap_mlx"]))
def test_streamed_counts_and_means_are_exact(raw, setting):
    raw["server"]["settings"] = [setting]
    scenario = sim.load_scenario(raw)
    full_result = sim.simulate(scenario, setting)
    full = full_result.summary()
    for tables in ("summary", "none"):
        streamed = sim.simulate(scenario, setting, tables=tables).summary()
        for key in SUMMARY_KEYS:
            if key in QUANTILE_KEYS:
                continue
            a, b = full[key], streamed[key]
            if isinstance(a, float) and math.isnan(a):
                assert math.isnan(b), key
            else:
                assert b == pytest.approx(a, rel=1e-9, abs=1e-12), (key, tables)
        assert_quantiles_bracketed(full_result, streamed)


def test_streamed_quantiles_on_a_long_run():
    raw = {"name": "long", "seed": 1,
           "workload": {"arrival": "poisson", "rate_per_s": 40, "num_requests": 600, "warmup_requests": 50,
                        "input_len": {"dist": "lognormal", "mean": 200, "sigma": 0.8},
                        "output_len": {"dist": "lognormal", "mean": 120, "sigma": 0.8}, "finish": "eos"},
           "costs": {"noise": {"gpu_cv": 0.05, "cpu_cv": 0.2}}}
    for setting in ("normal", "overlap"):
        full = sim.simulate(raw, setting)
        streamed = sim.simulate(raw, setting, tables="none")
        a, b = full.summary(), streamed.summary()
        for key in SUMMARY_KEYS:
            if key not in QUANTILE_KEYS:
                assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-12), key
        assert_quantiles_bracketed(full, b)
        assert streamed.steps.empty and streamed.requests.empty
        kept = sim.simulate(raw, setting, tables="summary")
        assert len(kept.requests) == 600 and kept.steps.empty


def test_streamed_failure_counts_match_the_tables():
    from tests.conftest import SCENARIOS

    scenario = sim.load_scenario(SCENARIOS / "mlx-disable-overlap.yaml")
    full = sim.simulate(scenario, "normal").summary()
    streamed = sim.simulate(scenario, "normal", tables="none").summary()
    for key in ("failed", "cut_off", "could_not_connect", "aborted", "completed"):
        assert streamed[key] == full[key], key
    assert full["failed"] == 32


def test_a_window_no_step_started_in_is_idle_in_both_modes():
    """The MLX normal loop at v0.5.22 dies on the warm-up's batch, before any forward starts in
    the measured window: the tables count the window idle throughout (1.0), and so does the
    streamed summary (it gave NaN: found by an invariant fuzz), with no step, gap or sync wait."""
    raw = {"name": "idle", "seed": 0, "workload": {"arrival": "poisson", "rate_per_s": 50, "num_requests": 10,
                                                   "warmup_requests": 2, "input_len": 50, "output_len": 20},
           "server": {"settings": ["normal"], "device": "mlx"}}
    full = sim.simulate(raw, "normal").summary()
    assert full["outcome"] == "server_died" and full["num_steps"] == 0 and full["gpu_idle_fraction"] == 1.0
    for tables in ("summary", "none"):
        streamed = sim.simulate(raw, "normal", tables=tables).summary()
        for key in ("num_steps", "gpu_idle_fraction", "mean_gap_ms", "mean_sync_wait_ms", "mean_decode_batch_size",
                    "overshoot_tokens", "duration_s"):
            a, b = full[key], streamed[key]
            assert (math.isnan(a) and math.isnan(b)) if isinstance(a, float) and math.isnan(a) else a == b, key


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.floats(-1e-3, 10.0), st.sampled_from([0.0, 1e-320, 5e-324, 1e-9, 2.0])),
                          st.integers(1, 50)), min_size=0, max_size=300))
def test_stat_quantiles_equal_ddsketch(samples):
    """The streamed metrics' bucket counting gives DDSketch's quantiles exactly (same keys, same
    rank walk), negative values counting as 0 as before."""
    from ddsketch import DDSketch

    from sim.trace.sketch import RELATIVE_ACCURACY, Stat

    stat, sketch = Stat(), DDSketch(relative_accuracy=RELATIVE_ACCURACY)
    for value, weight in samples:
        stat.add(value, weight)
        sketch.add(max(value, 0.0), weight)
    for q in (0.0, 0.01, 0.5, 0.99, 1.0):
        want, got = sketch.get_quantile_value(q), stat.quantile(q)
        assert math.isnan(got) if want is None else got == want, (q, got, want)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.floats(-1e-3, 1e6), st.sampled_from([0.0, -0.0, 5e-324, 1e-300, 1e300])), max_size=300),
       st.integers(0, 300))
def test_stat_extend_equals_adds(values, cut):
    """``Stat.add_once_each`` of a list (a flush's gaps at once) counts as ``add`` of each value in order: the
    same count, total (the same running sum) and buckets, wherever the values are split. (Gaps
    are finite: NaN ones are left out before they reach the metric.)"""
    from sim.trace.sketch import Stat

    one, many = Stat(), Stat()
    for v in values:
        one.add(v)
    many.add_once_each(values[:cut])
    many.add_once_each(values[cut:])
    one.fold()
    many.fold()
    assert (one.count, one.zero, one.bins) == (many.count, many.zero, many.bins)
    assert one.total == many.total or (math.isnan(one.total) and math.isnan(many.total))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(0.0, 50.0), st.floats(0.0, 50.0), st.integers(1, 300)),
                min_size=1, max_size=40),
       st.floats(0.0, 200.0), st.booleans(), st.booleans())
def test_a_group_recorded_together_equals_one_by_one(group, finish_s, earlier_window, keep_requests):
    """``StreamingRecorder.requests_finished`` (a group finished at one time, SGLang's
    ``_settle_all``) gives what ``request`` of each member in order gives: the counts, the
    window's end (and the pending steps it flushes), each metric's count, total and buckets, the
    requests table; warm-up members left out, single-token outputs without a TPOT."""
    from sim.model.batch import FINISHED, Req
    from sim.trace.streaming import StreamingRecorder

    def recorder() -> StreamingRecorder:
        rec = StreamingRecorder(0, keep_requests)
        rec.arrival(0, 0.0)
        rec.window_end = finish_s - 1.0 if earlier_window else finish_s + 1.0
        for i in range(3):  # steps waiting for the window's end
            rec._record(0.5 * i, 0.5 * i + 0.4, False, 1, 4, 0, 0.01)
        return rec

    def members() -> list[Req]:
        out = []
        for rid, (warmup, arrival, first_after, tokens) in enumerate(group):
            r = Req(rid, arrival, 10, 0, tokens, True, warmup)
            r.status, r.output_done = FINISHED, tokens
            r.first_token_s, r.finish_s = arrival + first_after, finish_s
            out.append(r)
        return out

    one, together = recorder(), recorder()
    for r in members():
        one.request(r)
    together.requests_finished(members())
    assert one.summary() == together.summary() or json_equal(one.summary(), together.summary())
    for name in ("ttft", "e2e", "tpot"):
        a, b = getattr(one, name), getattr(together, name)
        a.fold()
        b.fold()
        assert (a.count, a.zero, a.bins, a.total) == (b.count, b.zero, b.bins, b.total), name
    if keep_requests:
        a, b = one.request_columns(), together.request_columns()
        assert a.names == b.names and all(np.array_equal(a[n], b[n], equal_nan=a[n].dtype.kind == "f")
                                          for n in a.names)


def json_equal(a: dict, b: dict) -> bool:
    """Two summaries equal as JSON text (NaN equal to NaN)."""
    import json

    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
