"""The profile file: round trip and each way loading it can fail (one clear line, exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.profile import profile_text, save_profile
from sim.cli import main
from sim.errors import ProfileError, UserInputError
from sim.model.profile import CURVE_AXES, SCHEMA_VERSION, load_profile
from tests.calibrate_helpers import synthetic_profile

ROOT = Path(__file__).resolve().parents[1]


def test_round_trip(tmp_path):
    prof = synthetic_profile({"forward.decode": lambda n, c: 1e-3 + 1e-5 * n}, repeats=3)
    path = tmp_path / "p.json"
    save_profile(path, prof)
    assert load_profile(path) == json.loads(profile_text(prof))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # atomic write left nothing behind
    assert set(load_profile(path)["curves"]) == set(CURVE_AXES)


def _write(tmp_path, mutate=None, text=None) -> Path:
    path = tmp_path / "bad.json"
    if text is None:
        prof = json.loads(profile_text(synthetic_profile()))
        mutate(prof)
        text = json.dumps(prof)
    path.write_text(text)
    return path


def _expect(path: Path, field: str, words: str):
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    err = info.value
    assert isinstance(err, UserInputError)
    assert err.source == str(path) and err.field == field and words in err.expected
    assert "\n" not in str(err)


def test_corrupt_file(tmp_path):
    good = profile_text(synthetic_profile())
    _expect(_write(tmp_path, text=good[: len(good) // 2]), "", "not valid JSON")


def test_newer_schema(tmp_path):
    _expect(_write(tmp_path, lambda p: p.update(schema_version=SCHEMA_VERSION + 1)), "schema_version", "newer")


def test_not_a_profile(tmp_path):
    _expect(_write(tmp_path, text='{"steps": []}'), "format", "not an overlap-sim calibration profile")


def test_missing_phase(tmp_path):
    _expect(_write(tmp_path, lambda p: p["curves"].pop("process.decode")), "curves.process.decode", "missing")


def test_missing_metadata(tmp_path):
    _expect(_write(tmp_path, lambda p: p["metadata"].pop("host_cpu")), "metadata.host_cpu", "missing")


def test_nan_time(tmp_path):
    path = _write(tmp_path, lambda p: p["curves"]["forward.decode"]["values_s"][1].__setitem__(0, float("nan")))
    assert "NaN" in path.read_text()
    _expect(path, "curves.forward.decode.values_s[1][0]", "finite time")


def test_negative_time(tmp_path):
    _expect(_write(tmp_path, lambda p: p["curves"]["recv"]["values_s"].__setitem__(2, -1e-3)),
            "curves.recv.values_s[2]", ">= 0")
    _expect(_write(tmp_path, lambda p: p["samples"][0]["times_s"].__setitem__(0, -1.0)),
            "samples[0].times_s[0]", ">= 0")


def test_grid_shape(tmp_path):
    _expect(_write(tmp_path, lambda p: p["curves"]["launch.decode"]["grid"][0].reverse()),
            "curves.launch.decode.grid[0]", "strictly increasing")
    _expect(_write(tmp_path, lambda p: p["curves"]["forward.extend"]["values_s"].pop()),
            "curves.forward.extend.values_s", "rows")


def test_missing_file(tmp_path):
    _expect(tmp_path / "nope.json", "", "no such profile file")


def test_cli_reports_a_bad_profile_in_one_line(tmp_path, capsys):
    bad = _write(tmp_path, lambda p: p.update(schema_version=99))
    rc = main(["run", str(ROOT / "scenarios" / "quickstart.yaml"), "--set", f"costs.profile={bad}",
               "--out", str(tmp_path / "res"), "--no-plots"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0
    assert str(bad) in err and "schema_version" in err and "newer" in err


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios" / "profiles").glob("*.json")), ids=lambda p: p.name)
def test_shipped_profiles_load_and_are_measured(path):
    from sim.engines.vllm.profile import VLLM_CURVES
    from sim.model.profile import SGLANG_CURVES

    table = VLLM_CURVES if json.loads(path.read_text())["metadata"].get("engine") == "vllm" else SGLANG_CURVES
    prof = load_profile(path, table)
    m = prof["metadata"]
    assert m["host_cpu"] and m["device_name"] and m["date"] and m["command"].startswith("overlap-sim calibrate")
    assert not m["quick"]
    for name in table.required:  # raw samples of every curve, at least `repeats` per point
        counts = [len(s["times_s"]) for s in prof["samples"] if s["curve"] == name]
        assert counts and min(counts) >= m["repeats"]
    assert all(t > 0 for s in prof["samples"] if s["curve"] in table.forward for t in s["times_s"])


def test_a_read_only_profile_is_loaded_once_per_file_version(tmp_path):
    """load_profile_read_only hands back the same validated dict while the file is unchanged (a
    run's scenario check and its settings' cost models share it), and reads the file again once
    it changes; a bad file still fails as load_profile does."""
    import os

    from sim.model.profile import load_profile_read_only

    path = tmp_path / "p.json"
    save_profile(path, synthetic_profile())
    first = load_profile_read_only(path)
    assert load_profile_read_only(path) is first and first == load_profile(path)
    changed = synthetic_profile()
    changed["metadata"]["note"] = "changed"
    save_profile(path, changed)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a new version even within one clock tick
    second = load_profile_read_only(path)
    assert second is not first and second["metadata"]["note"] == "changed"
    path.write_text("{")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile_read_only(path)
    with pytest.raises(ProfileError, match="no such profile file"):
        load_profile_read_only(tmp_path / "missing.json")


def test_labels_read_the_loaded_profiles_metadata_of_the_same_file_version(tmp_path):
    """The table's title and the warnings read the metadata of the profile the run loaded
    (loaded_metadata), not the file again, and only for the file's version it loaded: a changed
    file is read afresh."""
    import os

    from sim.model.profile import load_profile_read_only, loaded_metadata
    from sim.output.report import profile_metadata

    path = tmp_path / "p.json"
    save_profile(path, synthetic_profile())
    assert loaded_metadata(path) is None and loaded_metadata(tmp_path / "missing.json") is None
    assert profile_metadata(path) == load_profile(path)["metadata"]  # (read from the file)
    loaded = load_profile_read_only(path)
    assert loaded_metadata(path) is loaded["metadata"] and profile_metadata(path) is loaded["metadata"]
    changed = synthetic_profile()
    changed["metadata"]["note"] = "changed"
    save_profile(path, changed)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert loaded_metadata(path) is None and profile_metadata(path)["note"] == "changed"
