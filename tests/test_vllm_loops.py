"""The vLLM engine loops' closed forms, with constant costs (test profiles, no noise): one batch of
c equal requests, decode steps away from the prefill and the end.

Engine core per step: S (schedule) + D (dispatch) + U (update); the worker: P (prepare) + F
(forward) + Sa (sample); latencies: R (the synchronous round trip between execute_model and
sample_tokens), L (collect: the output back in the engine core); K (pickup: under async
scheduling, the worker taking an RPC already queued for it; 0 in these profiles unless a test
sets it).

sync, CPU platform:   step = S + D + P + F + R + Sa + L + U                  (CPU + forward)
async, CPU platform:  step = max(K + P + F + K + Sa, S + D + U [+ L])      (max(CPU, forward) + residue)
sync, GPU:            step = S + D + P + max(F, R + Sa) + L + U
async, GPU:           step = F when the rest fits behind it
"""

from __future__ import annotations

import numpy as np
import pytest

import sim
from tests.vllm_helpers import CONSTANT, vllm_scenario, write_profile


def steady(res: sim.Result):
    """Forward-start intervals and gaps of the decode steps away from the prefill and the end."""
    steps = res.steps
    dec = steps[steps["kind"] == "decode"].iloc[3:-3]
    gaps = dec["forward_start"].to_numpy() - steps["forward_end"].shift(1)[dec.index].to_numpy()
    return np.diff(dec["forward_start"].to_numpy()), gaps


def run(tmp_path, setting, costs=None, **kw):
    profile = write_profile(tmp_path, costs=costs)
    return sim.simulate(vllm_scenario(profile=profile, **kw), setting)


def total(c: dict, *names) -> float:
    return sum(c[n] for n in names)


FORWARD_BOUND = {}  # the test profile's defaults: F = 4 ms
CPU_BOUND = {"forward": 1e-4, "prepare": 1e-4, "sample": 1e-4}


@pytest.mark.parametrize("costs", [FORWARD_BOUND, CPU_BOUND], ids=["forward_bound", "cpu_bound"])
def test_sync_step_is_core_plus_worker(tmp_path, costs):
    c = {**CONSTANT, **costs}
    res = run(tmp_path, "sync", costs)
    step, gap = steady(res)
    cpu = total(c, "schedule", "dispatch", "prepare", "roundtrip", "sample", "collect", "update")
    np.testing.assert_allclose(step, cpu + c["forward"], rtol=1e-9)
    np.testing.assert_allclose(gap, cpu, rtol=1e-9)
    assert res.summary()["median_tpot_ms"] == pytest.approx((cpu + c["forward"]) * 1e3, rel=1e-6)


def test_async_forward_bound_step_is_the_worker(tmp_path):
    c = CONSTANT
    worker = total(c, "prepare", "forward", "sample")
    assert total(c, "schedule", "dispatch", "update", "collect") <= worker
    res = run(tmp_path, "async")
    step, gap = steady(res)
    np.testing.assert_allclose(step, worker, rtol=1e-9)
    np.testing.assert_allclose(gap, c["prepare"] + c["sample"], rtol=1e-9)  # the worker's own CPU, not the core's
    assert res.summary()["median_itl_ms"] == pytest.approx(worker * 1e3, rel=1e-6)


def test_async_cpu_bound_step_is_the_engine_core(tmp_path):
    c = {**CONSTANT, **CPU_BOUND}
    core = total(c, "schedule", "dispatch", "update")
    assert core >= total(c, "prepare", "forward", "sample", "collect")
    step, gap = steady(run(tmp_path, "async", CPU_BOUND))
    np.testing.assert_allclose(step, core, rtol=1e-9)
    np.testing.assert_allclose(gap, core - c["forward"], rtol=1e-9)


def test_gpu_forward_hides_the_worker_and_the_core_under_async(tmp_path):
    c = CONSTANT
    step, gap = steady(run(tmp_path, "async", device="cuda"))
    np.testing.assert_allclose(step, c["forward"], rtol=1e-9)
    np.testing.assert_allclose(gap, 0.0, atol=1e-12)
    sync_step, _ = steady(run(tmp_path, "sync", device="cuda"))
    expected = total(c, "schedule", "dispatch", "prepare", "collect", "update") + max(c["forward"],
                                                                                    c["roundtrip"] + c["sample"])
    np.testing.assert_allclose(sync_step, expected, rtol=1e-9)


