"""`overlap-sim run` end to end on the shipped quickstart scenario."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from sim.cli import main
from sim.trace.metrics import SUMMARY_KEYS

QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"


def test_run_writes_results_and_json(tmp_path, capsys):
    out = tmp_path / "res"
    assert main(["run", str(QUICKSTART), "--out", str(out), "--json", "--set", "workload.num_requests=24"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["scenario"] == "quickstart" and payload["seed"] == 0
    assert set(payload["settings"]) == {"overlap", "normal"}
    for summ in payload["settings"].values():
        assert set(SUMMARY_KEYS) <= set(summ)
        assert summ["completed"] == 16 and summ["failed"] == 0
    ratio = payload["ratios"]["overlap/normal"]
    assert ratio["output_throughput"] == payload["settings"]["overlap"]["output_throughput"] / \
        payload["settings"]["normal"]["output_throughput"]
    names = {p.name for p in out.iterdir()}
    for setting in ("overlap", "normal"):
        assert {f"steps_{setting}.csv", f"requests_{setting}.csv", f"itl_{setting}.csv"} <= names
    assert {"summary.json", "gaps.png", "metrics.png", "timeline.png"} <= names
    assert not any(n.startswith(".") for n in names)  # no temporary files left behind
    steps = pd.read_csv(out / "steps_overlap.csv")
    assert (steps["forward_start"] >= steps["launch_end"] - 1e-12).all()
    saved = json.loads((out / "summary.json").read_text())
    assert saved["settings"] == payload["settings"]


def test_run_table_and_parquet(tmp_path, capsys):
    out = tmp_path / "res"
    assert main(["run", str(QUICKSTART), "--out", str(out), "--format", "parquet", "--no-plots",
                 "--set", "workload.num_requests=16"]) == 0
    text = capsys.readouterr().out
    assert "overlap/normal" in text and "output throughput" in text
    assert pd.read_parquet(out / "steps_normal.parquet").shape[0] > 0
    assert not (out / "gaps.png").exists()
