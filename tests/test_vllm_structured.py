"""Structured output in the vLLM model (sim.engines.vllm.structured): closed forms first, then
invariants, then the refusals.

Closed forms with the constant test profile (tests/vllm_helpers.py: S, D, P, F, R, Sa, L, U), every
request constrained (share 1), grammar curves constant: B (the engine core's bitmask), Sa + A
(sample_tokens with the mask), U + C (update_from_output with the grammars' accept):

- sync, CPU: the bitmask runs behind the worker's forward, sample_tokens waits for both:
  step = S + D + max(P + F, B) + R + Sa + A + L + U + C;
- async, CPU, forward-bound (L + U + C + B < P + F): step = P + F + Sa + A (the core hidden);
- async, CPU, core-bound: each step's sample_tokens waits for the previous step's output, update
  and the bitmask: step = L + U + C + B + Sa + A, where plain async would hide them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim
from sim.engines.vllm.structured import StructuredOutput
from sim.errors import ScenarioError
from tests.test_vllm_loops import steady, total
from tests.vllm_helpers import CONSTANT, make_profile, vllm_scenario

A, C = 3e-4, 2e-4  # the mask's and the accept's excess over plain sample and update


def grammar_profile(tmp_path, bitmask: float, kind="json_schema", costs=None) -> str:
    prof = make_profile(costs=costs)
    c = {**CONSTANT, **(costs or {})}
    for name, value in (("bitmask", bitmask), ("sample", c["sample"] + A), ("update", c["update"] + C)):
        prof["curves"][f"vllm.grammar_{name}"] = {"axes": ["num_reqs"], "grid": [[0, 100000]],
                                                  "values_s": [value, value]}
    prof["metadata"]["structured_output"] = {"kind": kind}
    path = tmp_path / f"vllm-grammar-{bitmask}.json"
    path.write_text(json.dumps(prof))
    return str(path)


def run(tmp_path, setting, bitmask, share=1.0, costs=None, **kw):
    scen = vllm_scenario(profile=grammar_profile(tmp_path, bitmask, costs=costs), output_len=80,
                         server__structured_output={"share": share}, **kw)
    return sim.simulate(scen, setting)


@pytest.mark.parametrize("bitmask", [1e-4, 2e-2])
def test_sync_bitmask_hides_behind_the_forward_until_it_is_longer(tmp_path, bitmask):
    c = CONSTANT
    step, _ = steady(run(tmp_path, "sync", bitmask))
    expect = (total(c, "schedule", "dispatch", "roundtrip", "sample", "collect", "update") + A + C
              + max(c["prepare"] + c["forward"], bitmask))
    np.testing.assert_allclose(step, expect, rtol=1e-9)


def test_async_forward_bound_hides_the_engine_cores_grammar_work(tmp_path):
    c = CONSTANT
    step, _ = steady(run(tmp_path, "async", 1e-4))
    np.testing.assert_allclose(step, c["prepare"] + c["forward"] + c["sample"] + A, rtol=1e-9)


def test_async_defers_sampling_until_the_previous_update_and_bitmask(tmp_path):
    """B = 20 ms: each step's sampling waits for the engine core; plain async (no grammar) at
    the same costs runs forward-bound."""
    c, b = CONSTANT, 2e-2
    step, _ = steady(run(tmp_path, "async", b))
    np.testing.assert_allclose(step, c["collect"] + c["update"] + C + b + c["sample"] + A, rtol=1e-9)
    plain, _ = steady(run(tmp_path, "async", b, share=0.0))
    np.testing.assert_allclose(plain, c["prepare"] + c["forward"] + c["sample"], rtol=1e-9)


def test_share_zero_is_plain_decoding_exactly(tmp_path):
    base = vllm_scenario(profile=grammar_profile(tmp_path, 1e-3), c=6, n=18, output_len=40)
    for setting in ("sync", "async"):
        a = sim.simulate(base, setting).summary()
        b = sim.simulate({**base, "server": {**base["server"], "structured_output": {"share": 0.0}}}, setting).summary()
        assert {k: v for k, v in a.items() if k != "wall_s"} == {k: v for k, v in b.items() if k != "wall_s"}


def test_given_costs_are_linear_per_constrained_request(tmp_path):
    """Inline terms (no profile's grammar curves): sync, B = 50 us x m below the forward."""
    from tests.vllm_helpers import write_profile

    m = 4
    section = {"share": 1.0, "bitmask_us_per_request": 50, "apply_us_per_request": 30, "accept_us_per_request": 20}
    scen = vllm_scenario(profile=write_profile(tmp_path), c=m, output_len=80, server__structured_output=section)
    step, _ = steady(sim.simulate(scen, "sync"))
    c = CONSTANT
    expect = total(c, "schedule", "dispatch", "prepare", "forward", "roundtrip", "sample", "collect", "update") \
        + m * (30 + 20) * 1e-6
    np.testing.assert_allclose(step, expect, rtol=1e-9)


# --- invariants ------------------------------------------------------------------------------

@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(share=st.floats(0.0, 1.0), seed=st.integers(0, 2 ** 31), bitmask=st.sampled_from([0.0, 1e-4, 5e-3]),
       setting=st.sampled_from(["sync", "async"]))
def test_every_request_gets_its_tokens_and_grammar_only_slows(tmp_path, share, seed, bitmask, setting):
    scen = vllm_scenario(profile=grammar_profile(tmp_path, bitmask), c=5, n=15,
                         input_len={"dist": "uniform", "low": 8, "high": 200},
                         output_len={"dist": "uniform", "low": 1, "high": 60})
    scen["seed"] = seed
    plain = sim.simulate(scen, setting)
    scen["server"]["structured_output"] = {"share": share}
    res = sim.simulate(scen, setting)
    assert (res.requests["output_len"].to_numpy() == plain.requests["output_len"].to_numpy()).all()
    assert res.summary()["duration_s"] >= plain.summary()["duration_s"] * (1 - 1e-12)


def test_the_same_requests_carry_a_grammar_under_every_setting():
    s = StructuredOutput(share=0.3)
    a, b = s.draw(1000, 7), s.draw(1000, 7)
    assert (a == b).all() and 0.25 < a.mean() < 0.35 and not (a == s.draw(1000, 8)).all()


# --- refusals and what every run says --------------------------------------------------------

@pytest.mark.parametrize("bad, words", [({"share": 1.5}, "share"), ({"share": float("nan")}, "share"),
                                        ({"share": 0.5, "kind": "xml"}, "kind"),
                                        ({"share": 0.5, "bitmask_us_per_request": -1}, "bitmask_us_per_request")])
def test_bad_sections_are_refused_by_field(bad, words):
    with pytest.raises(ScenarioError) as err:
        sim.load_scenario(vllm_scenario(server__structured_output=bad))
    assert words in str(err.value)


def test_unknown_costs_are_refused_in_one_line(tmp_path):
    from tests.vllm_helpers import write_profile

    scen = vllm_scenario(profile=write_profile(tmp_path), server__structured_output={"share": 0.5})
    with pytest.raises(ScenarioError) as err:
        sim.simulate(scen, "sync")
    assert "server.structured_output" in str(err.value) and "--structured-output" in str(err.value)


def test_speculation_with_a_grammar_is_refused():
    spec = {"method": "eagle", "num_speculative_tokens": 2, "draft_cost_ratio": 0.1, "acceptance_rate": 0.5}
    with pytest.raises(ScenarioError) as err:
        sim.load_scenario(vllm_scenario(server__speculative=spec, server__structured_output={"share": 0.5}))
    assert "structured_output" in str(err.value)


def test_every_run_says_where_the_grammar_costs_come_from(tmp_path, run_cli):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(vllm_scenario(profile=grammar_profile(tmp_path, 1e-4, kind="regex"),
                                             server__structured_output={"share": 0.5})))
    code, out, _ = run_cli(["run", str(path), "--out", str(tmp_path / "o"), "--no-plots"])
    out = " ".join(out.split())  # (notes and the verdict's clauses are wrapped)
    assert code == 0 and "50% of the requests carry a json_schema grammar" in out
    assert "measured with regex grammars" in out and "assumed to cost alike" in out


