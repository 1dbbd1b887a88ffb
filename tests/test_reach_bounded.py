"""A forward priced below the profile's lowest measured context is bounded, not counted as
extrapolated (sim.model.reach): the share by hand, the meter's counts, the cost models' counting (SGLang's and
vLLM's profiles, step by step and over a run's arrays), the verdict's ends, and `ask` on a short
prompt, which said "cannot tell" on a clear answer before."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from sim.model.costs import DECODE
from sim.model.reach import BOUNDED_MAX, FAR, ReachMeter, below_share, bounded_words

ROOT = Path(__file__).resolve().parents[1]
H200_1B = ROOT / "scenarios" / "profiles" / "h200-llama-3.2-1b.json"
H200_VLLM = ROOT / "scenarios" / "profiles" / "h200-vllm-llama-3.2-1b.json"


def test_below_share_by_hand():
    assert below_share(0.9, 1.0) == pytest.approx(0.1)
    assert below_share(1.2, 1.0) == pytest.approx(0.2)  # (an edge segment falling: the same size of doubt)
    assert below_share(1.0, 1.0) == 0.0
    assert below_share(0.5, 0.0) == math.inf and below_share(0.0, -1.0) == math.inf
    words = bounded_words(0.034, "x")
    assert words.startswith("by the curve's edge segment (x): the true price lies between that and the price at")
    assert words.endswith("at most 3.4% apart")


def test_the_meter_counts_bounded_steps_apart():
    m = ReachMeter()
    assert [m.bounded(s) for s in (0.01, 0.03, 0.02)] == [True, True, False]  # a new largest share
    assert m.bounded_many(np.array([0.01, 0.05, 0.05])) == 1 and m.bounded_many(np.array([0.04])) == -1
    assert m.bounded_many(np.array([])) == -1
    assert m.outcome() == {"extrapolated_steps": 0, "far_steps": 0, "max_extrapolation": 1.0, "bounded_steps": 7,
                           "max_bounded_share": 0.05}


def test_a_decode_below_the_h200_profiles_contexts_by_hand():
    """8 requests at 17 tokens of context against the grid's 128: the curve extends the 128-512
    segment, so the share is that segment's slope times 111 tokens over the price at 128."""
    from sim.model.profile_costs import ProfileCostModel

    costs = ProfileCostModel.from_file(H200_1B)
    curve = costs.curves["forward.decode"]
    f128, f512 = curve(8, 128), curve(8, 512)
    price = costs.forward_s(DECODE, 8, 8, 8 * 17)
    assert price == pytest.approx(f128 - (f512 - f128) / 384 * 111, rel=1e-12)
    out = costs.reach.outcome()
    assert out["extrapolated_steps"] == 0 and out["bounded_steps"] == 1
    assert out["max_bounded_share"] == pytest.approx((f512 - f128) / 384 * 111 / f128, rel=1e-9)
    assert 0.02 < out["max_bounded_share"] < 0.05
    assert costs.bounded_at() == "forward.decode at ctx 17, measured from 128"

    # beyond the data on its batch size too (coverage stated to 4 requests): extrapolated at the
    # size's distance only, (8 + 1) / (4 + 1), not bounded
    from sim.model.profile import load_profile

    profile = load_profile(H200_1B)
    profile["metadata"]["coverage"] = {"forward.decode": {"num_reqs": [1, 4], "ctx": [128, 4096]}}
    costs = ProfileCostModel(profile)
    costs.forward_s(DECODE, 8, 8, 8 * 17)
    out = costs.reach.outcome()
    assert out["extrapolated_steps"] == 1 and out["bounded_steps"] == 0
    assert out["max_extrapolation"] == pytest.approx(9 / 5)
    assert costs.farthest_at() == "forward.decode at num_reqs 8, measured 1-4"


def test_a_price_far_from_the_edges_is_extrapolated_as_before():
    """A curve whose edge segment falls steeply toward small contexts (more than BOUNDED_MAX of
    the price below the data): the context's distance counts, as it did before."""
    from sim.model.profile_costs import ProfileCostModel

    costs = ProfileCostModel.from_file(ROOT / "scenarios" / "profiles" / "cpu-torch-small.json")
    curve, lo = costs.curves["forward.decode"], 128.0
    assert below_share(curve(64, 1), curve(64, lo)) > BOUNDED_MAX
    costs.forward_s(DECODE, 64, 64, 64)
    out = costs.reach.outcome()
    assert out["bounded_steps"] == 0 and out["extrapolated_steps"] == 1
    assert out["max_extrapolation"] == pytest.approx(129 / 2)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 256), st.floats(0.0, 200.0, allow_nan=False), st.integers(1, 60), st.integers(0, 3))
def test_each_step_is_counted_once(num_reqs, ctx0, k, growth):
    """Whatever its contexts, each decode step is counted at most once (bounded or extrapolated,
    never both), and a run's arrays count what the steps do one by one."""
    from sim.model.profile_costs import ProfileCostModel

    stepwise, vector = ProfileCostModel.from_file(H200_1B), ProfileCostModel.from_file(H200_1B)
    sums = [int(ctx0 * num_reqs) + i * growth * num_reqs for i in range(k)]
    for c in sums:
        stepwise.forward_s(DECODE, num_reqs, num_reqs, c)
    vector.count_decode_steps(num_reqs, np.array(sums, dtype=np.int64))
    out = stepwise.reach.outcome()
    assert vector.reach.outcome() == out
    assert out["bounded_steps"] + out["extrapolated_steps"] <= k
    assert 0.0 <= out["max_bounded_share"] <= BOUNDED_MAX
    assert vector.bounded_at() == stepwise.bounded_at()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 64), st.integers(0, 4000), st.integers(1, 40), st.sampled_from(["sync", "async"]))
