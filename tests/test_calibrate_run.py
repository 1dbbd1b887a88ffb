"""`overlap-sim calibrate` end to end on this machine's CPU: torch and MLX, resume, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from calibrate import measure, sidecar
from sim.cli import main
from sim.model.profile import CURVE_AXES, load_profile

TINY_GRID = ["--batch-sizes", "1,2", "--contexts", "16,32", "--extend-tokens", "1,8", "--prefixes", "0,8",
             "--bookkeeping-batch-sizes", "1,2", "--repeats", "2", "--warmup", "1"]


def _check_profile(path, backend, device):
    prof = load_profile(path)
    m = prof["metadata"]
    assert (m["backend"], m["device"], m["model"]["name"]) == (backend, device, "tiny")
    assert m["host_cpu"] and m["libraries"]["tokenizers"] and m["date"]
    assert m["command"].startswith(f"overlap-sim calibrate --backend {backend} --device {device} --model tiny")
    assert set(CURVE_AXES) <= set(prof["curves"])
    assert all(t > 0 for s in prof["samples"] if s["curve"].startswith("forward") for t in s["times_s"])
    assert not path.with_name(path.name + ".samples.jsonl").exists()  # sidecar removed once written
    return prof


def test_torch_quick_on_cpu_then_simulate(tmp_path, capsys):
    out = tmp_path / "torch.json"
    assert main(["calibrate", "--backend", "torch", "--device", "cpu", "--model", "tiny", "--quick",
                 "--out", str(out)]) == 0
    prof = _check_profile(out, "torch", "cpu")
    assert prof["metadata"]["quick"] and prof["metadata"]["grid"]["decode_batch_sizes"] == [1, 4, 16]
    # the bookkeeping bench sized as the host yardstick's (256), whatever the grid's largest batch (32)
    assert prof["metadata"]["bookkeeping_bench_max_batch"] == 256
    err = capsys.readouterr().err
    assert "decode batch 1 x ctx 64" in err and "profile written to" in err  # progress lines, then a summary
    res = tmp_path / "res"
    assert main(["run", "scenarios/quickstart.yaml", "--set", f"costs.profile={out}", "--set",
                 "workload.num_requests=12", "--set", "workload.warmup_requests=2", "--out", str(res),
                 "--no-plots", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["settings"]["overlap"]["completed"] == 10
    assert "extrapolated_steps" in payload["settings"]["normal"]


def test_mlx_quick_on_cpu(tmp_path):
    pytest.importorskip("mlx.core")
    out = tmp_path / "mlx.json"
    assert main(["calibrate", "--backend", "mlx", "--device", "cpu", "--model", "tiny", "--quick",
                 "--out", str(out), "--quiet"]) == 0
    prof = _check_profile(out, "mlx", "cpu")
    assert "MLX" in prof["metadata"]["device_name"]
    assert {"submit.decode", "submit.extend"} <= set(prof["curves"])  # mx.async_eval's blocking, per point


def test_interrupted_calibration_resumes(tmp_path, monkeypatch):
    out = tmp_path / "p.json"
    args = ["calibrate", "--backend", "torch", "--device", "cpu", "--out", str(out), "--quiet", *TINY_GRID]
    real_run = measure.Measurer.run
    calls = []

    def interrupted(self, task):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(task.key)
        return real_run(self, task)

    monkeypatch.setattr(measure.Measurer, "run", interrupted)
    assert main(args) == 130  # Ctrl-C: one line, the exit status a shell gives it
    sidecar = out.with_name(out.name + ".samples.jsonl")
    assert not out.exists() and len(sidecar.read_text().splitlines()) == 1 + 3
    with sidecar.open("a") as fh:  # a line cut short by the interruption
        fh.write('{"task": "decode:2:16", "sam')

    resumed = []

    def counting(self, task):
        resumed.append(task.key)
        return real_run(self, task)

    monkeypatch.setattr(measure.Measurer, "run", counting)
    assert main(args) == 0
    total = 4 + 4 + 3  # decode 2x2, extend 2x2, bookkeeping 0,1,2
    assert len(resumed) == total - 3 and not set(resumed) & set(calls)
    prof = load_profile(out)
    assert {(s["curve"], s["point"].get("num_reqs"), s["point"].get("ctx")) for s in prof["samples"]
            if s["curve"] == "forward.decode"} == {("forward.decode", b, c) for b in (1, 2) for c in (16, 32)}


def test_sidecar_of_another_calibration_is_refused(tmp_path, capsys):
    out = tmp_path / "p.json"
    sidecar = out.with_name(out.name + ".samples.jsonl")
    sidecar.write_text(json.dumps({"sidecar": "overlap-sim calibration samples", "identity": {"backend": "mlx"}}) + "\n")
    args = ["calibrate", "--backend", "torch", "--device", "cpu", "--out", str(out), "--quiet", *TINY_GRID]
    assert main(args) == 2
    assert "--fresh" in capsys.readouterr().err
    assert main(args + ["--fresh"]) == 0 and out.exists()


@pytest.mark.parametrize("argv, words", [
    (["--backend", "torch", "--device", "cpu", "--model", "gpt-9"], "--model"),
    (["--backend", "torch", "--device", "gpu"], "--device"),
    (["--backend", "mlx", "--device", "cuda"], "--device"),
    (["--backend", "torch", "--device", "cpu", "--model", "tiny", "--heads", "3"], "--kv-heads"),
    # a framework calibration's flag with --engine: the engine's run would start without it
    (["--engine", "sglang", "--host-only", "--dry-run"], "--dry-run: not with --engine sglang"),
    (["--engine", "vllm", "--backend", "torch", "--device", "cpu"], "--backend: not with --engine vllm"),
    (["--engine", "sglang", "--quick"], "--quick: not with --engine sglang"),
])
def test_bad_requests_exit_2_in_one_line(tmp_path, capsys, argv, words):
    assert main(["calibrate", *argv, "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and words in err


def test_cuda_requested_without_cuda(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["calibrate", "--backend", "torch", "--device", "cuda", "--out", str(tmp_path / "x.json")]) == 2
    assert "torch.cuda.is_available() is False" in capsys.readouterr().err


def test_metal_calibration(tmp_path):
    pytest.importorskip("mlx.core")
    from calibrate.forward.mlx_backend import metal_available

    if not metal_available():
        pytest.skip("needs an Apple Metal GPU")
    out = tmp_path / "metal.json"
    assert main(["calibrate", "--backend", "mlx", "--device", "gpu", "--out", str(out), "--quiet", *TINY_GRID]) == 0
    assert load_profile(out)["metadata"]["device"] == "gpu"


def test_metal_requested_without_metal(tmp_path, capsys):
    pytest.importorskip("mlx.core")
    from calibrate.forward.mlx_backend import metal_available

    if metal_available():
        pytest.skip("this machine has Metal")
    assert main(["calibrate", "--backend", "mlx", "--device", "gpu", "--out", str(tmp_path / "x.json")]) == 2
    assert "no Metal device" in capsys.readouterr().err


def test_a_failed_first_point_leaves_nothing_that_blocks_the_corrected_retry(tmp_path, capsys, monkeypatch):
    # a GPU calibration that fails at once (here: a backend whose first forward runs out of device
    # memory, as `--device cuda` with a too large grid does) must not leave a samples file behind:
    # the corrected command (another device or grid) then runs without --fresh
    out = tmp_path / "p.json"
    sidecar = out.with_name(out.name + ".samples.jsonl")

    class OutOfMemoryError(RuntimeError):  # torch.cuda.OutOfMemoryError's name
        pass

    def oom(self, task):
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(measure.Measurer, "run", oom)
    assert main(["calibrate", "--backend", "torch", "--device", "cpu", "--out", str(out), "--quiet",
                 "--batch-sizes", "64", *TINY_GRID[2:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "out of cpu memory" in err[0] and "--batch-sizes" in err[0]
    assert not sidecar.exists() and not out.exists()
    monkeypatch.undo()
    assert main(["calibrate", "--backend", "torch", "--device", "cpu", "--out", str(out), "--quiet", *TINY_GRID]) == 0
    assert out.is_file() and not sidecar.exists()


def test_a_missing_device_writes_nothing(tmp_path, capsys, monkeypatch):
    # the backend (framework, device) is checked before the samples file is created
    out = tmp_path / "p.json"

    def no_device(cfg):
        raise measure.CalibrationInputError("--device", "", "cuda, but there is no GPU here")

    monkeypatch.setattr(measure, "make_backend", no_device)
    assert main(["calibrate", "--backend", "torch", "--device", "cpu", "--out", str(out), "--quiet", *TINY_GRID]) == 2
    assert list(tmp_path.iterdir()) == []


# what a GPU box with only torch lacks: the simulator's own dependencies (pyproject.toml), blocked
# in the child by a finder that raises ImportError as a missing package does
_BLOCKED = ("pydantic", "simpy", "ddsketch", "pandas", "matplotlib", "scipy", "pyarrow", "yaml", "packaging")
_BLOCKER = f"""
import sys