def test_first_token_closed_forms(tmp_path):
    c = CONSTANT
    one = {"c": 1, "output_len": 5}
    ttft_sync = run(tmp_path, "sync", **one).summary()["median_ttft_ms"] / 1e3
    ttft_async = run(tmp_path, "async", **one).summary()["median_ttft_ms"] / 1e3
    full = total(c, "schedule", "dispatch", "prepare", "forward", "roundtrip", "sample", "collect", "update")
    assert ttft_sync == pytest.approx(full, rel=1e-9)
    assert ttft_async == pytest.approx(full - c["roundtrip"], rel=1e-9)  # both RPCs sent at once


def test_a_stop_token_costs_async_one_extra_step_per_request(tmp_path):
    steps = {(s, f): run(tmp_path, s, finish=f).steps for s in ("sync", "async") for f in ("length", "eos")}
    assert len(steps["async", "length"]) == len(steps["sync", "length"]) == 40  # max_tokens stops are foreseen
    assert steps["async", "length"]["overshoot"].sum() == 0
    assert len(steps["async", "eos"]) == len(steps["sync", "eos"]) + 1
    assert steps["async", "eos"]["overshoot"].sum() == 4 and steps["sync", "eos"]["overshoot"].sum() == 0


def test_setting_curves_price_a_setting_apart(tmp_path):
    path = write_profile(tmp_path, setting_curves={"async": {"vllm.prepare": {"axes": ["num_reqs"], "grid": [[0, 100000]],
                                                                              "values_s": [1e-3, 1e-3]}}})
    step, _ = steady(sim.simulate(vllm_scenario(profile=path), "async"))
    np.testing.assert_allclose(step, 1e-3 + CONSTANT["forward"] + CONSTANT["sample"], rtol=1e-9)


def test_inline_costs_map_onto_the_engine_phases():
    costs = {"gpu": {"decode": {"base": 4e-3}, "prefill": {"base": 2e-3}},
             "cpu": {"recv": {"base": 1e-4}, "schedule": {"base": 2e-4}, "launch": {"base": 3e-4},
                     "process": {"base": 4e-4}}}
    scen = vllm_scenario(costs=costs)
    step, _ = steady(sim.simulate(scen, "sync"))
    np.testing.assert_allclose(step, 2e-4 + 3e-4 + 4e-3 + 4e-4, rtol=1e-9)
    step, _ = steady(sim.simulate(scen, "async"))
    np.testing.assert_allclose(step, 4e-3, rtol=1e-9)


def test_settings_share_requests_and_runs_repeat_exactly(tmp_path):
    scen = vllm_scenario(profile=write_profile(tmp_path), c=6, n=18, input_len={"dist": "uniform", "low": 8, "high": 300},
                         output_len={"dist": "uniform", "low": 1, "high": 50}, workload__warmup_requests=2)
    a, b = sim.simulate(scen, "async"), sim.simulate(scen, "async")
    assert a.steps.equals(b.steps) and a.requests.equals(b.requests)
    s = sim.simulate(scen, "sync")
    assert (s.requests["output_len"] == a.requests["output_len"]).all()
    assert (s.requests["output_tokens"] == a.requests["output_tokens"]).all()


def test_async_worker_picks_up_its_queued_rpcs(tmp_path):
    """Under async scheduling the worker takes two queued RPCs per step (the next execute_model,
    then sample_tokens behind it): K twice per worker cycle; the synchronous loop has none."""
    k = 1.5e-4
    pickup = {"vllm.pickup": {"axes": ["num_reqs"], "grid": [[0, 100000]], "values_s": [k, k]}}
    path = write_profile(tmp_path, setting_curves={"async": pickup})
    c = CONSTANT
    step, gap = steady(sim.simulate(vllm_scenario(profile=path), "async"))
    np.testing.assert_allclose(step, total(c, "prepare", "forward", "sample") + 2 * k, rtol=1e-9)
    np.testing.assert_allclose(gap, c["prepare"] + c["sample"] + 2 * k, rtol=1e-9)
    sync_step, _ = steady(sim.simulate(vllm_scenario(profile=path), "sync"))
    cpu = total(c, "schedule", "dispatch", "prepare", "roundtrip", "sample", "collect", "update")
    np.testing.assert_allclose(sync_step, cpu + c["forward"], rtol=1e-9)


