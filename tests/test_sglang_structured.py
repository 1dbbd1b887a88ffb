"""Structured output in the SGLang model (sim.engines.sglang.structured): closed forms first, then
invariants, then the refusals and the calibration's samples.

Closed forms with constant costs (tests/helpers.py: cpu = recv + schedule + launch + process, gpu
the decode forward, no residue), c requests all constrained, the given costs m and a microseconds
per constrained request: M = c m (the mask), A = c a (the accept, in process):

- normal (``event_loop_normal``): the mask is filled right after the forward's launch and the
  sampling waits for it: step = cpu + max(gpu, M) + A; the device idles step - gpu;
- overlap (``event_loop_overlap``): the mask is filled after k-1 is processed
  (``launch_batch_sample_if_needed``), on the CPU's path: step = max(gpu, cpu + A + M).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim
from sim.engines.sglang.structured import GrammarCosts, StructuredOutput
from sim.errors import ScenarioError
from tests.helpers import constant_scenario
from tests.test_closed_forms import steady_decode

GPU, RECV, SCHEDULE, LAUNCH, PROCESS = 0.004, 1e-4, 2e-4, 3e-4, 4e-4
CPU = RECV + SCHEDULE + LAUNCH + PROCESS
C = 4


def scenario(mask_us: float, accept_us: float, share: float = 1.0, **kw) -> dict:
    kw.setdefault("c", C)
    return constant_scenario(gpu=GPU, recv=RECV, schedule=SCHEDULE, launch=LAUNCH, process=PROCESS, output_len=60,
                             server__structured_output={"share": share, "mask_us_per_request": mask_us,
                                                        "accept_us_per_request": accept_us}, **kw)


@pytest.mark.parametrize("mask_us", [50.0, 2500.0])  # M = 0.2 ms (under the forward), 10 ms (over it)
def test_normal_fills_the_mask_behind_the_forward_it_launched(mask_us):
    m, a = C * mask_us * 1e-6, C * 30e-6
    res = sim.simulate(scenario(mask_us, 30.0), "normal")
    step, gap = steady_decode(res)
    np.testing.assert_allclose(step, CPU + max(GPU, m) + a, rtol=1e-9)
    np.testing.assert_allclose(gap, CPU + max(GPU, m) + a - GPU, rtol=1e-9)


@pytest.mark.parametrize("mask_us", [50.0, 2500.0])
def test_overlap_puts_the_mask_on_the_cpus_path(mask_us):
    m, a = C * mask_us * 1e-6, C * 30e-6
    res = sim.simulate(scenario(mask_us, 30.0), "overlap")
    step, gap = steady_decode(res)
    np.testing.assert_allclose(step, max(GPU, CPU + a + m), rtol=1e-9)
    np.testing.assert_allclose(gap, max(0.0, CPU + a + m - GPU), atol=1e-12)


def test_a_mask_longer_than_the_forward_turns_the_verdict():
    """M = 10 ms against a 4 ms forward: normal hides 4 ms of it under the forward, overlap none."""
    normal = sim.simulate(scenario(2500.0, 0.0), "normal").summary()["output_throughput"]
    overlap = sim.simulate(scenario(2500.0, 0.0), "overlap").summary()["output_throughput"]
    assert overlap < normal
    plain_o = sim.simulate(scenario(2500.0, 0.0, share=0.0), "overlap").summary()["output_throughput"]
    plain_n = sim.simulate(scenario(2500.0, 0.0, share=0.0), "normal").summary()["output_throughput"]
    assert plain_o > plain_n


def test_the_cpu_engine_pays_the_mask_after_its_blocking_forward():
    """device: cpu (the forward on the scheduler's thread): both loops pay cpu + gpu + M + A."""
    m, a = C * 100e-6, C * 30e-6
    for setting in ("normal", "overlap"):
        res = sim.simulate(scenario(100.0, 30.0, server__device="cpu"), setting)
        step, _ = steady_decode(res)
        np.testing.assert_allclose(step, CPU + GPU + m + a, rtol=1e-9)


def _summary(res) -> dict:
    return {k: v for k, v in res.summary().items() if k != "wall_s"}


def test_share_zero_is_plain_decoding_exactly():
    base = constant_scenario(c=6, num_requests=18, output_len=40)
    for setting in ("normal", "overlap"):
        a = _summary(sim.simulate(base, setting))
        b = _summary(sim.simulate({**base, "server": {**base["server"], "structured_output": {"share": 0.0}}}, setting))
        assert a == b


def test_given_costs_are_linear_per_constrained_request():
    g = GrammarCosts(StructuredOutput(share=1.0, mask_us_per_request=40, accept_us_per_request=10), None, 2.0)
    assert g.mask_s(0) == 0.0 and g.accept_s(0) == 0.0
    assert g.mask_s(3) == pytest.approx(3 * 40e-6 * 2) and g.accept_s(5) == pytest.approx(5 * 10e-6 * 2)


def test_measured_curves_price_the_mask_and_the_accept_as_excess_over_plain_processing():
    curves = {"grammar.mask": lambda n: 1e-5 * n, "grammar.process": lambda n: 3e-4 + 2e-5 * n,
              "process.decode": lambda n: 3e-4 + 1e-5 * n}
    g = GrammarCosts(StructuredOutput(share=0.5), curves, 1.0)
    assert g.measured and g.mask_s(4) == pytest.approx(4e-5) and g.accept_s(4) == pytest.approx(4e-5)
    curves["grammar.process"] = lambda n: 1e-4  # cheaper than plain (noise): no negative accept
    assert GrammarCosts(StructuredOutput(share=0.5), curves, 1.0).accept_s(4) == 0.0
    assert g.sample_s(4) == 0.0  # no grammar.sample: none
    curves["grammar.sample"] = lambda n: 5e-5 * n
    assert GrammarCosts(StructuredOutput(share=0.5), curves, 2.0).sample_s(4) == pytest.approx(4e-4)


def test_the_cpu_engine_pays_the_masked_sampler_on_its_thread(tmp_path):
    """A CPU profile with grammar.sample: under both loops the step gains mask + sampler + accept."""
    from calibrate.profile import build_profile
    from tests.calibrate_helpers import synthetic_profile

    def profile(extra):
        prof = synthetic_profile({"forward.decode": lambda n, c: 4e-3, "process.decode": lambda n: 4e-4})
        prof = build_profile(prof["metadata"], prof["samples"] + [
            {"curve": name, "point": {"num_reqs": n}, "times_s": [f(n)]} for name, f in extra.items() for n in (1, 64)])
        prof["metadata"]["device"] = "cpu"
        path = tmp_path / f"p{len(extra)}.json"
        path.write_text(json.dumps(prof))
        return str(path)

    grammar = {"grammar.mask": lambda n: 1e-4, "grammar.process": lambda n: 4e-4 + 3e-5 * n,
               "grammar.sample": lambda n: 2e-4}
    for setting in ("normal", "overlap"):
        steps = []
        for extra, share in (({}, 0.0), (grammar, 1.0)):
            scen = constant_scenario(server__device="cpu", server__structured_output={"share": share}, output_len=60,
                                     costs={"profile": profile(extra)})
            steps.append(steady_decode(sim.simulate(scen, setting))[0])
        np.testing.assert_allclose(steps[1] - steps[0], 1e-4 + 2e-4 + C * 3e-5, rtol=1e-6)


# --- invariants ------------------------------------------------------------------------------

@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(share=st.floats(0.0, 1.0), seed=st.integers(0, 2 ** 31), c=st.integers(1, 8),
       setting=st.sampled_from(["normal", "overlap"]), finish=st.sampled_from(["length", "eos"]),
       pool=st.sampled_from([400_000, 1200]))
def test_free_grammars_change_nothing_and_costly_ones_only_slow(share, seed, c, setting, finish, pool):
    """Zero mask and accept costs give the plain answer byte for byte (the leap, which steps
    aside for grammars, included); positive ones keep every request's tokens and never shorten
    the run."""
    plain = constant_scenario(c=c, num_requests=3 * c, finish=finish,
                              input_len={"dist": "uniform", "low": 8, "high": 200},
                              output_len={"dist": "uniform", "low": 1, "high": 60})
    plain["server"]["kv_pool_tokens"] = pool
    plain["seed"] = seed
    base = sim.simulate(plain, setting)
    free = json.loads(json.dumps(plain))
    free["server"]["structured_output"] = {"share": share, "mask_us_per_request": 0, "accept_us_per_request": 0}
    assert _summary(sim.simulate(free, setting)) == _summary(base)
    costly = json.loads(json.dumps(free))
    costly["server"]["structured_output"].update(mask_us_per_request=300, accept_us_per_request=50)
    res = sim.simulate(costly, setting)
    assert (res.requests["output_len"].to_numpy() == base.requests["output_len"].to_numpy()).all()
    assert res.summary()["duration_s"] >= base.summary()["duration_s"] * (1 - 1e-12)


def test_the_leap_steps_aside_for_grammars():
    res = sim.simulate(scenario(50.0, 30.0, num_requests=40), "overlap")
    assert res.stats["leapt_steps"] == 0
    assert sim.simulate(scenario(50.0, 30.0, share=0.0, num_requests=40), "overlap").stats["leapt_steps"] > 0


# --- refusals and what every run says --------------------------------------------------------

@pytest.mark.parametrize("bad, words", [({"share": 1.5}, "share"), ({"share": float("nan")}, "share"),
                                        ({"share": 0.5, "kind": "xml"}, "kind"),
                                        ({"share": 0.5, "mask_us_per_request": -1}, "mask_us_per_request"),
                                        ({"share": 0.5, "bitmask_us_per_request": 1}, "bitmask_us_per_request")])
def test_bad_sections_are_refused_by_field(bad, words):
    with pytest.raises(ScenarioError) as err:
        sim.load_scenario(constant_scenario(server__structured_output=bad))
    assert words in str(err.value)


@pytest.mark.parametrize("setting", ["overlap_mlx", "thread_overlap"])
def test_loops_without_the_delayed_sampling_are_refused(setting):
    with pytest.raises(ScenarioError) as err:
        sim.load_scenario(scenario(50.0, 30.0, settings=(setting, "normal")))
    assert "structured_output" in str(err.value) and setting in str(err.value)


def test_unknown_costs_are_refused_naming_the_section():
    scen = constant_scenario(server__structured_output={"share": 0.5})
    with pytest.raises(ScenarioError) as err:
        sim.simulate(scen, "overlap")
    assert "server.structured_output" in str(err.value) and "--structured-output" in str(err.value)


def test_every_run_says_where_the_grammar_costs_come_from(tmp_path, run_cli):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(scenario(50.0, 30.0, share=0.5)))
    code, out, _ = run_cli(["run", str(path), "--out", str(tmp_path / "o"), "--no-plots"])
    assert code == 0 and "50% of the requests carry a json_schema grammar" in out
    assert "given 50/30 us per constrained request" in out and "not measured" in out