def test_vllm_counts_a_run_below_the_contexts_as_its_steps(num_reqs, ctx0, k, setting):
    from sim.engines.vllm.costs import VllmProfileCosts
    from sim.engines.vllm.profile import load_vllm_profile

    profile = load_vllm_profile(H200_VLLM, read_only=True)
    stepwise, run = VllmProfileCosts(profile, setting), VllmProfileCosts(profile, setting)
    for i in range(k):
        stepwise.forward_s(DECODE, num_reqs, num_reqs, ctx0 + i * num_reqs)
    run.count_decode_steps(num_reqs, ctx0, k, 0)
    out = stepwise.reach.outcome()
    assert run.reach.outcome() == out
    assert out["bounded_steps"] + out["extrapolated_steps"] <= k
    assert run.bounded_at() == stepwise.bounded_at()


def _verdict(ratio: float, bounded: tuple):
    from sim.whatif.verdict import KEEP, PAIRS, Verdict

    return Verdict(KEEP, PAIRS[0], ratio, (3.0, 3.5), 0.02, "assumed").with_reach(
        0.0, 0.0, 1.0, "", bounded)


def test_the_verdict_says_whether_it_holds_at_the_bound_by_hand():
    """At CV 2% the threshold is about 1.057x. Ratio 1.2 with every step bounded within 5%: the
    ends are 1.2 x 0.95/1.05 = 1.086 and 1.2 x 1.05/0.95 = 1.326, both 'keep'; within 10%: the low
    end 1.2 x 0.9/1.1 = 0.982 is no visible difference, and the clause says the range spans both.
    A bound never turns the answer (as extrapolation within x4 does not): the loose range is said."""
    from sim.whatif.verdict import KEEP

    holds = _verdict(1.2, (1.0, 0.05, "forward.decode at ctx 17, measured from 128"))
    assert holds.answer == KEEP
    assert holds.bounded_ends() == pytest.approx((1.2 * 0.95 / 1.05, 1.2 * 1.05 / 0.95))
    assert "the ratio would be 1.086-1.326x: the answer holds" in holds.line()
    assert holds.as_json()["max_bounded_at"] == "forward.decode at ctx 17, measured from 128"
    wide = _verdict(1.2, (1.0, 0.10, ""))
    assert wide.answer == KEEP
    assert ("the ratio would be 0.982-1.467x: it spans 'no difference one A/B run could see' to 'keep on' (the answer "
            "above stands on the curve's prices)") in wide.line()
    from sim.whatif.verdict import PAIRS, UNSEEN, Verdict  # an open loop's latency answer: no ratio range

    latency = Verdict(UNSEEN, PAIRS[0], 1.005, (20.362, 29.905), 0.02, "test", ttft_ms=(89.35, 69.34),
                      open_loop=True).with_reach(0.0, 0.0, 1.0, "", (0.75, 0.117, ""))
    assert "the arrivals set both throughputs, so the bound moves the latencies only" in latency.line()
    assert "the ratio would be" not in latency.line() and "runs of each setting" not in latency.line()
    closed = Verdict(UNSEEN, PAIRS[0], 1.031, (7.21, 7.822), 0.02, "test").with_reach(  # a closed loop's latency
        0.0, 0.0, 1.0, "", (0.75, 0.117, ""))  # answer: its throughputs are its own (a range and a run count)
    assert "the arrivals set" not in closed.line() and "the ratio would be" in closed.line()
    assert "runs of each setting detect it" in closed.line()
    assert "the answer holds" in _verdict(1.2, (0.5, 0.10, "")).line()  # half the steps: 5% at most
    assert _verdict(1.2, (0.0, 0.0, "")).line().count("bounded") == 0


@settings(max_examples=200, deadline=None)
@given(st.floats(0.01, 100.0), st.floats(0.0, 1.0), st.floats(0.0, BOUNDED_MAX))
def test_a_bound_never_turns_the_answer_and_its_ends_hold_the_ratio(ratio, share, bound):
    plain, bounded = _verdict(ratio, (0.0, 0.0, "")), _verdict(ratio, (share, bound, ""))
    assert bounded.answer == plain.answer
    lo, hi = bounded.bounded_ends()
    assert lo <= ratio <= hi


def test_ask_answers_a_short_prompt_on_the_h200_profile(run_cli, tmp_path):
    """16-token prompts, 64 tokens out: every decode lies below the profile's 128 tokens of
    context. It answered "cannot tell" (x7.2 its range, 23% of the steps beyond x4) on a 1.23x
    gain; the price there is bounded within about 3%, and the answer stands."""
    code, out, err = run_cli(["ask", "--card", "h200", "--model", "llama-3.2-1b", "--concurrency", "8",
                              "--input-len", "16", "--output-len", "64", "--num-requests", "64",
                              "--out", str(tmp_path / "ask")])
    assert code == 0, err
    text = " ".join((out + err).split())
    assert "verdict: keep overlap on" in text
    assert "priced below the profile's measured contexts by the curve's edge segment" in text
    assert "at most 3.3% apart, counted apart from the steps beyond the data" in text
    assert "forward.decode at ctx 17, measured from 128" in text
    assert f"beyond x{FAR:g}" not in text
