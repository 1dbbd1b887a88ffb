"""Metric definitions against direct computations."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.trace.metrics import weighted_quantile


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(-1e3, 1e3, allow_nan=False), st.integers(0, 20)), min_size=1, max_size=30),
       st.floats(0, 1))
def test_weighted_quantile_matches_repeated_percentile(pairs, q):
    values = np.array([p[0] for p in pairs])
    weights = np.array([p[1] for p in pairs])
    got = weighted_quantile(values, weights, q)
    if weights.sum() == 0:
        assert np.isnan(got)
    else:
        assert got == pytest.approx(np.percentile(np.repeat(values, weights), 100 * q), rel=1e-9, abs=1e-9)


# --- the queue's growth through a run (ttft_growth, queue_grew) -------------------------------
def _sums(ts, ys):
    return (len(ts), sum(ts), sum(t * t for t in ts), sum(ys), sum(t * y for t, y in zip(ts, ys)))


def test_ttft_growth_by_hand():
    from sim.trace.metrics import ttft_growth

    # TTFT 1, 2, 3 s for arrivals at 0, 1, 2 s: a second of TTFT per second of arrivals
    assert ttft_growth(*_sums([0.0, 1.0, 2.0], [1.0, 2.0, 3.0])) == 1.0
    # (n Σty - Σt Σy) / (n Σt² - (Σt)²) = (3 x 4 - 6 x 3) / (3 x 20 - 36) = -6 / 24
    assert ttft_growth(*_sums([0.0, 2.0, 4.0], [2.0, 0.0, 1.0])) == -0.25
    assert ttft_growth(*_sums([0.0, 1.0], [1.0, 2.0])) != ttft_growth(*_sums([0.0, 1.0], [1.0, 2.0]))  # n < 3: NaN
    assert np.isnan(ttft_growth(*_sums([3.0, 3.0, 3.0], [1.0, 2.0, 3.0])))  # every arrival at one time


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(allow_nan=True, allow_infinity=True), st.floats(allow_nan=True,
                                                                                  allow_infinity=True)),
                max_size=8))
def test_ttft_growth_is_a_float_for_any_sums(pairs):
    from sim.trace.metrics import ttft_growth

    ts, ys = [p[0] for p in pairs], [p[1] for p in pairs]
    assert isinstance(ttft_growth(*_sums(ts, ys)), float)


def test_queue_grew_by_hand():
    from sim.trace.metrics import GROWTH_WARN, queue_grew

    base = {"duration_s": 100.0, "median_ttft_ms": 2000.0}
    assert queue_grew({**base, "ttft_growth": 0.06})  # 6 s over the run, beyond the 2 s median
    assert not queue_grew({**base, "ttft_growth": GROWTH_WARN})  # at the threshold: not beyond it
    assert not queue_grew({**base, "ttft_growth": 0.06, "median_ttft_ms": 7000.0})  # a rise under the median
    assert not queue_grew({**base, "ttft_growth": float("nan")}) and not queue_grew({})


def _open_loop(rate: float, **workload) -> dict:
    return {"name": "grow", "seed": 0,
            "workload": {"arrival": "poisson", "rate_per_s": rate, "num_requests": 300, "warmup_requests": 0,
                         "input_len": 512, "output_len": 128, "finish": "length", **workload},
            "server": {"device": "cuda", "settings": ["overlap", "normal"], "max_running_requests": 16},
            "costs": {"gpu": {"decode": {"base": 0.025, "per_req": 1e-4, "per_ctx_token": 1e-8},
                              "prefill": {"base": 0.005, "per_token": 1.1e-4}}}}


@pytest.mark.parametrize("setting", ["overlap", "normal"])
def test_an_overloaded_open_loop_grows_by_its_load_over_its_capacity(setting):
    import sim

    # at most 16 running and about 27 ms a step of 16: about 3.6 requests/s (the served rate)
    for rate, grows in ((2.0, False), (10.0, True)):
        scenario = sim.load_scenario(_open_loop(rate))
        streamed = sim.simulate(scenario, setting, tables="none").summary()
        full = sim.simulate(scenario, setting, tables="steps").summary()
        assert full["ttft_growth"] == pytest.approx(streamed["ttft_growth"], rel=1e-9, abs=1e-12)
        from sim.trace.metrics import queue_grew

        assert queue_grew(streamed) is grows
        if grows:  # the waits grow by (load / capacity - 1) s a second: 10 / 3.6 - 1 = 1.8
            load = rate / streamed["request_throughput"]
            assert 0.8 * (load - 1) < streamed["ttft_growth"] < 1.2 * (load - 1)
        else:
            assert abs(streamed["ttft_growth"]) < 0.01


def test_the_run_warns_and_the_verdict_says_where_an_open_loops_queue_grew(run_cli, tmp_path):
    import yaml

    path = tmp_path / "grow.yaml"
    path.write_text(yaml.safe_dump(_open_loop(10.0)))
    code, out, err = run_cli(["run", path, "--tables", "none", "--no-plots", "--out", tmp_path / "r"])
    assert code == 0, err
    text = " ".join(out.split())
    assert "warning: overlap: the queue grew through the run: TTFT rose" in text
    assert "warning: normal: the queue grew through the run" in text
    assert "the queue grew through the run with overlap and normal (TTFT +" in text
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert set(summary["verdict"]["queue_growth"]) == {"overlap", "normal"}
    assert sum("the queue grew through the run" in w for w in summary["warnings"]) == 2  # as under the table
    code, out, err = run_cli(["run", path, "--tables", "none", "--json", "--out", tmp_path / "j"])
    assert code == 0, err
    assert sum("the queue grew through the run" in w for w in json.loads(out)["warnings"]) == 2
    closed = _open_loop(10.0, arrival="closed_loop", concurrency=4)
    del closed["workload"]["rate_per_s"]
    path.write_text(yaml.safe_dump(closed))
    code, out, err = run_cli(["run", path, "--tables", "none", "--no-plots", "--out", tmp_path / "c"])
    assert code == 0, err
    assert "queue grew" not in out  # a closed loop's arrivals wait for its answers
    import math

    import sim

    for tables in ("none", "steps"):  # not summed there, in either mode
        assert math.isnan(sim.simulate(sim.load_scenario(closed), "overlap", tables=tables).summary()["ttft_growth"])
