"""Closed forms with constant costs: one batch of c equal requests, no per-request terms, no noise.

cpu = recv + schedule + launch + process (every phase runs once per step)
normal:  decode step = cpu + gpu,                gap = cpu
overlap: decode step = max(cpu, gpu + residue),  gap = max(0, cpu - gpu - residue)
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from tests.helpers import constant_scenario


def steady_decode(res: sim.Result):
    """Forward-start intervals and gaps of decode steps away from the prefill and the end."""
    steps = res.steps
    dec = steps[steps["kind"] == "decode"].iloc[3:-3]
    starts = dec["forward_start"].to_numpy()
    gaps = (dec["forward_start"].to_numpy() - steps["forward_end"].shift(1)[dec.index].to_numpy())
    return np.diff(starts), gaps


CASES = {
    # name: (gpu, residue, recv, schedule, launch, process)
    "gpu_bound": (0.004, 2e-5, 1e-4, 2e-4, 3e-4, 4e-4),
    "cpu_bound": (0.0005, 2e-5, 1e-4, 4e-4, 3e-4, 6e-4),
    "balanced": (0.001, 0.0, 1e-4, 2e-4, 3e-4, 4e-4),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_normal_step_is_cpu_plus_gpu(case):
    gpu, residue, recv, schedule, launch, process = CASES[case]
    cpu = recv + schedule + launch + process
    scen = constant_scenario(gpu=gpu, residue=residue, recv=recv, schedule=schedule, launch=launch, process=process)
    res = sim.simulate(scen, "normal")
    step, gap = steady_decode(res)
    np.testing.assert_allclose(step, cpu + gpu, rtol=1e-9)
    np.testing.assert_allclose(gap, cpu, rtol=1e-9)
    s = res.summary()
    assert s["median_tpot_ms"] == pytest.approx((cpu + gpu) * 1e3, rel=1e-6)
    assert s["median_itl_ms"] == pytest.approx((cpu + gpu) * 1e3, rel=1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_overlap_step_is_max_of_cpu_and_gpu(case):
    gpu, residue, recv, schedule, launch, process = CASES[case]
    cpu = recv + schedule + launch + process
    scen = constant_scenario(gpu=gpu, residue=residue, recv=recv, schedule=schedule, launch=launch, process=process)
    res = sim.simulate(scen, "overlap")
    step, gap = steady_decode(res)
    np.testing.assert_allclose(step, max(cpu, gpu + residue), rtol=1e-9)
    np.testing.assert_allclose(gap, max(0.0, cpu - gpu - residue), atol=1e-12)
    assert res.summary()["median_itl_ms"] == pytest.approx(max(cpu, gpu + residue) * 1e3, rel=1e-6)


@settings(max_examples=25, deadline=None)
@given(gpu=st.floats(1e-4, 1e-2), residue=st.floats(0, 1e-4), phases=st.lists(st.floats(1e-5, 2e-3), min_size=4, max_size=4),
       c=st.integers(1, 16))
def test_closed_forms_any_constant_costs(gpu, residue, phases, c):
    recv, schedule, launch, process = phases
    cpu = sum(phases)
    scen = constant_scenario(c=c, gpu=gpu, residue=residue, recv=recv, schedule=schedule, launch=launch,
                             process=process, output_len=20)
    step_n, gap_n = steady_decode(sim.simulate(scen, "normal"))
    step_o, gap_o = steady_decode(sim.simulate(scen, "overlap"))
    np.testing.assert_allclose(step_n, cpu + gpu, rtol=1e-9)
    np.testing.assert_allclose(gap_n, cpu, rtol=1e-9)
    np.testing.assert_allclose(step_o, max(cpu, gpu + residue), rtol=1e-9)
    np.testing.assert_allclose(gap_o, max(0.0, cpu - gpu - residue), atol=1e-12)


def test_ttft_closed_form_normal_and_overlap():
    """First request's TTFT: normal = recv+schedule+launch+prefill+process. Overlap delivers the
    first token only after the next batch (the first decode) is scheduled and launched."""
    recv, schedule, launch, process, prefill, gpu = 1e-4, 2e-4, 3e-4, 4e-4, 0.002, 0.004
    scen = constant_scenario(c=1, prefill=prefill, gpu=gpu)
    normal = sim.simulate(scen, "normal").requests.iloc[0]
    assert normal.first_token_s - normal.arrival_s == pytest.approx(recv + schedule + launch + prefill + process)
    overlap = sim.simulate(scen, "overlap").requests.iloc[0]
    # launch ends at r+s+l; CPU schedules+launches the decode (r+s+l), then waits for the prefill
    expected = max(2 * (recv + schedule + launch), recv + schedule + launch + prefill) + process
    assert overlap.first_token_s - overlap.arrival_s == pytest.approx(expected)


@pytest.mark.parametrize("finish,retraction,expected_overshoot", [
    ("eos", "v0.5.22", 4), ("length", "naive", 4), ("length", "v0.5.22", 0)])
def test_overshoot_counted_and_tokens_conserved(finish, retraction, expected_overshoot):
    c, out = 4, 30
    scen = constant_scenario(c=c, output_len=out, finish=finish, retraction=retraction)
    res = sim.simulate(scen, "overlap")
    steps = res.steps
    assert int(steps["overshoot"].sum()) == expected_overshoot
    computed = int(steps.loc[steps["kind"] == "decode", "num_reqs"].sum()) + c  # + one token per prefill
    delivered = int(res.requests["output_tokens"].sum())
    assert delivered == c * out
    assert computed == delivered + expected_overshoot
    assert (res.requests["output_tokens"] == out).all()


def test_normal_has_no_overshoot():
    res = sim.simulate(constant_scenario(finish="eos"), "normal")
    assert int(res.steps["overshoot"].sum()) == 0
    steps = res.steps
    assert int(steps.loc[steps["kind"] == "decode", "num_reqs"].sum()) + 4 == int(res.requests["output_tokens"].sum())


def test_overlap_mlx_chain_and_breaks():
    """MLX chain: steady decode step = max(cpu, gpu) (no FutureMap residue); when a request
    finishes the chained step carries its discarded token, then the chain breaks and the device
    idles for one full CPU iteration (process + recv + schedule + launch = cpu)."""
    recv, schedule, launch, process, gpu = 1e-4, 2e-4, 3e-4, 4e-4, 0.004
    cpu = recv + schedule + launch + process
    scen = constant_scenario(c=2, output_len={"dist": "choice", "values": [10, 30]}, finish="eos", gpu=gpu,
                             residue=1e-3, settings=["overlap_mlx"], seed=3)
    res = sim.simulate(scen, "overlap_mlx")
    steps = res.steps
    assert sorted(res.requests["output_len"]) == [10, 30]
    gaps = (steps["forward_start"] - steps["forward_end"].shift(1)).to_numpy()[1:]
    decode = (steps["kind"] == "decode").to_numpy()[1:]
    # breaks: after the prefill, and after each step that carried an overshoot token (except the last)
    breaks = np.flatnonzero(gaps > 1e-12)
    assert np.allclose(gaps[breaks], cpu)
    overshoot_steps = np.flatnonzero(steps["overshoot"].to_numpy() > 0)
    assert list(breaks + 1) == [1] + [int(k) + 1 for k in overshoot_steps[:-1]]
    assert int(steps["overshoot"].sum()) == 2
    chained = np.diff(steps["forward_start"].to_numpy())[decode][3:8]
    np.testing.assert_allclose(chained, gpu)  # residue applies to CUDA overlap only


def test_overlap_mlx_has_no_v0522_lookahead():
    """SGLang's length-finish exclusion lives in event_loop_overlap only: under the MLX chain a
    request finishing by length still rides in the chained step, and its token is discarded."""
    res = sim.simulate(constant_scenario(c=4, finish="length", retraction="v0.5.22", settings=["overlap_mlx"]),
                       "overlap_mlx")
    assert int(res.steps["overshoot"].sum()) == 4
    assert int(sim.simulate(constant_scenario(c=4, finish="length"), "overlap").steps["overshoot"].sum()) == 0


@pytest.mark.parametrize("case", sorted(CASES))
def test_phases_after_a_wait_cost_after_wait_scale_more(case):
    """``costs.cpu.after_wait_scale`` = s: every phase from a blocking wait to the next launch
    costs s times more. normal waits every step: step = s*cpu + gpu. overlap waits only when the
    device is behind: GPU-bound, step = gpu + residue still (the cold CPU work hides while it
    fits: s*cpu <= gpu + residue); CPU-bound it never waits, so step = cpu, unchanged (a wait
    under a microsecond, as in the balanced case's float ties, does not count)."""
    gpu, residue, recv, schedule, launch, process = CASES[case]
    cpu = recv + schedule + launch + process
    s = 1.5
    scen = constant_scenario(gpu=gpu, residue=residue, recv=recv, schedule=schedule, launch=launch, process=process)
    scen["costs"]["cpu"]["after_wait_scale"] = s
    step, gap = steady_decode(sim.simulate(scen, "normal"))
    np.testing.assert_allclose(step, s * cpu + gpu, rtol=1e-9)
    np.testing.assert_allclose(gap, s * cpu, rtol=1e-9)
    step, _ = steady_decode(sim.simulate(scen, "overlap"))
    if s * cpu <= gpu + residue:
        np.testing.assert_allclose(step, gpu + residue, rtol=1e-9)
    else:
        assert cpu >= gpu + residue  # the cases have no step between the two regimes
        np.testing.assert_allclose(step, cpu, rtol=1e-9)
