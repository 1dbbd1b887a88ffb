"""Bad profiles, traces and transfer flags a fuzzer found: each is refused in one line on stderr
naming the file and the field, exit status 2, nothing written (sim.model.profile,
sim.engines.vllm.profile.check_metadata, sim.model.transfer.check_metadata, the trace reader)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from sim.cli import main
from sim.errors import ProfileError
from sim.model.profile import load_profile, profile_curves

ROOT = Path(__file__).resolve().parents[1]
H200_1B = ROOT / "scenarios/profiles/h200-llama-3.2-1b.json"
H200_VLLM = ROOT / "scenarios/profiles/h200-vllm-llama-3.2-1b.json"
QUICKSTART = ROOT / "scenarios/quickstart.yaml"
VLLM_H200 = ROOT / "scenarios/vllm-h200.yaml"
SGLANG = json.loads(H200_1B.read_text())
VLLM = json.loads(H200_VLLM.read_text())


def _write(tmp_path: Path, profile: dict, name: str = "p.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(profile))
    return path


def _refused(capsys, argv: list, *needles: str, written: Path | None = None) -> str:
    """Run ``overlap-sim ARGV``: exit 2, one line on stderr holding every needle, no traceback,
    ``written`` not there."""
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    if written is not None:
        assert not written.exists()
    return err


def _run(profile: Path, tmp_path: Path, *sets: str, scenario: Path = QUICKSTART) -> list:
    words = [w for s in (f"costs.profile={profile}", *sets) for w in ("--set", s)]
    return ["run", scenario, *words, "--no-plots", "--tables", "none", "--out", tmp_path / "r"]


# ---- 1: an integer too large for a float ----------------------------------------------------------

@pytest.mark.parametrize("edit, field", [
    (lambda p: p["curves"]["recv"].update(grid=[[0, 10**400]]), "curves.recv.grid[0]"),
    (lambda p: p["curves"]["recv"]["values_s"].__setitem__(0, 10**400), "curves.recv.values_s[0]"),
    (lambda p: p["samples"][0]["point"].update(ctx=10**400), "samples[0].point.ctx"),
    (lambda p: p["samples"][0]["times_s"].__setitem__(0, 10**400), "samples[0].times_s[0]"),
    (lambda p: p["metadata"].update(tp_size=10**400), "metadata.tp_size"),
])
def test_a_huge_integer_is_refused_naming_the_field(tmp_path, capsys, edit, field):
    """json reads 10**400 as an int that no float holds: math.isfinite of it raised OverflowError
    (exit 1, a traceback) in run and transfer; now a bad value of the field it is in."""
    p = copy.deepcopy(SGLANG)
    edit(p)
    path = _write(tmp_path, p)
    _refused(capsys, _run(path, tmp_path), str(path), field, written=tmp_path / "r")
    _refused(capsys, ["transfer", path, "--to", "l4", "--out", tmp_path / "o.json"], str(path), field,
             written=tmp_path / "o.json")


def test_an_integer_beyond_json_s_digit_limit_is_one_line(tmp_path, capsys):
    """An integer of 5,000 digits is past Python's int_max_str_digits: json raises a plain ValueError."""
    text = H200_1B.read_text().replace('"schema_version": 1', '"schema_version": 1' + "0" * 5000, 1)
    path = tmp_path / "p.json"
    path.write_text(text)
    _refused(capsys, _run(path, tmp_path), str(path), "not readable JSON", written=tmp_path / "r")


# ---- 2: a vLLM profile's shared_prefix and speculative metadata ----------------------------------

@pytest.mark.parametrize("meta, field", [
    ({"shared_prefix": "x"}, "metadata.shared_prefix"),
    ({"speculative": "x"}, "metadata.speculative"),
    ({"shared_prefix": {"saving": 5}}, "metadata.shared_prefix.saving"),
    ({"shared_prefix": {"saving": -0.1}}, "metadata.shared_prefix.saving"),
    ({"shared_prefix": {"saving": "x"}}, "metadata.shared_prefix.saving"),
    ({"shared_prefix": {"saving": 0.5, "by_setting": "x"}}, "metadata.shared_prefix.by_setting"),
    ({"shared_prefix": {"saving": 0.5, "by_setting": {"async": 1.5}}}, "metadata.shared_prefix.by_setting.async"),
    ({"speculative": {"num_speculative_tokens": "x"}}, "metadata.speculative.num_speculative_tokens"),
    ({"speculative": {"num_speculative_tokens": 0}}, "metadata.speculative.num_speculative_tokens"),
    ({"mixed_steps": "sum-of-parts"}, "metadata.mixed_steps"),
])
def test_bad_vllm_metadata_is_refused(tmp_path, capsys, meta, field):
    """A string where an object belongs crashed the run (AttributeError); a saving of 5 (500%) was
    used as given. A saving is the share f of a shared prefix's attention counted once, which the
    calibration measures in [0, 1]."""
    p = copy.deepcopy(VLLM)
    p["metadata"].update(meta)
    path = _write(tmp_path, p)
    _refused(capsys, _run(path, tmp_path, "workload.prefix_sharing=shared", scenario=VLLM_H200), str(path),
             f"{field}: ", written=tmp_path / "r")


