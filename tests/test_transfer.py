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
    other = json.loads(H200_1B.read_text())
    other["metadata"]["engine"] = "trtllm"
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert main(["transfer", str(tmp_path / "other.json"), "--to", "l4", "--out", str(tmp_path / "z.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "metadata.engine" in err and "'trtllm'" in err
    assert not (tmp_path / "z.json").exists()
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


# ---- vLLM profiles: one forward curve vllm.forward (num_tokens x ctx), the rest host time ----

VLLM_TINY = ROOT / "scenarios/profiles/cpu-vllm-tiny.json"
H200, L4 = CARDS["h200"], CARDS["l4"]
ATTN = 4 * 16 * 32 * 64  # 4 L H d of llama-3.2-1b
P1B, KV1B = 1235746816, 2 * 16 * 8 * 64 * 2


def _vllm_profile(forward_s: float = 0.02, host_s: float = 1e-3, slope: float = 0.0) -> dict:
    """A made-up vLLM profile (test data) of llama-3.2-1b's shape on an H200: every host curve
    ``host_s`` (linear: ``+ slope`` per request), the forward ``forward_s`` on the grid
    num_tokens {1, 8, 16, 17, 256} x ctx {128, 1024}; ``async`` keeps its own sample, pickup and
    forward; samples at one decode, one prefill and one host point."""
    from tests.vllm_helpers import make_profile

    def host(scale=1.0):
        return {"axes": ["num_reqs"], "grid": [[1, 16]], "values_s": [host_s * scale, (host_s + 15 * slope) * scale]}

    def forward(scale=1.0):
        return {"axes": ["num_tokens", "ctx"], "grid": [[1, 8, 16, 17, 256], [128, 1024]],
                "values_s": [[forward_s * scale, forward_s * scale] for _ in range(5)]}

    p = make_profile(frontend={"in": 1.0, "out": 1.0},
                     setting_curves={"async": {"vllm.sample": host(2), "vllm.pickup": host(0.5),
                                               "vllm.forward": forward(1.5)}})
    p["curves"]["vllm.pickup"] = host()
    for name in p["curves"]:
        p["curves"][name] = forward() if name == "vllm.forward" else host()
    p["metadata"].update({"device": "cuda", "device_name": "NVIDIA H200", "dtype": "bfloat16",
                          "model": dict(PROFILE["metadata"]["model"]), "params": P1B,
                          "grid": {"decode_batch_sizes": [1, 8, 16], "max_num_seqs": 16}})
    p["samples"] = [
        {"curve": "vllm.forward", "point": {"num_tokens": 8, "ctx": 1024}, "times_s": [forward_s, 2 * forward_s]},
        {"curve": "vllm.forward", "point": {"num_tokens": 256, "ctx": 128}, "times_s": [forward_s]},
        {"curve": "vllm.schedule", "point": {"num_reqs": 4}, "times_s": [host_s, 3 * host_s]},
        {"curve": "vllm.forward", "point": {"num_tokens": 1, "ctx": 128}, "times_s": [forward_s], "setting": "async"},
    ]
    validate_profile(p, "test", _vllm_curves())
    return p


def _vllm_curves():
    from sim.engines.vllm.profile import VLLM_CURVES

    return VLLM_CURVES


def _node(curve: dict, n, c) -> float:
    return curve["values_s"][curve["grid"][0].index(n)][curve["grid"][1].index(c)]


def _moved(t, flops, nbytes, src=H200, dst=L4, eta=0.8):
    """The roofline move written out (t >= R at the source)."""
    r = lambda card: max(flops / (eta * card.bf16_flops), nbytes / (eta * card.bandwidth_bytes_s))  # noqa: E731
    assert t >= r(src)
    return t - r(src) + r(dst)


def test_vllm_forward_point_mapping():
    from sim.model.transfer import vllm_forward_point

    # up to the largest decode batch: a decode of n requests over ctx keys
    assert vllm_forward_point(1, 128, 16) == ("forward.decode", 1, 128, 1.0)
    assert vllm_forward_point(16, 768, 16) == ("forward.decode", 16, 768, 1.0)
    # beyond it: r = max(1, n / ctx) prefills of t = min(n, ctx) tokens after ctx - t cached
    assert vllm_forward_point(256, 128, 16) == ("forward.extend", 128, 0, 2.0)   # 2 prompts of 128
    assert vllm_forward_point(128, 768, 16) == ("forward.extend", 128, 640, 1.0)  # 128 after 640 cached
    assert vllm_forward_point(17, 512, 16) == ("forward.extend", 17, 495, 1.0)
    # a decode is the one-token extend: the two shapes agree there
    assert work("forward.decode", 1, 128, M) == work("forward.extend", 1, 127, M)
    # an extend of r requests: r times the flops and the cache traffic, the weights once
    f1, b1 = work("forward.extend", 128, 0, M)
    f2, b2 = work("forward.extend", 128, 0, M, requests=2.0)
    assert f2 == 2 * f1 and b2 == b1 + 128 * M["kv"]


def test_vllm_forward_moved_by_hand():
    """Each node of vllm.forward (20 ms on the H200) equals the closed-form roofline move to an L4."""
    new = transfer_profile(_vllm_profile(), "l4", curves=_vllm_curves())
    fwd = new["curves"]["vllm.forward"]
    # decode of 8 requests at 1024 keys: bandwidth-bound on both cards
    flops, nbytes = 2 * P1B * 8 + ATTN * 8 * 1024, 2 * P1B + 8 * 1024 * KV1B
    expected = 0.02 - nbytes / (0.8 * 4.8e12) + nbytes / (0.8 * 300e9)
    assert _node(fwd, 8, 1024) == pytest.approx(expected, rel=1e-12)
    assert _moved(0.02, flops, nbytes) == pytest.approx(expected, rel=1e-12)
    # 256 tokens at ctx 128: two 128-token prompts, no prefix: compute-bound on the H200, not on the L4
    flops = 2 * P1B * 256 + 2 * ATTN * 128 * (0 + 129 / 2)
    nbytes = 2 * P1B + 2 * 128 * KV1B
    assert flops / (0.8 * 989.5e12) > nbytes / (0.8 * 4.8e12) and flops / (0.8 * 121e12) < nbytes / (0.8 * 300e9)
    assert _node(fwd, 256, 128) == pytest.approx(_moved(0.02, flops, nbytes), rel=1e-12)
    # 256 tokens at ctx 1024: one prompt of 256 tokens after 768 cached
    flops, nbytes = 2 * P1B * 256 + ATTN * 256 * (768 + 257 / 2), 2 * P1B + 1024 * KV1B
    assert _node(fwd, 256, 1024) == pytest.approx(_moved(0.02, flops, nbytes), rel=1e-12)
    # 17 tokens (beyond the largest decode batch, 16): a prefill of 17 tokens after 111 cached
    flops, nbytes = 2 * P1B * 17 + ATTN * 17 * (111 + 9), 2 * P1B + 128 * KV1B
    assert _node(fwd, 17, 128) == pytest.approx(_moved(0.02, flops, nbytes), rel=1e-12)
    # the ratio method: decode by the bandwidth ratio, prefill by the compute ratio
    ratio = transfer_profile(_vllm_profile(), "l4", method="ratio", curves=_vllm_curves())["curves"]["vllm.forward"]
    assert _node(ratio, 16, 128) == pytest.approx(0.02 * 16)
    assert _node(ratio, 17, 128) == pytest.approx(0.02 * 989.5 / 121)
    rec = new["metadata"]["transfer"]
    assert rec["from_device_name"] == "NVIDIA H200" and rec["to_card"] == "l4" and rec["uncertainty_rel"] == 0.3
    assert rec["method_spread_rel"] > 0 and new["metadata"]["device_name"] == "NVIDIA L4"
    assert new["metadata"]["engine"] == "vllm"


def test_vllm_host_curves_divided_and_setting_curves_moved():
    from sim.engines.vllm.profile import VLLM_CURVES

    old = _vllm_profile(host_s=1e-3, slope=2e-4)
    new = transfer_profile(old, "l4", host_speed=4.0, curves=VLLM_CURVES)
    host = [n for n in old["curves"] if n not in VLLM_CURVES.forward]
    assert set(host) <= set(new["curves"]) and {"vllm.frontend_in", "vllm.frontend_out"} <= set(host)
    for name in host:
        assert new["curves"][name]["values_s"] == [v / 4 for v in old["curves"][name]["values_s"]], name
    a_old, a_new = old["setting_curves"]["async"], new["setting_curves"]["async"]
    for name in ("vllm.sample", "vllm.pickup"):
        assert a_new[name]["values_s"] == [v / 4 for v in a_old[name]["values_s"]]
    # async's own forward (30 ms) moves by the same roofline as the base one
    nbytes = 2 * P1B + 8 * 1024 * KV1B
    assert _node(a_new["vllm.forward"], 8, 1024) == pytest.approx(0.03 - nbytes / 3.84e12 + nbytes / 2.4e11)
    # samples: forward ones moved, host ones divided, a setting's sample too
    by = {(s["curve"], tuple(s["point"].values()), s.get("setting")): s["times_s"] for s in new["samples"]}
    assert by[("vllm.schedule", (4,), None)] == [1e-3 / 4, 3e-3 / 4]
    assert by[("vllm.forward", (8, 1024), None)][0] == pytest.approx(_node(new["curves"]["vllm.forward"], 8, 1024))
    assert by[("vllm.forward", (1, 128), "async")][0] == pytest.approx(_node(new["curves"]["vllm.forward"], 1, 128))
    validate_profile(new, "new", VLLM_CURVES)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(CARDS)), st.sampled_from(sorted(CARDS)), st.floats(1e-3, 0.5), st.floats(1e-6, 1e-2),
       st.floats(0.0, 1e-3), st.floats(0.25, 4.0), st.sampled_from(["roofline", "ratio"]))
def test_vllm_same_card_is_identity_and_round_trip(src, dst, forward_s, host_s, slope, speed, method):
    """To the same card at host speed 1 every curve and sample stays; there and back (host speed
    h, then 1/h) returns the profile."""
    p = _vllm_profile(forward_s, host_s, slope)
    p["metadata"]["device_name"] = CARDS[src].name

    def flat(q):
        sets = [q["curves"], *q["setting_curves"].values()]
        vals = [v for cs in sets for c in cs.values() for v in (c["values_s"] if not isinstance(c["values_s"][0], list)
                                                                 else [x for row in c["values_s"] for x in row])]
        return vals + [t for s in q["samples"] for t in s["times_s"]]

    vc = _vllm_curves()
    assert flat(transfer_profile(p, src, curves=vc)) == pytest.approx(flat(p), rel=1e-12)
    there = transfer_profile(p, dst, host_speed=speed, method=method, curves=vc)
    back = transfer_profile(there, src, host_speed=1 / speed, method=method, curves=vc)
    assert flat(back) == pytest.approx(flat(p), rel=1e-9)


def test_vllm_cpu_profile_needs_from_and_runs_on_the_card(tmp_path, capsys):
    """The shipped CPU vLLM profile: refused without --from (its device is no card), moved with it;
    the vLLM scenario then runs on it with server.device cuda, its title naming the card."""
    out = tmp_path / "l4-vllm.json"
    assert main(["transfer", str(VLLM_TINY), "--to", "l4", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "metadata.device_name" in err and "--from" in err and not out.exists()
    assert main(["transfer", str(VLLM_TINY), "--to", "l4", "--from", "a10g", "--host-speed", "2",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "NVIDIA A10G -> NVIDIA L4" in text and "vllm.forward (num_tokens x ctx) 1 x 128:" in text
    assert "16 x 768:" in text and "server.device: cuda" in text
    new, old = load_profile(out, _vllm_curves()), load_profile(VLLM_TINY, _vllm_curves())
    assert new["metadata"]["engine"] == "vllm" and new["metadata"]["transfer"]["from_card"] == "a10g"
    assert new["setting_curves"]["async"]["vllm.update"]["values_s"] == \
        pytest.approx([v / 2 for v in old["setting_curves"]["async"]["vllm.update"]["values_s"]])
    # decode rows move by the bandwidth-bound roofline (A10G 600 -> L4 300 GB/s): slower
    f_old, f_new = old["curves"]["vllm.forward"], new["curves"]["vllm.forward"]
    assert all(b > a for a, b in zip(f_old["values_s"][0], f_new["values_s"][0]))
    assert main(["run", str(ROOT / "scenarios/vllm-cpu.yaml"), "--set", f"costs.profile={out}",
                 "--set", "server.device=cuda", "--no-plots", "--tables", "none", "--out", str(tmp_path / "r")]) == 0
    text = capsys.readouterr().out
    assert "vllm-cpu (seed 0, cuda): NVIDIA L4 (transferred from NVIDIA A10G, ±30%), tiny-llama" in text
    assert "verdict:" in text and "async" in text


def test_vllm_host_probe(tmp_path):
    """The vLLM profile carries its host's probe reading: a target twice as fast halves every host curve."""
    ref = load_profile(VLLM_TINY, _vllm_curves())["metadata"]["host_speed"]["python_s"]
    (tmp_path / "reading.json").write_text(json.dumps({"python_s": ref / 2}))
    out = tmp_path / "out.json"
    assert main(["transfer", str(VLLM_TINY), "--to", "l4", "--from", "l4", "--host-probe",
                 str(tmp_path / "reading.json"), "--out", str(out)]) == 0
    new, old = json.loads(out.read_text()), json.loads(VLLM_TINY.read_text())
    assert new["metadata"]["transfer"]["host_speed"] == pytest.approx(2.0)
    halved = [v / 2 for v in old["curves"]["vllm.schedule"]["values_s"]]
    assert new["curves"]["vllm.schedule"]["values_s"] == pytest.approx(halved)
    for a, b in zip(old["curves"]["vllm.forward"]["values_s"], new["curves"]["vllm.forward"]["values_s"]):
        assert b == pytest.approx(a)


@pytest.mark.parametrize("edit, needle", [
    (lambda m: m.update(grid={}), "metadata.grid.max_num_seqs"),
    (lambda m: m.update(grid={"decode_batch_sizes": [], "max_num_seqs": 0}), "metadata.grid.max_num_seqs"),
    (lambda m: m["model"].pop("heads"), "metadata.model.heads"),
    (lambda m: m.update(dtype="int3"), "metadata.dtype"),
])
def test_bad_vllm_profiles_are_one_line(tmp_path, capsys, edit, needle):
    p = _vllm_profile()
    edit(p["metadata"])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(p))
    assert main(["transfer", str(path), "--to", "l4", "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and str(path) in err and "Traceback" not in err
    assert not (tmp_path / "x.json").exists()


def test_a_vllm_profile_missing_a_curve_is_one_line(tmp_path, capsys):
    p = _vllm_profile()
    del p["curves"]["vllm.forward"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(p))
    assert main(["transfer", str(path), "--to", "l4", "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "curves.vllm.forward" in err and not (tmp_path / "x.json").exists()


def test_the_curves_must_be_the_profiles_engine():
    """transfer_profile is given the engine's curves (sim.model does not import an engine): a vLLM
    profile with SGLang's curves, or the other way round, is refused naming metadata.engine."""
    with pytest.raises(ProfileError, match="metadata.engine.*an SGLang profile.*'vllm'"):
        transfer_profile(_vllm_profile(), "l4")
    with pytest.raises(ProfileError, match="metadata.engine.*a vLLM profile.*'sglang'"):
        transfer_profile(PROFILE, "l4", curves=_vllm_curves())


def test_a_transferred_vllm_profile_drops_the_cpu_rule_for_mixed_steps():
    """``metadata.mixed_steps: sum_of_parts`` is the CPU kernel's; a card's forward reads the
    weights once per step, so the moved profile prices a mixed step as one step."""
    p = _vllm_profile()
    p["metadata"]["mixed_steps"] = "sum_of_parts"
    new = transfer_profile(p, "l4", curves=_vllm_curves())
    assert "mixed_steps" not in new["metadata"] and p["metadata"]["mixed_steps"] == "sum_of_parts"


def test_the_card_list_fits_80_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["transfer", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = [line for line in lines if line.startswith(("┃", "│", "┏", "└"))]
    assert table and all(len(line) <= 80 for line in table)
    assert any(line.startswith("│ h200") and "NVIDIA H200" in line for line in table)  # names not broken
    assert any(line.startswith("l4: host ") for line in lines)


def test_a_host_speed_on_the_profiles_own_card_moves_the_host_phases_only():
    """transfer to the card the profile was measured on with a host speed (ask --host-speed on
    the profile's card): every forward curve and sample as measured, every host phase divided by
    the speed, and no forward uncertainty stated (ask had added a card move's ±30%)."""
    import json

    from sim.model.profile import SGLANG_CURVES
    from sim.model.transfer import transfer_profile
    from sim.whatif.stated_range import stated_uncertainties

    path = ROOT / "scenarios" / "profiles" / "h200-llama-3.2-1b.json"
    profile = json.loads(path.read_text())
    moved = transfer_profile(profile, "h200", host_speed=2.0, curves=SGLANG_CURVES)
    for name in SGLANG_CURVES.forward:
        if name in profile["curves"]:
            assert moved["curves"][name]["values_s"] == profile["curves"][name]["values_s"]
    assert moved["curves"]["recv"]["values_s"] == [v / 2.0 for v in profile["curves"]["recv"]["values_s"]]
    assert moved["metadata"]["transfer"]["uncertainty_rel"] == 0.0
    assert not any(s.axis == "gpu" for s in stated_uncertainties(moved["metadata"]))
    other = transfer_profile(profile, "h100", host_speed=2.0, curves=SGLANG_CURVES)
    assert any(s.axis == "gpu" for s in stated_uncertainties(other["metadata"]))
