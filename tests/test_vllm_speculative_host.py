"""The speculative host curves (calibrate.real.vllm.speculative, sim.engines.vllm.costs): what the
calibration takes from a drafting server's steps, and how a run prices them.

Closed forms with the constant test profile (tests/vllm_helpers.py: forward F whatever the
tokens), spec curves constant: Sp (spec_prepare), Ss (spec_sample), H (draft_host), k drafts, a
accepted, draft passes at r x F:

- sync, CPU: step = S + D + Sp + F (1 + r k) + R + Ss + H + L + U + T (T: take_drafts, post_step's RPC);
- async, CPU, forward-bound: step = Sp + F (1 + r k) + Ss + H;
- the host work measured at k_cal and run at k: H k / k_cal (stated).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import sim
from calibrate.errors import CalibrationInputError
from calibrate.real.vllm import speculative as vllm_speculative, trace as vllm_trace
from sim.engines.vllm.speculative import Speculative, draft_passes_s
from tests.test_vllm_loops import steady, total
from tests.vllm_helpers import CONSTANT, make_profile, vllm_scenario

SPEC = {"spec_schedule": 4e-4, "spec_prepare": 5e-4, "spec_sample": 6e-4, "spec_update": 7e-4, "draft_host": 9e-4,
        "take_drafts": 1.1e-3}


def spec_profile(tmp_path, k_cal=2, method="draft_model", curves=SPEC) -> str:
    prof = make_profile()
    for name, value in curves.items():
        prof["curves"][f"vllm.{name}"] = {"axes": ["num_reqs"], "grid": [[0, 100000]], "values_s": [value, value]}
    prof["metadata"]["speculative"] = {"method": method, "num_speculative_tokens": k_cal, "model": "test",
                                       "draft_cost_ratio": 1.0}
    path = tmp_path / "vllm-spec.json"
    path.write_text(json.dumps(prof))
    return str(path)


def speculative(k=2, a=1, r=0.5, method="draft_model") -> dict:
    return {"method": method, "num_speculative_tokens": k, "draft_cost_ratio": r,
            "accepted_histogram": [1.0 if i == a else 0.0 for i in range(k + 1)]}


# --- the run, by hand ------------------------------------------------------------------------

def test_sync_step_prices_the_measured_spec_phases_and_the_drafters_host_work(tmp_path):
    k, r = 2, 0.5
    c = {**CONSTANT, "schedule": SPEC["spec_schedule"], "prepare": SPEC["spec_prepare"],
         "sample": SPEC["spec_sample"] + SPEC["draft_host"], "update": SPEC["spec_update"]}
    scen = vllm_scenario(profile=spec_profile(tmp_path), output_len=120, server__speculative=speculative(k, 1, r))
    step, gap = steady(sim.simulate(scen, "sync"))
    cpu = total(c, "schedule", "dispatch", "prepare", "roundtrip", "sample", "collect", "update") + SPEC["take_drafts"]
    np.testing.assert_allclose(step, cpu + c["forward"] * (1 + r * k), rtol=1e-9)


def test_async_step_carries_the_drafters_host_work_on_the_worker(tmp_path):
    k, r = 2, 0.0
    scen = vllm_scenario(profile=spec_profile(tmp_path), output_len=120, server__speculative=speculative(k, 1, r))
    step, _ = steady(sim.simulate(scen, "async"))
    np.testing.assert_allclose(step, SPEC["spec_prepare"] + CONSTANT["forward"] + SPEC["spec_sample"]
                               + SPEC["draft_host"], rtol=1e-9)


def test_host_work_measured_at_another_k_scales_by_k_and_says_so(tmp_path):
    k, r = 4, 0.0
    scen = vllm_scenario(profile=spec_profile(tmp_path, k_cal=2), output_len=120,
                         server__speculative=speculative(k, 1, r))
    step, _ = steady(sim.simulate(scen, "async"))
    np.testing.assert_allclose(step, SPEC["spec_prepare"] + CONSTANT["forward"] + SPEC["spec_sample"]
                               + SPEC["draft_host"] * k / 2, rtol=1e-9)
    lines = Speculative(**speculative(k, 1, r)).caveats({"method": "eagle", "num_speculative_tokens": 2})
    assert "measured with eagle k=2" in lines[0] and "scaled by k/2" in lines[0] and "assumed alike" in lines[0]


def test_a_plain_run_ignores_the_spec_curves(tmp_path):
    """Without server.speculative the profile's speculative curves are not read."""
    plain = sim.simulate(vllm_scenario(profile=spec_profile(tmp_path), output_len=60), "sync")
    step, _ = steady(plain)
    cpu = total(CONSTANT, "schedule", "dispatch", "prepare", "roundtrip", "sample", "collect", "update")
    np.testing.assert_allclose(step, cpu + CONSTANT["forward"], rtol=1e-9)


