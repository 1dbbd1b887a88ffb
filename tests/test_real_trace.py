"""`overlap-sim gaps` on traces that a real torch.profiler run writes during the test (CPU)."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import numpy as np
import pytest

from sim.cli import main
from sim.output.real_trace import find_steps, gap_summary, measure_gaps

SLEEP_S = 0.004  # host idle time between forward steps
STEPS = 8


@pytest.fixture(scope="module")
def torch_trace(tmp_path_factory) -> Path:
    """A torch.profiler Chrome trace of a decode-like loop: each step runs a small forward
    (matmuls) inside record_function('decode_forward'), then the host sleeps."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    w = torch.randn(128, 128)
    x = torch.randn(8, 128)
    for _ in range(3):  # warm up outside the profile
        torch.relu(x @ w) @ w
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS):
            with record_function("decode_forward"):
                for _ in range(4):
                    x = torch.tanh(x @ w)
            time.sleep(SLEEP_S)
    path = tmp_path_factory.mktemp("prof") / "trace.json"
    prof.export_chrome_trace(str(path))
    return path


def _annotation_spans(path: Path, name: str) -> list[tuple[float, float]]:
    events = json.loads(path.read_text())["traceEvents"]
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and e.get("name") == name)


def test_gaps_of_a_real_profile(torch_trace):
    got = measure_gaps(torch_trace, "decode_forward")
    spans = _annotation_spans(torch_trace, "decode_forward")
    assert got["num_steps"] == STEPS == len(spans)
    gaps_ms = [(b[0] - a[1]) / 1e3 for a, b in zip(spans, spans[1:])]
    assert got["gaps_ms"] == pytest.approx(gaps_ms, abs=1e-6)
    assert got["mean_gap_ms"] == pytest.approx(np.mean(gaps_ms), abs=1e-6)
    assert got["median_gap_ms"] == pytest.approx(np.median(gaps_ms), abs=1e-6)
    assert got["p99_gap_ms"] == pytest.approx(np.percentile(gaps_ms, 99), abs=1e-6)
    # the host slept SLEEP_S between steps: every gap is at least that (sleep never returns early)
    assert min(gaps_ms) >= SLEEP_S * 1e3 * 0.99
    duration = spans[-1][1] - spans[0][0]
    assert got["gpu_idle_fraction"] == pytest.approx(sum(gaps_ms) * 1e3 / duration, rel=1e-6)
    assert "CPU spans" in got["mode"]


def test_cli_json_table_plot_and_gzip(torch_trace, tmp_path, capsys):
    assert main(["gaps", str(torch_trace), "--step-name", "decode_forward", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("mean_gap_ms", "median_gap_ms", "p99_gap_ms", "gpu_idle_fraction", "num_steps"):
        assert key in out
    assert out["num_steps"] == STEPS
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(torch_trace.read_bytes()))
    assert main(["gaps", str(gz), "--step-name", "decode_forward", "--plot", str(tmp_path / "g.png")]) == 0
    text = capsys.readouterr().out
    assert "GPU idle fraction" in text and "measured" in text
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"


def test_measured_beside_predicted(torch_trace, tmp_path, capsys):
    run = tmp_path / "run"
    root = Path(__file__).resolve().parents[1]
    assert main(["run", str(root / "scenarios" / "quickstart.yaml"), "--set", "workload.num_requests=16",
                 "--no-plots", "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["gaps", str(torch_trace), "--step-name", "decode_forward", "--against", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    summary = json.loads((run / "summary.json").read_text())
    assert out["predicted"]["normal"]["mean_gap_ms"] == summary["settings"]["normal"]["mean_gap_ms"]


@pytest.mark.parametrize("cut", [0.3, 0.9])
def test_truncated_trace_exits_2(torch_trace, tmp_path, capsys, cut):
    raw = torch_trace.read_bytes()
    bad = tmp_path / "cut.json"
    bad.write_bytes(raw[: int(len(raw) * cut)])
    assert main(["gaps", str(bad), "--step-name", "decode_forward"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "truncated" in err and len(err.strip().splitlines()) == 1
    bad_gz = tmp_path / "cut.json.gz"
    bad_gz.write_bytes(gzip.compress(raw)[:200])
    assert main(["gaps", str(bad_gz)]) == 2
    assert "truncated" in capsys.readouterr().err


def test_no_steps_exits_2(torch_trace, tmp_path, capsys):
    assert main(["gaps", str(torch_trace)]) == 2  # a CPU profile has no device kernels
    assert "--step-name" in capsys.readouterr().err
    assert main(["gaps", str(torch_trace), "--step-name", "Decode_Forward"]) == 2
    assert "no span of that name" in capsys.readouterr().err
    assert main(["gaps", str(tmp_path / "missing.json")]) == 2
    empty = tmp_path / "empty.json"
    empty.write_text("")
    assert main(["gaps", str(empty)]) == 2
    capsys.readouterr()


def _cuda_style_trace() -> list[dict]:
    """Events in torch.profiler's CUDA layout (kernels on the device pid, runtime launches on the
    host linked by ``correlation``), written by hand so the expected gaps are known exactly:
    three steps of two kernels each, device idle 300 us then 500 us between the steps."""
    events = []
    corr = 0
    for step, (t_dev, t_host) in enumerate([(1000.0, 900.0), (1500.0, 1400.0), (2200.0, 2100.0)]):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 10, "tid": 10,
                       "ts": t_host - 50, "dur": 150})
        for k in range(2):
            corr += 1
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 10,
                           "ts": t_host + 10 * k, "dur": 5, "args": {"correlation": corr}})
            events.append({"ph": "X", "cat": "kernel", "name": f"gemm{k}", "pid": 0, "tid": 7,
                           "ts": t_dev + 100 * k, "dur": 100, "args": {"correlation": corr, "stream": 7}})
    return events


def test_kernel_modes_on_a_cuda_layout():
    events = _cuda_style_trace()
    steps, mode = find_steps(events)
    assert "ProfilerStep" in mode
    assert steps == [(1000.0, 1200.0), (1500.0, 1700.0), (2200.0, 2400.0)]
    summ = gap_summary(steps)
    assert summ["mean_gap_ms"] == pytest.approx(0.4) and summ["num_steps"] == 3
    assert summ["gpu_idle_fraction"] == pytest.approx(800 / 1400)
    # without step annotations: split where the device idles longer than the threshold
    plain = [e for e in events if not e["name"].startswith("ProfilerStep")]
    assert find_steps(plain, split_gap_us=50)[0] == steps
    assert len(find_steps(plain, split_gap_us=400)[0]) == 2
