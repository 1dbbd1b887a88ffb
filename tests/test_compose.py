"""A device profile from parts (calibrate.host.compose) and the host yardstick (calibrate.host.yardstick):
hand-computed cases first, then invariants, then the command's bad inputs."""

from __future__ import annotations

import copy
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibrate.host import yardstick
from calibrate.host.compose import compose
from calibrate.profile import build_profile, save_profile
from sim.errors import ProfileError
from sim.model.profile import CURVE_AXES, SGLANG_HOST_CURVES, validate_profile
from tests.calibrate_helpers import synthetic_profile
from tests.helpers import verdict_of

HOST_META = {"backend": "sglang", "device": "host", "kind": "host", "device_name": "host only", "host_cpu": "hostA",
             "libraries": {"sglang": "0.5.23"}, "model": {"name": "tiny-llama"}, "date": "2026-12-02T00:00:00+00:00",
             "grid": {}, "repeats": 1, "engine": "sglang", "engine_version": "0.5.23"}


def host_file(values: dict, overlap: dict | None = None, readings: list | None = None) -> dict:
    """A host-costs file whose host curves are ``values[name](x)`` (s) at batch sizes 1, 8, 64
    (recv also 0) and new tokens 16, 512; ``overlap``: the same for setting_curves.overlap."""
    samples = []
    for setting, vals in (("", values), ("overlap", overlap or {})):
        for name, axes in CURVE_AXES.items():
            if name.startswith("forward") or name not in vals:
                continue
            nodes = [16, 512] if axes == ("num_tokens",) else ([0, 1, 8, 64] if name == "recv" else [1, 8, 64])
            for x in nodes:
                smp = {"curve": name, "point": {axes[0]: x}, "times_s": [vals[name](x)]}
                if setting:
                    smp["setting"] = setting
                samples.append(smp)
    meta = copy.deepcopy(HOST_META)
    if readings is not None:
        meta["yardstick"] = {"python": "3.11", "readings": readings}
    return build_profile(meta, samples, SGLANG_HOST_CURVES)


ALL_HOST = {n: (lambda x, n=n: 1e-4 * (1 + x / 64)) for n in CURVE_AXES if not n.startswith("forward")}


def reading(curve: str, n: int, t: float) -> dict:
    return {"curve": curve, "point": {"num_reqs": n}, "median_s": t, "n": 5}


def test_launch_is_host_part_moved_plus_device_part():
    """Hand-computed: host launch 0.1 ms at host speed 2 (-> 0.05 ms) plus the device's 0.2 ms."""
    device = synthetic_profile({"launch.decode": lambda n: 2e-4, "launch.extend": lambda t: 3e-3,
                                "process.decode": lambda n: 9.0})  # the re-implementation's: dropped
    host = host_file({**ALL_HOST, "launch.decode": lambda n: 1e-4, "process.decode": lambda n: 4e-4})
    out = compose(device, host, host_speed=2.0)
    validate_profile(out, "<composed>")
    assert out["curves"]["launch.decode"]["values_s"] == pytest.approx([2.5e-4] * 3)
    assert out["curves"]["process.decode"]["values_s"] == pytest.approx([2e-4] * 3)
    assert out["curves"]["launch.extend"]["values_s"] == pytest.approx([ALL_HOST["launch.extend"](t) / 2 + 3e-3
                                                                      for t in (16, 512)])
    assert out["curves"]["forward.decode"] == device["curves"]["forward.decode"]
    src = out["metadata"]["curve_sources"]
    assert src["forward.decode"]["source"] == "measured"
    assert src["process.decode"]["source"] == "moved" and src["process.decode"]["host_speed"] == 2.0
    assert src["launch.decode"]["source"] == "parts"
    assert not any(s["curve"] == "process.decode" and s["times_s"] == [9.0] for s in out["samples"])


def test_overlap_setting_curves_carry_their_own_launch():
    device = synthetic_profile({"launch.decode": lambda n: 2e-4})
    host = host_file({**ALL_HOST, "launch.decode": lambda n: 1e-4}, overlap={"launch.decode": lambda n: 3e-4})
    out = compose(device, host, host_speed=1.0)
    assert out["setting_curves"]["overlap"]["launch.decode"]["values_s"] == pytest.approx([5e-4] * 3)


def test_cpu_engine_device_profile_has_no_device_launch_part():
    """SGLang's CPU engine timed its launch as run_batch less the forward: the host part itself."""
    device = synthetic_profile({"launch.decode": lambda n: 7e-4})
    device["metadata"].update({"backend": "sglang", "device": "cpu", "engine": "sglang"})
    host = host_file({**ALL_HOST, "launch.decode": lambda n: 1e-4})
    out = compose(device, host, host_speed=1.0)
    assert out["curves"]["launch.decode"]["values_s"] == pytest.approx([1e-4] * 3)
    assert out["metadata"]["curve_sources"]["launch.decode"]["device_part"]["source"] == "none"


