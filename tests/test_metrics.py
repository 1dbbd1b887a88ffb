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


def test_requests_in_the_server_by_hand():
    from sim.trace.metrics import in_server, probe_times

    arrival, finish = np.array([0.0, 1.0, 2.0, 4.0]), np.array([3.0, 1.5, 5.0, 4.0])
    assert probe_times(np.array([4.0, 0.0, 2.0])) == (2.0, 4.0)  # the arrivals' midpoint and the last, any order
    assert all(np.isnan(probe_times(np.array([]))))
    assert in_server(arrival, finish, 2.0) == 2  # rids 0 and 2 (arrived by 2, not finished); rid 1 left at 1.5
    assert in_server(arrival, finish, 4.0) == 1  # rid 2; rid 3 left at its arrival (failed at once)
    assert in_server(arrival, finish, 3.0) == 1  # rid 0 left at 3: not in the server then


def test_queue_growth_by_the_requests_in_the_server_by_hand():
    from sim.trace.metrics import GROWN_IN_SERVER, GROWN_TTFT, queue_growth, queue_growth_words

    base = {"duration_s": 100.0, "median_ttft_ms": 2000.0, "ttft_growth": 0.0}
    # 160 over 100: beyond 1.25x and beyond 3 x sqrt(100 + 160 + 1) = 48.5 more
    assert queue_growth({**base, "in_server_mid": 100, "in_server_last": 160}) == (GROWN_IN_SERVER, (100, 160))
    assert queue_growth({**base, "in_server_mid": 100, "in_server_last": 145}) is None  # 45 more: within 3 sigmas
    assert queue_growth({**base, "in_server_mid": 1000, "in_server_last": 1200}) is None  # 1.2x: not beyond 1.25x
    assert queue_growth({**base, "in_server_mid": 0, "in_server_last": 10}) == (GROWN_IN_SERVER, (0, 10))  # > 9.95
    assert queue_growth({**base, "in_server_mid": 0, "in_server_last": 9}) is None  # 9 < 3 x sqrt(10)
    assert queue_growth({**base, "in_server_mid": float("nan"), "in_server_last": 9.0}) is None
    assert queue_growth({**base, "in_server_mid": 5.0, "in_server_last": float("inf")}) is None  # not a count
    # a TTFT that grew is said first
    assert queue_growth({**base, "ttft_growth": 0.06, "in_server_mid": 1, "in_server_last": 90})[0] == GROWN_TTFT
    assert queue_growth_words((GROWN_IN_SERVER, (1215, 2294))) == \
        "requests in the server 1,215 at the arrivals' midpoint, 2,294 at the last"
    assert queue_growth_words((GROWN_TTFT, (0.055,))) == "TTFT +55 ms per second of arrivals"


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["duration_s", "median_ttft_ms", "ttft_growth", "in_server_mid",
                                        "in_server_last"]),
                       st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10**6), st.none())))
def test_queue_growth_takes_any_summary(summary):
    from sim.trace.metrics import queue_growth, queue_growth_words

    grown = queue_growth(summary)
    assert grown is None or isinstance(queue_growth_words(grown), str)


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
        assert (full["in_server_mid"], full["in_server_last"]) == (streamed["in_server_mid"], streamed["in_server_last"])
        from sim.trace.metrics import queue_grew

        assert queue_grew(streamed) is grows
        if grows:  # the waits grow by (load / capacity - 1) s a second: 10 / 3.6 - 1 = 1.8
            load = rate / streamed["request_throughput"]
            assert 0.8 * (load - 1) < streamed["ttft_growth"] < 1.2 * (load - 1)
        else:
            assert abs(streamed["ttft_growth"]) < 0.01


def _admitted_open_loop(rate: float) -> dict:
    """An open loop whose server admits every arrival at once (prefill 5 ms, room for 4,096
    running, a KV pool that holds them) and whose decode step grows by 1 ms a request: about 7.8
    requests/s of 128 tokens at most. Beyond that the running batch grows, not the waiting queue."""
    spec = _open_loop(rate)
    spec["server"]["max_running_requests"] = 4096
    spec["costs"]["gpu"] = {"decode": {"base": 0.025, "per_req": 1e-3}, "prefill": {"base": 0.005, "per_token": 1e-6}}
    return spec


@pytest.mark.parametrize("setting", ["overlap", "normal"])
def test_a_running_batch_that_grows_with_ttft_flat_is_a_queue_that_grew(setting):
    import sim
    from sim.trace.metrics import GROWN_IN_SERVER, queue_growth

    for rate, grows in ((4.0, False), (15.0, True)):  # about half the capacity; about twice it
        scenario = sim.load_scenario(_admitted_open_loop(rate))
        streamed = sim.simulate(scenario, setting, tables="none").summary()
        full = sim.simulate(scenario, setting, tables="steps").summary()
        assert (full["in_server_mid"], full["in_server_last"]) == (streamed["in_server_mid"], streamed["in_server_last"])
        assert streamed["ttft_growth"] < 0.05  # TTFT flat: the old test alone saw nothing
        grown = queue_growth(streamed)
        assert (grown is not None) is grows
        if grows:  # the arrivals' second half adds about (15 - 7.8) x 10 s = 72 requests and more
            mid, last = grown[1]
            assert grown[0] == GROWN_IN_SERVER and last - mid > 72


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
    path.write_text(yaml.safe_dump(_admitted_open_loop(15.0)))  # the running batch grew, TTFT flat
    code, out, err = run_cli(["run", path, "--tables", "none", "--no-plots", "--out", tmp_path / "a"])
    assert code == 0, err
    text = " ".join(out.split())
    assert "warning: overlap: the queue grew through the run: requests in the server 147 at the arrivals' midpoint, " \
           "277 at the last (admitted requests wait in a running batch that keeps growing" in text
    assert "the queue grew through the run with overlap (requests in the server 147 at the arrivals' midpoint, 277 " \
           "at the last); normal (requests in the server 148" in text
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["verdict"]["queue_growth"]["overlap"] == {"in_server_mid": 147, "in_server_last": 277}
    path.write_text(yaml.safe_dump(_open_loop(10.0)))
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
