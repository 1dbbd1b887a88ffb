"""`overlap-sim validate` end to end on the test-only smoke grid (torch on this CPU), its JSON
object, resume, the error summary, and its input errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.validate import report, runner
from sim.cli import main


@pytest.fixture
def no_wait(monkeypatch):
    # the quiet-machine gate and the busy-run retry are for real validations; tests just run
    monkeypatch.setattr(runner, "wait_quiet", lambda *a, **k: None)
    monkeypatch.setattr(runner, "ATTEMPTS", 1)
    monkeypatch.setattr(runner, "_steady", lambda: True)


@pytest.fixture
def never_waits(monkeypatch):
    # the smoke grid does not depend on how busy the machine is: it never waits, probes or retakes
    def fail(*a, **k):
        raise AssertionError("the smoke grid waited for a quiet machine")
    monkeypatch.setattr(runner, "wait_quiet", fail)
    monkeypatch.setattr(runner, "_probe_cores", fail)


def test_validate_smoke_grid_prints_the_table_and_resumes(tmp_path, capsys, never_waits):
    out = tmp_path / "v"
    assert main(["validate", "--backend", "torch", "--device", "cpu", "--grid", "smoke", "--out", str(out)]) == 0
    text = capsys.readouterr()
    assert "smoke-torch-length" in text.out and "thread_overlap" in text.out and "median |error|" in text.out
    assert (out / "validation.csv").is_file() and (out / "validation.png").is_file()
    assert sorted(p.name for p in (out / "cases").iterdir()) == ["smoke-torch-eos.json", "smoke-torch-length.json"]
    # the second run reuses both saved configurations (no harness run) and prints the same object
    assert main(["validate", "--backend", "torch", "--device", "cpu", "--grid", "smoke", "--out", str(out),
                 "--json", "--no-plot"]) == 0
    text = capsys.readouterr()
    assert "resuming: 2 of 2" in text.err
    obj = json.loads(text.out)
    assert set(obj) == {"rows", "summary"}
    assert set(obj["summary"]) == {"output_throughput", "median_tpot_ms", "median_ttft_ms", "mean_gap_ms", "speedup"}
    assert set(obj["summary"]["speedup"]) == {"median_abs_error_pp", "max_abs_error_pp"}
    assert set(obj["summary"]["output_throughput"]) == {"median_abs_rel_error", "max_abs_rel_error"}
    rows = obj["rows"]
    assert len(rows) == 6 and {r["setting"] for r in rows} == {"normal", "overlap", "thread_overlap"}
    for r in rows:
        assert r["measured_output_throughput"] > 0 and r["predicted_output_throughput"] > 0
        assert (r["speedup_error_pp"] is None) == (r["setting"] == "normal")
    case = json.loads((out / "cases" / "smoke-torch-eos.json").read_text())
    assert case["gil"]["ops_per_forward"] >= 1 and case["gil"]["measured"]["torch_calls"] > 0
    assert "sync_latency_s" in json.loads(next((out / "profiles").glob("*.process.json")).read_text())["metadata"]
    # the length and eos configurations have the same ranges: one calibration serves both
    assert len(list((out / "profiles").glob("*.process.json"))) == 1


def test_error_summary_by_hand():
    case = {"name": "c", "regime": "balanced", "config": {"finish": "length", "concurrency": 4, "stop_strings": 2},
            "measured": {"normal": {"output_throughput": 100.0, "median_tpot_ms": 2.0, "median_ttft_ms": 10.0,
                                    "mean_gap_ms": 1.0},
                         "overlap": {"output_throughput": 150.0, "median_tpot_ms": 1.0, "median_ttft_ms": 10.0,
                                     "mean_gap_ms": 0.5}},
            "predicted": {"normal": {"output_throughput": 110.0, "median_tpot_ms": 2.0, "median_ttft_ms": 9.0,
                                     "mean_gap_ms": 1.0},
                          "overlap": {"output_throughput": 132.0, "median_tpot_ms": 1.1, "median_ttft_ms": 10.0,
                                      "mean_gap_ms": 0.25}}}
    rows = report.case_rows(case)
    assert rows[0]["rel_error_output_throughput"] == pytest.approx(0.1)
    assert rows[1]["rel_error_output_throughput"] == pytest.approx(-0.12)
    assert rows[1]["measured_speedup"] == pytest.approx(1.5) and rows[1]["predicted_speedup"] == pytest.approx(1.2)
    assert rows[1]["speedup_error_pp"] == pytest.approx(-30.0)
    s = report.summarize_errors(rows)
    assert s["output_throughput"] == {"median_abs_rel_error": pytest.approx(0.11), "max_abs_rel_error": pytest.approx(0.12)}
    assert s["mean_gap_ms"]["max_abs_rel_error"] == pytest.approx(0.5)
    assert s["speedup"] == {"median_abs_error_pp": pytest.approx(30.0), "max_abs_error_pp": pytest.approx(30.0)}
    assert "worst 12.0%, c overlap" in report.overall_line(rows)


@pytest.mark.parametrize("args, field", [
    (["--backend", "torch", "--device", "gpu"], "--device"),
    (["--backend", "mlx", "--device", "cuda"], "--device"),
    (["--backend", "torch", "--device", "cpu", "--only", "no-such-config"], "--only"),
    (["--backend", "torch", "--device", "cpu", "--profile", "/nonexistent/p.json"], "--profile"),
    (["--backend", "torch", "--device", "cpu", "--max-wait", "-5"], "--max-wait"),
    (["--backend", "torch", "--device", "cpu", "--grid", "structured"], "--grid"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, field):
    assert main(["validate", *args, "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0]


def test_a_corrupt_profile_fails_before_any_harness_run(tmp_path, capsys, monkeypatch):
    def no_harness(*a, **k):
        raise AssertionError("a harness run started")
    monkeypatch.setattr(runner, "_quiet_run", no_harness)
    bad = tmp_path / "p.json"
    bad.write_text('{"format": "overlap-sim calibration profile", "sche')
    assert main(["validate", "--backend", "torch", "--device", "cpu", "--grid", "smoke", "--profile", str(bad),
                 "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "not valid JSON" in err[0]
    assert not (tmp_path / "v").exists()


def test_cuda_without_a_gpu_is_exit_2(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["validate", "--backend", "torch", "--device", "cuda", "--out", str(tmp_path)]) == 2
    assert "cuda" in capsys.readouterr().err


def test_quick_grid_configuration_end_to_end(tmp_path, capsys, no_wait):
    # one configuration of the published quick grid, calibrated and run as `--grid quick` does
    # (the whole grid takes minutes: it is run by hand and reported in docs/validation.md)
    out = tmp_path / "q"
    assert main(["validate", "--backend", "torch", "--device", "cpu", "--grid", "quick",
                 "--only", "gpu-tiny2-c8-length", "--out", str(out), "--no-plot"]) == 0
    text = capsys.readouterr().out
    assert "gpu-tiny2-c8-length" in text and "median |error|" in text
    rows = report.case_rows(runner.load_cases(out)["gpu-tiny2-c8-length"])
    assert [r["setting"] for r in rows] == ["normal", "overlap", "thread_overlap"]
    for r in rows:
        assert r["measured_output_throughput"] > 0 and r["predicted_output_throughput"] > 0
        assert r["measured_median_tpot_ms"] > 0 and r["predicted_median_tpot_ms"] > 0


def test_mlx_smoke_grid(tmp_path, capsys, no_wait):
    pytest.importorskip("mlx.core")
    out = tmp_path / "m"
    assert main(["validate", "--backend", "mlx", "--device", "cpu", "--grid", "smoke", "--out", str(out),
                 "--json", "--no-plot"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert len(rows) == 4 and {r["setting"] for r in rows} == {"normal", "overlap_mlx"}
    for r in rows:
        assert r["measured_output_throughput"] > 0 and r["predicted_output_throughput"] > 0


def _interleaved():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "validate_interleaved.py"
    spec = importlib.util.spec_from_file_location("validate_interleaved", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_interleaved_validation_alternates_calibration_rounds_and_repeats(capsys):
    mod = _interleaved()
    assert mod.interleaved_order(4, 3) == [("calibrate", 0), ("calibrate", 1), ("validate", 0), ("calibrate", 2),
                                           ("validate", 1), ("calibrate", 3), ("validate", 2)]
    assert mod.interleaved_order(2, 2) == [("calibrate", 0), ("calibrate", 1), ("validate", 0), ("validate", 1)]
    assert mod.interleaved_order(5, 1) == [("calibrate", 0), ("calibrate", 1), ("validate", 0), ("calibrate", 2),
                                           ("calibrate", 3), ("calibrate", 4)]
    assert mod.main(["--rounds", "1"]) == 2  # before any engine is looked for
    assert "--rounds" in capsys.readouterr().err


def test_the_speedup_pooled_over_configurations_and_repeats():
    """Two configurations of two repeats: errors (predicted - measured ratio) 0, -10, +10, 0
    points: mean 0, a t-interval of 3.182 x 8.165 / 2 either side."""
    from calibrate.real.validate import pooled_speedup

    def case(pred, a, b):
        return {"speedup": {"predicted": pred},
                "settings": {"async": {"runs": [{"output_throughput": x} for x in a]},
                             "sync": {"runs": [{"output_throughput": x} for x in b]}}}

    cases = [case(1.1, [110, 120], [100, 100]), case(1.0, [90, 100], [100, 100]), {"name": "no speedup"}]
    got = pooled_speedup(cases, ("async", "sync"))
    assert got["pairs"] == 4 and got["of"] == "async/sync"
    assert got["measured_mean"] == pytest.approx(1.05) and got["predicted_mean"] == pytest.approx(1.05)
    assert got["error_pp"] == pytest.approx(0.0, abs=1e-9)
    half = 3.1824463 * (200 / 3) ** 0.5 / 2
    assert got["ci95_pp"] == pytest.approx([-half, half], rel=1e-6)
    assert pooled_speedup(cases, ("async",)) is None
    assert pooled_speedup(cases[:1][:0], ("async", "sync")) is None


def test_the_noise_floor_of_one_configuration_is_a_half_normal():
    """One configuration, one setting, repeats 90, 100, 110: median 100, stdev 10, n 3, so the
    relative standard error is sqrt(pi/2) 10 / (sqrt(3) 100) = 0.0724; a perfect model's |error|
    is half-normal: median 0.6745 x 0.0724 = 0.0488, 90th percentile 1.645 x 0.0724 = 0.119,
    and P(|error| <= 5%) = erf(0.05 / (0.0724 sqrt 2)) = 0.51 (Monte Carlo: within 2%)."""
    import math

    from calibrate.real.validate import noise_floor

    se = math.sqrt(math.pi / 2) * 10 / (math.sqrt(3) * 100)
    cases = [{"settings": {"sync": {"runs": [{"output_throughput": x} for x in (90, 110, 100)]}}}]
    got = noise_floor(cases, ("sync",), "output_throughput")
    assert got["pairs"] == 1 and got["se_median"] == pytest.approx(se)
    assert got["expected"] == pytest.approx(0.67449 * se, rel=0.02)
    assert got["p90"] == pytest.approx(1.64485 * se, rel=0.02)
    assert got["p_within"] == pytest.approx(math.erf(0.05 / (se * math.sqrt(2))), abs=0.02)
    assert noise_floor(cases, ("sync",), "output_throughput") == got  # a fixed seed: the same every time
    same = [{"settings": {"sync": {"runs": [{"output_throughput": 5.0}] * 4}}}]
    assert noise_floor(same, ("sync",), "output_throughput")["expected"] == 0.0  # no spread, no floor
    one = [{"settings": {"sync": {"runs": [{"output_throughput": 5.0}]}}}]
    assert noise_floor(one, ("sync",), "output_throughput") is None  # one repeat: no spread to read


def test_the_structured_grid_refuses_a_profile_without_grammar_curves_before_any_session(tmp_path, capsys):
    from tests.calibrate_helpers import synthetic_profile

    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(synthetic_profile()))
    assert main(["validate", "--engine", "sglang", "--grid", "structured", "--profile", str(plain),
                 "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--profile" in err[0] and "--structured-output" in err[0]
    assert not (tmp_path / "v").exists()
