"""The leap over vLLM's steady decode runs (:mod:`sim.engines.vllm.leap`) changes no answer.

Every case runs with the leap and through the processes step by step (``leap=False``) and compares
the outputs byte for byte (:func:`tests.test_leap.assert_same`: the summary, the outcome and the
steps, requests and ITL tables). Hand-checked cases first (where the leap must and must not apply),
then a hypothesis-generated family: closed and open loop, warm-up, lengths, finishes by EOS and by
length, ``max_model_len`` caps, KV pressure with preemption, prefix hits (private and shared),
chunked prefill and the long-prefill threshold, noise, inline costs and a calibration profile
(its API server, pickups and collect), both settings.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

import sim
from tests.test_leap import assert_same, draw_workload

ROOT = Path(__file__).resolve().parents[1]
PROFILE = str(ROOT / "scenarios" / "profiles" / "h200-vllm-llama-3.2-1b.json")


def vllm(**workload) -> dict:
    base = {"arrival": "closed_loop", "concurrency": 4, "num_requests": 16, "warmup_requests": 2,
            "input_len": 64, "output_len": 40, "finish": "length"}
    return {"name": "vllm-leap", "seed": 1, "workload": {**base, **workload},
            "server": {"engine": "vllm", "settings": ["async", "sync"]}}


# --- hand-checked cases --------------------------------------------------------------------------
def test_a_lone_request_is_leapt_over_its_decodes():
    """One request of 40 tokens, closed loop: its prefill step, then 39 decode steps, of which the
    leap takes all but those next to the prefill and to the finish (37 in each setting's loop;
    async scheduling also counts the empty steps it schedules once the request is done)."""
    scenario = sim.load_scenario(vllm(concurrency=1, num_requests=1, warmup_requests=0))
    for setting in ("sync", "async"):
        res = sim.simulate(scenario, setting)
        assert res.stats["leapt_steps"] == 37 and len(res.steps) == 40
        assert sim.simulate(scenario, setting, leap=False).stats["leapt_steps"] == 0
        assert_same(scenario, setting)


def test_no_leap_where_the_loop_has_none():
    """vLLM's CPU platform (the forward holds the worker), speculative decoding and structured
    output run step by step throughout."""
    for name in ("vllm-cpu", "vllm-h200-eagle"):
        scenario = sim.load_scenario(ROOT / "scenarios" / f"{name}.yaml")
        assert all(sim.simulate(scenario, s, tables="none").stats["leapt_steps"] == 0 for s in ("sync", "async"))
    raw = vllm()
    raw["server"]["structured_output"] = {"share": 0.5, "bitmask_us_per_request": 20, "apply_us_per_request": 10,
                                          "accept_us_per_request": 15}
    assert sim.simulate(sim.load_scenario(raw), "async", tables="none").stats["leapt_steps"] == 0


def test_the_leap_takes_most_steps_of_a_steady_closed_loop():
    raw = vllm(concurrency=8, num_requests=64, output_len=200)
    raw["costs"] = {"profile": PROFILE}
    scenario = sim.load_scenario(raw)
    for setting in ("sync", "async"):
        res = sim.simulate(scenario, setting, tables="none")
        assert res.stats["leapt_steps"] > 0.8 * res.stats["steps"]
        assert_same(scenario, setting)


def test_preemption_and_noise_are_unchanged():
    """A KV cache that forces preemption (the leap stops before a step that cannot get its
    blocks) and jitter on every phase (the draws of a step the leap does not take are given
    back)."""
    raw = vllm(arrival="poisson", rate_per_s=200.0, num_requests=120, output_len=200, input_len=300)
    raw["server"].update(num_gpu_blocks=300, max_model_len=1024)
    raw["costs"] = {"noise": {"gpu_cv": 0.2, "cpu_cv": 0.3}}
    scenario = sim.load_scenario(raw)
    for setting in ("sync", "async"):
        res = sim.simulate(scenario, setting, tables="none")
        assert res.outcome["retractions"] > 0 and res.stats["leapt_steps"] > 0
        assert_same(scenario, setting)
        assert_same(scenario, setting, tables="summary")


# --- a generated family ------------------------------------------------------------------------
@st.composite
def scenarios(draw) -> dict:
    workload = {**draw_workload(draw), "prefix_sharing": draw(st.sampled_from(["private", "shared"]))}
    block = draw(st.sampled_from([1, 16, 64]))
    max_len = draw(st.sampled_from([2048, 8192]))
    blocks = draw(st.sampled_from([None, 12_000 // block + 2, 3_000 // block + 2]))
    server = {"engine": "vllm", "settings": ["async", "sync"], "block_size": block, "max_model_len": max_len,
              "max_num_seqs": draw(st.integers(1, 32)), "long_prefill_token_threshold": draw(st.sampled_from([0, 32])),
              "max_num_batched_tokens": draw(st.sampled_from([2048, 4096]))}
    if blocks is not None and (blocks - 1) * block >= max_len:
        server["num_gpu_blocks"] = blocks
    costs = {"noise": {"gpu_cv": draw(st.sampled_from([0.0, 0.0, 0.1])), "cpu_cv": draw(st.sampled_from([0.0, 0.2]))},
             "gpu": {"decode": {"base": draw(st.floats(1e-4, 0.03)), "per_req": draw(st.floats(0, 1e-4)),
                                "per_ctx_token": draw(st.floats(0, 1e-7))}},
             "cpu": {"process": {"base": draw(st.floats(1e-5, 5e-3)), "per_req": draw(st.floats(0, 5e-5))}}}
    if draw(st.integers(0, 2)) == 0:  # a calibration profile: the API server, pickups, collect, reach counters
        costs = {"profile": PROFILE, "noise": costs["noise"]}
    return {"name": "vllm-leap-family", "seed": draw(st.integers(0, 3)), "workload": workload, "server": server,
            "costs": costs}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=scenarios(), setting=st.sampled_from(["sync", "async"]), tables=st.sampled_from(["steps", "none"]))
def test_generated_vllm_runs_are_unchanged(raw, setting, tables):
    assert_same(sim.load_scenario(raw), setting, tables)
