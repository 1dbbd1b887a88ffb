"""Speculative decoding in the vLLM model (sim.engines.vllm.speculative): closed forms first, then
invariants, then the launch command.

Closed forms with the constant test profile (forward F whatever the tokens, tests/vllm_helpers.py),
k drafts per step, each accepted a at a time (a point-mass histogram), draft passes at r x F:

- device per verify step: F (verify) + r (F + (k - 1) F) = F (1 + r k);
- sync, CPU:  step = S + D + P + F (1 + r k) + R + Sa + L + U + R  (post_step's take_draft RPC: R);
- async, CPU, forward-bound: step = P + F (1 + r k) + Sa;
- a request of L output tokens (by length) takes J = ceil((L - 1) / (1 + a)) verify steps; async
  scheduling one more, wasted, when 2 + (J - 1)(1 + a) < L (its look-ahead counts no draft).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim
from sim.engines.vllm.speculative import AcceptanceDraws, Speculative
from sim.errors import ScenarioError
from tests.test_vllm_loops import steady, total
from tests.vllm_helpers import CONSTANT, vllm_scenario, write_profile
from tests.helpers import verdict_of


def spec(k=3, a=None, rate=None, r=0.0, method="draft_model") -> dict:
    out = {"method": method, "num_speculative_tokens": k, "draft_cost_ratio": r}
    if rate is not None:
        out["acceptance_rate"] = rate
    else:
        out["accepted_histogram"] = [1.0 if i == (a or 0) else 0.0 for i in range(k + 1)]
    return out


def run(tmp_path, setting, speculative=None, **kw):
    extra = {"server__speculative": speculative} if speculative else {}
    return sim.simulate(vllm_scenario(profile=write_profile(tmp_path), **extra, **kw), setting)


# --- the acceptance law, by hand ----------------------------------------------------------

def test_per_position_acceptance_is_vllms_log_read_exactly():
    """vLLM's "Per-position acceptance rate" r_i: P(a) = r_a - r_(a+1)."""
    s = Speculative(**spec(k=3) | {"accepted_histogram": None, "per_position_acceptance": [0.8, 0.6, 0.4]})
    np.testing.assert_allclose(s.probabilities(), [0.2, 0.2, 0.2, 0.4])
    assert s.mean_accepted() == pytest.approx(0.8 + 0.6 + 0.4)


def test_acceptance_rate_is_vllms_average_spread_geometrically():
    """vLLM's "Avg Draft acceptance rate" A = mean accepted / k; q + q^2 + q^3 = 3 A."""
    s = Speculative(**spec(k=3, rate=0.875 / 3))  # q = 0.5: 0.5 + 0.25 + 0.125
    np.testing.assert_allclose(s.probabilities(), [0.5, 0.25, 0.125, 0.125], atol=1e-9)
    assert s.mean_accepted() == pytest.approx(0.875)


@settings(max_examples=30, deadline=None)
@given(k=st.integers(1, 12), rate=st.floats(0, 1))
def test_acceptance_rate_mean_is_rate_times_k(k, rate):
    assert Speculative(**spec(k=k, rate=rate)).mean_accepted() == pytest.approx(rate * k, abs=1e-9)


def test_draws_of_a_point_mass_are_exact_and_capped():
    draws = AcceptanceDraws(Speculative(**spec(k=3, a=2)), np.random.default_rng(0))
    assert [draws(3), draws(3), draws(1), draws(0)] == [2, 2, 1, 0]
    assert draws.mean_accept_length == pytest.approx(1 + 5 / 3)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=2, max_size=9).filter(lambda p: sum(p) > 0.1))
def test_draws_follow_the_histogram(raw):
    p = [x / sum(raw) for x in raw]
    k = len(p) - 1
    draws = AcceptanceDraws(Speculative(**spec(k=k, a=0) | {"accepted_histogram": p}), np.random.default_rng(1))
    got = [draws(k) for _ in range(4000)]
    assert all(0 <= g <= k for g in got)
    mean = float(np.dot(np.arange(k + 1), p))
    sd = math.sqrt(float(np.dot((np.arange(k + 1) - mean) ** 2, p)))
    assert abs(np.mean(got) - mean) <= 6 * sd / math.sqrt(4000) + 1e-9


