"""The API server in front of vLLM's engine core (sim.engines.vllm.frontend): closed forms of the
FIFO server, a request's latency through it, and invariants."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sim
from sim.engines.vllm.frontend import ApiServer
from tests.vllm_helpers import CONSTANT, vllm_scenario, write_profile


class Costs:
    def __init__(self, c_in: float, c_out: float):
        self.c = {"in": c_in, "out": c_out}

    def frontend_s(self, kind: str, num_reqs: int) -> float:
        return self.c[kind] * (num_reqs if kind == "out" else 1)


def test_an_idle_api_server_adds_its_service_time():
    api = ApiServer(Costs(0.005, 0.001))
    assert api.ingress(1.0) == pytest.approx(1.005)
    assert api.egress(2.0, 3) == pytest.approx(2.003)


def test_a_request_waits_behind_a_steps_outputs_and_the_other_way_round():
    api = ApiServer(Costs(0.005, 0.001))
    assert api.egress(1.0, 4) == pytest.approx(1.004)  # busy until 1.004
    assert api.ingress(1.001) == pytest.approx(1.009)  # waits 3 ms, then 5 ms
    assert api.egress(1.002, 2) == pytest.approx(1.011)  # behind the request


def test_a_front_end_of_no_cost_changes_no_time():
    """A profile without the front-end curves: every job passes at once, whatever the call order."""
    api = ApiServer(Costs(0.0, 0.0))
    assert api.egress(0.5, 8) == 0.5 and api.ingress(0.25) == 0.25


times = st.lists(st.floats(min_value=0, max_value=1e4, allow_nan=False), min_size=1, max_size=30)


@given(times, st.floats(min_value=1e-9, max_value=1.0), st.floats(min_value=1e-9, max_value=1.0))
def test_jobs_end_no_earlier_than_they_arrive_and_in_order(ts, c_in, c_out):
    api = ApiServer(Costs(c_in, c_out))
    ends = []
    for i, t in enumerate(sorted(ts)):
        end = api.ingress(t) if i % 2 else api.egress(t, 2)
        assert end >= t
        ends.append(end)
    assert ends == sorted(ends)


@pytest.mark.parametrize("setting", ["sync", "async"])
def test_one_request_pays_the_front_end_once_in_and_once_out(tmp_path, setting):
    """One request alone: TTFT grows by exactly ingress + egress; its later tokens each pay the
    egress once, after the previous token's (no queue: the egress is shorter than a step), so
    TPOT is unchanged."""
    c_in, c_out = 0.006, 0.002
    assert c_out < CONSTANT["forward"]
    base = sim.simulate(vllm_scenario(profile=write_profile(tmp_path, "a.json"), c=1), setting).summary()
    front = sim.simulate(vllm_scenario(profile=write_profile(tmp_path, "b.json", frontend={"in": c_in, "out": c_out}),
                                       c=1), setting).summary()
    assert front["median_ttft_ms"] == pytest.approx(base["median_ttft_ms"] + (c_in + c_out) * 1e3, rel=1e-9)
    assert front["median_tpot_ms"] == pytest.approx(base["median_tpot_ms"], rel=1e-9)


def test_the_next_request_of_a_closed_loop_client_is_sent_after_the_last_token_arrives(tmp_path):
    """A client sends its next request when it has the last token: one client, two requests,
    the second's engine arrival is ingress + egress later than without a front end."""
    c_in, c_out = 0.006, 0.002
    base = sim.simulate(vllm_scenario(profile=write_profile(tmp_path, "a.json"), c=1, n=2), "sync")
    front = sim.simulate(vllm_scenario(profile=write_profile(tmp_path, "b.json", frontend={"in": c_in, "out": c_out}),
                                       c=1, n=2), "sync")
    first = [r.steps["schedule_start"].iloc[0] for r in (base, front)]
    assert first[1] - first[0] == pytest.approx(c_in, rel=1e-9)
    second = [r.steps["schedule_start"][r.steps["kind"] != "decode"].iloc[-1] for r in (base, front)]
    assert second[1] - second[0] == pytest.approx(2 * c_in + c_out, rel=1e-6)