# --- the calibration's samples and the loads, by hand -----------------------------------------

def test_each_step_gets_its_bitmask_and_the_samples_keep_fully_constrained_decode_steps():
    from calibrate.real.vllm import structured, trace

    def sched(t, reqs, tok):
        return {"ph": "schedule", "t0": t, "dur": 0.001, "reqs": reqs, "tok": tok, "done": [50] * len(reqs)}

    eng = [sched(0.0, ["a", "b"], [1, 1]), {"ph": "bitmask", "t0": 0.002, "dur": 0.0004, "n": 2},
           {"ph": "update", "t0": 0.02, "dur": 0.0006, "n": 2},
           sched(0.03, ["a", "b"], [1, 1]), {"ph": "bitmask", "t0": 0.032, "dur": 0.0005, "n": 1},  # b's grammar ended
           {"ph": "update", "t0": 0.05, "dur": 0.0006, "n": 2}]
    wrk = []
    for t in (0.0, 0.03):
        wrk += [{"ph": "execute", "t0": t + 0.0015, "dur": 0.01, "n_tok": 2}, {"ph": "forward", "t0": t + 0.002, "dur": 0.008},
                {"ph": "sample", "t0": t + 0.012, "dur": 0.003}]
    end = lambda r: r["t0"] + r["dur"]  # noqa: E731
    steps = trace.steps(sorted(eng, key=end), sorted(wrk, key=end))
    assert [s.bitmask["n"] for s in steps] == [2, 1]
    got = {(s["curve"], s["point"]["num_reqs"]): s["times_s"] for s in structured.samples(steps, {1, 2})}
    assert got == {("vllm.grammar_bitmask", 2): [0.0004], ("vllm.grammar_sample", 2): [0.003],
                   ("vllm.grammar_update", 2): [0.0006]}