class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {_BLOCKED!r}:
            raise ImportError(f"blocked: {{name}}", name=name)
        return None

sys.meta_path.insert(0, _Blocker())
"""


@pytest.mark.parametrize("extra", [["--quick"], ["--dry-run"]])
def test_framework_calibration_needs_none_of_the_simulators_dependencies(tmp_path, extra):
    """``python -m calibrate.cli --backend torch ...`` (docs/calibration.md: the path for a GPU box
    with only torch, numpy, tokenizers and rich) runs with pydantic, SimPy, ddsketch, pandas,
    matplotlib, SciPy, pyarrow, PyYAML and packaging unimportable, and writes its profile."""
    pytest.importorskip("torch")
    pytest.importorskip("tokenizers")
    (tmp_path / "sitecustomize.py").write_text(_BLOCKER)
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "p.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    done = subprocess.run([sys.executable, "-m", "calibrate.cli", "--backend", "torch", "--device", "cpu",
                           "--model", "tiny", "--out", str(out), "--quiet", *extra],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    if extra == ["--dry-run"]:
        assert "grid: decode" in done.stderr and not out.exists()
        return
    prof = _check_profile(out, "torch", "cpu")
    assert prof["metadata"]["quick"]
    # and the blocker did block: the simulator's API says what is missing
    probe = subprocess.run([sys.executable, "-c", "import sim; sim.compare"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0 and "sim.compare needs" in probe.stderr


def test_the_bookkeeping_bench_holds_the_yardsticks_batches():
    """A calibration's bookkeeping (the yardstick a GPU or Mac profile carries) runs on a bench sized
    as the host yardstick's, so both hosts time the same work; a larger grid sizes it larger."""
    from calibrate.config import YARDSTICK_BATCH_SIZES
    from calibrate.measure import bench_max_batch

    assert bench_max_batch((1, 4, 16)) == bench_max_batch((1, 128)) == max(YARDSTICK_BATCH_SIZES) == 256
    assert bench_max_batch((1, 512)) == 512


