"""The share of the scheduler's CPU time hidden behind a forward (sim.trace.metrics.hidden_cpu_share):
closed forms, invariants, and the vLLM loops at both ends."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sim
from sim.trace.metrics import hidden_cpu_share
from tests.vllm_helpers import vllm_scenario, write_profile

COLS = ("schedule_start", "schedule_end", "forward_start", "forward_end", "process_start", "process_end")


def frame(*rows) -> pd.DataFrame:
    return pd.DataFrame(list(rows), columns=list(COLS))


def test_a_synchronous_step_hides_nothing():
    assert hidden_cpu_share(frame((0.0, 0.5, 1.0, 2.0, 2.0, 2.5))) == 0.0


def test_phases_inside_and_half_inside_a_forward():
    # schedule 0.5 s wholly inside the forward 0..2, process 1.5..2.5 half inside: 1.0 of 1.5 s
    steps = frame((0.5, 1.0, 0.0, 2.0, 1.5, 2.5))
    assert hidden_cpu_share(steps) == pytest.approx(1.0 / 1.5)


def test_a_phase_counts_the_forward_of_another_step():
    # step 2's schedule runs under step 1's forward (overlap scheduling)
    steps = frame((0.0, 0.1, 0.1, 1.1, 1.1, 1.2), (0.5, 0.7, 1.2, 2.2, 2.2, 2.3))
    assert hidden_cpu_share(steps) == pytest.approx(0.2 / (0.1 + 0.1 + 0.2 + 0.1))


def test_the_window_keeps_phases_that_start_in_it():
    steps = frame((0.5, 1.0, 0.0, 2.0, 1.5, 2.5))
    assert hidden_cpu_share(steps, start=1.0) == pytest.approx(0.5)


def test_no_phase_is_nan():
    assert math.isnan(hidden_cpu_share(frame((1.0, 1.0, 0.0, 2.0, math.nan, math.nan))))


t = st.one_of(st.floats(min_value=-1e3, max_value=1e3), st.sampled_from([math.nan, math.inf, -math.inf]))


@given(st.lists(st.tuples(t, t, t, t, t, t), min_size=1, max_size=12))
def test_the_share_is_a_fraction_or_nan(rows):
    share = hidden_cpu_share(frame(*rows))
    assert math.isnan(share) or 0.0 <= share <= 1.0 + 1e-12


@pytest.mark.parametrize("setting, low, high", [("sync", 0.0, 0.0), ("async", 0.3, 1.0)])
def test_vllm_sync_hides_nothing_and_async_much(tmp_path, setting, low, high):
    """The test profile: schedule 0.2 ms and update 0.3 ms against a 4 ms forward; under async
    scheduling the update of k runs while the worker prepares k+1 (not a forward), so about
    half the engine core's time is under a forward."""
    res = sim.simulate(vllm_scenario(profile=write_profile(tmp_path), c=4, n=8), setting)
    assert low <= hidden_cpu_share(res.steps) <= high