def test_a_constrained_load_sends_its_schema_through_either_client():
    from calibrate.real.jobs import JSON_SCHEMA, Workload
    from realengines.vllm.bench import command

    w = Workload("j", num_requests=4, concurrency=2, input_len=(8, 8), output_len=(4, 4), client="engine",
                 grammar="json_schema")
    argv = command(w.engine_load(), "http://x", "m", __import__("pathlib").Path("/tmp/o.json"), "m")
    assert json.loads(argv[argv.index("--extra-body") + 1]) == {"structured_outputs": {"json": JSON_SCHEMA}}
    own = Workload("j", num_requests=2, concurrency=1, input_len=(8, 8), output_len=(4, 4), grammar="json_schema")
    assert all(r["structured_outputs"] == {"json": JSON_SCHEMA} for r in own.requests())
    with pytest.raises(ValueError):
        Workload("j", grammar="xml")


def test_advise_points_a_grammar_backend_flag_at_the_scenario_key(run_cli):
    code, out, _ = run_cli(["advise", "--engine", "vllm", "--device", "cuda", "--", "--model", "m",
                            "--structured-outputs-config", '{"backend": "xgrammar"}'])
    assert code == 0 and "server.structured_output" in " ".join(out.split())


def test_the_measured_profile_prices_grammars_and_matches_the_readme_example():
    """benchmarks/results/profile-vllm-cpu-structured.json (the 4 December calibration's curves):
    a constrained run prices the grammars from them, and the README's per-request example is
    what they give at 16 requests, sync."""
    import re
    from pathlib import Path

    from sim.engines.vllm.profile import VLLM_CURVES
    from sim.model.profile import profile_curves

    root = Path(__file__).resolve().parent.parent
    path = root / "benchmarks" / "results" / "profile-vllm-cpu-structured.json"
    c = profile_curves(json.loads(path.read_text()), "median", "sync", VLLM_CURVES)
    per = [c["vllm.grammar_bitmask"](16) / 16, (c["vllm.grammar_sample"](16) - c["vllm.sample"](16)) / 16,
           (c["vllm.grammar_update"](16) - c["vllm.update"](16)) / 16]
    readme = (root / "README.md").read_text()
    given = [float(re.search(rf"structured_output\.{k}_us_per_request=([0-9.]+)", readme).group(1))
             for k in ("bitmask", "apply", "accept")]
    np.testing.assert_allclose(given, [round(x * 1e6) for x in per])
    scen = vllm_scenario(profile=str(path), c=4, n=8, output_len=40, server__structured_output={"share": 1.0})
    with_grammar = sim.simulate(scen, "sync").summary()["duration_s"]
    scen["server"].pop("structured_output")
    assert with_grammar > sim.simulate(scen, "sync").summary()["duration_s"]