@pytest.mark.parametrize("shared", [None, {"saving": 0.0}, {"saving": 1.0, "by_setting": {"sync": 1.0, "async": 0}}])
def test_good_shared_prefix_metadata_is_taken(shared):
    """The shares' ends (0: no saving, 1: the repeats cost nothing, as the CPU calibrations measured
    synchronously) and null (none measured) are taken."""
    from sim.engines.vllm.costs import VllmProfileCosts

    p = copy.deepcopy(VLLM)
    p["metadata"]["shared_prefix"] = shared
    costs = VllmProfileCosts(p, "async")
    assert costs.shared_prefix_saving == ((shared or {}).get("by_setting", {}).get("async", (shared or {}).get(
        "saving", 0.0)))


# ---- 3: a forward of no time through the statistic the run uses ---------------------------------

def _zero_forward_samples(profile: dict, curves=("forward.decode", "forward.extend")) -> dict:
    p = copy.deepcopy(profile)
    for s in p["samples"]:
        if s["curve"] in curves:
            s["times_s"] = [0.0] * len(s["times_s"])
    return p


def test_forward_samples_of_no_time_are_refused_under_the_mean(tmp_path, capsys):
    """The stored curves (medians) are held to a forward >= 1e-9 s; the mean of the samples was not:
    samples of 0 s priced every forward at 0 and the run answered with a confident verdict."""
    p = _zero_forward_samples(SGLANG)
    first = next(k for k, s in enumerate(p["samples"]) if s["curve"].startswith("forward"))
    path = _write(tmp_path, p)
    _refused(capsys, _run(path, tmp_path, "costs.profile_statistic=mean"), str(path),
             f"samples[{first}].times_s: ", "a forward takes time", written=tmp_path / "r")
    profile = load_profile(path)  # the median (the stored curves) is still good
    assert profile_curves(profile, "median")["forward.decode"](8, 512) > 0
    with pytest.raises(ProfileError, match=rf"^{path}: samples\[{first}\]\.times_s: "):
        profile_curves(profile, "mean", source=str(path))


def test_vllm_forward_samples_of_no_time_are_refused_under_the_mean(tmp_path):
    from sim.engines.vllm.costs import VllmProfileCosts

    p = _zero_forward_samples(VLLM, ("vllm.forward",))
    with pytest.raises(ProfileError, match=r"^x\.json: samples\[\d+\]\.times_s: a mean >= 1e-09 s"):
        VllmProfileCosts(p, "sync", statistic="mean", source="x.json")
    VllmProfileCosts(p, "sync", statistic="median", source="x.json")


def test_a_sample_off_the_grid_prices_nothing_and_is_not_refused():
    """Only a mean that replaces a node of the curve the run uses is held to the rule."""
    p = copy.deepcopy(SGLANG)
    p["samples"].append({"curve": "forward.decode", "point": {"num_reqs": 3.5, "ctx": 77}, "times_s": [0.0]})
    profile_curves(p, "mean")


@pytest.mark.parametrize("where", ["setting_curves", "optional"])
def test_a_stored_forward_of_no_time_is_refused_wherever_it_is(where):
    """The rule held the required forward curves only: a setting's forward curve, or an optional one
    (vLLM's vllm.spec_forward), of 0 s was taken."""
    from sim.engines.vllm.profile import VLLM_CURVES
    from sim.model.profile import validate_profile

    p = copy.deepcopy(VLLM)
    zero = copy.deepcopy(p["curves"]["vllm.forward"])
    zero["values_s"] = [[0.0] * len(row) for row in zero["values_s"]]
    if where == "optional":
        p["curves"]["vllm.spec_forward"], field = zero, "curves.vllm.spec_forward.values_s"
    else:
        p.setdefault("setting_curves", {}).setdefault("async", {})["vllm.forward"] = zero
        field = "setting_curves.async.vllm.forward.values_s"
    with pytest.raises(ProfileError, match=rf"^x: {field}: times >= 1e-09 s: a forward takes time"):
        validate_profile(p, "x", VLLM_CURVES)


