"""Invariants of any simulated run, over random small scenarios (hypothesis)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim

LOOPS = ["normal", "overlap", "overlap_mlx"]


@st.composite
def scenarios(draw):
    arrival = draw(st.sampled_from(["closed_loop", "poisson"]))
    n = draw(st.integers(2, 24))
    input_len = draw(st.integers(2, 300))
    return {
        "name": "random",
        "seed": draw(st.integers(0, 2**16)),
        "workload": {
            "arrival": arrival,
            "concurrency": draw(st.integers(1, 12)),
            "rate_per_s": draw(st.floats(5.0, 500.0)),
            "num_requests": n,
            "warmup_requests": draw(st.integers(0, n - 1)),
            "input_len": {"dist": "uniform", "low": 2, "high": input_len},
            "cached_len": draw(st.integers(0, min(200, input_len))),  # a cached prefix is part of the prompt
            "output_len": {"dist": "uniform", "low": 1, "high": draw(st.integers(1, 60))},
            "finish": draw(st.sampled_from(["length", "eos"])),
        },
        "server": {
            "settings": LOOPS,
            "max_running_requests": draw(st.integers(1, 16)),
            "chunked_prefill_size": draw(st.integers(16, 512)),
            "retraction": draw(st.sampled_from(["naive", "v0.5.22"])),
            "disable_consecutive_prefill_overlap": draw(st.booleans()),
        },
        "costs": {
            "gpu": {"decode": {"base": draw(st.floats(1e-4, 5e-3)), "per_req": 1e-5, "per_ctx_token": 1e-8},
                    "prefill": {"base": 1e-3, "per_token": draw(st.floats(0, 1e-5))},
                    "overlap_residue": draw(st.floats(0, 1e-4))},
            "cpu": {"schedule": {"base": draw(st.floats(1e-5, 3e-3)), "per_req": 1e-6},
                    "process": {"base": draw(st.floats(1e-5, 3e-3)), "per_req": 1e-6}},
            "noise": {"gpu_cv": draw(st.sampled_from([0.0, 0.1])), "cpu_cv": draw(st.sampled_from([0.0, 0.3]))},
        },
    }


def cpu_intervals(steps: pd.DataFrame) -> np.ndarray:
    iv = np.vstack([steps[["recv_start", "schedule_end"]].to_numpy(), steps[["launch_start", "launch_end"]].to_numpy(),
                    steps[["sync_start", "process_end"]].to_numpy()])
    return iv[np.argsort(iv[:, 0], kind="stable")]


def check_run(res: sim.Result):
    req, steps = res.requests, res.steps
    assert (req["status"] == "completed").all()
    assert (req["output_tokens"] == req["output_len"]).all()
    assert (req["first_token_s"] >= req["arrival_s"]).all()
    assert (req["finish_s"] >= req["first_token_s"]).all()
    # the device runs one forward at a time, in launch order, each after its launch
    assert (steps["forward_start"].to_numpy()[1:] >= steps["forward_end"].to_numpy()[:-1] - 1e-12).all()
    assert (steps["forward_start"] >= steps["launch_end"] - 1e-12).all()
    # results are read only after the forward ended
    assert (steps["process_start"] >= steps["forward_end"] - 1e-12).all()
    # one scheduler thread: its phases never overlap
    iv = cpu_intervals(steps)
    assert (iv[1:, 0] >= iv[:-1, 1] - 1e-12).all()
    # tokens: every computed token is delivered or discarded as overshoot
    decode_tokens = int(steps.loc[steps["kind"] == "decode", "num_reqs"].sum())
    assert decode_tokens + len(req) == int(req["output_tokens"].sum()) + int(steps["overshoot"].sum())
    assert (steps["kv_used"] <= res.scenario.server.kv_pool_tokens).all()
    if res.setting == "normal":
        assert int(steps["overshoot"].sum()) == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_invariants_hold_for_every_loop(raw):
    scenario = sim.load_scenario(raw)
    results = [sim.simulate(scenario, s) for s in LOOPS]
    for res in results:
        check_run(res)
    # the settings see the same requests (common random numbers)
    for res in results[1:]:
        pd.testing.assert_series_equal(res.requests["input_len"], results[0].requests["input_len"])


def test_same_seed_same_result_other_seed_differs():
    raw = {"name": "det", "seed": 7, "workload": {"arrival": "poisson", "rate_per_s": 50, "num_requests": 40,
                                                  "input_len": {"dist": "lognormal", "mean": 200, "sigma": 0.8},
                                                  "output_len": {"dist": "uniform", "low": 5, "high": 50}},
           "costs": {"noise": {"gpu_cv": 0.1, "cpu_cv": 0.2}}}
    a = sim.simulate(raw, "overlap")
    b = sim.simulate(raw, "overlap")
    pd.testing.assert_frame_equal(a.steps, b.steps)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert a.summary() == b.summary()
    raw["seed"] = 8
    c = sim.simulate(raw, "overlap")
    assert not a.requests["input_len"].equals(c.requests["input_len"])