@pytest.mark.parametrize("line, field", [
    ({"task": "d1", "samples": [{"curve": "forward.decode", "point": {"num_reqs": 1, "ctx": 8},
                                 "times_s": [float("nan")]}]}, "line 2: samples[0].times_s[0]"),
    ({"task": "d1", "samples": [{"curve": "forward.decode", "point": {"num_reqs": 1, "ctx": 8},
                                 "times_s": ["abc"]}]}, "line 2: samples[0].times_s[0]"),
    ({"task": "d1", "samples": [{"curve": "nope", "point": {}, "times_s": []}]}, "line 2: samples[0]"),
    ({"task": "d1"}, "line 2"),
    ([1, 2], "line 2"),
])
def test_a_corrupt_sidecar_line_is_refused_at_once_naming_the_file(tmp_path, line, field):
    """An interrupted calibration resumes from its sidecar: a line edited or corrupted (not cut
    short) is said before anything is measured, naming the sidecar, not the profile built later."""
    from calibrate.errors import CalibrationInputError

    path = tmp_path / "p.json.samples.jsonl"
    identity = {"backend": "torch", "model": "tiny"}
    path.write_text(json.dumps({"sidecar": "overlap-sim calibration samples", "identity": identity}) + "\n"
                    + json.dumps(line) + "\n" + '{"task": "cut sh')  # (a last line cut short: measured again)
    with pytest.raises(CalibrationInputError) as err:
        sidecar.Sidecar(path, identity, fresh=False)
    assert err.value.source == str(path) and err.value.field == field and "pass --fresh" in str(err.value)
    good = {"task": "d1", "samples": [{"curve": "forward.decode", "point": {"num_reqs": 1, "ctx": 8}, "times_s": [0.01]}]}
    path.write_text(json.dumps({"sidecar": "x", "identity": identity}) + "\n" + json.dumps(good) + "\n")
    assert sidecar.Sidecar(path, identity, fresh=False).done == {"d1": good["samples"]}


def test_a_bad_sidecar_is_the_only_line_before_any_plan(tmp_path, capsys):
    out = tmp_path / "p.json"
    sidecar.sidecar_path(out).write_text('{"sidecar": "x", "identity": {}}\n')  # another calibration's
    assert main(["calibrate", "--backend", "torch", "--device", "cpu", "--model", "tiny", "--quick",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "samples.jsonl: holds samples of a different calibration" in err, err
    assert not out.exists()
