"""The GIL model and the thread-era overlap loop (``thread_overlap``), against closed forms;
and the existing loops unchanged by adding it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import simpy

import sim
from sim.engines.sglang.gil import GIL
from tests.conftest import SCENARIOS


def _run(env, gen, out, key):
    def proc():
        start = env.now
        yield from gen
        out[key] = (start, env.now)
    env.process(proc())


def test_forward_beside_a_spinning_thread_waits_one_switch_interval_per_op():
    # DESIGN.md sec. 6: an eager CPU forward took 4 ms alone and 38 ms beside a spinning thread.
    # 7 ops of 10 us Python + 4/7 ms compute: each op waits 5 ms for the spinner to drop the GIL.
    def forward(env, gil, out):
        start = env.now
        for _ in range(7):
            yield from gil.run("forward", 1e-5)
            gil.release("forward")
            yield env.timeout(4e-3 / 7)
        out["forward"] = env.now - start

    def spinner(gil):
        yield from gil.run("main", 1.0)
        gil.release("main")

    for spinning, expected in ((False, 4.07e-3), (True, 7 * 5e-3 + 4.07e-3)):
        env, out = simpy.Environment(), {}
        gil = GIL(env, 0.005)
        if spinning:
            env.process(spinner(gil))
        env.process(forward(env, gil, out))
        env.run(until=2.0)
        assert out["forward"] == pytest.approx(expected, abs=1e-12)


def test_two_cpu_bound_threads_alternate_every_switch_interval():
    env, out = simpy.Environment(), {}
    gil = GIL(env, 0.005)

    def work(name):
        yield from gil.run(name, 0.012)
        gil.release(name)

    _run(env, work("a"), out, "a")
    _run(env, work("b"), out, "b")
    env.run()
    # a: 0-5, 10-15, 20-22 ms; b: 5-10, 15-20, 22-24 ms
    assert out["a"][1] == pytest.approx(0.022) and out["b"][1] == pytest.approx(0.024)
    assert gil.forced_switches == 4


def test_release_hands_the_gil_to_the_waiter_at_once():
    env, out = simpy.Environment(), {}
    gil = GIL(env, 0.005)

    def short(name, d):
        yield from gil.run(name, d)
        gil.release(name)

    _run(env, short("a", 0.001), out, "a")
    _run(env, short("b", 0.001), out, "b")
    env.run()
    assert out["b"][1] == pytest.approx(0.002) and gil.forced_switches == 0


@pytest.mark.parametrize("dropped", [False, True])
def test_the_gil_wait_resumes_where_an_any_of_condition_would(dropped):
    """``GIL.run`` waits for its work's end or a drop request through a relay to one event
    (:func:`sim.engines.sglang.gil._relay`) instead of SimPy's ``ran | drop``: the thread must
    resume at the same place in SimPy's event order, one hop after the first of the two is
    processed, so that a tie with another process's event (here one scheduled for the same
    instant, right after the work's timeout) goes the same way; also when the drop comes first."""
    from sim.engines.sglang.gil import _relay

    def order(use_relay: bool) -> list[str]:
        env, seen = simpy.Environment(), []
        drop = env.event()

        def waiter():
            ran = env.timeout(1.0)
            if use_relay:
                wake, relay = env.event(), None
                relay = _relay(wake)
                drop.callbacks.append(relay)
                ran.callbacks.append(relay)
                yield wake
            else:
                yield ran | drop
            seen.append("waiter")

        def other():
            yield env.timeout(0.5 if dropped else 1.0)
            if dropped:
                drop.succeed()
                yield env.timeout(0.0)
            seen.append("other")

        env.process(waiter())
        env.process(other())
        env.run()
        return seen

    assert order(True) == order(False)


def _decode_periods(res):
    d = res.steps[res.steps["kind"] == "decode"]
    period = np.diff(d["process_end"].to_numpy())
    values, counts = np.unique(np.round(period, 9), return_counts=True)
    return values[np.argmax(counts)]  # the steady-state step