# --- the calibration's samples, by hand ------------------------------------------------------

def test_the_samples_keep_fully_constrained_masks_and_decode_processing():
    from calibrate.real.sglang_structured import job, sample_excess, samples

    recs = [{"ph": "mask", "cpu": 5e-5, "n": 4, "bs": 4}, {"ph": "mask", "cpu": 9e-5, "n": 3, "bs": 4},
            {"ph": "mask", "cpu": 3e-6, "n": 0, "bs": 2},
            {"ph": "process", "cpu": 2e-4, "batch": {"mode": "DECODE", "bs": 4}},
            {"ph": "process", "cpu": 7e-4, "batch": {"mode": "EXTEND", "bs": 4}},
            {"ph": "process", "cpu": 1e-4, "batch": {"mode": "DECODE", "bs": 3}}]
    got = {(s["curve"], s["point"]["num_reqs"]): s["times_s"] for s in samples(recs, {1, 4})}
    assert got == {("grammar.mask", 4): [5e-5], ("grammar.process", 4): [2e-4]}
    plain = [{"ph": "mask", "cpu": 2e-6, "n": 0, "bs": 4}, {"ph": "sample", "cpu": 8e-5},
             {"ph": "mask", "cpu": 2e-6, "n": 0, "bs": 4}, {"ph": "sample", "cpu": 1e-4}]
    constrained = [{"ph": "mask", "cpu": 5e-5, "n": 4, "bs": 4}, {"ph": "sample", "cpu": 4e-4},
                   {"ph": "mask", "cpu": 5e-5, "n": 3, "bs": 4}, {"ph": "sample", "cpu": 9e-4},
                   {"ph": "mask", "cpu": 5e-5, "n": 4, "bs": 4}, {"ph": "sample", "cpu": 1e-4}]
    (exc,) = sample_excess(constrained, plain, {4})
    assert exc["curve"] == "grammar.sample" and exc["times_s"] == pytest.approx([4e-4 - 5e-5 - 8.8e-5, 0.0])  # plain median (7.8e-5 + 9.8e-5) / 2
    from types import SimpleNamespace

    grid = SimpleNamespace(server_args=lambda: ["--x"], decode_batch_sizes=(1, 2), decode_waves=2, seed=0)
    j = job("/m", True, grid)
    assert len(j["requests"]) == 2 * 2 * 3 and all(r["json_schema"] for r in j["requests"])
    assert [len(w) for w in j["arrival"]["waves"]] == [1, 2, 1, 2] * 2
    assert len({r["sampling_seed"] for r in j["requests"]}) == len(j["requests"])


