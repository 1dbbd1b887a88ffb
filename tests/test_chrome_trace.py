"""`overlap-sim trace`: a run's saved tables as a Chrome trace; `overlap-sim plots` on a run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from sim.cli import main
from sim.output.real_trace import measure_gaps
from sim.trace.metrics import step_gaps

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    assert main(["run", str(QUICKSTART), "--set", "workload.num_requests=24", "--set", "workload.output_len=32",
                 "--set", "workload.warmup_requests=0", "--plots", "--out", str(out)]) == 0
    return out


def _trace(run_dir, tmp_path, *extra) -> dict:
    out = tmp_path / "t.json"
    assert main(["trace", str(run_dir), "--out", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_trace_tracks_slices_and_times(run_dir, tmp_path):
    trace = _trace(run_dir, tmp_path)
    ev = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names.values()) == ["quickstart: normal", "quickstart: overlap"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(threads.values()) == {"scheduler thread (CPU)", "device stream"}
    for pid, label in names.items():
        setting = label.split(": ")[1]
        steps = pd.read_parquet(run_dir / f"steps_{setting}.parquet")
        forwards = sorted((e for e in ev if e["ph"] == "X" and e["pid"] == pid and e["tid"] == 2), key=lambda e: e["ts"])
        assert len(forwards) == len(steps)
        assert [e["args"]["batch"] for e in forwards] == list(steps["seq"])
        assert [e["ts"] for e in forwards] == pytest.approx(list(steps["forward_start"] * 1e6), abs=1e-2)
        assert {e["name"] for e in forwards} == {"forward extend", "forward decode"}
        # one thread: CPU phases never overlap, and every phase of every step is there
        cpu = sorted((e for e in ev if e["ph"] == "X" and e["pid"] == pid and e["tid"] == 1), key=lambda e: e["ts"])
        assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(cpu, cpu[1:]))
        assert {e["name"] for e in cpu} == {"recv", "schedule", "launch", "sync wait", "process"}
        counters = {e["name"] for e in ev if e["ph"] == "C" and e["pid"] == pid}
        assert counters == {"running requests", "waiting queue", "KV token usage"}


def test_flows_pair_up_and_futuremap_only_under_overlap(run_dir, tmp_path):
    ev = _trace(run_dir, tmp_path)["traceEvents"]
    starts = {(e["pid"], e["id"]): e for e in ev if e["ph"] == "s"}
    ends = {(e["pid"], e["id"]): e for e in ev if e["ph"] == "f"}
    assert starts.keys() == ends.keys() and starts
    pids = {e["args"]["name"].split(": ")[1]: e["pid"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    for setting, pid in pids.items():
        steps = pd.read_parquet(run_dir / f"steps_{setting}.parquet")
        launch = [k for k, e in starts.items() if k[0] == pid and e["cat"] == "launch"]
        dep = [k for k, e in starts.items() if k[0] == pid and e["cat"] == "device_dependency"]
        assert len(launch) == len(steps)
        if setting == "overlap":
            assert len(dep) >= 0.8 * (steps["kind"] == "decode").sum()
            for k in dep:  # the arrow runs forward k-1 -> forward k on the device track
                assert starts[k]["tid"] == ends[k]["tid"] == 2 and ends[k]["ts"] >= starts[k]["ts"]
        else:
            assert dep == []
        for k in launch:
            assert starts[k]["tid"] == 1 and ends[k]["tid"] == 2 and ends[k]["bp"] == "e"
    # every arrow end lies inside exactly one slice of its track, so viewers bind it unambiguously
    slices = [e for e in ev if e["ph"] == "X"]
    for e in list(starts.values()) + list(ends.values()):
        hits = [x for x in slices if x["pid"] == e["pid"] and x["tid"] == e["tid"]
                and x["ts"] <= e["ts"] <= x["ts"] + x["dur"]]
        assert len(hits) == 1


def test_window_and_setting_filters(run_dir, tmp_path):
    steps = pd.read_parquet(run_dir / "steps_overlap.parquet")
    mid = float(steps["forward_start"].median())
    full = _trace(run_dir, tmp_path, "--setting", "overlap")
    part = _trace(run_dir, tmp_path, "--setting", "overlap", "--window", f"{mid}:{mid + 0.02}")
    assert {e["pid"] for e in full["traceEvents"]} == {1}
    n_full = sum(e["ph"] == "X" for e in full["traceEvents"])
    n_part = sum(e["ph"] == "X" for e in part["traceEvents"])
    assert 0 < n_part < n_full
    kept = {e["args"]["batch"] for e in part["traceEvents"] if e["ph"] == "X" and e["tid"] == 2}
    first = steps[["recv_start", "forward_start"]].min(axis=1)
    last = steps[["process_end", "forward_end"]].max(axis=1)
    overlapping = set(steps["seq"][(last >= mid) & (first <= mid + 0.02)])
    assert kept == overlapping  # steps that touch the window, whole


def test_simulator_trace_round_trips_through_gaps(run_dir, tmp_path):
    """The gaps reader measures on our own Chrome trace what the steps table says."""
    path = tmp_path / "t.json"
    assert main(["trace", str(run_dir), "--out", str(path)]) == 0
    for pid, setting in ((1, "overlap"), (2, "normal")):
        steps = pd.read_parquet(run_dir / f"steps_{setting}.parquet")
        got = measure_gaps(path, "forward", pid=pid)
        gaps = step_gaps(steps).dropna()
        assert got["num_steps"] == len(steps)
        assert got["mean_gap_ms"] == pytest.approx(gaps.mean() * 1e3, abs=1e-5)
        assert got["median_gap_ms"] == pytest.approx(gaps.median() * 1e3, abs=1e-5)


@pytest.mark.parametrize("extra, needle", [(["--window", "0.5:0.2"], "--window"), (["--window", "abc"], "--window"),
                                           (["--window", "900:901"], "no step"), (["--setting", "overlap_mlx"], "overlap_mlx")])
def test_trace_bad_input_exits_2(run_dir, tmp_path, capsys, extra, needle):
    assert main(["trace", str(run_dir), "--out", str(tmp_path / "t.json"), *extra]) == 2
    assert needle in capsys.readouterr().err


def test_trace_of_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert main(["trace", str(tmp_path), "--out", str(tmp_path / "t.json")]) == 2
    assert "summary.json" in capsys.readouterr().err


def test_preview_and_plots_regenerate_from_tables(run_dir, tmp_path, capsys):
    assert main(["trace", str(run_dir), "--window", "0.05:0.1", "--out", str(tmp_path / "t.json.gz"),
                 "--preview", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert measure_gaps(tmp_path / "t.json.gz", "forward")["num_steps"] > 0
    for name in ("gaps.png", "metrics.png", "timeline.png"):
        (run_dir / name).unlink()
    capsys.readouterr()
    assert main(["plots", str(run_dir)]) == 0
    for name in ("gaps.png", "metrics.png", "timeline.png"):
        assert (run_dir / name).read_bytes()[:4] == b"\x89PNG"
    assert main(["plots", str(tmp_path)]) == 2
    assert "not a run or sweep folder" in capsys.readouterr().err