def test_thread_overlap_on_cpu_is_serial_plus_the_sample_launch():
    # CPU: the forward thread computes the ops, the scheduler waits for launch_done (= the
    # compute), so a decode step of 4 requests is recv + schedule + launch + forward + process
    # + the forward thread's sample launch, one after the other.
    s = sim.load_scenario(SCENARIOS / "thread-overlap.yaml")
    recv, sched, launch = 5e-5, 3e-4 + 4 * 2e-5, 4e-4
    forward, process, sample = 4e-3 + 4 * 1e-4, 1.5e-3 + 4 * 5e-5, 5e-5
    assert _decode_periods(sim.simulate(s, "thread_overlap")) == pytest.approx(
        recv + sched + launch + forward + process + sample, abs=1e-9)
    assert _decode_periods(sim.simulate(s, "normal")) == pytest.approx(
        recv + sched + launch + forward + process, abs=1e-9)


def test_thread_overlap_on_an_accelerator_is_device_bound_like_two_streams():
    s = sim.load_scenario(SCENARIOS / "thread-overlap.yaml", ["server.device=cuda"])
    assert _decode_periods(sim.simulate(s, "thread_overlap")) == pytest.approx(4e-3 + 4 * 1e-4, abs=1e-9)


def test_thread_overlap_effects_two_streams_do_better():
    s = sim.load_scenario(SCENARIOS / "thread-overlap.yaml")
    ov, th, no = (sim.simulate(s, k).summary() for k in ("overlap", "thread_overlap", "normal"))
    # the blocking wait on launch completion, and a worse TTFT than two streams
    assert th["mean_sync_wait_ms"] > no["mean_sync_wait_ms"] > ov["mean_sync_wait_ms"]
    assert th["median_ttft_ms"] > 1.15 * ov["median_ttft_ms"]
    assert th["output_throughput"] < 1.01 * no["output_throughput"] < ov["output_throughput"]
    # a worker thread that runs k while the scheduler processes k-1 hides little: GIL turns
    s = sim.load_scenario(SCENARIOS / "thread-overlap.yaml", ["costs.gil.wait_launch_done=false"])
    th = sim.simulate(s, "thread_overlap").summary()
    hidden = (no["median_tpot_ms"] - th["median_tpot_ms"]) / (no["median_tpot_ms"] - ov["median_tpot_ms"])
    assert 0.0 < hidden < 0.5


# The simulator core's results for the shipped quickstart scenario before this branch
# (commit 4b5000a): adding loops, retraction and faults must not move them. The quickstart then
# had inline linear costs, which are the schema's defaults: `costs.profile=null` restores them.
INLINE = ["costs.profile=null"]
BEFORE = {
    "overlap": {"output_throughput": 1914.0337176478777, "median_ttft_ms": 2.7860000000003993,
                "median_itl_ms": 4.18511999999982, "mean_sync_wait_ms": 3.5012640625001836},
    "normal": {"output_throughput": 1654.5997225961294, "median_ttft_ms": 2.7660000000002682,
               "mean_gap_ms": 0.6783124999996629, "gpu_idle_fraction": 0.1402919592916162},
}


@pytest.mark.parametrize("setting", sorted(BEFORE))
def test_existing_loops_unchanged(setting):
    x = sim.simulate(sim.load_scenario(SCENARIOS / "quickstart.yaml", INLINE), setting).summary()
    for key, value in BEFORE[setting].items():
        assert math.isclose(x[key], value, rel_tol=1e-9), key


# A noisy open-loop variant (eos finishes, lognormal outputs, 60k-token pool), same origin.
VARIANT = ["workload.arrival=poisson", "workload.rate_per_s=30",
           "workload.output_len={dist: lognormal, mean: 200, sigma: 0.8}", "workload.finish=eos",
           "costs.noise.gpu_cv=0.1", "costs.noise.cpu_cv=0.2", "server.kv_pool_tokens=60000",
           "workload.cached_len=0", "server.disable_consecutive_prefill_overlap=true"]
BEFORE_VARIANT_MLX = {"output_throughput": 1495.483061170889, "median_ttft_ms": 9.614261525525913,
                      "p99_itl_ms": 9.293112311376639, "mean_gap_ms": 0.05449390178236234}


def test_existing_mlx_chain_unchanged():
    s = sim.load_scenario(SCENARIOS / "quickstart.yaml", INLINE + VARIANT)
    x = sim.simulate(s, "overlap_mlx").summary()
    for key, value in BEFORE_VARIANT_MLX.items():
        assert math.isclose(x[key], value, rel_tol=1e-9), key
