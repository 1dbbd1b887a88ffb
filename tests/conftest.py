"""Shared helpers for the tests: small scenarios as dicts, trace files, the repository root."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"


@pytest.fixture
def write_trace(tmp_path):
    """Write requests [(arrival_s, input_len, output_len), ...] as a JSON-lines trace; returns its path."""
    def write(rows, name="trace.jsonl"):
        path = tmp_path / name
        path.write_text("".join(json.dumps({"arrival_s": a, "input_len": i, "output_len": o}) + "\n"
                                for a, i, o in rows))
        return str(path)
    return write


@pytest.fixture
def run_cli(capsys):
    """Run ``overlap-sim ARGV`` in this process; returns (exit status, stdout, stderr)."""
    def run(argv):
        from sim.cli import main

        code = main([str(a) for a in argv])
        out = capsys.readouterr()
        return code, out.out, out.err
    return run
