"""The loops run on their own clock between SimPy yields (sim.engines.sglang.phases.Phases.must_yield);
yielding after every iteration must give exactly the same run."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings

import sim
from sim.engines.sglang.phases import Phases
from tests.conftest import SCENARIOS
from tests.test_invariants import scenarios


def run_both(monkeypatch, scenario, setting):
    lazy = sim.simulate(scenario, setting)
    with monkeypatch.context() as m:
        m.setattr(Phases, "must_yield", lambda self, until: True)
        eager = sim.simulate(scenario, setting)
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
