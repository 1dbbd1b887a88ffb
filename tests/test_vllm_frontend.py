"""The API server in front of vLLM's engine core (sim.engines.vllm.frontend): closed forms of the
server, a request's latency through it, and invariants."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.engines.vllm.frontend import ApiServer
from tests.vllm_helpers import CONSTANT, vllm_scenario, write_profile


class Costs:
    """Constant front-end costs: ``L`` latency, ``w`` work per request, ``out`` per step's request;
    ``edge``: the largest burst measured (None: no data, nothing beyond it)."""

    def __init__(self, latency_s: float, work_s: float, out_s: float = 0.0, edge: int | None = None):
        self.line, self.out, self.edge = (latency_s, work_s), out_s, edge

    def frontend_in_line(self):
        return self.line

    def frontend_in_edge(self):
        return self.edge

    def frontend_s(self, kind: str, num_reqs: int) -> float:
        assert kind in ("out", "work")  # no frontend_work curve: the whole latency is the work
        return self.out * num_reqs


def serve(sends: list[float], latency_s: float, work_s: float) -> dict[int, float]:
    """Request id -> when it reached the engine core, for requests sent at ``sends``."""
    env = simpy.Environment()
    got: dict[int, float] = {}
    api = ApiServer(env, Costs(latency_s, work_s), lambda rid, at, sent: got.setdefault(rid, at))
    for rid, t in enumerate(sends):
        api.ingress(rid, t)
    env.run()
    return got


def test_a_lone_request_takes_the_latency_and_its_work():
    assert serve([1.0], 0.004, 0.002) == {0: pytest.approx(1.006)}


def test_a_burst_reaches_the_engine_one_at_a_time():
    """n requests sent together share the event loop, then leave one at a time (the renderer's
    one tokenizer thread): the first L + n w after the send, each next one w later."""
    L, w = 0.004, 0.002
    got = serve([0.0] * 8, L, w)
    assert [got[r] for r in range(8)] == pytest.approx([L + 8 * w + i * w for i in range(8)])


def test_a_request_long_after_the_last_leaves_at_once():
    """The one-at-a-time spacing applies only to requests leaving within w of each other."""
    L, w = 0.004, 0.002
    got = serve([0.0, 1.0], L, w)
    assert got == {0: pytest.approx(L + w), 1: pytest.approx(1.0 + L + w)}


def test_a_later_request_shares_what_is_left():
    """r0 alone for w/2, then both at half speed: r0 done at L + 1.5 w; r1's share is done at
    L + 2 w, but it leaves w after r0, at L + 2.5 w."""
    L, w = 0.004, 0.002
    got = serve([0.0, w / 2], L, w)
    assert got[0] == pytest.approx(L + 1.5 * w) and got[1] == pytest.approx(L + 2.5 * w)


def test_a_front_end_of_no_cost_changes_no_time():
    """A profile without the front-end curves: a request reaches the engine when sent, a token
    the client when the update ends."""
    assert serve([0.5, 0.25], 0.0, 0.0) == {0: 0.5, 1: 0.25}
    api = ApiServer(simpy.Environment(), Costs(0.0, 0.0), lambda *a: None)
    assert api.egress(0.5, 8) == 0.5


def test_step_outputs_are_handled_one_after_the_other():
    api = ApiServer(simpy.Environment(), Costs(0.0, 0.0, out_s=0.001), lambda *a: None)
    assert api.egress(1.0, 4) == pytest.approx(1.004)
    assert api.egress(1.002, 2) == pytest.approx(1.006)  # waits for the first
    assert api.egress(2.0, 1) == pytest.approx(2.001)


sends = st.lists(st.floats(min_value=0, max_value=1.0, allow_nan=False), min_size=1, max_size=25)


@given(sends, st.floats(min_value=0, max_value=0.01), st.floats(min_value=1e-6, max_value=0.01))
def test_every_request_arrives_within_its_share_and_none_is_lost(ts, latency_s, work_s):
    """Each request reaches the engine no sooner than L + w after its send and no later than
    L + (2 x requests in the loop with it - 1) w (its share, then one w behind each other
    leaving); all of them arrive, and no two reach it less than w apart."""
    got = serve(ts, latency_s, work_s)
    assert sorted(got) == list(range(len(ts)))
    for rid, t in enumerate(ts):
        assert got[rid] >= t + latency_s + work_s - 1e-9
        assert got[rid] <= t + latency_s + (2 * len(ts) - 1) * work_s + 1e-9
    times = sorted(got.values())
    assert all(b - a >= work_s * (1 - 1e-9) - 1e-12 for a, b in zip(times, times[1:]))


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


def test_a_step_beyond_the_output_curves_data_is_priced_as_the_largest_measured_and_counted(tmp_path):
    """frontend_out measured at 1, 2 and 4 requests (1, 2 and 3 ms; the edge segment rises 0.5 ms
    a request): a step of 256 requests pays 3 ms, not 129 ms by the edge segment, and a step of 8
    counts as priced beyond the data at (8 + 1) / (4 + 1) = 1.8 its range; 4 requests and fewer
    count as inside it."""
    import json

    from sim.engines.vllm.costs import VllmProfileCosts
    from sim.engines.vllm.profile import VLLM_CURVES
    from sim.model.profile import validate_profile
    from tests.vllm_helpers import make_profile

    profile = make_profile(frontend={"in": 0.006})
    profile["curves"]["vllm.frontend_out"] = {"axes": ["num_reqs"], "grid": [[1, 2, 4]], "values_s": [1e-3, 2e-3, 3e-3]}
    validate_profile(json.loads(json.dumps(profile)), "<test>", VLLM_CURVES)
    costs = VllmProfileCosts(profile, "sync")
    assert [costs.frontend_s("out", n) for n in (1, 2, 3, 4)] == pytest.approx([1e-3, 2e-3, 2.5e-3, 3e-3])
    assert costs.frontend_s("out", 8) == costs.frontend_s("out", 256) == pytest.approx(3e-3)
    assert costs.frontend_s("in", 1) == pytest.approx(0.006)  # (a burst's curve: not held)
    costs.forward_s(1, 4, 4, 400)
    assert costs.reach.outcome() == {"extrapolated_steps": 0, "far_steps": 0, "max_extrapolation": 1.0,
                                     "bounded_steps": 0, "max_bounded_share": 0.0}
    costs.forward_s(1, 8, 8, 800)
    costs.forward_s(1, 256, 256, 25600)
    out = costs.reach.outcome()
    assert out["extrapolated_steps"] == 2 and out["far_steps"] == 1
    assert out["max_extrapolation"] == pytest.approx(257 / 5)


def test_the_api_servers_work_on_a_step_is_summed_over_its_slices_of_128():
    """frontend_work measured to 128 requests (1 ms + 10 us a request): a step of 256 is two calls
    of 128 (AsyncLLM.output_handler's slices), 200 one of 128 and one of 72, by hand; such steps
    are inside the data for it (the latency curve, measured to 256, too)."""
    from sim.engines.vllm.costs import OUTPUT_CHUNK, VllmProfileCosts
    from tests.vllm_helpers import make_profile

    assert OUTPUT_CHUNK == 128
    profile = make_profile()
    grid = [1, 2, 4, 8, 16, 32, 64, 128]
    profile["curves"]["vllm.frontend_work"] = {"axes": ["num_reqs"], "grid": [grid],
                                               "values_s": [1e-3 + 1e-5 * n for n in grid]}
    profile["curves"]["vllm.frontend_out"] = {"axes": ["num_reqs"], "grid": [[1, 256]], "values_s": [0.01, 0.02]}
    costs = VllmProfileCosts(profile, "sync")
    assert costs.frontend_s("work", 100) == pytest.approx(1e-3 + 1e-3)
    assert costs.frontend_s("work", 128) == pytest.approx(1e-3 + 1.28e-3)
    assert costs.frontend_s("work", 256) == pytest.approx(2 * (1e-3 + 1.28e-3))
    assert costs.frontend_s("work", 200) == pytest.approx((1e-3 + 1.28e-3) + (1e-3 + 0.72e-3))
    assert costs.frontend_s("work", 1000) == pytest.approx(7 * (1e-3 + 1.28e-3) + (1e-3 + 1.04e-3))
    costs.forward_s(1, 256, 256, 25600)
    assert costs.reach.outcome()["extrapolated_steps"] == 0
    costs.forward_s(1, 300, 300, 30000)  # (beyond frontend_out's 256)
    assert costs.reach.outcome()["extrapolated_steps"] == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1e-5, 1e-2), min_size=2, max_size=5), st.integers(1, 4096))
def test_the_held_output_cost_never_exceeds_the_largest_measured_point(values, num_reqs):
    from sim.engines.vllm.costs import VllmProfileCosts
    from tests.vllm_helpers import make_profile

    profile = make_profile()
    grid = [2 ** i for i in range(len(values))]
    profile["curves"]["vllm.frontend_out"] = {"axes": ["num_reqs"], "grid": [grid], "values_s": values}
    got = VllmProfileCosts(profile, "async").frontend_s("out", num_reqs)
    assert 0.0 <= got <= max(values) * (1 + 1e-12)
    if num_reqs >= grid[-1]:
        assert got == pytest.approx(values[-1])


@pytest.mark.parametrize("edge, beyond", [(None, 0), (8, 0), (5, 3), (1, 7)])
def test_requests_entering_a_pool_larger_than_the_measured_burst_are_counted(edge, beyond):
    """8 requests sent together enter the pool one after another: the (edge + 1)-th to the 8th
    find it holding more than the largest burst measured."""
    env = simpy.Environment()
    api = ApiServer(env, Costs(0.004, 0.002, edge=edge), lambda rid, at, sent: None)
    for rid in range(8):
        api.ingress(rid, 0.0)
    env.run()
    assert (api.entered_beyond, api.most_in_pool) == (beyond, 8)


def test_a_run_whose_first_burst_exceeds_frontend_ins_data_says_so(tmp_path):
    """frontend_in measured at bursts of 1 and 2; 5 clients send at once: 3 requests enter a
    pool beyond the data, the summary counts them and the run warns; 2 clients: nothing."""
    import json

    from sim.output.report import run_warnings
    from tests.vllm_helpers import make_profile

    profile = make_profile(frontend={"in": 0.006})
    profile["curves"]["vllm.frontend_in"] = {"axes": ["num_reqs"], "grid": [[1, 2]], "values_s": [6e-3, 8e-3]}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    for c, beyond in ((5, 3), (2, 0)):
        for setting in ("async", "sync"):
            summary = sim.simulate(vllm_scenario(profile=str(path), c=c), setting, tables="none").summary()
            warned = run_warnings({setting: summary}).get(setting, [])
            if beyond:
                assert (summary["frontend_in_beyond"], summary["frontend_in_pool"],
                        summary["frontend_in_measured_to"]) == (beyond, c, 2)
                assert any("3 requests (warm-up included) entered vLLM's API server" in w and "up to 5 at once" in w for w in warned)
            else:
                assert "frontend_in_beyond" not in summary and not warned


def test_a_sweep_says_at_how_many_points_requests_entered_beyond_frontend_ins_data(tmp_path):
    import json

    from sim.whatif.sweep_verdict import sweep_verdict_text
    from tests.vllm_helpers import make_profile

    profile = make_profile(frontend={"in": 0.006})
    profile["curves"]["vllm.frontend_in"] = {"axes": ["num_reqs"], "grid": [[1, 2]], "values_s": [6e-3, 8e-3]}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    scenario = sim.load_scenario(vllm_scenario(profile=str(path), c=2, n=10))
    table = sim.sweep(scenario, {"workload.concurrency": [2, 5]}, workers=1)
    line = sweep_verdict_text(table, scenario.costs.noise, device="cpu").line()
    assert "at 1 of 2 points requests entered vLLM's API server" in line and "(to 2; up to 5 at once)" in line
    one = sim.sweep(scenario, {"workload.concurrency": [5]}, workers=1)
    assert "at 1 of 1 points requests entered" in sweep_verdict_text(one, scenario.costs.noise, device="cpu").line()
