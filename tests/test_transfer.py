"""Moving a profile between cards (sim.model.transfer, overlap-sim transfer): the arithmetic by hand,
identities, the card table, bad input, and invariants."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.errors import ProfileError
from sim.model.cards import CARDS, find_card
from sim.model.profile import load_profile, validate_profile
from sim.model.transfer import forward_time_s, model_terms, transfer_profile, work

ROOT = Path(__file__).resolve().parents[1]
H200_1B = ROOT / "scenarios/profiles/h200-llama-3.2-1b.json"
PROFILE = load_profile(H200_1B)
M = model_terms(PROFILE["metadata"], "test")


def test_card_table_is_complete_and_cited():
    for key in ("l4", "a10g", "a100-40gb", "a100-80gb", "h100", "h200", "b200", "rtx-4090", "m2-max", "m3-max",
                "m4-max", "m2-ultra", "m3-ultra"):
        c = CARDS[key]
        assert c.bandwidth_gb_s > 0 and c.memory_gb > 0 and "https://" in c.source and c.host
    assert CARDS["h200"].bandwidth_gb_s == 4800 and CARDS["l4"].bandwidth_gb_s == 300
    assert find_card("NVIDIA H200") is CARDS["h200"] and find_card("nvidia  l4") is CARDS["l4"]
    assert find_card("cpu (1 torch threads)") is None


def test_model_terms_of_llama_3_2_1b():
    assert M == {"P": 1235746816, "w": 2, "L": 16, "H": 32, "d": 64, "kv": 2 * 16 * 8 * 64 * 2}
    flops, nbytes = work("forward.decode", 1, 128, M)
    assert flops == 2 * 1235746816 + 4 * 16 * 32 * 64 * 128
    assert nbytes == 2 * 1235746816 + 128 * 32768
    flops, nbytes = work("forward.extend", 4, 10, M)  # 4 new tokens after 10 cached: keys 10 + (1+2+3+4)/4
    assert flops == 2 * 1235746816 * 4 + 4 * 16 * 32 * 64 * 4 * (10 + 2.5)
    assert nbytes == 2 * 1235746816 + 14 * 32768


def test_roofline_move_by_hand():
    # decode 1 x 128 on H200 -> L4: bandwidth-bound on both; t' = t - B/(0.8*4.8e12) + B/(0.8*300e9)
    b = 2 * 1235746816 + 128 * 32768
    t = 2.419e-3
    expected = t - b / (0.8 * 4.8e12) + b / (0.8 * 300e9)
    assert forward_time_s(t, "forward.decode", 1, 128, M, CARDS["h200"], CARDS["l4"]) == pytest.approx(expected)
    assert expected == pytest.approx(12.09e-3, abs=0.01e-3)
    # the ratio method: the whole decode by 4800/300 = 16, a prefill by 989.5/121
    assert forward_time_s(t, "forward.decode", 1, 128, M, CARDS["h200"], CARDS["l4"], "ratio") == pytest.approx(16 * t)
    assert forward_time_s(t, "forward.extend", 8, 0, M, CARDS["h200"], CARDS["l4"], "ratio") == \
        pytest.approx(t * 989.5 / 121)
    # faster than the roofline at the source: all of it scales (here by the bandwidth ratio)
    tiny = 1e-4
    assert forward_time_s(tiny, "forward.decode", 1, 128, M, CARDS["h200"], CARDS["l4"]) == pytest.approx(tiny * 16)


def test_transfer_profile_records_and_scales(tmp_path):
    new = transfer_profile(PROFILE, "l4", host_speed=2.0)
    meta = new["metadata"]
    assert meta["device_name"] == "NVIDIA L4" and meta["transfer"]["from_device_name"] == "NVIDIA H200"
    assert meta["transfer"]["bandwidth_ratio"] == pytest.approx(300 / 4800)
    assert meta["transfer"]["uncertainty_rel"] == 0.3 and meta["transfer"]["host_speed"] == 2.0
    for name in ("recv", "schedule.decode", "launch.decode", "process.decode"):
        assert new["curves"][name]["values_s"] == pytest.approx([v / 2 for v in PROFILE["curves"][name]["values_s"]])
    old, moved = PROFILE["curves"]["forward.decode"], new["curves"]["forward.decode"]
    assert all(b > a for ra, rb in zip(old["values_s"], moved["values_s"]) for a, b in zip(ra, rb))
    validate_profile(new, "new")
    # samples moved like the curves: the median of a point's moved samples is its moved node
    smp = next(s for s in new["samples"] if s["curve"] == "forward.decode" and s["point"] == {"num_reqs": 1, "ctx": 128})
    i, j = old["grid"][0].index(1), old["grid"][1].index(128)
    assert sorted(smp["times_s"])[len(smp["times_s"]) // 2] == pytest.approx(moved["values_s"][i][j], rel=0.05)


def test_identity_and_round_trip():
    same = transfer_profile(PROFILE, "h200")
    for ra, rb in zip(PROFILE["curves"]["forward.decode"]["values_s"], same["curves"]["forward.decode"]["values_s"]):
        assert rb == pytest.approx(ra)
    there = transfer_profile(PROFILE, "a10g")
    back = transfer_profile(there, "h200")
    for name in ("forward.decode", "forward.extend"):
        for ra, rb in zip(PROFILE["curves"][name]["values_s"], back["curves"][name]["values_s"]):
            assert rb == pytest.approx(ra, rel=1e-9)


def test_apple_card_without_compute_figure():
    new = transfer_profile(PROFILE, "m4-max")
    assert new["metadata"]["transfer"]["compute_published"] is False
    assert new["metadata"]["transfer"]["compute_ratio"] == pytest.approx(546 / 4800)


def test_cli_writes_and_the_run_names_the_card(tmp_path, capsys):
    out = tmp_path / "l4.json"
    assert main(["transfer", str(H200_1B), "--to", "l4", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "NVIDIA H200 -> NVIDIA L4" in text and "stated uncertainty ±30%" in text
    assert json.loads(out.read_text())["metadata"]["device_name"] == "NVIDIA L4"
    assert main(["run", str(ROOT / "scenarios/quickstart.yaml"), "--set", f"costs.profile={out}", "--no-plots",
                 "--tables", "none", "--out", str(tmp_path / "r")]) == 0
    text = capsys.readouterr().out
    assert "NVIDIA L4 (transferred from NVIDIA H200, ±30%), llama-3.2-1b" in text and "verdict:" in text
    assert main(["transfer", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "NVIDIA L4" in listed and "Apple M4 Max" in listed and "https://" in listed


@pytest.mark.parametrize("argv, needle", [
    (["--to", "t4"], "--to: one of l4"),
    (["--to", "l4", "--host-speed", "0"], "--host-speed"),
    (["--to", "l4", "--efficiency", "2"], "--efficiency"),
    (["--to", "l4", "--from", "tpu"], "--from: one of"),
])
def test_bad_flags_are_one_line(argv, needle, tmp_path, capsys):
    assert main(["transfer", str(H200_1B), "--out", str(tmp_path / "x.json"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and not (tmp_path / "x.json").exists()


def test_bad_profiles_are_one_line(tmp_path, capsys):
    cpu = ROOT / "scenarios/profiles/cpu-torch-small.json"
    assert main(["transfer", str(cpu), "--to", "l4", "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "metadata.device_name" in err and "--from" in err
    # with --from it moves (a CPU profile read as if measured on an A10G: the user's claim)
    assert main(["transfer", str(cpu), "--to", "l4", "--from", "a10g", "--out", str(tmp_path / "y.json")]) == 0
    capsys.readouterr()
    vllm = ROOT / "scenarios/profiles/cpu-vllm-tiny.json"
    assert main(["transfer", str(vllm), "--to", "l4", "--from", "l4", "--out", str(tmp_path / "z.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "metadata.engine" in err
    data = json.loads(H200_1B.read_text())
    del data["metadata"]["model"]["layers"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="metadata.model.layers"):
        transfer_profile(data, "l4", source=str(bad))
    assert main(["transfer", "--to", "l4"]) == 2 and "PROFILE" in capsys.readouterr().err


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(CARDS)), st.sampled_from(sorted(CARDS)), st.floats(1e-5, 1.0),
       st.sampled_from([(1, 128), (8, 512), (256, 4096)]), st.sampled_from(["forward.decode", "forward.extend"]))
def test_faster_card_never_slower_and_round_trip(a, b, t, point, curve):
    src, dst = CARDS[a], CARDS[b]
    moved = forward_time_s(t, curve, *point, M, src, dst)
    assert moved > 0 and math.isfinite(moved)
    assert forward_time_s(moved, curve, *point, M, dst, src) == pytest.approx(t, rel=1e-9)
    both_faster = dst.bandwidth_gb_s >= src.bandwidth_gb_s and (
        dst.bf16_tflops is None or src.bf16_tflops is None or dst.bf16_tflops >= src.bf16_tflops)
    if both_faster and (dst.bf16_tflops is None) == (src.bf16_tflops is None):
        assert moved <= t * (1 + 1e-12)


def test_the_split_checked_on_the_two_h200_profiles():
    """docs/transfer.md's check: the 8B profile predicted from the 1B one on the same H200, the
    roofline part by the 8B's own work and the rest by the layer ratio: median within 15%, worst
    within 45%; whole steps scaled by the work ratio are off by more than 50% at the median."""
    import statistics

    from sim.model.profile import profile_curves
    from sim.model.transfer import EFFICIENCY, roofline_s

    big = load_profile(ROOT / "scenarios/profiles/h200-llama-3.1-8b.json")
    m8 = model_terms(big["metadata"], "8b")
    c1, c8, h200 = profile_curves(PROFILE), profile_curves(big), CARDS["h200"]
    for name in ("forward.decode", "forward.extend"):
        split, whole = [], []
        g = big["curves"][name]["grid"]
        for x in g[0]:
            for y in g[1]:
                t1, t8 = c1[name](x, y), c8[name](x, y)
                r1 = roofline_s(*work(name, x, y, M), h200.bandwidth_bytes_s, h200.bf16_flops, EFFICIENCY)
                r8 = roofline_s(*work(name, x, y, m8), h200.bandwidth_bytes_s, h200.bf16_flops, EFFICIENCY)
                pred = (t1 - r1) * m8["L"] / M["L"] + r8 if t1 >= r1 else t1 * r8 / r1
                split.append(pred / t8 - 1)
                k = 1 if name == "forward.decode" else 0  # bytes for decode, flops for prefill
                whole.append(t1 * work(name, x, y, m8)[k] / work(name, x, y, M)[k] / t8 - 1)
        assert abs(statistics.median(split)) < 0.15 and max(map(abs, split)) < 0.45
        assert statistics.median(whole) > 0.5


def _with_probe(tmp_path, python_s=0.002):
    p = json.loads(H200_1B.read_text())
    p["metadata"]["host_speed"] = {"python_s": python_s, "torch_s": 0.005}
    path = tmp_path / "probed.json"
    path.write_text(json.dumps(p))
    return path


def test_the_host_probe_sets_the_host_speed(tmp_path, capsys):
    """The profile's host read 2 ms per repetition, the target 1 ms: the target is twice as fast,
    so every host phase halves."""
    (tmp_path / "reading.json").write_text(json.dumps({"python_s": 0.001}))
    out = tmp_path / "out.json"
    assert main(["transfer", str(_with_probe(tmp_path)), "--to", "h200", "--host-probe", str(tmp_path / "reading.json"),
                 "--out", str(out)]) == 0
    new, old = json.loads(out.read_text()), json.loads(H200_1B.read_text())
    assert new["metadata"]["transfer"]["host_speed"] == pytest.approx(2.0)
    s_old, s_new = old["curves"]["schedule.decode"], new["curves"]["schedule.decode"]
    assert s_new["values_s"][0] == pytest.approx(s_old["values_s"][0] / 2)


@pytest.mark.parametrize("reading, needle", [("not json", "--host-probe"), ('{"python_s": -1}', "python_s"),
                                             ('{"python_s": 1e9}', "python_s")])
def test_a_bad_host_probe_is_one_line(tmp_path, capsys, reading, needle):
    (tmp_path / "reading.json").write_text(reading)
    assert main(["transfer", str(_with_probe(tmp_path)), "--to", "l4", "--host-probe", str(tmp_path / "reading.json"),
                 "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.json").exists()


def test_a_profile_without_a_probe_reading_says_so(tmp_path, capsys):
    (tmp_path / "reading.json").write_text('{"python_s": 0.001}')
    assert main(["transfer", str(H200_1B), "--to", "l4", "--host-probe", str(tmp_path / "reading.json"),
                 "--out", str(tmp_path / "x.json")]) == 2
    assert "metadata.host_speed" in capsys.readouterr().err
