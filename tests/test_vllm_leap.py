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

import json
from pathlib import Path

import simpy
from hypothesis import HealthCheck, given, settings, strategies as st

import sim
import pytest

from sim.engines.vllm.leap import arrival as leap_arrival, loop as leap_module, runs as leap_runs, steady
from tests.test_leap import assert_same, draw_workload

ROOT = Path(__file__).resolve().parents[1]
PROFILE = str(ROOT / "scenarios" / "profiles" / "h200-vllm-llama-3.2-1b.json")


def vllm(**workload) -> dict:
    base = {"arrival": "closed_loop", "concurrency": 4, "num_requests": 16, "warmup_requests": 2,
            "input_len": 64, "output_len": 40, "finish": "length"}
    return {"name": "vllm-leap", "seed": 1, "workload": {**base, **workload},
            "server": {"engine": "vllm", "settings": ["async", "sync"]}}


@pytest.fixture(autouse=True)
def _steady_sums_checked(monkeypatch):
    """Every summary of the running requests the leap keeps across its iterations
    (:class:`sim.engines.vllm.leap.steady.SteadyRunning`) is compared with a walk over them all."""
    monkeypatch.setattr(steady, "CHECK", True)


# --- hand-checked cases --------------------------------------------------------------------------
def test_a_lone_request_is_leapt_over_its_decodes():
    """One request of 40 tokens, closed loop: its prefill step, then 39 decode steps. The
    synchronous loop's leap takes all 39, the last one's update (which finishes the request)
    included; async scheduling's takes all but the last, from the first iteration after the
    prefill's update: 38 (it also counts the empty steps it schedules once the request is done)."""
    scenario = sim.load_scenario(vllm(concurrency=1, num_requests=1, warmup_requests=0))
    for setting, leapt in (("sync", 39), ("async", 38)):
        res = sim.simulate(scenario, setting)
        assert res.stats["leapt_steps"] == leapt and len(res.steps) == 40
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


def test_the_leap_takes_most_steps_of_a_steady_closed_loop(tmp_path):
    """Both loops on a constant test profile, and the synchronous one on the shipped H200 profile.
    Async scheduling on the shipped profile (its host file of 6 December 2026) waits at each
    iteration's top for the step in flight's output, where a run cannot start (Leap._back): there
    the leap takes 0-85% of the steps by load (docs/speed.md), the answer the same."""
    from tests.vllm_helpers import write_profile

    raw = vllm(concurrency=8, num_requests=64, output_len=200)
    for profile, loops in ((write_profile(tmp_path), ("sync", "async")), (PROFILE, ("sync",))):
        raw["costs"] = {"profile": profile}
        scenario = sim.load_scenario(raw)
        for setting in loops:
            res = sim.simulate(scenario, setting, tables="none")
            assert res.stats["leapt_steps"] > 0.8 * res.stats["steps"]
            assert_same(scenario, setting)
    assert_same(scenario, "async")


def test_a_saturated_server_leaps_with_requests_waiting():
    """More clients than ``max_num_seqs``: requests wait while the running batch is full, and the
    WAITING pass takes none of them, so the leap takes the decode runs (stopping before a finish,
    after which one is admitted) and writes each step's ``num_queued`` as the processes do."""
    raw = vllm(concurrency=16, num_requests=80, output_len=150)
    raw["server"]["max_num_seqs"] = 8
    for costs in (None, {"profile": PROFILE}):
        if costs is not None:
            raw["costs"] = costs
        scenario = sim.load_scenario(raw)
        for setting in ("sync", "async"):
            res = sim.simulate(scenario, setting)
            assert (res.steps["num_queued"] > 0).mean() > 0.8
            assert res.stats["leapt_steps"] > 0.8 * res.stats["steps"]
            assert_same(scenario, setting)
            assert_same(scenario, setting, tables="none")


