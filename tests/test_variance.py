"""Repeat statistics: intervals of ratios, power, spread; run-level noise in the simulator."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import sim
from sim.whatif.sweeps import sweep
from sim.whatif.variance import log_ratio_interval, log_sigma, paired_ratios, ratio_ci, runs_needed, single_run_tail, spread

NOISY = {
    "name": "noisy", "seed": 3,
    "workload": {"concurrency": 1, "num_requests": 4, "input_len": 8, "cached_len": 0,
                 "output_len": {"dist": "uniform", "low": 5, "high": 30}},
    "costs": {"gpu": {"decode": {"base": 0.004}, "prefill": {"base": 0.002}, "overlap_residue": 0.0},
              "cpu": {"recv": {"base": 1e-4}, "schedule": {"base": 2e-4}, "launch": {"base": 3e-4},
                      "process": {"base": 4e-4}},
              "noise": {"gpu_cv": 0.2, "cpu_cv": 0.2}},
}


def test_t_interval_by_hand():
    ratios = [1.1, 1.2, 1.0]
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = 4.302652729749464 * sd / math.sqrt(3)  # t(0.975, df=2)
    centre, lo, hi = log_ratio_interval(ratios)
    assert centre == pytest.approx(math.exp(mean))
    assert lo == pytest.approx(math.exp(mean - half)) and hi == pytest.approx(math.exp(mean + half))


def test_interval_edge_cases():
    assert math.isnan(log_ratio_interval([1.2])[1])
    assert log_ratio_interval([1.2])[0] == pytest.approx(1.2)
    assert all(math.isnan(v) for v in log_ratio_interval([]))
    with pytest.raises(ValueError):
        log_ratio_interval([1.0, 1.1], method="magic")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.5, 2.0), min_size=3, max_size=12))
def test_intervals_contain_the_geometric_mean(ratios):
    for method in ("t", "bootstrap"):
        centre, lo, hi = log_ratio_interval(ratios, method=method)
        assert lo <= centre * (1 + 1e-9) and centre <= hi * (1 + 1e-9)


def test_t_interval_covers_at_its_level():
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(400):
        ratios = np.exp(rng.normal(math.log(1.1), 0.1, size=5))
        _, lo, hi = log_ratio_interval(ratios)
        hits += lo <= 1.1 <= hi
    assert 0.91 <= hits / 400 <= 0.98


def test_single_run_tail():
    cv = 0.1
    sd = math.sqrt(2) * log_sigma(cv)
    assert single_run_tail(cv, 1.0, math.exp(1.959964 * sd)) == pytest.approx(0.05, abs=1e-5)
    assert single_run_tail(cv, 1.1, 1.1) == pytest.approx(1.0)
    assert single_run_tail(0.01, 1.1, 1 / 1.14) < 1e-6


def test_runs_needed_has_the_power_it_claims():
    n = runs_needed(0.1, 1.1)
    # the normal approximation 2 (z_a + z_b)^2 sigma^2 / delta^2 is a lower bound
    approx = 2 * (1.959964 + 0.841621) ** 2 * log_sigma(0.1) ** 2 / math.log(1.1) ** 2
    assert approx <= n <= approx + 3
    rng = np.random.default_rng(2)
    sigma = log_sigma(0.1)

    def power(k):
        a = rng.normal(math.log(1.1), sigma, size=(3000, k))
        b = rng.normal(0.0, sigma, size=(3000, k))
        return (stats.ttest_ind(a, b, axis=1).pvalue < 0.05).mean()
    assert power(n) >= 0.77 and power(n - 3) < 0.8
    assert runs_needed(0.02, 1.1) < runs_needed(0.05, 1.1) < runs_needed(0.1, 1.1)
    assert runs_needed(0.0, 1.1) == 1
    with pytest.raises(ValueError):
        runs_needed(0.1, 1.0)


def test_spread_and_ratio_ci_of_a_sweep():
    table = sweep(NOISY, {"workload.concurrency": [1, 2]}, repeats=4, workers=1)
    s = spread(table, ["output_throughput"])
    assert list(s["n"]) == [4, 4, 4, 4]
    g = table[(table["point"] == 0) & (table["setting"] == "overlap")]["output_throughput"]
    row = s[(s["point"] == 0) & (s["setting"] == "overlap")].iloc[0]
    assert row["output_throughput_mean"] == pytest.approx(g.mean())
    assert row["output_throughput_std"] == pytest.approx(g.std(ddof=1))
    assert row["output_throughput_cv"] == pytest.approx(g.std(ddof=1) / g.mean())
    pr = paired_ratios(table)
    assert len(pr) == 8
    ci = ratio_ci(table)
    assert list(ci["n"]) == [4, 4]
    first = pr[pr["point"] == 0]["ratio"]
    assert ci.iloc[0]["ratio"] == pytest.approx(math.exp(np.log(first).mean()))
    assert (ci["ci_low"] <= ci["ratio"]).all() and (ci["ratio"] <= ci["ci_high"]).all()
    assert list(s["failed_runs"]) == [0, 0, 0, 0] and list(ci["failed_settings"]) == ["", ""]  # every run served its load


def test_failed_runs_are_counted_and_named_where_the_ratio_is_missing():
    """A hand-made table, two points of two repeats: at point 0 normal's server died in one repeat
    (outcome), at point 1 overlap served no request (completed 0) in one, and the gap is 0 under
    normal at both. spread counts the failed runs per point and setting; ratio_ci names the
    failed setting where it gives no ratio, and leaves ``failed_settings`` empty where a ratio is missing
    only because the metric is 0 (the mean gap)."""
    import pandas as pd

    rows = []
    for point in (0, 1):
        for repeat in (0, 1):
            for setting in ("overlap", "normal"):
                died = point == 0 and repeat == 1 and setting == "normal"
                none = point == 1 and repeat == 0 and setting == "overlap"
                rows.append({"point": point, "workload.concurrency": 4 * (point + 1), "setting": setting,
                             "repeat": repeat, "seed": repeat, "outcome": "server_died" if died else "ok",
                             "completed": 0 if none else 10, "output_throughput": 110.0 if setting == "overlap" else 100.0,
                             "mean_gap_ms": 0.5 if setting == "overlap" else 0.0})
    table = pd.DataFrame(rows)
    s = spread(table, ["output_throughput"]).set_index(["point", "setting"])["failed_runs"]
    assert s.to_dict() == {(0, "overlap"): 0, (0, "normal"): 1, (1, "overlap"): 1, (1, "normal"): 0}
    ci = ratio_ci(table).set_index("point")
    assert ci["failed_settings"].to_dict() == {0: "normal", 1: "overlap"} and ci["ratio"].isna().all()
    gap = ratio_ci(table, "mean_gap_ms")
    assert gap["ratio"].isna().all() and list(gap["failed_settings"]) == ["normal", "overlap"]
    gap_served = ratio_ci(table.drop(columns=["outcome"]).assign(completed=10), "mean_gap_ms")
    assert gap_served["ratio"].isna().all() and list(gap_served["failed_settings"]) == ["", ""]  # no ratio, none failed


def test_run_level_noise_is_per_run_and_per_setting():
    scen = sim.load_scenario(NOISY)
    noisy = scen.with_overrides(["costs.noise.run_gpu_cv=0.2"])
    a = sim.simulate(noisy, "normal").summary()
    b = sim.simulate(noisy, "normal").summary()
    assert a == b  # reproducible from the seed
    plain = sim.simulate(scen, "normal").summary()
    assert a["output_throughput"] != plain["output_throughput"]
    # explicit zero leaves the run exactly as without the field
    zero = sim.simulate(scen.with_overrides(["costs.noise.run_gpu_cv=0"]), "normal").summary()
    assert zero == plain
    # across seeds the whole run's speed varies by about the given CV
    table = sweep(noisy, {}, repeats=12, workers=1)
    cv = spread(table, ["median_itl_ms"])["median_itl_ms_cv"]
    assert (cv > 0.08).all() and (cv < 0.4).all()
    # per-step noise of the same size averages out over a run
    per_step = sweep(scen, {}, repeats=12, workers=1)
    assert (spread(per_step, ["output_throughput"])["output_throughput_cv"] < 0.05).all()


def test_a_ratio_of_zero_is_left_out_without_a_warning():
    """A metric at 0 under one setting (no GPU gap) gives ratios of 0: they have no log and are
    left out of the interval, with no numpy warning on the user's terminal."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert log_ratio_interval([0.0, 1.1, 1.2]) == log_ratio_interval([1.1, 1.2])
        assert all(v != v for v in log_ratio_interval([0.0, 0.0]))  # NaN: nothing to average
