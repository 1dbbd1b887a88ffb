"""The device part of a prefill's launch (calibrate's own model launched eagerly on CUDA, standing
in for the engine's): kept apart by compose, scaled by ``costs.cpu.extend_launch_device_scale``,
and simulated at nil by the verdict (:mod:`sim.whatif.harness`). Hand-computed cases first, then
invariants, then the real commands on the shipped profiles."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibrate.host.compose import DEVICE_LAUNCH, HOLD_MAX_S, compose, launches_outliving_hold
from sim.cli import main
from sim.model.costs import EXTEND
from sim.model.curve import Curve
from sim.model.profile_costs import ProfileCostModel, scaled_device_part
from tests.calibrate_helpers import synthetic_profile
from tests.test_compose import ALL_HOST, host_file

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
SMALL = ["--set", "workload.num_requests=24", "--set", "workload.warmup_requests=4"]


def _composed(device_extend=lambda t: 3e-3 + 1e-6 * t, host_extend=lambda t: 2e-4):
    """A profile composed from a synthetic CUDA torch device part and a host file (host speed 1)."""
    device = synthetic_profile({"launch.extend": device_extend})
    host = host_file({**ALL_HOST, "launch.extend": host_extend})
    return compose(device, host, host_speed=1.0)


# --- hand-computed ------------------------------------------------------------------------------------

def test_compose_keeps_the_device_part_apart_and_the_launch_unchanged():
    """Host launch 0.2 ms at 16 and 512 tokens; the device part 3 ms + 1 us a token, linear between its
    nodes 1, 64, 4096: the composed launch is their sum, device_launch.extend the device part alone."""
    out = _composed()
    launch, part = out["curves"]["launch.extend"], out["curves"][DEVICE_LAUNCH]
    assert launch["grid"] == part["grid"] == [[16.0, 512.0]]
    assert part["values_s"] == pytest.approx([3e-3 + 16e-6, 3e-3 + 512e-6])
    assert launch["values_s"] == pytest.approx([2e-4 + 3e-3 + 16e-6, 2e-4 + 3e-3 + 512e-6])
    assert "device_launch.extend" in out["metadata"]["composed"]["launch"]


def test_scale_zero_leaves_the_host_part_and_half_is_halfway():
    model = ProfileCostModel(_composed(), extend_launch_device_scale=0.0)
    assert model.launch_s(EXTEND, 1, 16, 16) == pytest.approx(2e-4)
    half = ProfileCostModel(_composed(), extend_launch_device_scale=0.5)
    assert half.launch_s(EXTEND, 1, 16, 16) == pytest.approx(2e-4 + 0.5 * (3e-3 + 16e-6))
    whole = ProfileCostModel(_composed())
    assert whole.launch_s(EXTEND, 1, 16, 16) == pytest.approx(2e-4 + 3e-3 + 16e-6)


def test_a_cuda_torch_profile_as_it_is_is_all_device_part():
    """Not composed: the harness timed the whole launch, so scale 0 leaves nothing."""
    profile = synthetic_profile({"launch.extend": lambda t: 5e-3})
    model = ProfileCostModel(profile, extend_launch_device_scale=0.0)
    assert model.device_launch is model.curves["launch.extend"]
    assert ProfileCostModel(profile, extend_launch_device_scale=3.0).launch_s(EXTEND, 1, 64, 64) == \
        pytest.approx(15e-3)
    assert model.launch_s(EXTEND, 1, 64, 64) == 0.0
    assert ProfileCostModel(profile, extend_launch_device_scale=0.25).launch_s(EXTEND, 1, 64, 64) == \
        pytest.approx(1.25e-3)


def test_no_device_part_on_a_cpu_profile_or_sglangs_own_engine():
    cpu = synthetic_profile()
    cpu["metadata"]["device"] = "cpu"
    assert ProfileCostModel(cpu).device_launch is None
    engine = synthetic_profile()
    engine["metadata"]["backend"] = "sglang"
    assert ProfileCostModel(engine).device_launch is None


def test_launches_outliving_the_hold_by_median_and_by_the_calibrations_own_count():
    device = synthetic_profile({"launch.extend": lambda t: HOLD_MAX_S if t >= 64 else HOLD_MAX_S / 2})
    assert launches_outliving_hold(device) == [64.0, 4096.0]
    device["metadata"]["launch_outlived_hold"] = ["extend 1 tokens: 3 of 10", "decode 8 x ctx 16: 1 of 10"]
    assert launches_outliving_hold(device) == [1.0, 64.0, 4096.0]
    device["metadata"]["device"] = "cpu"
    assert launches_outliving_hold(device) == []
    out = compose(synthetic_profile({"launch.extend": lambda t: 0.04}), host_file(ALL_HOST), host_speed=1.0)
    held = out["metadata"]["composed"]["device_launch_outlived_hold"]
    assert held["num_tokens"] == [1.0, 64.0, 4096.0] and held["hold_max_s"] == HOLD_MAX_S


def test_the_shipped_h200_profiles_keep_the_part_and_the_8b_outlived_its_hold():
    for name, outlived in (("h200-llama-3.2-1b", False), ("h200-llama-3.1-8b", True)):
        profile = json.loads((ROOT / "scenarios" / "profiles" / f"{name}.json").read_text())
        assert DEVICE_LAUNCH in profile["curves"]
        assert ("device_launch_outlived_hold" in profile["metadata"]["composed"]) is outlived
        launch, part = profile["curves"]["launch.extend"]["values_s"], profile["curves"][DEVICE_LAUNCH]["values_s"]
        assert all(0 < p < v for p, v in zip(part, launch))  # the host part is the rest, above 0


# --- invariants ---------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.floats(0, 1.0), min_size=2, max_size=5),
       shares=st.lists(st.floats(0, 1.0), min_size=5, max_size=5),
       x=st.floats(0, 1e6), lo=st.floats(0, 1.0), hi=st.floats(0, 1.0))
def test_scaled_launch_lies_between_the_host_part_and_the_launch_and_grows_with_the_scale(values, shares, x, lo, hi):
    grid = [[float(2 ** k) for k in range(len(values))]]
    launch = Curve(("num_tokens",), grid, values)
    device = Curve(("num_tokens",), grid, [v * s for v, s in zip(values, shares)])
    lo, hi = min(lo, hi), max(lo, hi)
    a, b = scaled_device_part(launch, device, lo)(x), scaled_device_part(launch, device, hi)(x)
    assert a <= b + 1e-12
    assert scaled_device_part(launch, device, 0.0)(x) <= a + 1e-12 and b <= launch(x) + 1e-12
    assert scaled_device_part(launch, device, 1.0)(x) == launch(x)
    assert scaled_device_part(launch, device, 2.0)(x) >= launch(x)
    assert a >= 0.0 and math.isfinite(b)


# --- the commands -------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["nan", "inf", "-0.5", "1e7"])
def test_a_bad_scale_is_one_line_exit_2(tmp_path, capsys, value):
    out = tmp_path / "r"
    assert main(["run", str(QUICKSTART), *SMALL, "--set", f"costs.cpu.extend_launch_device_scale={value}",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "costs.cpu.extend_launch_device_scale" in err[0] and not out.exists()


CPU_PROFILE = f"costs.profile={ROOT}/scenarios/profiles/cpu-sglang-tiny.json"


@pytest.mark.parametrize("sets", [["costs.profile=null"], [CPU_PROFILE, "server.device=cpu"]])
def test_a_scale_without_a_device_part_is_refused(tmp_path, capsys, sets):
    args = [a for s in sets for a in ("--set", s)]
    out = tmp_path / "r"
    assert main(["run", str(QUICKSTART), *SMALL, *args, "--set", "costs.cpu.extend_launch_device_scale=0",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "costs.cpu.extend_launch_device_scale: 1" in err[0] and not out.exists()


def test_the_verdict_simulates_the_floor_and_it_is_the_run_with_the_scale_at_zero(tmp_path, capsys):
    assert main(["run", str(QUICKSTART), *SMALL, "--tables", "none", "--json", "--out", str(tmp_path / "a")]) == 0
    ran = json.loads(capsys.readouterr().out)
    floor = ran["verdict"]["prefill_launch_floor"]
    assert floor["simulated"] and floor["device_part_ms"] > 0.9 * floor["launch_ms"]
    assert "were that part nil (the engine's host part alone" in ran["verdict"]["line"]
    assert main(["run", str(QUICKSTART), *SMALL, "--tables", "none", "--json", "--out", str(tmp_path / "b"),
                 "--set", "costs.cpu.extend_launch_device_scale=0"]) == 0
    at_zero = json.loads(capsys.readouterr().out)["settings"]
    for name, got in floor["at_floor"].items():
        assert got["output_throughput"] == at_zero[name]["output_throughput"]
        assert got["median_ttft_ms"] == at_zero[name]["median_ttft_ms"]
        assert got["median_ttft_ms"] < ran["settings"][name]["median_ttft_ms"]  # no launch to wait for


def test_no_range_says_the_floor_was_not_simulated(tmp_path, capsys):
    assert main(["run", str(QUICKSTART), *SMALL, "--tables", "none", "--json", "--no-range",
                 "--out", str(tmp_path / "a")]) == 0
    verdict = json.loads(capsys.readouterr().out)["verdict"]
    assert "the TTFTs would be lower (not simulated: --no-range)" in verdict["line"]


def test_the_8b_profile_says_its_launch_outlived_the_hold(tmp_path, capsys):
    assert main(["run", str(QUICKSTART), *SMALL, "--tables", "none", "--json", "--out", str(tmp_path / "a"),
                 "--set", f"costs.profile={ROOT}/scenarios/profiles/h200-llama-3.1-8b.json", "--set",
                 "workload.cached_len=0", "--set", "workload.input_len=32", "--set", "workload.concurrency=1"]) == 0
    verdict = json.loads(capsys.readouterr().out)["verdict"]
    assert "at every prefill size the device calibration measured (1 to 8,192 tokens) that part lasted at least " \
           "the harness's longest stream hold (30 ms)" in verdict["line"]


def test_a_profile_without_the_part_gets_no_clause(tmp_path, capsys):
    assert main(["run", str(ROOT / "scenarios" / "vllm-h200.yaml"), *SMALL, "--tables", "none", "--json",
                 "--out", str(tmp_path / "a")]) == 0
    verdict = json.loads(capsys.readouterr().out)["verdict"]
    assert "prefill_launch_floor" not in verdict and "queued kernel by kernel" not in verdict["line"]


def test_the_sweep_clause_counts_the_points_where_the_launch_is_mostly_the_harness():
    from sim.whatif.harness import prefill_launch_sweep_clause

    assert prefill_launch_sweep_clause([(1.0, 10.0, "a=1")], 1) == ""
    clause = prefill_launch_sweep_clause([(9.6, 10.0, "a=1"), (1.0, 10.0, "a=2"), (40.0, 41.0, "a=3")], 3)
    assert clause.startswith("at 2 of 3 points the profile's prefill launch is mostly")
    assert "up to 40 of 41 ms a prefill, at a=3" in clause


def test_the_calibration_counts_launches_that_outlive_the_hold():
    """The CUDA harness's bookkeeping, with the timed step faked (no card here)."""
    pytest.importorskip("torch")
    from calibrate.forward.torch_backend import TorchBackend

    backend = TorchBackend.__new__(TorchBackend)  # (no config: only the counting is exercised)
    backend.outlived_hold = []
    flags = iter([True, False, True, True, False])  # the first is warm-up: not counted

    def timed(make_inputs, launch, n_out, cycles):
        return 1e-3, 2e-3, [0], next(flags)

    backend._timed = timed
    fwd, lau = backend._repeat(None, None, 1, 1, 4, lambda: "extend 16 tokens")
    assert fwd == [1e-3] * 4 and lau == [2e-3] * 4
    assert backend.outlived_hold == ["extend 16 tokens: 2 of 4"]