def test_the_warning_says_whether_the_host_work_was_measured(tmp_path, run_cli):
    sc = vllm_scenario(profile=spec_profile(tmp_path), server__speculative=speculative())
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(sc))
    code, out, _ = run_cli(["run", str(path), "--out", str(tmp_path / "o"), "--no-plots"])
    assert code == 0
    assert "measured with draft_model k=2" in out and "not modelled" not in out
    plain = Speculative(**speculative()).caveats(None)[0]
    assert "not modelled" in plain and "calibrate --engine vllm --speculative" in plain


# --- the calibration's samples, by hand --------------------------------------------------------

def _step(k, tok, forward, draft, sample, execute=0.010, done=100):
    """A traced step at t = 0.1 k s (schedule 1 ms, execute, sample with its draft, update)."""
    t = 0.1 * k
    s = vllm_trace.VllmStep(k=k, reqs=[f"spec-d{len(tok)}x128-{i}" for i in range(len(tok))], tok=list(tok),
                            done=[done] * len(tok), new=0, preempted=[], running=len(tok), waiting=0, free_blocks=0,
                            schedule={"t0": t, "dur": 0.001})
    s.execute = {"t0": t + 0.002, "dur": execute}
    s.forward = forward
    s.sample = {"t0": t + 0.02, "dur": sample}
    s.draft = {"t0": t + 0.021, "dur": draft}
    s.update = {"t0": t + 0.05, "dur": 0.0005}
    return s


def test_samples_split_the_proposal_into_priced_passes_and_host_work():
    """forward(n, c) = 1 ms + 0.1 ms n: a step of 4 requests at k = 2 verifies 12 tokens:
    passes r (f(12) + (k - 1) f(4)) = 0.5 (2.2 + 1.4) ms = 1.8 ms; host = 5 - 1.8 = 3.2 ms."""
    fwd = lambda n, c: 1e-3 + 1e-4 * n  # noqa: E731
    cfg = {"method": "draft_model", "num_speculative_tokens": 2, "draft_cost_ratio": 0.5, "model": "m"}
    assert draft_passes_s(2, 0.5, fwd(12, 0), fwd(4, 0)) == pytest.approx(1.8e-3)
    steps = [_step(0, [3, 3, 3, 3], 0.004, 0.005, 0.008),
             _step(1, [3, 3, 100, 3], 0.004, 0.005, 0.008),  # a prefill in the step: left out
             _step(2, [3, 3, 3], 0.004, 0.001, 0.008),  # 3 requests: not a grid size
             _step(3, [1, 1, 1, 1], 0.004, 0.0001, 0.008)]  # passes priced above the proposal: host 0
    got = {(s["curve"], s["point"]["num_reqs"]): s["times_s"] for s in
           vllm_speculative.samples(steps, fwd, cfg, {1, 2, 4, 8})}
    np.testing.assert_allclose(got[("vllm.draft_host", 4)], [3.2e-3, 0.0], atol=1e-12)
    np.testing.assert_allclose(got[("vllm.spec_sample", 4)], [3e-3, 7.9e-3])
    np.testing.assert_allclose(got[("vllm.spec_prepare", 4)], [6e-3, 6e-3])
    np.testing.assert_allclose(got[("vllm.take_drafts", 4)], [0.0495])  # step 0 -> 1 (same requests)
    assert not any(c == "vllm.take_drafts" for c, _ in
                   {(s["curve"], 0) for s in vllm_speculative.samples(steps, fwd, cfg, {4}, "async")})
    assert ("vllm.draft_host", 3) not in got