def _ctx_profile(tmp_path, saving: float | None, per_ctx: float = 1e-5) -> str:
    """A test profile whose forward grows linearly with the mean context: F = 2 ms + per_ctx x ctx;
    ``saving``: its ``metadata.shared_prefix.saving`` (None: absent)."""
    import json

    from tests.vllm_helpers import make_profile

    prof = make_profile()
    prof["curves"]["vllm.forward"]["values_s"] = [[2e-3, 2e-3 + per_ctx * 1e5], [2e-3, 2e-3 + per_ctx * 1e5]]
    if saving is not None:
        prof["metadata"]["shared_prefix"] = {"saving": saving, "by_batch": {}, "prefix_tokens": 0, "steps": 0}
    path = tmp_path / f"ctx-{saving}.json"
    path.write_text(json.dumps(prof))
    return str(path)


@pytest.mark.parametrize("saving", [0.0, 0.5, 1.0])
def test_a_shared_prefix_is_priced_once_by_the_measured_share(tmp_path, saving):
    """c requests holding the same cached prefix of p tokens: each decode forward is priced at the
    mean context less saving x (c - 1) p / c; private prefixes (or no measured saving) in full."""
    c, p, per_ctx = 4, 128, 1e-5
    base = dict(c=c, input_len=200, cached_len=p, output_len=12, server__block_size=128, settings=("sync",))
    path = _ctx_profile(tmp_path, saving, per_ctx)
    fwd = {}
    for sharing in ("private", "shared"):
        steps = sim.simulate(vllm_scenario(profile=path, workload__prefix_sharing=sharing, **base), "sync").steps
        dec = steps[steps["kind"] == "decode"]
        fwd[sharing] = (dec["forward_end"] - dec["forward_start"]).to_numpy()
    np.testing.assert_allclose(fwd["private"] - fwd["shared"], per_ctx * saving * (c - 1) * p / c, rtol=1e-6, atol=1e-12)
    without = _ctx_profile(tmp_path, None, per_ctx)
    steps = sim.simulate(vllm_scenario(profile=without, workload__prefix_sharing="shared", **base), "sync").steps
    dec = steps[steps["kind"] == "decode"]
    np.testing.assert_allclose((dec["forward_end"] - dec["forward_start"]).to_numpy(), fwd["private"], rtol=1e-12)


def test_a_mixed_step_is_priced_by_its_parts_when_the_profile_says_so():
    """Forward f(n) = F + k n (the test profile's curve, any context). A step of 3 prefill tokens
    for one request and 2 decodes: f(5) by default; f(3) + f(2) = 2F + 5k with
    ``metadata.mixed_steps: sum_of_parts``; a pure decode or prefill step is priced the same."""
    from sim.engines.vllm.costs import VllmProfileCosts
    from sim.model.costs import DECODE, EXTEND
    from tests.vllm_helpers import make_profile

    k, f0 = 1e-4, CONSTANT["forward"]
    plain = make_profile(prefill_per_token=k)
    parts = make_profile(prefill_per_token=k)
    parts["metadata"]["mixed_steps"] = "sum_of_parts"
    a, b = VllmProfileCosts(plain, "sync"), VllmProfileCosts(parts, "sync")
    mixed = dict(kind=EXTEND, num_reqs=3, num_tokens=5, sum_ctx=(3 + 0) + (40 + 1) + (60 + 1), decode_reqs=2,
                 decode_sum_ctx=102)
    assert a.forward_s(**mixed) == pytest.approx(f0 + 5 * k)
    assert b.forward_s(**mixed) == pytest.approx(2 * f0 + 5 * k)
    for costs in (a, b):
        assert costs.forward_s(DECODE, 2, 2, 102, decode_reqs=0) == pytest.approx(f0 + 2 * k)  # a decode step
        assert costs.forward_s(EXTEND, 1, 3, 3) == pytest.approx(f0 + 3 * k)  # a prefill step