@pytest.mark.parametrize("bad, words", [
    ({"acceptance_rate": 0.5, "accepted_histogram": [0.5, 0.5, 0, 0]}, "exactly one"),
    ({"accepted_histogram": [0.5, 0.5]}, "needs 4 values"),
    ({"accepted_histogram": [0.5, 0.6, 0, 0]}, "summing to 1"),
    ({"accepted_histogram": None, "per_position_acceptance": [0.5, 0.6, 0.1]}, "must not increase"),
    ({"accepted_histogram": None, "per_position_acceptance": [0.5, 0.4]}, "needs 3 values"),
    ({"accepted_histogram": None, "per_position_acceptance": [1.5, 0.4, 0.1]}, "from 0 to 1"),
    ({"accepted_histogram": None, "acceptance_rate": float("nan")}, "finite"),
    ({"accepted_histogram": None, "acceptance_rate": 1.5}, "less than or equal"),
    ({"method": "ngram"}, "not modelled"),
    ({"num_speculative_tokens": 0}, "greater than or equal"),
])
def test_bad_speculative_sections_are_refused(bad, words):
    s = {k: v for k, v in {**spec(k=3), **bad}.items() if v is not None}
    with pytest.raises(ScenarioError, match="speculative") as err:
        sim.load_scenario(vllm_scenario(server__speculative=s))
    assert words in str(err.value)


def test_acceptance_needs_to_be_given():
    s = spec(k=2)
    s.pop("accepted_histogram")
    with pytest.raises(ScenarioError, match="acceptance_rate"):
        sim.load_scenario(vllm_scenario(server__speculative=s))


# --- closed forms ----------------------------------------------------------------------

@pytest.mark.parametrize("setting", ["sync", "async"])
def test_nothing_accepted_and_free_drafts_is_plain_decoding_plus_the_draft_rpc(tmp_path, setting):
    """a = 0, r = 0: one token per step, the verify priced as the plain decode (the test profile's
    forward does not grow with tokens); only sync's take_draft RPC (R per step) differs."""
    plain, specd = run(tmp_path, setting), run(tmp_path, setting, spec(k=3, a=0))
    assert len(specd.steps) == len(plain.steps)
    assert (specd.requests["output_tokens"] == plain.requests["output_tokens"]).all()
    step_p, _ = steady(plain)
    step_s, _ = steady(specd)
    extra = CONSTANT["roundtrip"] if setting == "sync" else 0.0
    np.testing.assert_allclose(step_s, step_p + extra, rtol=1e-9)
    assert specd.summary()["spec_accept_length"] == 1.0


@pytest.mark.parametrize("a", [0, 1, 3])
@pytest.mark.parametrize("setting", ["sync", "async"])
def test_a_fixed_accept_count_gives_one_plus_a_tokens_per_step(tmp_path, setting, a):
    length = 40
    res = run(tmp_path, setting, spec(k=3, a=a), c=1, output_len=length)
    assert int(res.requests["output_tokens"].iloc[0]) == length  # tokens past the stop dropped
    decode = res.steps[res.steps["kind"] == "decode"]
    needed = math.ceil((length - 1) / (1 + a))
    # async schedules step j + 1 before j's output unless the tokens known plus j's one sure token
    # reach max_tokens (scheduler.py:664: drafts may all be rejected): one wasted step when not
    extra = setting == "async" and 2 + (needed - 1) * (1 + a) < length
    assert len(decode) == needed + extra
    assert res.steps["overshoot"].sum() == extra
    assert res.summary()["spec_accept_length"] == 1 + a  # as drawn: a stop may use fewer


@pytest.mark.parametrize("r", [0.0, 0.25, 1.0])
def test_sync_step_adds_the_drafts_and_the_draft_rpc(tmp_path, r):
    k = 3
    c = CONSTANT
    step, gap = steady(run(tmp_path, "sync", spec(k=k, a=2, r=r), output_len=120))
    cpu = total(c, "schedule", "dispatch", "prepare", "roundtrip", "sample", "collect", "update") + c["roundtrip"]
    np.testing.assert_allclose(step, cpu + c["forward"] * (1 + r * k), rtol=1e-9)
    np.testing.assert_allclose(gap, cpu, rtol=1e-9)