# --- the device runs an eager prefill's kernels as they are queued ----------------------------------

@pytest.mark.parametrize("launch, forward", [(0.010, 0.003), (0.002, 0.008)])
def test_an_eager_prefill_ends_with_its_launch_or_a_forward_after_its_start(tmp_path, launch, forward):
    """Hand-computed, one request under ``normal``: a CUDA torch profile's whole prefill launch is
    its kernels queued one by one, so the device may start with the launch and ends at the later of
    the launch's end (launch-bound) and a forward after it could start (device-bound); the forward's
    device time is placed last in that window."""
    from calibrate.profile import save_profile
    from sim.simulate import simulate
    from tests.helpers import constant_scenario

    const = lambda v: (lambda *x: v)  # noqa: E731
    profile = synthetic_profile({"launch.extend": const(launch), "forward.extend": const(forward)})
    path = tmp_path / "p.json"
    save_profile(path, profile)
    scenario = constant_scenario(c=1, output_len=3, settings=("normal",), costs__profile=str(path))
    steps = simulate(scenario, "normal").steps
    prefill = steps[steps["kind"] == "extend"].iloc[0]
    assert prefill["launch_end"] - prefill["launch_start"] == pytest.approx(launch)
    assert prefill["forward_end"] == pytest.approx(prefill["launch_start"] + max(launch, forward))
    assert prefill["forward_end"] - prefill["forward_start"] == pytest.approx(forward)
    decode = steps[steps["kind"] == "decode"]
    assert (decode["forward_start"] >= decode["launch_end"] - 1e-12).all()  # a graph replay: after its launch