def test_the_leap_carries_a_finish(monkeypatch):
    """Requests that finish at different steps (uniform lengths, a closed and an open loop, by
    length and by EOS): a run goes on to the iteration whose update stops requests, which the
    loop performs at its own time through ``Leap.update`` (synchronous loop: every finish;
    async scheduling: finishes at ``max_tokens``, which its next step already leaves out); the
    outputs are step by step's, with the profile's API server (whose input side a finished
    client's next request goes through) and with inline costs."""
    carried = {"sync": 0, "async": 0}
    finish = leap_module.Leap._finish

    def counted(self, *args):
        carried["async" if self.async_scheduling else "sync"] += 1
        return finish(self, *args)

    monkeypatch.setattr(leap_module.Leap, "_finish", counted)
    lengths = {"dist": "uniform", "low": 20, "high": 240}
    for workload in ({"concurrency": 6}, {"arrival": "poisson", "rate_per_s": 40.0}):
        for end in ("length", "eos"):
            raw = vllm(num_requests=48, output_len=lengths, finish=end, **workload)
            for costs in (None, {"profile": PROFILE}):
                if costs is not None:
                    raw["costs"] = costs
                scenario = sim.load_scenario(raw)
                for setting in ("sync", "async"):
                    assert_same(scenario, setting)
                    assert_same(scenario, setting, tables="none")
    assert carried["sync"] > 50 and carried["async"] > 20


def test_a_run_goes_on_past_the_api_servers_events(monkeypatch):
    """While a run is computed, the API server's events (a request on its way in, its share of
    the event loop) and the open loop's next send may fall inside it: they change nothing an
    iteration reads until a request can reach the input queue, so a run goes on to that bound
    (``ApiServer.earliest_enqueue_s``, ``EngineCore.next_send_s``) and the loop waits for its
    last update's start, then the update, as the processes do. The shipped ``vllm-h200`` scenario
    in closed loops (its profile's API server: at 4 clients the synchronous runs cross such
    events, at 12 the asynchronous ones) and in an open loop, and the open loop on inline costs
    (no API server work: the arrival process's events): the outputs of step by step."""
    crossed = []
    duration = leap_module._duration
    monkeypatch.setattr(leap_module, "_duration", lambda update_s: crossed.append(update_s) or duration(update_s))
    h200 = ROOT / "scenarios" / "vllm-h200.yaml"
    both = ("sync", "async")
    cases = [(sim.load_scenario(h200, ["workload.concurrency=4", "workload.num_requests=120"]), ("sync",)),
             (sim.load_scenario(h200, ["workload.concurrency=12", "workload.num_requests=120"]), ("async",)),
             (sim.load_scenario(h200, ["workload.arrival=poisson", "workload.rate_per_s=60",
                                       "workload.num_requests=120"]), both),
             (sim.load_scenario(vllm(arrival="poisson", rate_per_s=150.0, num_requests=80, output_len=120)), both)]
    for scenario, crossing in cases:
        for setting in both:
            before = len(crossed)
            assert_same(scenario, setting)
            assert_same(scenario, setting, tables="none")
            assert setting not in crossing or len(crossed) > before, setting


def test_the_leap_carries_an_arrival(monkeypatch, tmp_path):
    """An iteration where requests arrive while the running ones decode steadily is carried, in
    both loops (``Leap._arrival``: the policy's own ``add_requests`` and WAITING pass, the phases
    priced by the engine core's and the worker's own methods, the update at its start; under
    async scheduling the update of the decode in flight, the new step going on in flight for the
    processes to update): prompts cut by the
    long-prefill threshold, requests that stop at their first token, a KV cache too small for
    every admission, the shipped ``vllm-h200`` at 24 clients, and its profile with mixed steps
    priced by their parts (the forward reads every entry of the step) and a shared prefix; the
    outputs of step by step."""
    carried = {"sync": 0, "async": 0}
    arrival = leap_module.Leap._arrival

    def counted(self, now, prev):
        got = arrival(self, now, prev)
        carried["async" if self.async_scheduling else "sync"] += got is not None
        return got

    monkeypatch.setattr(leap_module.Leap, "_arrival", counted)
    raws = [vllm(concurrency=6, num_requests=48, output_len={"dist": "uniform", "low": 1, "high": 120}),
            vllm(arrival="poisson", rate_per_s=120.0, num_requests=60, input_len=600, output_len=80)]
    raws[1]["server"].update(long_prefill_token_threshold=128, num_gpu_blocks=130, block_size=16, max_model_len=2048)
    scenarios = [sim.load_scenario(raw) for raw in raws]
    scenarios.append(sim.load_scenario(ROOT / "scenarios" / "vllm-h200.yaml",
                                       ["workload.concurrency=24", "workload.num_requests=120"]))
    profile = json.loads(Path(PROFILE).read_text())
    profile["metadata"]["mixed_steps"] = "sum_of_parts"
    (tmp_path / "parts.json").write_text(json.dumps(profile))
    raw = vllm(concurrency=12, num_requests=60, input_len=64, cached_len=40, prefix_sharing="shared",
               output_len={"dist": "uniform", "low": 20, "high": 160})
    raw["costs"] = {"profile": str(tmp_path / "parts.json")}
    raw["server"]["block_size"] = 1
    scenarios.append(sim.load_scenario(raw))
    for scenario in scenarios:
        for setting in ("sync", "async"):
            before = carried[setting]
            assert_same(scenario, setting)
            assert_same(scenario, setting, tables="none")
            assert carried[setting] > before