def test_the_worker_splits_a_mixed_step_into_its_decodes_and_its_prefill():
    """The worker passes how many of a step's entries run one token (plus their drafts), their
    context (computed before the step + scheduled) and their tokens, to the cost model."""
    from types import SimpleNamespace

    from sim.engines.vllm.worker import Worker
    from sim.model.batch import Batch
    from sim.model.costs import DECODE, EXTEND

    seen = []
    costs = SimpleNamespace(shared_prefix_saving=0.0, mixed_sum_of_parts=True,
                            forward_s=lambda *a, verify=False: seen.append(a) or 0.01)
    stream = SimpleNamespace(enqueue=lambda step, at, dur: setattr(step, "forward_end", at + dur))
    w = Worker(costs, stream, lambda: 1.0, lambda: 1.0, blocking_forward=True, async_scheduling=False)
    step = Batch(0, EXTEND, 3, 52, 0)
    step.chunks = [["r1", 1, 40, True, 0], ["r2", 50, 0, True, 0], ["r3", 1, 60, True, 0]]
    step.sum_ctx = 41 + 50 + 61
    assert w.forward(step, 1.0) == pytest.approx(0.01)
    assert seen[-1] == (EXTEND, 3, 52, 152, 0, 2, 41 + 61, 2)
    dec = Batch(1, DECODE, 2, 2, 102)
    w.forward(dec, 2.0)
    assert seen[-1][-3:] == (0, 0, 0)  # a decode step is not split
    spec = Batch(2, EXTEND, 2, 53, 0)  # one request verifying 1 + 3 drafts beside a prefill
    spec.chunks = [["r1", 4, 40, True, 3], ["r2", 49, 0, True, 0]]
    spec.sum_ctx = 44 + 49
    w.forward(spec, 3.0)
    assert seen[-1] == (EXTEND, 2, 53, 93, 0, 1, 44, 4)


@pytest.mark.parametrize("setting", ["sync", "async"])
def test_a_request_no_idle_engine_can_schedule_stops_the_run(monkeypatch, setting):
    """A waiting request that an idle engine cannot schedule (here a KV pool that refuses every
    allocation) would have the engine core sleep 1 ms and try again forever: the run stops at the
    first such step with the stall's RuntimeError (a livelock of this kind hung the speculative
    runs near max_model_len before their lookahead was capped)."""
    import signal

    from sim.engines.vllm.policy.kv_blocks import BlockPool

    monkeypatch.setattr(BlockPool, "allocate_slots", lambda self, *a, **k: False)
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("the run hung")))
    signal.alarm(60)
    try:
        with pytest.raises(RuntimeError, match=r"simulation stalled at t=.*request 0 .* cannot be scheduled on an "
                                               r"idle engine .*a modelling bug"):
            sim.simulate(vllm_scenario(c=3), setting, tables="none")
    finally:
        signal.alarm(0)


def test_a_stalled_run_is_one_line_and_exit_1_on_the_command_line(monkeypatch, tmp_path, capsys):
    """The stall (a modelling bug) reaches the user as one stderr line with what to report, exit
    status 1, and leaves no results folder; not a traceback."""
    import signal

    import yaml

    from sim.cli import main
    from sim.engines.vllm.policy.kv_blocks import BlockPool

    monkeypatch.setattr(BlockPool, "allocate_slots", lambda self, *a, **k: False)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(vllm_scenario(c=2, settings=("sync",))))
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("the run hung")))
    signal.alarm(60)
    try:
        code = main(["run", str(path), "--tables", "none", "--out", str(tmp_path / "out")])
    finally:
        signal.alarm(0)
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("overlap-sim: error: simulation stalled") and "please report it with the scenario" in err
    assert not (tmp_path / "out").exists()
