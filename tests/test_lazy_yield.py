"""The loops run on their own clock between SimPy yields (they yield only once another process may
act: ``Phases.horizon``, the next open-loop arrival); yielding after every iteration must give
exactly the same run, with the open loop's arrivals pulled by the loop
(sim.model.workload.PulledArrivals, where the leap runs) and from their SimPy process (``leap=False``)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings

import sim
from sim.engines.sglang.phases import Phases
from tests.conftest import SCENARIOS
from tests.test_invariants import scenarios


def run_both(monkeypatch, scenario, setting):
    """(the run as it goes, the run yielding after every iteration); the second with the leap on
    (pulled arrivals; its runs then stop at every step) and off (SimPy's arrival process) must agree."""
    lazy = sim.simulate(scenario, setting)
    with monkeypatch.context() as m:  # every iteration ends past the horizon
        m.setattr(Phases, "horizon", property(lambda self: -math.inf, lambda self, value: None), raising=False)
        eager = sim.simulate(scenario, setting)
        eager_simpy = sim.simulate(scenario, setting, leap=False)
    assert_same(eager, eager_simpy)
    return lazy, eager


def assert_same(lazy, eager):
    pd.testing.assert_frame_equal(lazy.steps, eager.steps, check_exact=False, rtol=1e-12, atol=1e-12)
    pd.testing.assert_frame_equal(lazy.requests, eager.requests, check_exact=False, rtol=1e-12, atol=1e-12)
    pd.testing.assert_frame_equal(lazy.itl, eager.itl, check_exact=False, rtol=1e-12, atol=1e-12)
    assert lazy.outcome["status"] == eager.outcome["status"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(scenarios())
def test_lazy_yield_changes_nothing(monkeypatch, raw):
    scenario = sim.load_scenario(raw)
    for setting in ("normal", "overlap", "overlap_mlx"):
        assert_same(*run_both(monkeypatch, scenario, setting))


@pytest.mark.parametrize("name,setting", [("kv-pressure.yaml", "overlap"), ("mlx-disable-overlap.yaml", "normal"),
                                          ("quickstart.yaml", "overlap")])
def test_lazy_yield_on_shipped_scenarios(monkeypatch, name, setting):
    scenario = sim.load_scenario(SCENARIOS / name, ["server.retraction=naive"] if name == "kv-pressure.yaml" else [])
    assert_same(*run_both(monkeypatch, scenario, setting))