def test_the_own_client_sends_sglang_its_schema_sampled():
    from realengines.client import _sglang_body

    _, body = _sglang_body({"rid": "q3", "input_ids": [5, 6], "max_new_tokens": 8,
                            "structured_outputs": {"json": {"type": "object"}}})
    p = body["sampling_params"]
    assert json.loads(p["json_schema"]) == {"type": "object"} and p["temperature"] == 1.0
    assert isinstance(p["sampling_seed"], int)


def test_advise_points_a_grammar_backend_flag_at_the_scenario_key(run_cli):
    code, out, _ = run_cli(["advise", "--device", "cuda", "--", "--model-path", "m", "--grammar-backend", "xgrammar"])
    assert code == 0 and "server.structured_output" in out.replace("\n", " ")


def _decode_run(n_iters: int, launch: float, delayed: float, mask_n: int, bs: int = 2) -> list[dict]:
    """Tracer records of ``n_iters`` decode iterations at batch size ``bs``, back to back:
    recv 0.1 ms, schedule 0.2, run_batch (forward 5 ms, sample 0.1 inside; ``launch`` ms of its
    own), process 0.3, then ``delayed`` ms outside every phase (under overlap, the delayed
    sampling: its mask record with ``mask_n`` live rows of ``bs``)."""
    recs, t = [], 0.0
    for k in range(n_iters):
        def rec(ph, dur_ms, **kw):
            nonlocal t
            r = {"ph": ph, "t0": t, "dur": dur_ms * 1e-3, "cpu": dur_ms * 1e-3, **kw}
            t += dur_ms * 1e-3
            return r
        recs.append(rec("recv", 0.1, n=0))
        recs.append(rec("schedule", 0.2, batch={"mode": "DECODE", "rids": ["a", "b"][:bs], "ctx": 100}))
        start = t
        fwd = rec("forward", 5.0, mode="DECODE", bs=bs)
        m = rec("mask", 0.01, n=0, bs=bs)
        smp = rec("sample", 0.1)
        t += launch * 1e-3
        recs += [fwd, m, smp, {"ph": "run_batch", "t0": start, "dur": t - start, "cpu": t - start,
                               "batch": {"iter": k, "mode": "DECODE", "bs": bs}}]
        recs.append(rec("process", 0.3, batch={"iter": k, "mode": "DECODE", "bs": bs}))
        if delayed:
            recs.append(rec("mask", 0.05, n=mask_n, bs=bs))
            t += (delayed - 0.05) * 1e-3
    return recs