@pytest.mark.parametrize("r", [0.0, 0.5])
def test_async_forward_bound_step_is_the_worker_with_its_drafts(tmp_path, r):
    k = 2
    c = CONSTANT
    step, _ = steady(run(tmp_path, "async", spec(k=k, a=1, r=r), output_len=120))
    np.testing.assert_allclose(step, c["prepare"] + c["forward"] * (1 + r * k) + c["sample"], rtol=1e-9)


def test_async_over_sync_follows_max_against_sum(tmp_path):
    """Throughput async/sync of a speculative run (equal accept counts in both): the sum of the
    engine core's and the worker's times over the worker's."""
    k, r, a = 4, 0.2, 2
    c = CONSTANT
    worker = c["prepare"] + c["forward"] * (1 + r * k) + c["sample"]
    core = total(c, "schedule", "dispatch", "roundtrip", "collect", "update") + c["roundtrip"]
    assert total(c, "schedule", "dispatch", "update", "collect") <= worker
    step_sync, _ = steady(run(tmp_path, "sync", spec(k=k, a=a, r=r), output_len=200))
    step_async, _ = steady(run(tmp_path, "async", spec(k=k, a=a, r=r), output_len=200))
    assert np.median(step_sync) / np.median(step_async) == pytest.approx((worker + core) / worker, rel=1e-9)


def test_gpu_async_step_is_the_device(tmp_path):
    k, r = 3, 0.1
    step, gap = steady(run(tmp_path, "async", spec(k=k, a=1, r=r), device="cuda", output_len=120))
    np.testing.assert_allclose(step, CONSTANT["forward"] * (1 + r * k), rtol=1e-9)
    np.testing.assert_allclose(gap, 0.0, atol=1e-12)


def test_inline_costs_price_a_verify_as_a_decode():
    costs = {"gpu": {"decode": {"base": 4e-3, "per_token": 1e-4}, "prefill": {"base": 2e-3}},
             "cpu": {"schedule": {"base": 2e-4}, "launch": {"base": 3e-4}, "process": {"base": 4e-4}}}
    k, r = 3, 0.5
    scen = vllm_scenario(costs=costs, c=2, output_len=100, server__speculative=spec(k=k, a=1, r=r))
    step, _ = steady(sim.simulate(scen, "async"))
    verify = 4e-3 + 1e-4 * 2 * (1 + k)  # 2 requests x (1 + k) tokens
    one_pass = 4e-3 + 1e-4 * 2
    np.testing.assert_allclose(step, verify + r * (verify + (k - 1) * one_pass), rtol=1e-9)


# --- invariants ----------------------------------------------------------------------------

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(k=st.integers(1, 6), rate=st.floats(0, 1), setting=st.sampled_from(["sync", "async"]),
       finish=st.sampled_from(["length", "eos"]), blocks=st.integers(60, 400), seed=st.integers(0, 2**32))
def test_every_request_gets_exactly_its_tokens(tmp_path, k, rate, setting, finish, blocks, seed):
    """Whatever the law and a KV cache tight enough to preempt: each request ends with its output
    length, the KV cache is empty at the end and the run repeats exactly."""
    scen = vllm_scenario(profile=write_profile(tmp_path), c=6, n=14, finish=finish, seed=seed,
                         input_len={"dist": "uniform", "low": 8, "high": 200},
                         output_len={"dist": "uniform", "low": 1, "high": 90},
                         server__num_gpu_blocks=blocks, server__speculative=spec(k=k, rate=rate))
    scen["seed"] = seed
    try:
        res = sim.simulate(scen, setting)
    except ScenarioError:
        return  # a cache too small for one request of max_model_len: refused like vLLM
    req = res.requests
    assert (req["output_tokens"] == req["output_len"]).all()
    again = sim.simulate(scen, setting)
    assert res.requests.equals(again.requests)
    assert 1.0 <= res.summary()["spec_accept_length"] <= 1 + k


# --- the launch command ----------------------------------------------------------------------