def test_yardstick_host_speed_closed_form():
    """Every point twice as fast on the target: speed 2, the uncertainty at its floor."""
    src = [reading("recv", n, 2e-4 * n) for n in (1, 2, 4, 8)]
    dst = [reading("recv", n, 1e-4 * n) for n in (1, 2, 4, 8)]
    got = yardstick.host_speed(src, dst)
    assert got["host_speed"] == pytest.approx(2.0)
    assert got["uncertainty_rel"] == pytest.approx(yardstick.FLOOR_REL)
    assert got["points"] == 4


def test_yardstick_spread_is_the_geometric_sd():
    src = [reading("recv", 1, 1.0), reading("recv", 2, 1.0), reading("recv", 4, 1.0), reading("recv", 8, 1.0)]
    dst = [reading("recv", 1, 0.5), reading("recv", 2, 2.0), reading("recv", 4, 0.5), reading("recv", 8, 2.0)]
    got = yardstick.host_speed(src, dst)
    assert got["host_speed"] == pytest.approx(1.0)
    assert got["uncertainty_rel"] == pytest.approx(1.0)  # logs +-ln 2: sd ln 2, exp - 1 = 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1e-7, 1.0), min_size=3, max_size=12), st.floats(1e-3, 1e3))
def test_yardstick_scales_inversely_with_the_target(times, k):
    src = [reading("recv", i, t) for i, t in enumerate(times)]
    dst = [reading("recv", i, t * k) for i, t in enumerate(times)]
    got = yardstick.host_speed(src, dst)
    assert got["host_speed"] == pytest.approx(1 / k, rel=1e-9)
    assert math.isfinite(got["uncertainty_rel"]) and got["uncertainty_rel"] >= yardstick.FLOOR_REL


@pytest.mark.parametrize("bad", [[], [reading("recv", 1, 0.0)] * 5, [reading("recv", 1, 1e-3)] * 2])
def test_yardstick_needs_three_usable_points(bad):
    with pytest.raises(ValueError, match="at least 3"):
        yardstick.host_speed(bad, bad)


def test_compose_moves_by_the_yardsticks():
    """The device host ran the yardstick in half the time: its phases take half."""
    device = synthetic_profile({"recv": lambda n: 1e-5 * (n + 1), "schedule.decode": lambda n: 2e-5 * n})
    readings = [reading("recv", n, 2e-5 * (n + 1)) for n in (0, 1, 8, 64)]
    readings += [reading("schedule.decode", n, 4e-5 * n) for n in (1, 8, 64)]
    host = host_file({**ALL_HOST, "schedule.decode": lambda n: 1e-3}, readings=readings)
    out = compose(device, host)
    move = out["metadata"]["composed"]["move"]
    assert move["host_speed"] == pytest.approx(2.0)
    assert out["curves"]["schedule.decode"]["values_s"] == pytest.approx([5e-4] * 3)
    assert "±" in out["metadata"]["composed"]["note"]


def test_compose_refuses_what_it_cannot_use():
    device = synthetic_profile()
    host = host_file(ALL_HOST)
    with pytest.raises(ProfileError, match="host-costs file"):
        compose(device, device, host_speed=1.0)
    with pytest.raises(ProfileError, match="device profile"):
        compose(host, host, host_speed=1.0)
    with pytest.raises(ProfileError, match="yardstick"):
        compose(device, host)  # no readings in the host file
    moved = copy.deepcopy(device)
    moved["metadata"]["transfer"] = {"from_device_name": "x"}
    with pytest.raises(ProfileError, match="--host-speed"):
        compose(moved, host_file(ALL_HOST, readings=[reading("recv", 1, 1e-4)] * 3))
    with pytest.raises(ValueError):
        compose(device, host, host_speed=float("nan"))


def _write(tmp_path, name, profile):
    path = tmp_path / name
    save_profile(path, profile)
    return path