def test_the_delayed_sampling_is_priced_from_the_time_outside_the_phases():
    """Overlap (hand-computed): the constrained run's iterations have 0.9 ms outside every phase
    where the plain run's have none; its launch is 0.05 ms shorter (the result copy moved into
    the delayed call). grammar.sample = 0.9 - mask 0.05 - plain sampler (0.1 less its 0.01 ms
    mask call) - 0.05 = 0.71 ms."""
    from calibrate.real.sglang_structured import delayed_excess

    plain = _decode_run(12, launch=0.25, delayed=0.0, mask_n=0)
    constrained = _decode_run(12, launch=0.20, delayed=0.9, mask_n=2)
    (got,) = delayed_excess(constrained, plain, {2})
    assert got["curve"] == "grammar.sample" and got["point"] == {"num_reqs": 2}
    assert got["times_s"][1:-1] == pytest.approx([0.71e-3] * (len(got["times_s"]) - 2), abs=1e-9)


def test_the_committed_host_file_gives_the_readme_examples_costs():
    """benchmarks/results/host-sglang-structured.json (the stubbed calibration of 4 December):
    at 8 requests under normal, the README's 5.3 us mask and 5.9 us accept per request."""
    from pathlib import Path

    from sim.model.profile import SGLANG_HOST_CURVES, load_profile, profile_curves

    root = Path(__file__).resolve().parents[1]
    c = profile_curves(load_profile(root / "benchmarks" / "results" / "host-sglang-structured.json", SGLANG_HOST_CURVES),
                       "median", None, SGLANG_HOST_CURVES)
    assert c["grammar.mask"](8) / 8 * 1e6 == pytest.approx(5.3, abs=0.05)
    assert (c["grammar.process"](8) - c["process.decode"](8)) / 8 * 1e6 == pytest.approx(5.9, abs=0.05)
    readme = (root / "README.md").read_text()
    assert "mask_us_per_request=5.3" in readme and "accept_us_per_request=5.9" in readme