# ---- 4: a key given twice -------------------------------------------------------------------------

@pytest.mark.parametrize("anchor, extra, field", [
    ('"schema_version"', '"schema_version": 1, ', "schema_version"),
    ('"date"', '"date": "x", ', "metadata.date"),
    ('"ctx"', '"ctx": 5, ', "samples[0].point.ctx"),
])
def test_a_profile_key_given_twice_is_refused(tmp_path, capsys, anchor, extra, field):
    """json.loads kept the last of two equal keys in silence; the message names the key's path."""
    text = H200_1B.read_text()
    i = text.index(anchor)
    path = tmp_path / "p.json"
    path.write_text(text[:i] + extra + text[i:])
    _refused(capsys, _run(path, tmp_path), f"{path}: {field}: given twice", written=tmp_path / "r")
    _refused(capsys, ["transfer", path, "--to", "l4", "--out", tmp_path / "o.json"], f"{path}: {field}: given twice",
             written=tmp_path / "o.json")


def test_a_trace_key_given_twice_is_refused(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "input_len": 256, "output_len": 8}\n'
                     '{"arrival_s": 0.1, "input_len": 256, "input_len": 9, "output_len": 8}\n')
    argv = ["run", QUICKSTART, "--set", "workload.arrival=trace", "--set", f"workload.trace={trace}",
            "--no-plots", "--tables", "none", "--out", tmp_path / "r"]
    _refused(capsys, argv, f"{trace}: line 2: input_len: given twice", written=tmp_path / "r")


def test_a_huge_integer_in_a_trace_is_refused(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "input_len": 1' + "0" * 400 + ', "output_len": 8}\n')
    argv = ["run", QUICKSTART, "--set", "workload.arrival=trace", "--set", f"workload.trace={trace}",
            "--no-plots", "--tables", "none", "--out", tmp_path / "r"]
    _refused(capsys, argv, f"{trace}: line 1: input_len: expected an integer", written=tmp_path / "r")


def test_unique_keys_refuses_the_first_repeat():
    from sim.jsonio import DuplicateKeyError, duplicate_key_path, unique_keys

    assert unique_keys([("a", 1), ("b", 2)]) == {"a": 1, "b": 2}
    with pytest.raises(DuplicateKeyError) as err:
        unique_keys([("a", 1), ("b", 2), ("b", 3), ("a", 4)])
    assert err.value.key == "b"
    assert duplicate_key_path('{"x": [{"y": {"k": 1, "k": 2}}]}', "k") == "x[0].y.k"


# ---- 5: transfer's --from against the profile's card, and its metadata ---------------------------

def test_from_contradicting_the_profiles_card_is_refused(tmp_path, capsys):
    """An H200 profile moved as if measured on an A10G: refused naming --from and the card;
    --from naming its own card, or a card for a profile that names none (a CPU profile), is taken."""
    out = tmp_path / "o.json"
    _refused(capsys, ["transfer", H200_1B, "--to", "l4", "--from", "a10g", "--out", out],
             "--from: a10g (NVIDIA A10G)", "measured on NVIDIA H200 (metadata.device_name)", written=out)
    assert main(["transfer", str(H200_1B), "--to", "l4", "--from", "h200", "--out", str(out)]) == 0
    cpu = ROOT / "scenarios/profiles/cpu-torch-small.json"
    assert main(["transfer", str(cpu), "--to", "l4", "--from", "a10g", "--out", str(tmp_path / "c.json")]) == 0


@pytest.mark.parametrize("profile, meta, field", [
    (SGLANG, {"tp_size": "two"}, "metadata.tp_size"),
    (VLLM, {"tensor_parallel_size": 0}, "metadata.tensor_parallel_size"),
    (SGLANG, {"device": "quantum"}, "metadata.device"),
    (SGLANG, {"composed": "yes"}, "metadata.composed"),
    (VLLM, {"grid": {"max_num_seqs": 10**400}}, "metadata.grid.max_num_seqs"),
])
def test_transfer_refuses_bad_metadata(tmp_path, capsys, profile, meta, field):
    p = copy.deepcopy(profile)
    p["metadata"].update(meta)
    path = _write(tmp_path, p)
    out = tmp_path / "o.json"
    _refused(capsys, ["transfer", path, "--to", "l4", "--out", out], f"{path}: {field}: ", written=out)


