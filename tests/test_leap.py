"""The leap over steady decode runs (:mod:`sim.engines.sglang.leap`) changes no answer.

Every case runs twice, with the leap and step by step (``leap=False``), and compares the outputs
byte for byte: the summary (as JSON), and with ``tables='steps'`` the steps, requests and ITL
tables as CSV text. Hand-checked cases first (where the leap must and must not apply), then a
hypothesis-generated family: arrivals (Poisson, closed loop, warm-up before the benchmark),
lengths, finishes by EOS and by length, KV pressure with each retraction policy, prefix hits,
pages, sync latency, the after-wait scale, jitter, every SGLang setting, and vLLM's loops.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import sim
from sim.engines.sglang import leap as leap_module

ROOT = Path(__file__).resolve().parents[1]
SGLANG_SETTINGS = ["normal", "overlap", "overlap_mlx", "thread_overlap"]


def outputs(scenario, setting: str, tables: str, leap: bool) -> dict:
    """What a run gives a user: the summary, the outcome and, with tables, the three tables as CSV."""
    res = sim.simulate(scenario, setting, tables=tables, leap=leap)
    out = {"summary": json.dumps(res.summary(), sort_keys=True, default=str),
           "outcome": json.dumps(res.outcome, sort_keys=True, default=str),
           "stats": (res.stats["steps"], res.stats.get("decode_steps"), repr(res.stats["sim_time_s"]))}
    if tables == "steps":
        out.update(steps=res.steps.to_csv(), requests=res.requests.to_csv(), itl=res.itl.to_csv())
    return out


def assert_same(scenario, setting: str, tables: str = "steps") -> None:
    leapt, stepped = outputs(scenario, setting, tables, True), outputs(scenario, setting, tables, False)
    for key in stepped:
        assert leapt[key] == stepped[key], f"{setting} tables={tables}: {key} differs with the leap"


class Counter:
    """Counts the iterations the leap takes (patched over both loops' entry points)."""

    def __init__(self, monkeypatch):
        self.leapt = 0
        overlap, normal = leap_module.Leap.overlap, leap_module.Leap.normal

        def counted_overlap(leap, now, last):
            out = overlap(leap, now, last)
            self.leapt += out[2]
            return out

        def counted_normal(leap, now):
            out = normal(leap, now)
            self.leapt += out[1]
            return out

        monkeypatch.setattr(leap_module.Leap, "overlap", counted_overlap)
        monkeypatch.setattr(leap_module.Leap, "normal", counted_normal)


def closed_loop(**workload) -> dict:
    base = {"arrival": "closed_loop", "concurrency": 4, "num_requests": 16, "warmup_requests": 2,
            "input_len": 64, "output_len": 40, "finish": "length"}
    return {"name": "leap", "seed": 1, "workload": {**base, **workload},
            "server": {"settings": ["overlap", "normal"], "kv_pool_tokens": 100_000}}


# --- hand-checked cases --------------------------------------------------------------------------
def test_a_lone_request_is_leapt_over_all_but_its_first_decodes(monkeypatch):
    """One request of 40 output tokens, closed loop: a prefill, then 39 decodes. Step by step the
    first decode (its member fresh from the prefill) and, under overlap, the iteration that
    processes it run through the loop; the leap takes the other decodes."""
    count = Counter(monkeypatch)
    scenario = sim.load_scenario(closed_loop(concurrency=1, num_requests=1, warmup_requests=0))
    res = sim.simulate(scenario, "normal", leap=True)
    assert res.stats["decode_steps"] == 39
    assert count.leapt == 38  # decode 0 carries the fresh member; 1..38 are leapt
    count.leapt = 0
    res = sim.simulate(scenario, "overlap", leap=True)
    assert res.stats["decode_steps"] == 39
    # overlap: iteration k schedules decode k and processes k-1; the leap starts with decode 0
    # in flight (processed by the policy's own path) and stops before the finished request's
    # result would leave the loop with nothing to run
    assert 36 <= count.leapt <= 38
    for setting in ("normal", "overlap"):
        assert_same(scenario, setting)


def test_no_leap_where_the_loop_has_none(monkeypatch):
    """The MLX chain, thread_overlap, SGLang's CPU engine and vLLM run step by step throughout."""
    count = Counter(monkeypatch)
    for setting in ("overlap_mlx", "thread_overlap"):
        sim.simulate(sim.load_scenario(closed_loop()), setting)
    cpu = closed_loop()
    cpu["server"]["device"] = "cpu"
    for setting in ("normal", "overlap"):
        sim.simulate(sim.load_scenario(cpu), setting)
    assert count.leapt == 0


def test_the_leap_takes_most_steps_of_a_steady_closed_loop(monkeypatch):
    count = Counter(monkeypatch)
    scenario = sim.load_scenario(closed_loop(concurrency=8, num_requests=64, output_len=200))
    res = sim.simulate(scenario, "overlap", tables="none")
    assert count.leapt > 0.9 * res.stats["steps"]


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_scenarios_are_unchanged(path):
    scenario = sim.load_scenario(path)
    for setting in scenario.server.settings:
        assert_same(scenario, setting)
        assert_same(scenario, setting, tables="none")


def test_kv_pressure_with_retraction_is_unchanged():
    """Pages, a pool that forces retraction, each retraction policy (the naive one kills the server)."""
    for policy in ("naive", "v0.5.10", "v0.5.22"):
        raw = closed_loop(concurrency=16, num_requests=48, input_len=200, output_len=300, finish="length")
        raw["server"].update(kv_pool_tokens=4096, page_size=16, retraction=policy)
        scenario = sim.load_scenario(raw)
        for setting in ("normal", "overlap"):
            assert_same(scenario, setting)


def test_jitter_draws_are_the_step_by_step_ones():
    raw = closed_loop(concurrency=6, num_requests=30)
    raw["costs"] = {"noise": {"gpu_cv": 0.2, "cpu_cv": 0.3}, "cpu": {"after_wait_scale": 1.7},
                    "gpu": {"sync_latency": 2.0e-5}}
    scenario = sim.load_scenario(raw)
    for setting in ("normal", "overlap"):
        assert_same(scenario, setting)
        assert_same(scenario, setting, tables="summary")


# --- a generated family ------------------------------------------------------------------------
lengths = st.one_of(st.integers(1, 300), st.fixed_dictionaries(
    {"dist": st.just("lognormal"), "mean": st.integers(20, 200), "sigma": st.floats(0.1, 1.0), "max": st.just(600)}))


@st.composite
def scenarios(draw) -> dict:
    arrival = draw(st.sampled_from(["closed_loop", "poisson"]))
    n = draw(st.integers(2, 40))
    input_len = draw(st.integers(1, 400))
    workload = {"arrival": arrival, "num_requests": n, "warmup_requests": draw(st.integers(0, n - 1)),
                "concurrency": draw(st.integers(1, 16)), "rate_per_s": draw(st.floats(1.0, 400.0)),
                "input_len": input_len, "cached_len": draw(st.integers(0, input_len)),
                "output_len": draw(lengths), "finish": draw(st.sampled_from(["length", "eos"])),
                "warmup_before_benchmark": arrival == "closed_loop" and draw(st.booleans())}
    page = draw(st.sampled_from([1, 1, 4, 16]))
    pool = draw(st.sampled_from([200_000, 8_192, 3_072, 1_600]))
    server = {"settings": ["overlap"], "kv_pool_tokens": pool // page * page, "page_size": page,
              "max_running_requests": draw(st.integers(1, 32)),
              "chunked_prefill_size": draw(st.sampled_from([64, 512, 8192])),
              "retraction": draw(st.sampled_from(["naive", "v0.5.10", "v0.5.22"]))}
    costs = {"noise": {"gpu_cv": draw(st.sampled_from([0.0, 0.0, 0.1])), "cpu_cv": draw(st.sampled_from([0.0, 0.2]))},
             "gpu": {"decode": {"base": draw(st.floats(1e-4, 0.03)), "per_req": draw(st.floats(0, 1e-4)),
                                "per_ctx_token": draw(st.floats(0, 1e-7))},
                     "sync_latency": draw(st.sampled_from([0.0, 3e-5]))},
             "cpu": {"process": {"base": draw(st.floats(1e-5, 5e-3)), "per_req": draw(st.floats(0, 5e-5))},
                     "after_wait_scale": draw(st.sampled_from([1.0, 1.0, 1.5]))}}
    return {"name": "leap-family", "seed": draw(st.integers(0, 3)), "workload": workload, "server": server,
            "costs": costs}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=scenarios(), setting=st.sampled_from(SGLANG_SETTINGS), tables=st.sampled_from(["steps", "none"]))
def test_generated_sglang_runs_are_unchanged(raw, setting, tables):
    scenario = sim.load_scenario(raw)
    assert_same(scenario, setting, tables)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=scenarios(), setting=st.sampled_from(["sync", "async"]))
def test_vllm_runs_ignore_the_flag(raw, setting):
    raw["server"] = {"engine": "vllm", "settings": [setting]}
    raw["costs"] = {"noise": raw["costs"]["noise"]}
    assert_same(sim.load_scenario(raw), setting)