def test_the_committed_cpu_profile_prices_grammars(tmp_path):
    """benchmarks/results/profile-sglang-cpu-structured.json: every grammar curve, both loops."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "profile-sglang-cpu-structured.json"
    scen = constant_scenario(server__device="cpu", server__structured_output={"share": 1.0}, costs={"profile": str(path)},
                             c=4, num_requests=8)
    for setting in ("normal", "overlap"):
        res = sim.simulate(scen, setting)
        assert res.summary()["completed"] == 8
        g = GrammarCosts(StructuredOutput(share=1.0), sim.model.costs.make_cost_model(sim.load_scenario(scen),
                                                                                        setting).curves, 1.0)
        assert g.measured and g.mask_s(4) > 0 and g.sample_s(4) > 0


def test_every_structured_run_says_how_far_the_model_was_checked():
    from sim.engines.sglang.structured import StructuredOutput as SGLangSection
    from sim.engines.vllm.structured import StructuredOutput as VllmSection

    sglang = SGLangSection(share=0.5, mask_us_per_request=5, accept_us_per_request=6).caveats(None)
    vllm = VllmSection(share=1.0, bitmask_us_per_request=5, apply_us_per_request=4,
                       accept_us_per_request=6).caveats({"kind": "json_schema"})
    assert len(sglang) == len(vllm) == 1
    assert "SGLang 0.5.23's CPU server on a 2-core host" in sglang[0] and "3.2 points" in sglang[0]
    assert "vLLM 0.32's CPU server on a 2-core host" in vllm[0] and "not validated on a host with a core" in vllm[0]