def test_an_arrival_is_carried_with_a_finish(monkeypatch):
    """An iteration where requests arrive while running ones stop is carried in both loops: the
    synchronous step holds the stopping requests' last tokens, its update finishes them; under
    async scheduling (a finish by ``max_tokens``) the step leaves them out, and the update of the
    step in flight finishes them, with or without requests that step admitted (their first token
    in flight). Staggered finishes at 64 clients of the shipped ``vllm-h200``, and inline costs
    with lengths by EOS and by length; the outputs of step by step."""
    finished = {"sync": 0, "async": 0}
    update = leap_arrival._update

    def counted(leap, step, steady_reqs, finishing, *args):
        finished["async" if leap.async_scheduling else "sync"] += len(finishing)
        return update(leap, step, steady_reqs, finishing, *args)

    monkeypatch.setattr(leap_arrival, "_update", counted)
    scenarios = [sim.load_scenario(ROOT / "scenarios" / "vllm-h200.yaml",
                                   ["workload.concurrency=64", "workload.num_requests=200"]),
                 sim.load_scenario(vllm(concurrency=16, num_requests=120,
                                        output_len={"dist": "uniform", "low": 20, "high": 90})),
                 sim.load_scenario(vllm(concurrency=16, num_requests=120, finish="eos",
                                        output_len={"dist": "uniform", "low": 20, "high": 90}))]
    tight = vllm(concurrency=16, num_requests=160, output_len={"dist": "uniform", "low": 20, "high": 90})
    tight["server"].update(block_size=1, num_gpu_blocks=1900, max_model_len=1024)  # a block a token: the blocks a finish
    scenarios.append(sim.load_scenario(tight))  # frees decide later admissions
    for scenario in scenarios:
        for setting in ("sync", "async"):
            assert_same(scenario, setting)
            assert_same(scenario, setting, tables="none")
    assert finished["sync"] > 0 and finished["async"] > 0


def test_the_worker_is_held_while_it_samples_a_step_the_leap_ran(monkeypatch):
    """Async scheduling: when the leap carries an arrival, the worker may still be sampling the
    new step when the loop goes on; the worker process is then held until that step's sampling
    ends (an RPC of no step: ``worker_loop``), so the next step's RPC finds it busy and queued,
    as the processes have it. A generated run (three clients, one-token prompts, a profile with
    its API server, CPU noise) that the family found to differ before the hold; the outputs of
    step by step."""
    held = []
    put = simpy.Store.put
    monkeypatch.setattr(simpy.Store, "put", lambda store, item: (held.append(item[0] is None), put(store, item))[1])
    raw = {"name": "vllm-leap-hold", "seed": 0,
           "workload": {"arrival": "closed_loop", "num_requests": 11, "warmup_requests": 0, "concurrency": 3,
                        "input_len": 1, "cached_len": 0, "output_len": 3, "finish": "length"},
           "server": {"engine": "vllm", "settings": ["async", "sync"], "block_size": 1, "max_model_len": 2048,
                      "max_num_seqs": 3, "long_prefill_token_threshold": 0, "max_num_batched_tokens": 2048},
           "costs": {"profile": PROFILE, "noise": {"gpu_cv": 0.0, "cpu_cv": 0.2}}}
    scenario = sim.load_scenario(raw)
    assert_same(scenario, "async")
    assert any(held)


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


