"""Bad scenarios give one clear line naming the file and field, exit status 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sim.cli import main

QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


def run_cli(capsys, *argv) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize("text,field,words", [
    ("name: x\nworkload: {concurency: 3}\n", "workload.concurency", "unknown key"),
    ("name: x\nworkload: {concurrency: many}\n", "workload.concurrency", "integer"),
    ("name: x\ncosts: {gpu: {decode: {base: -0.001}}}\n", "costs.gpu.decode.base", "greater than or equal to 0"),
    ("name: x\nserver: {settings: [overlap, turbo]}\n", "server.settings.1", "normal"),
    ("name: x\nworkload: {arrival: trace, trace: missing.jsonl}\n", "workload.trace", "no such file"),
    ("name: x\nworkload: {input_len: {dist: lognormal, mean: 200}}\n", "workload.input_len.sigma", "required"),
    ("workload: {concurrency: 3}\n", "name", "required"),
])
def test_bad_field_one_line_exit_2(tmp_path, capsys, text, field, words):
    path = write(tmp_path, text)
    code, err = run_cli(capsys, "run", str(path), "--out", str(tmp_path / "out"))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert str(path) in lines[0] and f": {field}:" in lines[0] and words in lines[0]
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_missing_file(tmp_path, capsys):
    code, err = run_cli(capsys, "run", str(tmp_path / "nope.yaml"))
    assert code == 2 and "nope.yaml" in err and "no such scenario file" in err


def test_not_yaml(tmp_path, capsys):
    code, err = run_cli(capsys, "run", str(write(tmp_path, "name: [unclosed\n")))
    assert code == 2 and "not valid YAML" in err and len(err.strip().splitlines()) == 1


def test_bad_override(tmp_path, capsys):
    code, err = run_cli(capsys, "run", str(QUICKSTART), "--set", "workload.concurrency=-2", "--out", str(tmp_path))
    assert code == 2 and "workload.concurrency" in err and "greater than or equal to 1" in err
    code, err = run_cli(capsys, "run", str(QUICKSTART), "--set", "workload.bogus=1", "--out", str(tmp_path))
    assert code == 2 and "workload.bogus: unknown key" in err
    code, err = run_cli(capsys, "run", str(QUICKSTART), "--set", "noequals", "--out", str(tmp_path))
    assert code == 2 and "KEY.PATH=VALUE" in err


def test_real_process_prints_no_traceback(tmp_path):
    path = write(tmp_path, yaml.safe_dump({"name": "x", "server": {"kv_pool_tokens": 0}}))
    proc = subprocess.run([sys.executable, "-m", "sim.cli", "run", str(path)], capture_output=True, text=True,
                          cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "server.kv_pool_tokens" in proc.stderr
