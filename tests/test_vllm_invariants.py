"""Invariants of any simulated vLLM run over random small scenarios (hypothesis), and NaN,
infinite and extreme inputs rejected cleanly (one error naming the field, never a hang)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim
from sim.errors import ProfileError, ScenarioError
from tests.vllm_helpers import make_profile, vllm_scenario


@st.composite
def scenarios(draw):
    n = draw(st.integers(2, 16))
    block = draw(st.sampled_from([4, 16]))
    max_model_len = 256
    input_hi = draw(st.integers(1, 200))
    return {
        "name": "random-vllm", "seed": draw(st.integers(0, 2**16)),
        "workload": {
            "arrival": draw(st.sampled_from(["closed_loop", "poisson"])), "concurrency": draw(st.integers(1, 10)),
            "rate_per_s": draw(st.floats(20.0, 2000.0)), "num_requests": n,
            "warmup_requests": draw(st.integers(0, n - 1)),
            "input_len": {"dist": "uniform", "low": 1, "high": input_hi},
            "cached_len": draw(st.integers(0, min(64, input_hi))),  # a cached prefix is part of the prompt
            "output_len": {"dist": "uniform", "low": 1, "high": draw(st.integers(1, 60))},
            "finish": draw(st.sampled_from(["length", "eos"])),
        },
        "server": {
            "engine": "vllm", "device": draw(st.sampled_from(["cpu", "cuda"])), "settings": ["async", "sync"],
            "max_num_seqs": draw(st.integers(1, 8)), "max_num_batched_tokens": draw(st.integers(max_model_len, 600)),
            "max_model_len": max_model_len, "block_size": block,
            "num_gpu_blocks": max_model_len // block + 1 + draw(st.integers(0, 60)),
            "enable_chunked_prefill": draw(st.booleans()), "enable_prefix_caching": draw(st.booleans()),
            "long_prefill_token_threshold": draw(st.sampled_from([0, 32])),
        },
        "costs": {"gpu": {"decode": {"base": draw(st.floats(1e-4, 5e-3)), "per_req": 1e-5},
                          "prefill": {"base": 1e-3, "per_token": draw(st.floats(0, 1e-5))}},
                  "cpu": {"schedule": {"base": draw(st.floats(1e-5, 3e-3)), "per_req": 1e-6},
                          "process": {"base": draw(st.floats(1e-5, 3e-3))}},
                  "noise": {"gpu_cv": draw(st.sampled_from([0.0, 0.1])), "cpu_cv": draw(st.sampled_from([0.0, 0.3]))}},
    }


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_run_finishes_consistently(raw):
    scen = sim.load_scenario(raw)
    srv = scen.server
    for setting in ("async", "sync"):
        res = sim.simulate(scen, setting)
        req, steps = res.requests, res.steps
        assert (req["status"] == "completed").all()
        max_tokens = srv.max_model_len - req["input_len"]
        assert (req["output_tokens"] == np.minimum(req["output_len"], max_tokens)).all()
        assert (req["first_token_s"] > req["arrival_s"]).all() and (req["finish_s"] >= req["first_token_s"]).all()
        assert (steps["num_tokens"] <= srv.max_num_batched_tokens).all()
        assert (steps["num_reqs"] <= srv.max_num_seqs).all() and (steps["num_reqs"] >= 1).all()
        assert (steps["forward_start"].iloc[1:].to_numpy() >= steps["forward_end"].iloc[:-1].to_numpy() - 1e-12).all()
        for a, b in [("schedule_start", "schedule_end"), ("launch_start", "launch_end"), ("launch_end", "forward_start"),
                     ("forward_start", "forward_end"), ("forward_end", "process_start"), ("process_start", "process_end")]:
            assert (steps[b] >= steps[a] - 1e-12).all(), (a, b)
        assert 0 <= res.outcome["peak_token_usage"] <= 1
        if setting == "sync":
            assert steps["overshoot"].sum() == 0
        s = res.summary()
        assert s["completed"] == len(req) - int(req["warmup"].sum()) and s["output_throughput"] > 0


def _bad(path: str, value):
    raw = vllm_scenario()
    node = raw
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return raw


@pytest.mark.parametrize("path,value", [
    ("server.max_num_seqs", math.nan), ("server.max_num_seqs", math.inf), ("server.max_num_seqs", 0),
    ("server.max_num_seqs", 10**30), ("server.max_num_batched_tokens", -1), ("server.max_num_batched_tokens", "x"),
    ("server.block_size", math.inf), ("server.block_size", 0), ("server.num_gpu_blocks", 1),
    ("server.num_gpu_blocks", 10**30), ("server.max_model_len", math.nan), ("server.max_model_len", 1),
    ("server.long_prefill_token_threshold", -5), ("server.enable_chunked_prefill", "maybe"),
    ("server.settings", ["overlap"]), ("server.settings", ["sync", "sync"]), ("server.device", "mlx"),
    ("server.version", "0.11.0"),
])
def test_bad_server_values_are_one_clean_error(path, value):
    with pytest.raises(ScenarioError) as err:
        sim.load_scenario(_bad(path, value))
    assert err.value.field.startswith(path.rsplit(".", 1)[0]) and "\n" not in str(err.value)


@pytest.mark.parametrize("where,value", [("nan", math.nan), ("inf", math.inf), ("negative", -1.0), ("huge", 1e9)])
def test_bad_profile_times_are_rejected(tmp_path, where, value):
    prof = make_profile()
    prof["curves"]["vllm.update"]["values_s"][0] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    with pytest.raises(ProfileError) as err:
        sim.load_scenario(vllm_scenario(profile=str(path)))
    assert err.value.field == "curves.vllm.update.values_s[0]"


def test_a_forward_must_take_time(tmp_path):
    prof = make_profile({"forward": 0.0})
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    with pytest.raises(ProfileError, match="a forward takes time"):
        sim.load_scenario(vllm_scenario(profile=str(path)))


def test_extreme_but_valid_sizes_run_quickly():
    """A huge pool, budget and context: nothing is allocated up front, the run stays small."""
    raw = vllm_scenario(c=2, output_len=3, server__num_gpu_blocks=10**12, server__max_model_len=10**9,
                        server__max_num_batched_tokens=10**9, server__max_num_seqs=10**8)
    res = sim.simulate(raw, "async")
    assert (res.requests["status"] == "completed").all() and res.outcome["peak_token_usage"] < 1e-9