def test_a_composed_prefill_starts_after_its_host_part():
    """Host part 0.2 ms, device part 3 ms + 1 us a token at 16 tokens: the device may start 0.2 ms
    into the launch; the eager share is the device part over the launch."""
    model = ProfileCostModel(_composed())
    assert model.eager_share(EXTEND, 16) == pytest.approx((3e-3 + 16e-6) / (2e-4 + 3e-3 + 16e-6))
    assert model.eager_share(1, 16) == 0.0  # a decode: queued at its launch's end
    assert ProfileCostModel(_composed(), extend_launch_device_scale=0.0).eager_share(EXTEND, 16) == 0.0


def test_where_the_two_ends_differ_the_clause_names_both(tmp_path, capsys):
    """A closed loop of one client and 32-token prompts on the 8B profile: 1.031x at the profile's
    launch (no difference one A/B run could see), 1.058x at the floor (keep on); a closed loop's
    throughputs are its own, so the ratio is given, not 'the arrivals set both throughputs'."""
    assert main(["run", str(QUICKSTART), "--tables", "none", "--json", "--out", str(tmp_path / "a"),
                 "--set", f"costs.profile={ROOT}/scenarios/profiles/h200-llama-3.1-8b.json", "--set",
                 "workload.concurrency=1", "--set", "workload.input_len=32", "--set", "workload.cached_len=0",
                 "--set", "workload.output_len=8", "--set", "workload.num_requests=64"]) == 0
    line = json.loads(capsys.readouterr().out)["verdict"]["line"]
    assert ("'keep on' there, 'no difference one A/B run could see' at the profile's launch: which holds depends on "
            "the engine's launch, between the two") in line
    assert "the arrivals set" not in line and "the engine's TTFTs likely lie between the two" in line