# --- the numpy runs (sim.engines.vllm.leap.runs) -------------------------------------------------
def count_numpy_steps(monkeypatch) -> dict:
    """Counts the iterations the numpy runs take (``taken``) while the tests run."""
    counts = {"taken": 0}

    def counted(*args):
        got = leap_runs.numpy_steps(*args)
        counts["taken"] += 0 if got is None else got[0]
        return got

    monkeypatch.setattr(leap_module, "numpy_steps", counted)
    return counts


def test_a_long_decode_runs_at_the_closed_form_pace(monkeypatch):
    """One request of 400 tokens; inline costs: schedule 0.4 ms, dispatch 0.1 ms, update 0.5 ms,
    a flat 10 ms forward, the worker's own phases 0. Synchronously an iteration schedules,
    dispatches, waits for the forward and updates: 11 ms each. With async scheduling the next step
    is launched before the wait, so the forwards run back to back: one every 10 ms, the host's
    1 ms hidden under them. The numpy runs take most of the iterations, with the outputs of
    step by step."""
    counts = count_numpy_steps(monkeypatch)
    term = {"per_req": 0.0, "per_token": 0.0, "per_ctx_token": 0.0}
    raw = vllm(concurrency=1, num_requests=1, warmup_requests=0, output_len=400)
    raw["costs"] = {"gpu": {"decode": {"base": 0.010, **term}},
                    "cpu": {"schedule": {"base": 4e-4, **term}, "launch": {"base": 1e-4, **term},
                            "process": {"base": 5e-4, **term}}}
    scenario = sim.load_scenario(raw)
    for setting, pace_s, column in (("sync", 0.011, "process_end"), ("async", 0.010, "forward_end")):
        taken = counts["taken"]
        steps = sim.simulate(scenario, setting).steps
        decodes = steps[steps["kind"] == "decode"]
        paces = decodes[column].diff().dropna().to_numpy()[5:-5]  # away from the prefill and the finish
        assert len(paces) > 350 and abs(paces - pace_s).max() < 1e-12
        assert counts["taken"] - taken > 300
        assert_same(scenario, setting)


def test_long_runs_beyond_the_profile_are_counted_as_step_by_step(monkeypatch):
    """Long runs at contexts far beyond the profile's data (the reach counters move on every
    step) and within it, through the numpy runs: the same outputs, the extrapolated steps
    included, as step by step."""
    counts = count_numpy_steps(monkeypatch)
    far = sim.load_scenario(ROOT / "scenarios" / "vllm-h200.yaml",
                            ["workload.concurrency=4", "workload.num_requests=8", "workload.warmup_requests=2", "workload.output_len=1500",
                             "workload.input_len=30000", "workload.cached_len=0", "server.max_model_len=40000"])
    near = sim.load_scenario(ROOT / "scenarios" / "vllm-h200.yaml", ["workload.num_requests=24"])
    assert sim.simulate(far, "sync", tables="none").summary()["extrapolated_steps"] > 1000
    for scenario in (far, near):
        for setting in ("sync", "async"):
            assert_same(scenario, setting)
            assert_same(scenario, setting, tables="none")
    assert counts["taken"] > 5000
    # async scheduling in the two-parity form (launches alternate between a busy and an idle device,
    # each wait blocks), where numpy takes most of the steps: the shipped scenario's load with its host
    # phases at the pace of the profile composed before 5 December 2026 (moved by x1.13 where the
    # current one is moved by x0.80: costs.cpu.scale 0.71), and the shipped profile at 64 clients,
    # where one step's output waits behind the other's at the API server (EGRESS_PASSES)
    for overrides, share in ((["workload.num_requests=24", "costs.cpu.scale=0.71"], 0.8),
                             (["workload.num_requests=640", "workload.concurrency=64"], 0.7)):
        paired = sim.load_scenario(ROOT / "scenarios" / "vllm-h200.yaml", overrides)
        assert_same(paired, "async", tables="none")
        taken = counts["taken"]
        steps = sim.simulate(paired, "async", tables="none").stats["steps"]
        assert counts["taken"] - taken > share * steps


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(raw=scenarios(), setting=st.sampled_from(["sync", "async"]), tables=st.sampled_from(["steps", "none"]))
def test_generated_runs_through_numpy_are_unchanged(monkeypatch, raw, setting, tables):
    """The generated family with every stretch of the leap, however short, offered to the numpy
    runs (their threshold set to 1): their candidate timelines, the checks that cut them and
    the leap's loop that goes on after them give the outputs of step by step."""
    monkeypatch.setattr(leap_module, "NUMPY_MIN_RUN", 1)
    assert_same(sim.load_scenario(raw), setting, tables)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 2048), st.integers(0, 10**7), st.integers(1, 200), st.integers(0, 5000),
       st.sampled_from(["sync", "async"]))
