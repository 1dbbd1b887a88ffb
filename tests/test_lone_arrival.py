"""One request arriving at an empty waiting queue, admitted whole (``admit_lone_arrival``, the
policy's short way through ``recv_requests`` and ``get_next_batch_to_run``): every output equal
to the general pass's, byte for byte (the pass turned off by ``LONE_ARRIVAL``), on hand cases, the
leap's generated family and issue 31's open loop; and taken where it should be."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import sim
from sim.engines.sglang.policy import scheduler as policy
from tests.test_leap import SGLANG_SETTINGS, scenarios
from tests.test_leap import outputs as leap_outputs

ROOT = Path(__file__).resolve().parents[1]


def outputs(scenario, setting: str, tables: str, lone: bool, monkeypatch) -> dict:
    """What a run gives a user (``tests/test_leap.py``'s outputs, the leap on) with the short way
    on (``lone``) or off."""
    monkeypatch.setattr(policy, "LONE_ARRIVAL", lone)
    return leap_outputs(scenario, setting, tables, True)


def assert_same(scenario, setting: str, monkeypatch, tables: str = "steps") -> None:
    short, general = (outputs(scenario, setting, tables, lone, monkeypatch) for lone in (True, False))
    for key in general:
        assert short[key] == general[key], f"{setting} tables={tables}: {key} differs with admit_lone_arrival"


def taken(scenario, setting: str, monkeypatch) -> tuple[int, int]:
    """(times the scheduler asked, times the short way admitted a request) in one run."""
    counts = [0, 0]
    original = policy.Scheduler.admit_lone_arrival
    monkeypatch.setattr(policy, "LONE_ARRIVAL", True)

    def counted(self, now):
        batch = original(self, now)
        counts[0] += 1
        counts[1] += batch is not None
        return batch

    monkeypatch.setattr(policy.Scheduler, "admit_lone_arrival", counted)
    sim.simulate(scenario, setting, tables="none")
    monkeypatch.setattr(policy.Scheduler, "admit_lone_arrival", original)
    return counts[0], counts[1]


def open_loop(**server) -> dict:
    return {"name": "lone", "seed": 3,
            "workload": {"arrival": "poisson", "rate_per_s": 20.0, "num_requests": 60, "warmup_requests": 4,
                         "input_len": 300, "cached_len": 100, "output_len": 24, "finish": "length"},
            "server": {"settings": ["overlap", "normal"], "kv_pool_tokens": 200_000, **server}}


@pytest.mark.parametrize("setting", ["overlap", "normal", "overlap_mlx", "thread_overlap"])
def test_an_open_loop_below_capacity_admits_its_arrivals_the_short_way(setting, monkeypatch):
    """``normal``, ``overlap`` and the thread loop receive and schedule together
    (``Phases.recv_and_schedule``), the MLX chain apart: it never takes the short way."""
    scenario = sim.load_scenario(open_loop())
    asked, admitted = taken(scenario, setting, monkeypatch)
    if setting != "overlap_mlx":
        assert admitted >= 30 and asked >= admitted
    else:
        assert admitted == 0
    assert_same(scenario, setting, monkeypatch)


def test_an_arrival_right_after_a_prefill_merges_it_first(monkeypatch):
    """Arrivals every few steps at 200 requests/s: one often comes while the last prefill's
    request waits to be merged into the running batch (``get_next_batch_to_run`` merges it first,
    whatever it then schedules); the short way merges it too, and the outputs are the same."""
    raw = open_loop()
    raw["workload"].update(rate_per_s=200.0, output_len=60)
    scenario = sim.load_scenario(raw)
    merged = [0]
    original = policy.Scheduler.admit_lone_arrival

    def counted(self, now):
        pending = bool(self.pending_merge)
        batch = original(self, now)
        merged[0] += pending and batch is not None
        return batch

    for setting in ("overlap", "normal"):
        merged[0] = 0
        monkeypatch.setattr(policy, "LONE_ARRIVAL", True)
        monkeypatch.setattr(policy.Scheduler, "admit_lone_arrival", counted)
        sim.simulate(scenario, setting, tables="none")
        monkeypatch.setattr(policy.Scheduler, "admit_lone_arrival", original)
        assert merged[0] >= 5
        assert_same(scenario, setting, monkeypatch)


def test_where_anything_else_could_happen_the_general_pass_runs(monkeypatch):
    """A chunk budget below the prompt (300 tokens in chunks of 64): no arrival is admitted the
    short way. A pool of 6,000 tokens, too small for the reserve's bound (up to 4,096 tokens for
    each running request) once a request runs: only arrivals at an empty server are. The outputs
    are the general pass's either way."""
    chunked = sim.load_scenario(open_loop(chunked_prefill_size=64))
    for setting in ("overlap", "normal"):
        assert taken(chunked, setting, monkeypatch)[1] == 0
        assert_same(chunked, setting, monkeypatch)
    small = sim.load_scenario(open_loop(kv_pool_tokens=6_000))
    asked, admitted = taken(small, "overlap", monkeypatch)
    assert 0 < admitted < asked
    assert_same(small, "overlap", monkeypatch)


def test_noise_on_the_host_keeps_the_general_pass(monkeypatch):
    """A jittered host draws its recv and schedule factors in the general pass's order: the short
    way is not asked."""
    raw = open_loop()
    raw["costs"] = {"noise": {"gpu_cv": 0.1, "cpu_cv": 0.2}}
    scenario = sim.load_scenario(raw)
    assert taken(scenario, "overlap", monkeypatch)[1] == 0
    assert_same(scenario, "overlap", monkeypatch, tables="none")


def test_issue_31s_open_loop_is_unchanged(monkeypatch):
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import sim_speed

    scenario = sim_speed.leap_workload("open", 400)
    for setting in ("overlap", "normal"):
        asked, admitted = taken(scenario, setting, monkeypatch)
        assert admitted > 0.6 * 400
        assert_same(scenario, setting, monkeypatch, tables="none")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(raw=scenarios(), setting=st.sampled_from(SGLANG_SETTINGS), tables=st.sampled_from(["steps", "none"]))
def test_generated_runs_are_unchanged(raw, setting, tables, monkeypatch):
    assert_same(sim.load_scenario(raw), setting, monkeypatch, tables)