@pytest.mark.parametrize("case", ["nan", "zero", "folder", "host-as-device", "out-folder", "missing"])
def test_compose_command_bad_input_is_one_line(tmp_path, run_cli, case):
    dev = _write(tmp_path, "dev.json", synthetic_profile())
    host = _write(tmp_path, "host.json", host_file(ALL_HOST))
    out = tmp_path / "out.json"
    argv = {"nan": [dev, host, "--out", out, "--host-speed", "nan"],
            "zero": [dev, host, "--out", out, "--host-speed", "0"],
            "folder": [tmp_path, host, "--out", out, "--host-speed", "1"],
            "host-as-device": [host, host, "--out", out, "--host-speed", "1"],
            "out-folder": [dev, host, "--out", tmp_path, "--host-speed", "1"],
            "missing": [dev, tmp_path / "nope.json", "--out", out, "--host-speed", "1"]}[case]
    code, stdout, stderr = run_cli(["compose", *map(str, argv)])
    assert code == 2
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr
    assert not out.exists() or out.is_dir()


def test_compose_command_writes_a_profile(tmp_path, run_cli):
    dev = _write(tmp_path, "dev.json", synthetic_profile())
    host = _write(tmp_path, "host.json", host_file(ALL_HOST))
    out = tmp_path / "out.json"
    code, stdout, stderr = run_cli(["compose", str(dev), str(host), "--out", str(out), "--host-speed", "1.5"])
    assert code == 0, stderr
    data = json.loads(out.read_text())
    validate_profile(data, str(out))
    assert data["metadata"]["composed"]["move"]["host_speed"] == 1.5


# --- a vLLM profile for a card (calibrate.host.compose_vllm) ---

def vllm_host_profile(value_s: float = 1e-4) -> dict:
    """A vLLM profile whose every curve is ``value_s`` (forward 5 ms) at 1, 4, 16 requests."""
    from sim.engines.vllm.profile import VLLM_CURVES

    samples = []
    for name, axes in VLLM_CURVES.all.items():
        if axes == ("num_reqs",):
            for n in (1, 4, 16):
                samples.append({"curve": name, "point": {"num_reqs": n}, "times_s": [value_s]})
        else:
            for n in (1, 16, 512):
                for c in (128, 1024):
                    samples.append({"curve": name, "point": {"num_tokens": n, "ctx": c}, "times_s": [5e-3]})
    meta = {**copy.deepcopy(HOST_META), "kind": None, "engine": "vllm", "engine_version": "0.32.0", "backend": "vllm",
            "device": "cpu", "device_name": "cpu (vLLM)", "settings": ["sync", "async"], "base_setting": "sync",
            "grid": {"decode_batch_sizes": [1, 4, 16]}, "mixed_steps": "sum_of_parts",
            "shared_prefix": {"saving": 0.7}}
    meta.pop("kind")
    return build_profile(meta, samples, VLLM_CURVES)


def test_vllm_forward_is_the_cards_and_host_curves_are_moved():
    """Hand-computed: decode nodes read forward.decode(n, ctx); prefill nodes forward.extend of
    all their tokens; every host curve divided by the host speed."""
    from sim.engines.vllm.profile import VLLM_CURVES

    device = synthetic_profile({"forward.decode": lambda n, c: 1e-3 + 1e-6 * n * c,
                                "forward.extend": lambda t, p: 2e-3 + 1e-6 * t})
    out = compose(device, vllm_host_profile(1e-4), host_speed=2.0)
    validate_profile(out, "<vllm>", VLLM_CURVES)
    fwd = out["curves"]["vllm.forward"]
    tokens, ctxs = fwd["grid"]
    assert tokens[:3] == [1.0, 8.0, 64.0] and max(tokens) == 4096.0  # the device's decode batches, then prefills
    i, j = tokens.index(8.0), ctxs.index(1024.0)
    assert fwd["values_s"][i][j] == pytest.approx(1e-3 + 1e-6 * 8 * 1024)
    i = tokens.index(4096.0)  # 4096 tokens at ctx 1024: 4 prefills of 1024 new tokens, priced as one of 4096
    assert fwd["values_s"][i][j] == pytest.approx(2e-3 + 1e-6 * 4096)
    assert out["curves"]["vllm.schedule"]["values_s"] == pytest.approx([5e-5] * 3)
    meta = out["metadata"]
    assert meta["engine"] == "vllm" and meta["device"] == "cuda"
    assert "mixed_steps" not in meta and "shared_prefix" not in meta
    assert meta["curve_sources"]["vllm.schedule"]["measured_to"] == 16
    assert "CPU platform" in meta["composed"]["approximations"]


def test_vllm_compose_refuses_a_vllm_device_profile():
    with pytest.raises(ProfileError, match="metadata.engine"):
        compose(vllm_host_profile(), vllm_host_profile(), host_speed=1.0)