def test_an_mlx_launch_is_not_taken_for_eager_kernels():
    """An MLX calibration's launch builds a lazy graph the device starts only at its submission:
    compose keeps no device part of it, and a profile that says MLX is read as having none."""
    device = synthetic_profile({"launch.extend": lambda t: 3e-3})
    device["metadata"].update(backend="mlx", device="gpu")
    out = compose(device, host_file(ALL_HOST), host_speed=1.0)
    assert DEVICE_LAUNCH not in out["curves"]
    cuda = _composed()
    cuda["metadata"].update(backend="mlx", device="gpu")  # (the curve present, the metadata MLX's)
    model = ProfileCostModel(cuda)
    assert model.device_launch is None and model.eager_share(EXTEND, 16) == 0.0


def test_the_floor_is_in_the_json_even_where_it_moves_nothing(tmp_path, capsys):
    """32 clients of 512 uncached tokens on the 1B profile: the prefills are device-bound, so the
    floor moves nothing and the line says nothing of it; the JSON still holds what was checked,
    with exact medians (the run's tables)."""
    assert main(["run", str(QUICKSTART), "--json", "--no-plots", "--out", str(tmp_path / "a"), "--set",
                 "workload.concurrency=32", "--set", "workload.cached_len=0", "--set", "workload.output_len=32",
                 "--set", "workload.num_requests=96", "--set", "workload.warmup_requests=32"]) == 0
    ran = json.loads(capsys.readouterr().out)
    floor = ran["verdict"]["prefill_launch_floor"]
    assert floor["simulated"] and "queued kernel by kernel" not in ran["verdict"]["line"]
    for name, got in floor["at_floor"].items():
        assert got["median_ttft_ms"] == pytest.approx(ran["settings"][name]["median_ttft_ms"], rel=0.05)


def test_the_floor_streams_its_medians_where_the_run_does(tmp_path, capsys):
    """``--tables summary`` streams a run's medians: its floor is streamed too (the same sketch),
    so the two pairs the clause sets side by side are alike."""
    args = [*SMALL, "--tables", "summary", "--no-plots", "--json"]
    assert main(["run", str(QUICKSTART), *args, "--out", str(tmp_path / "a")]) == 0
    floor = json.loads(capsys.readouterr().out)["verdict"]["prefill_launch_floor"]["at_floor"]
    assert main(["run", str(QUICKSTART), *args, "--out", str(tmp_path / "b"), "--set",
                 "costs.cpu.extend_launch_device_scale=0", "--tables", "none"]) == 0
    at_zero = json.loads(capsys.readouterr().out)["settings"]
    for name, got in floor.items():
        assert got["median_ttft_ms"] == at_zero[name]["median_ttft_ms"]