@pytest.mark.parametrize("edit, field", [
    (lambda m: m.update(note=float("inf")), "metadata.note"),  # any field: strict JSON has no infinity
    (lambda m: m["machine"].update(x=float("nan")) if isinstance(m.get("machine"), dict) else m.update(machine=[float("nan")]),
     "metadata.machine"),
    (lambda m: m["composed"]["move"].update(uncertainty_rel=float("nan")), "metadata.composed.move.uncertainty_rel"),
    (lambda m: m["composed"]["move"].update(uncertainty_rel=-0.5), "metadata.composed.move.uncertainty_rel"),
    (lambda m: m["composed"]["move"].update(uncertainty_rel="42%"), "metadata.composed.move.uncertainty_rel"),
    (lambda m: m["composed"]["move"].update(uncertainty_rel=1e4), "metadata.composed.move.uncertainty_rel"),
    (lambda m: m.update(device_name=None), "metadata.device_name"),  # (the title printed "None")
    (lambda m: m.update(device=5), "metadata.device"),
    (lambda m: m.update(model="llama"), "metadata.model"),
])
def test_a_stated_uncertainty_or_a_non_finite_metadata_value_is_refused(tmp_path, capsys, edit, field):
    """A corrupt stated uncertainty dropped the verdict's range in silence (the title read "±nan%");
    a NaN anywhere in the metadata crashed transfer and compose on writing it back (strict JSON)."""
    p = copy.deepcopy(SGLANG)
    edit(p["metadata"])
    path = _write(tmp_path, p)
    _refused(capsys, _run(path, tmp_path), f"{path}: {field}", written=tmp_path / "r")
    _refused(capsys, ["transfer", path, "--to", "l4", "--out", tmp_path / "o.json"], f"{path}: {field}",
             written=tmp_path / "o.json")


def test_a_moved_profiles_own_card_and_an_unknown_uncertainty_are_taken():
    from sim.model.profile.file import validate_profile

    for u in (0.0, None, 23.6):  # a profile moved to its own card; compose --host-speed; a wide method spread
        p = copy.deepcopy(SGLANG)
        p["metadata"]["composed"]["move"]["uncertainty_rel"] = u
        validate_profile(p, "<p>")


@pytest.mark.parametrize("yardstick, field", [
    (1.0, "metadata.yardstick"),
    ({"version": "x", "readings": 5}, "metadata.yardstick.readings"),
    ({"version": "x", "readings": [5]}, "metadata.yardstick.readings[0]"),
    ({"version": "x", "readings": [{"curve": "recv", "point": {"num_reqs": 1}, "median_s": float("inf")}]},
     "metadata.yardstick"),  # (the metadata's own check: no infinity)
])
def test_compose_refuses_a_host_files_bad_yardstick(tmp_path, capsys, yardstick, field):
    parts = ROOT / "scenarios" / "profiles" / "parts"
    host = json.loads((parts / "sglang-0.5.23-host-amd-epyc.json").read_text())
    if isinstance(yardstick, dict):
        yardstick["version"] = host["metadata"]["yardstick"]["version"]
    host["metadata"]["yardstick"] = yardstick
    path = _write(tmp_path, host, "host.json")
    out = tmp_path / "c.json"
    _refused(capsys, ["compose", parts / "h200-llama-3.2-1b.device.json", path, "--out", out], f"{path}: {field}",
             written=out)


def test_transfer_tp_keys_are_the_engines():
    from sim.engines.sglang.server import TP_PRICING as SGLANG_TP
    from sim.engines.vllm.server import TP_PRICING as VLLM_TP
    from sim.model.transfer import TP_KEYS

    assert TP_KEYS == {"sglang": SGLANG_TP.key, "vllm": VLLM_TP.key}


@pytest.mark.parametrize("reading, field", [
    ('{"python_s": 1' + "0" * 400 + "}", "python_s: a positive number of seconds"),
    ('{"python_s": 0.002, "python_s": 0.003}', "python_s: given twice"),
])
def test_a_bad_host_probe_reading_is_one_line(tmp_path, capsys, reading, field):
    probe = tmp_path / "reading.json"
    probe.write_text(reading)
    out = tmp_path / "o.json"
    _refused(capsys, ["transfer", ROOT / "scenarios/profiles/cpu-vllm-tiny.json", "--to", "l4", "--from", "l4",
                      "--host-probe", probe, "--out", out], f"{probe}: {field}", written=out)
