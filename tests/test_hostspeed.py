"""The host speed probe (calibrate.hostspeed) and the validation's drift correction: closed forms
first, then invariants, then the probe itself and a recorded real session."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calibrate import hostspeed

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "sglang"


def test_drift_is_the_ratio_of_now_to_the_calibration():
    now = {"python_s": 0.003, "torch_s": 0.012}
    ref = {"python_s": 0.002, "torch_s": 0.008}
    assert hostspeed.drift(now, ref) == pytest.approx({"cpu": 1.5, "gpu": 1.5})
    assert hostspeed.drift(ref, ref) == {"cpu": 1.0, "gpu": 1.0}


def test_a_reading_without_torch_leaves_the_forward_unscaled():
    assert hostspeed.drift({"python_s": 2.0}, {"python_s": 1.0, "torch_s": 1.0}) == {"cpu": 2.0, "gpu": 1.0}


def test_the_mean_reading_averages_key_by_key():
    m = hostspeed.mean_reading([{"python_s": 1.0, "torch_s": 4.0, "utc": "a"},
                                {"python_s": 3.0, "torch_s": 6.0, "utc": "b"}])
    assert m["python_s"] == 2.0 and m["torch_s"] == 5.0 and m["utc_list"] == ["a", "b"]
    with pytest.raises(ValueError):
        hostspeed.mean_reading([])


odd = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.none(), st.text(max_size=3))


@given(odd, odd, odd, odd)
def test_drift_is_positive_and_finite_whatever_the_readings(a, b, c, d):
    out = hostspeed.drift({"python_s": a, "torch_s": b}, {"python_s": c, "torch_s": d})
    assert set(out) == {"cpu", "gpu"}
    assert all(math.isfinite(v) and v > 0 for v in out.values())


def test_the_python_workload_is_deterministic():
    assert hostspeed.python_work(200) == hostspeed.python_work(200) > 0


def test_the_probe_reads_positive_seconds():
    r = hostspeed.probe(reps=3, warmup=1)
    assert r["python_s"] > 0 and r["python_cpu_s"] >= 0 and "utc" in r
    if "torch_s" in r:
        assert r["torch_s"] > 0
    with pytest.raises(ValueError):
        hostspeed.probe(reps=0)


def test_the_probe_writes_its_reading(tmp_path):
    assert hostspeed.main([str(tmp_path / "p.json")]) == 0
    assert json.loads((tmp_path / "p.json").read_text())["python_s"] > 0
    assert hostspeed.main([]) == 2


def _validation_folder(tmp_path: Path, session_reading: dict) -> tuple[Path, Path]:
    """A validation folder of one recorded SGLang session per setting, each with ``session_reading``
    before and after it, and a profile whose calibration read 1 ms / 4 ms."""
    out = tmp_path / "validate"
    for setting in ("overlap", "normal"):
        folder = out / "sessions" / f"{setting}-0"
        shutil.copytree(DATA / "session", folder)
        (folder / "host_speed.json").write_text(json.dumps({"before": session_reading, "after": session_reading}))
    profile = json.loads((REPO / "scenarios" / "profiles" / "cpu-torch-small.json").read_text())
    profile["metadata"]["host_speed"] = {"python_s": 0.001, "torch_s": 0.004}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    return out, path


def _plan():
    from calibrate.real.jobs import Workload
    from calibrate.real.validate import Plan

    config = Workload("tiny", num_requests=6, warmup_requests=2, concurrency=2, input_len=(24, 40),
                      output_len=(6, 10), seed=9)
    return Plan(configs=(config,), repeats=1)


def test_an_unchanged_host_leaves_the_prediction_as_it_was(tmp_path):
    from calibrate.real.validate import compare

    out, profile = _validation_folder(tmp_path, {"python_s": 0.001, "torch_s": 0.004})
    result = compare(out, _plan(), profile)
    for setting in ("overlap", "normal"):
        fixed = result["drift_corrected"]["cases"][0]["settings"][setting]
        assert fixed["drift"] == [{"cpu": 1.0, "gpu": 1.0}]
        assert fixed["predicted"] == pytest.approx(result["cases"][0]["settings"][setting]["predicted"])


def test_a_host_twice_as_slow_doubles_the_predicted_step_times(tmp_path):
    """Every cost doubled: the simulated timeline stretches by 2, so TPOT doubles and throughput
    halves (the closed loop has no think time)."""
    from calibrate.real.validate import compare

    out, profile = _validation_folder(tmp_path, {"python_s": 0.002, "torch_s": 0.008})
    result = compare(out, _plan(), profile)
    for setting in ("overlap", "normal"):
        raw = result["cases"][0]["settings"][setting]["predicted"]
        fixed = result["drift_corrected"]["cases"][0]["settings"][setting]["predicted"]
        assert fixed["median_tpot_ms"] == pytest.approx(2 * raw["median_tpot_ms"], rel=0.02)
        assert fixed["output_throughput"] == pytest.approx(raw["output_throughput"] / 2, rel=0.02)
    assert "speedup" in result["drift_corrected"]["cases"][0]


def test_sessions_without_probes_get_no_correction(tmp_path):
    from calibrate.real.validate import compare

    out, profile = _validation_folder(tmp_path, {"python_s": 0.001, "torch_s": 0.004})
    (out / "sessions" / "normal-0" / "host_speed.json").unlink()
    assert "drift_corrected" not in compare(out, _plan(), profile)