def test_vllm_profile_prices_and_counts_a_run_as_its_steps(num_reqs, ctx0, k, shared, setting):
    """The leap's forms of ``forward_s`` over a run's contexts (``decode_forward_at``, one step at
    a time; ``decode_forward_array``, the numpy runs') give its floats, and
    ``count_decode_steps`` counts what ``forward_s`` counts step by step (extrapolated and far
    steps, the largest distance), inside the profile's data (its shortcut) and beyond it in
    batch size or context, with a shared prefix."""
    import numpy as np

    from sim.engines.vllm.costs import VllmProfileCosts
    from sim.engines.vllm.profile import load_vllm_profile
    from sim.model.costs import DECODE

    profile = load_vllm_profile(PROFILE, read_only=True)
    stepwise, run = VllmProfileCosts(profile, setting), VllmProfileCosts(profile, setting)
    ctx = [ctx0 + i * num_reqs for i in range(k)]
    prices = [stepwise.forward_s(DECODE, num_reqs, num_reqs, c, shared) for c in ctx]
    at = run.decode_forward_at(num_reqs, shared)
    assert [at(c) for c in ctx] == prices
    assert run.decode_forward_array(num_reqs, np.array(ctx, dtype=np.int64), shared).tolist() == prices
    run.count_decode_steps(num_reqs, ctx0, k, shared)
    assert run.reach.outcome() == stepwise.reach.outcome()


def test_a_runs_constant_arrays_are_kept_by_its_constants():
    """``runs._run_arrays``: the contexts, forward prices, block allocations and their running
    sum of a run's iterations, as computed directly; the same (read-only) arrays for the same
    constants; at most RUN_ARRAYS_KEPT kept, the oldest dropped."""
    import types

    import numpy as np

    from sim.engines.vllm.costs import VllmProfileCosts
    from sim.engines.vllm.profile import load_vllm_profile

    costs = VllmProfileCosts(load_vllm_profile(PROFILE, read_only=True), "async")
    leap = types.SimpleNamespace(run_arrays={})
    hist = [1, 0, 0, 2]
    ctx, fwd, need, need_sum = leap_runs._run_arrays(leap, costs, 8, 4, hist, 4620, 0, 3, 133)
    ks = np.arange(3, 133)
    assert ctx.tolist() == (4620 + 8 * ks).tolist()
    assert fwd.tolist() == costs.decode_forward_array(8, 4620 + 8 * ks, 0).tolist()
    assert need.tolist() == [hist[k % 4] for k in ks] and need_sum.tolist() == np.cumsum(need).tolist()
    assert not any(a.flags.writeable for a in (ctx, fwd, need, need_sum))
    assert leap_runs._run_arrays(leap, costs, 8, 4, hist, 4620, 0, 3, 133)[1] is fwd
    for ctx0 in range(leap_runs.RUN_ARRAYS_KEPT):
        leap_runs._run_arrays(leap, costs, 8, 4, hist, ctx0, 0, 0, 10)
    assert len(leap.run_arrays) == leap_runs.RUN_ARRAYS_KEPT
    assert leap_runs._run_arrays(leap, costs, 8, 4, hist, 4620, 0, 3, 133)[1] is not fwd  # dropped, made again


def test_the_farthest_step_is_named_alike_with_and_without_the_leap():
    # the shipped vllm-h200 profile's host curves are measured to 256 requests a step: 320 lie beyond
    scenario = sim.load_scenario(ROOT / "scenarios" / "vllm-h200.yaml",
                                 ["workload.num_requests=640", "workload.concurrency=320", "server.max_num_seqs=512",
                                  "workload.output_len=64", "workload.warmup_requests=0"])
    for setting in ("async", "sync"):
        leapt = sim.simulate(scenario, setting, tables="none").summary()
        stepped = sim.simulate(scenario, setting, tables="none", leap=False).summary()
        assert leapt == stepped and leapt["extrapolated_steps"] > 0
        assert leapt["max_extrapolation_at"] == "vllm.schedule at num_reqs 320, measured 1-256"