def test_a_device_drafter_is_modelled_and_ngram_refused():
    from sim.engines.vllm.rules.async_rules import advise

    adv = advise(["--model", "M", "--speculative-config",
                  '{"method": "eagle3", "model": "D", "num_speculative_tokens": 3}'])
    assert adv.setting == "async"
    assert adv.config.server["speculative"] == {"method": "eagle3", "num_speculative_tokens": 3}
    assert dict(adv.config.flags)['--speculative-config {"method": "eagle3", "model": "D", '
                                  '"num_speculative_tokens": 3}'] == "modelled"
    ngram = advise(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'])
    assert ngram.setting is None and ngram.async_scheduling is False
    assert "refused" in ngram.config.flags[0][1]
    no_k = advise(["--speculative-config.method", "eagle"])
    assert no_k.setting is None and "without num_speculative_tokens" in no_k.config.flags[0][1]


def test_every_run_says_what_speculation_rests_on(tmp_path):
    res = run(tmp_path, "async", spec(k=2, rate=0.6, r=0.1))
    from sim.output.report import load_warnings

    lines = load_warnings(res.scenario)
    assert any("server.speculative" in w and "acceptance_rate 0.6" in w and "not measured" in w
               and "ITL is per step" in w for w in lines)


def test_the_shipped_speculative_scenario_says_what_it_assumed(run_cli, tmp_path):
    import json

    from tests.conftest import SCENARIOS

    code, out, err = run_cli(["run", SCENARIOS / "vllm-h200-eagle.yaml", "--out", tmp_path, "--no-plots"])
    assert code == 0, err
    verdict = verdict_of(out)
    assert "speculative decoding" in verdict and "tokens per verify step" in verdict and "not measured" in verdict
    summary = json.loads((tmp_path / "summary.json").read_text())
    accept = summary["verdict"]["spec_accept_length"]
    assert all(abs(a - (1 + 0.75 + 0.55 + 0.4)) < 0.1 for a in accept)  # drawn around the logged rates' mean
    assert "(async) and" in verdict and "(sync) tokens per verify step" in verdict
    assert any("server.speculative" in w for w in summary["warnings"])


@pytest.mark.parametrize("setting", ["sync", "async"])
@pytest.mark.parametrize("input_len,output_len", [(400, 111), (400, 200), (100, 500)])
def test_a_request_near_max_model_len_fits_a_cache_of_one_such_request(setting, input_len, output_len):
    """A KV cache of exactly one max_model_len request (33 blocks of 16, one the null block: 512
    tokens) and 3 drafts of lookahead: vLLM caps a request's slots at max_model_len
    (``allocate_slots``' ``num_tokens_need_slot``), so one that reaches 511 tokens still fits and
    finishes (found by a generated family: without the cap it preempted itself at every step and
    the run never ended)."""
    from sim.engines.vllm.policy.kv_blocks import BlockPool
    from sim.engines.vllm.policy.request import Request

    raw = {"name": "near-max", "workload": {"arrival": "closed_loop", "concurrency": 1, "num_requests": 1,
                                            "input_len": input_len, "output_len": output_len, "finish": "length"},
           "server": {"engine": "vllm", "settings": [setting], "max_model_len": 512, "block_size": 16,
                      "num_gpu_blocks": 33, "speculative": {"method": "eagle3", "num_speculative_tokens": 3,
                                                            "per_position_acceptance": [0.75, 0.55, 0.4],
                                                            "draft_cost_ratio": 0.1}}}
    x = sim.simulate(sim.load_scenario(raw), setting, tables="none").summary()
    assert x["completed"] == 1 and x["total_output_tokens"] == min(output_len, 512 - input_len)
    # the cap itself: 510 tokens and 3 drafts of lookahead take 32 blocks, not 33
    req = Request(0, 0.0, 510, 0, 1, 1, False)  # (rid, arrival, prompt, cached, output, max_tokens, warm-up)
    assert not BlockPool(33, 16).allocate_slots(req, 510, num_lookahead_tokens=3)  # (no cap: 33 needed)
    assert BlockPool(33, 16, max_model_len=512).allocate_slots(req, 510, num_lookahead_tokens=3)
    assert req.num_blocks == 32