def test_the_trace_join_puts_each_proposal_in_its_sample_tokens():
    eng = [{"ph": "schedule", "t0": 0.0, "dur": 0.001, "reqs": ["a"], "tok": [3], "done": [10]},
           {"ph": "update", "t0": 0.03, "dur": 0.001, "n": 1}]
    wrk = [{"ph": "execute", "t0": 0.002, "dur": 0.01, "n_tok": 3}, {"ph": "forward", "t0": 0.003, "dur": 0.008},
           {"ph": "draft", "t0": 0.021, "dur": 0.004}, {"ph": "sample", "t0": 0.02, "dur": 0.006}]
    end = lambda r: r["t0"] + r["dur"]  # noqa: E731
    (s,) = vllm_trace.steps(sorted(eng, key=end), sorted(wrk, key=end))
    assert s.draft["dur"] == 0.004 and s.forward == pytest.approx(0.008)


@pytest.mark.parametrize("bad, field", [
    ([], ""), ({"method": "draft_model", "num_speculative_tokens": 2}, "draft_cost_ratio"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_cost_ratio": 1}, "method"),
    ({"method": "eagle", "num_speculative_tokens": 0, "draft_cost_ratio": 1}, "num_speculative_tokens"),
    ({"method": "eagle", "num_speculative_tokens": 2, "draft_cost_ratio": -1}, "draft_cost_ratio"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "draft_cost_ratio": 1}, "model")])
def test_bad_calibration_configs_are_refused_by_field(bad, field):
    with pytest.raises(CalibrationInputError) as err:
        vllm_speculative.check_config(bad)
    assert "--speculative" in str(err.value) and field in str(err.value)


def test_the_calibrate_flag_is_refused_outside_vllm(run_cli, tmp_path):
    code, _, err = run_cli(["calibrate", "--engine", "sglang", "--speculative", "{}", "--out", str(tmp_path / "p.json")])
    assert code == 2 and "--speculative" in err and "Traceback" not in err
    assert not (tmp_path / "p.json").exists()


def test_the_drafting_waves_can_be_sent_by_vllms_own_client():
    """--feature-client engine: the same waves (B in flight, B x waves requests, C - 16 prompt
    tokens, 32 output tokens) as loads of vLLM's benchmark client; the constrained waves carry
    the schema in the body."""
    from calibrate.real.vllm import structured as vllm_structured

    own = vllm_speculative.design((1, 4), 32, 2, 0)
    eng = vllm_speculative.design((1, 4), 32, 2, 0, client="engine")
    assert [x["name"] for x in own] == [x["name"] for x in eng]
    for o, e in zip(own, eng):
        assert e["client"] == "engine" and e["concurrency"] == o["concurrency"]
        assert e["num_requests"] == len(o["requests"]) and e["output_len"] == 32
        assert e["input_len"] == len(o["requests"][0]["input_ids"]) and e["range_ratio"] == 0.0
    (g, *_) = vllm_structured.design((2,), 32, 2, 0, client="engine")
    assert g["extra_body"] == {"structured_outputs": {"json": vllm_structured.SCHEMA}}


@pytest.mark.parametrize("argv, flag", [
    (["--feature-client", "engine"], "--feature-client"),
    (["--speculative", '{"method": "eagle", "num_speculative_tokens": 2, "draft_cost_ratio": 1}',
      "--feature-client-nice", "25"], "--feature-client-nice")])
def test_the_feature_client_flags_are_refused_by_name(run_cli, tmp_path, argv, flag):
    code, _, err = run_cli(["calibrate", "--engine", "vllm", *argv, "--out", str(tmp_path / "p.json")])
    assert code == 2 and flag in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p.json").exists()