def test_shipped_vllm_card_scenario_runs_both_settings_with_a_range(run_cli, tmp_path):
    from tests.conftest import SCENARIOS

    code, out, err = run_cli(["run", SCENARIOS / "vllm-h200.yaml", "--out", tmp_path, "--no-plots"])
    assert code == 0, err
    verdict = verdict_of(out)
    assert "async/sync" in verdict and "host phases ±" in verdict
    summary = json.loads((tmp_path / "summary.json").read_text())
    rng = summary["verdict"]["stated_range"]
    assert rng["ratio_low"] <= summary["verdict"]["throughput_ratio"] <= rng["ratio_high"]
    assert any(line.startswith("note: the profile approximates") for line in out.splitlines())


def test_a_moved_profile_range_is_wider_than_a_tighter_one(run_cli, tmp_path):
    """The range follows the stated uncertainty: the same profile stated at ±5% gives a narrower range."""
    from tests.conftest import ROOT, SCENARIOS

    prof = json.loads((ROOT / "scenarios/profiles/h200-llama-3.2-1b.json").read_text())
    prof["metadata"]["composed"]["move"]["uncertainty_rel"] = 0.05
    tight = tmp_path / "tight.json"
    tight.write_text(json.dumps(prof))
    ranges = {}
    for name, path in (("shipped", ROOT / "scenarios/profiles/h200-llama-3.2-1b.json"), ("tight", tight)):
        code, out, err = run_cli(["run", SCENARIOS / "quickstart.yaml", "--set", f"costs.profile={path}", "--out",
                                  tmp_path / name, "--no-plots", "--json"])
        assert code == 0, err
        r = json.loads(out)["verdict"]["stated_range"]
        ranges[name] = r["ratio_high"] - r["ratio_low"]
    assert 0 < ranges["tight"] < ranges["shipped"]


def test_a_gpu_profile_on_the_reimplementation_says_so(run_cli, tmp_path):
    from tests.conftest import ROOT, SCENARIOS

    old = ROOT / "scenarios/profiles/parts/h200-llama-3.2-1b.device.json"
    code, out, _ = run_cli(["run", SCENARIOS / "quickstart.yaml", "--set", f"costs.profile={old}", "--out",
                            tmp_path / "old", "--no-plots"])
    assert code == 0 and "host phases are the project's re-implementation" in out
    code, out, _ = run_cli(["run", SCENARIOS / "quickstart.yaml", "--out", tmp_path / "new", "--no-plots"])
    assert code == 0 and "re-implementation" not in out


@pytest.mark.parametrize("order, flag, words", [
    (("host", "dev"), "DEVICE", "the order is DEVICE HOST"),
    (("dev", "dev"), "HOST", "a device profile"),
    (("dev", "full"), "HOST", "without --host-only"),
])
def test_swapped_or_wrong_kinds_of_file_are_named(run_cli, tmp_path, order, flag, words):
    full = synthetic_profile()
    full["metadata"].update({"backend": "sglang", "device": "cpu", "engine": "sglang"})
    files = {"dev": _write(tmp_path, "dev.json", synthetic_profile()),
             "host": _write(tmp_path, "host.json", host_file(ALL_HOST)), "full": _write(tmp_path, "full.json", full)}
    code, _, err = run_cli(["compose", files[order[0]], files[order[1]], "--out", tmp_path / "o.json", "--host-speed", "1"])
    assert code == 2 and err.count("\n") == 1 and flag in err and words in err


def test_a_host_files_grammar_curves_are_moved_with_the_host_phases():
    """Structured output (calibrate --engine sglang --host-only --structured-output): the
    grammar.* curves join the composed profile moved like the host phases, with the metadata."""
    from sim.model.profile import GRAMMAR_CURVE_AXES

    host = host_file(ALL_HOST)
    for name in GRAMMAR_CURVE_AXES:
        host["samples"] += [{"curve": name, "point": {"num_reqs": n}, "times_s": [1e-4 * n]} for n in (1, 8, 64)]
    host["metadata"]["structured_output"] = {"kind": "json_schema"}
    host = build_profile(host["metadata"], host["samples"], SGLANG_HOST_CURVES)
    out = compose(synthetic_profile({"launch.decode": lambda n: 2e-4}), host, host_speed=2.0)
    validate_profile(out, "<composed>")
    assert out["curves"]["grammar.mask"]["values_s"] == pytest.approx([0.5e-4, 4e-4, 32e-4])
    assert out["metadata"]["structured_output"]["kind"] == "json_schema"
    assert out["metadata"]["curve_sources"]["grammar.process"]["source"] == "moved"
    plain = compose(synthetic_profile({"launch.decode": lambda n: 2e-4}), host_file(ALL_HOST), host_speed=2.0)
    assert "grammar.mask" not in plain["curves"] and "grammar.mask" not in plain["metadata"]["curve_sources"]
