"""``overlap-sim calibrate --from-trace``: a calibration profile from an SGLang server's own
torch.profiler trace (:mod:`calibrate.real.from_trace.torch_trace`, :mod:`calibrate.real.from_trace.profile`).

Recorded traces (``tests/data/sglang/profile/``, SGLang 0.5.23's CPU engine on this kind of
machine, ``realengines.sglang.record_profile``; how they were made: the folder's README) and
small GPU-shaped traces built here (CUDA kernels on a stream, their launches, the scheduler's
Python functions): the forward and phase times the importer recovers are the trace's own spans;
bad traces are one line and exit 2 with nothing written. The recording itself runs only where the
SGLang environment exists.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import statistics
import subprocess
from pathlib import Path

import pytest

from calibrate.real.from_trace.torch_trace import read_trace
from calibrate.real.from_trace.log_match import log_check
from sim.cli import main
from sim.model.profile import load_profile, profile_curves

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "sglang" / "profile"
TRACES = {"normal": DATA / "normal-c4.trace.json.gz", "overlap": DATA / "overlap-c4.trace.json.gz"}
SCHED = "sglang/srt/managers/scheduler.py"


def _events(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def _py(events: list[dict], func: str, file: str = SCHED) -> list[dict]:
    return sorted((e for e in events if e.get("cat") == "python_function" and e["name"].startswith(file)
                   and e["name"].endswith(f": {func}")), key=lambda e: e["ts"])


# ---------------------------------------------------------------------------------------------
# recorded traces


@pytest.mark.parametrize("loop", ["normal", "overlap"])
def test_a_recorded_trace_gives_each_forward_its_own_span(loop):
    path = TRACES[loop]
    events = _events(path)
    read = read_trace(path)
    assert read.loop == loop and read.device == "cpu" and read.with_stack
    spans = sorted((e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("step[")),
                   key=lambda e: e["ts"])
    assert [s.label for s in read.steps] == [e["name"] for e in spans]
    runs = _py(events, "run_batch")
    samples = _py(events, "sample", "sglang/srt/model_executor/model_runner.py")
    for step, span in zip(read.steps, spans):
        rb = next(r for r in runs if r["ts"] <= span["ts"] <= r["ts"] + r["dur"])
        sample = sum(s["dur"] for s in samples if rb["ts"] <= s["ts"] <= rb["ts"] + rb["dur"])
        want = (span["dur"] + sample) * 1e-6  # ModelRunner.forward + ModelRunner.sample
        assert step.forward_s == pytest.approx(want, rel=0.02)
        assert step.launch_s == pytest.approx(rb["dur"] * 1e-6 - want, rel=0.02, abs=1e-7)
        # ctx from the detailed annotations: g_sk / bs
        if step.kind == "decode":
            g_sk = int(span["name"].split("g_sk=")[1].split()[0])
            assert step.point == (step.num_reqs, g_sk / step.num_reqs)
    kinds = [s.kind for s in read.steps]
    assert kinds.count("extend") >= 1 and kinds.count("decode") >= 10
    # every phase of the batches in the middle of the window is there, and is a real span's time
    scheds = {round(e["dur"] * 1e-6, 9) for e in _py(events, "get_next_batch_to_run")}
    procs = {round(e["dur"] * 1e-6, 9) for e in _py(events, "process_batch_result")}
    for s in read.steps[1:-1]:
        assert round(s.schedule_s, 9) in scheds and round(s.process_s, 9) in procs


def test_under_overlap_a_batch_is_processed_in_the_next_iteration():
    events = _events(TRACES["overlap"])
    read = read_trace(TRACES["overlap"])
    procs = _py(events, "process_batch_result")
    for a, b in zip(read.steps, read.steps[1:]):
        # event_loop_overlap: the result of a is processed after b's launch (scheduler.py, result_queue)
        p = next(p for p in procs if round(p["dur"] * 1e-6, 9) == round(a.process_s, 9))
        assert p["ts"] > b.span.start_us


@pytest.mark.parametrize("loop", ["normal", "overlap"])
def test_the_server_log_agrees_with_the_trace(loop):
    read = read_trace(TRACES[loop])
    check = log_check([read], DATA / f"{loop}-c4.server.log")
    decodes = sum(s.kind == "decode" for s in read.steps)
    # under overlap a line is matched by the next step (the last decode of the window has none)
    assert decodes - (2 if loop == "overlap" else 0) <= check["matched"] <= decodes
    assert check["decode_lines"] >= check["matched"]
    assert check["median_abs_rel_diff"] < 0.02  # the log's step period is the trace's
    assert check["profiler_slowdown"] > 1.0  # the profiler's Python tracer slows the server


def test_the_recorded_trace_makes_a_profile_that_runs(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["calibrate", "--from-trace", str(TRACES["normal"]), "--server-log",
                 str(DATA / "normal-c4.server.log"), "--out", str(out)]) == 0
    profile = load_profile(out)
    meta = profile["metadata"]
    assert meta["device"] == "cpu" and meta["settings"] == ["normal"] and meta["server_log_check"]["matched"] > 0
    curves = profile_curves(profile)
    slow = meta["trace"]["slowdown"]  # the log measured the profiler's slowdown: divided out of every curve
    assert slow["removed"] and 1.5 < slow["host_slowdown"] < 4 and "(CPU engine)" in slow["applied_to"]
    f = slow["host_slowdown"]
    read = read_trace(TRACES["normal"])
    for s in read.steps:
        if s.kind == "extend":  # one step per (tokens, prefix 0): the curve passes through it, less
            # the per-forward overhead the log measured (at most divided by the median factor)
            want = max(s.forward_s - slow["local"]["forward_overhead_s"], s.forward_s / f)
            assert curves["forward.extend"](s.num_tokens, s.attended) == pytest.approx(want, rel=0.02)
    dec = [s for s in read.steps if s.kind == "decode"]
    grid_mean = statistics.fmean(curves["forward.decode"](*s.point) for s in dec)
    assert grid_mean == pytest.approx(statistics.fmean(s.forward_s for s in dec) / f, rel=0.05)
    cover = meta["coverage"]["forward.decode"]
    assert cover["num_reqs"] == [4, 4] and cover["ctx"][0] <= min(s.point[1] for s in dec)
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: t\nworkload: {arrival: closed_loop, concurrency: 4, num_requests: 8, "
                        "input_len: 128, output_len: 16}\nserver: {device: cpu, settings: [overlap, normal]}\n"
                        "costs: {profile: p.json}\n")
    capsys.readouterr()
    assert main(["run", str(scenario), "--out", str(tmp_path / "r"), "--no-plots", "--json"]) == 0


# ---------------------------------------------------------------------------------------------
# GPU-shaped traces built here


class GpuTrace:
    """A torch.profiler-shaped trace of SGLang's scheduler on a GPU: per iteration the Python
    functions of event_loop_normal / event_loop_overlap, the step span inside run_batch, the
    kernels' launches (cuda_runtime) and the kernels on stream 7 (ts in microseconds)."""

    def __init__(self, loop: str = "normal"):
        self.loop, self.events, self.t, self.corr = loop, [], 1000.0, 0
        self.expect: list[dict] = []
        self.pending = None

    def py(self, func: str, ts: float, dur: float, file: str = SCHED, line: int = 100) -> None:
        self.events.append({"ph": "X", "cat": "python_function", "name": f"{file}({line}): {func}", "pid": 1,
                            "tid": 1, "ts": ts, "dur": dur})

    def launch(self, ts: float, kernel_ts: float, kernel_dur: float) -> None:
        self.corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                            "ts": ts, "dur": 5.0, "args": {"correlation": self.corr}})
        self.events.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": kernel_ts,
                            "dur": kernel_dur, "args": {"correlation": self.corr, "stream": 7}})

    def iteration(self, kind: str, bs: int, sum_ctx: int, toks: int = 0, new_reqs: int = 0,
                  forward_us: float = 3000.0, sync_us: float = 400.0) -> None:
        t = self.t
        recv_us = 50.0 + 20 * new_reqs
        self.py("ingest_requests", t, recv_us)
        for k in range(new_reqs):
            self.py("handle_generate_request", t + 10 + 20 * k, 15)
        t += recv_us + 5
        sched_us = 100.0 + 10 * bs
        self.py("get_next_batch_to_run", t, sched_us)
        t += sched_us + 5
        rb_start, rb_dur = t, 600.0 + 5 * bs
        self.py("run_batch", rb_start, rb_dur)
        if kind == "decode":
            name = f"step[DECODE bs={bs} g_sq={bs} g_sqsq={bs} g_sqsk={sum_ctx} g_sk={sum_ctx} forward_id=1]"
        else:
            name = f"step[EXTEND bs={bs} toks={toks} c_sq={toks} c_sqsq=1 c_sqsk=1 c_sk={sum_ctx} forward_id=1]"
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1,
                            "ts": rb_start + 20, "dur": 400.0})
        # three forward kernels, then sampling launched after the span (inside run_batch)
        k0 = rb_start + 100.0
        self.launch(rb_start + 30, k0, forward_us * 0.5)
        self.launch(rb_start + 60, k0 + forward_us * 0.5 + 10, forward_us * 0.3)
        self.launch(rb_start + 300, k0 + forward_us * 0.8 + 20, forward_us * 0.2 - 40)
        self.launch(rb_start + 500, k0 + forward_us - 20, 20)  # sampling, after the span
        device_end = k0 + forward_us
        t = rb_start + rb_dur + 5
        expect = {"kind": kind, "bs": bs, "forward_s": forward_us * 1e-6, "schedule_s": sched_us * 1e-6,
                  "launch_s": rb_dur * 1e-6, "new_reqs": new_reqs}
        target = expect if self.loop == "normal" else self.pending
        proc_us = 300.0 + 20 * bs
        if target is not None:
            # process_batch_result, blocked on the device for sync_us (event_loop_normal's wait)
            self.py("process_batch_result", t, proc_us + sync_us)
            self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1,
                                "tid": 1, "ts": t + 10, "dur": sync_us})
            target["process_s"] = proc_us * 1e-6
            t += proc_us + sync_us + 5
        self.pending = expect
        self.expect.append(expect)
        self.t = max(t, device_end) + 30.0  # the loop's own time before the next ingest

    def write(self, path: Path, props: bool = True) -> Path:
        loop = {"ph": "X", "cat": "python_function", "name": f"{SCHED}(2033): event_loop_{self.loop}", "pid": 1,
                "tid": 1, "ts": 0.0, "dur": self.t + 10}
        data = {"schemaVersion": 1, "traceEvents": [loop, *self.events]}
        if props:
            data["deviceProperties"] = [{"id": 0, "name": "NVIDIA L4"}]
        path.write_bytes(gzip.compress(json.dumps(data).encode()))
        return path


def _gpu_trace(loop: str) -> GpuTrace:
    tr = GpuTrace(loop)
    tr.iteration("extend", 4, 512, toks=512, new_reqs=4, forward_us=9000.0)
    for bs in (4, 8):
        for k in range(6):
            ctx = 200 + 40 * k
            tr.iteration("decode", bs, bs * ctx, forward_us=2000.0 + 100 * bs + 2.0 * bs * ctx)
    tr.iteration("extend", 2, 2 * (128 + 128), toks=256, new_reqs=2, forward_us=6000.0)
    tr.iteration("decode", 8, 8 * 300, forward_us=2000.0 + 800 + 16.0 * 300)
    return tr


@pytest.mark.parametrize("loop", ["normal", "overlap"])
def test_a_gpu_trace_gives_kernel_spans_and_host_phases(tmp_path, loop):
    tr = _gpu_trace(loop)
    read = read_trace(tr.write(tmp_path / "t.json.gz"))
    assert read.device == "cuda" and read.device_name == "NVIDIA L4" and read.loop == loop
    assert len(read.steps) == len(tr.expect)
    for got, want in zip(read.steps, tr.expect):
        assert got.kind == want["kind"] and got.num_reqs == want["bs"]
        # the device time: first kernel start to last kernel end, sampling included
        assert got.forward_s == pytest.approx(want["forward_s"], rel=0.02)
        assert got.schedule_s == pytest.approx(want["schedule_s"], rel=0.02)
        assert got.launch_s == pytest.approx(want["launch_s"], rel=0.02)  # run_batch: the forward is launched
        if "process_s" in want:  # the synchronize wait is taken out
            assert got.process_s == pytest.approx(want["process_s"], rel=0.02)
        else:
            assert math.isnan(got.process_s)
    news = sorted({n for n, _ in read.recv})
    assert news == [0, 2]  # the first iteration's receive is not counted (it may predate the profiler)
    # the second extend step's coordinates: 256 new tokens, 128 cached per request
    assert [s.point for s in read.steps if s.kind == "extend"][1] == (256.0, 128.0)


def test_a_gpu_trace_makes_a_profile_on_a_full_grid(tmp_path):
    tr = _gpu_trace("normal")
    path = tr.write(tmp_path / "t.json.gz")
    out = tmp_path / "p.json"
    assert main(["calibrate", "--from-trace", str(path), "--out", str(out), "--model", "llama-3.1-8b"]) == 0
    profile = load_profile(out)
    assert profile["metadata"]["device"] == "cuda" and profile["metadata"]["model"]["name"] == "llama-3.1-8b"
    assert "NVIDIA L4" in profile["metadata"]["device_name"]
    curves = profile_curves(profile)
    # the forwards were made linear in (bs, bs*ctx): the binned grid reproduces every step
    for s in read_trace(path).steps:
        if s.kind == "decode":
            assert curves["forward.decode"](*s.point) == pytest.approx(s.forward_s, rel=0.02)
    # the measured batch sizes and at most 3 context nodes, and a node x4 beyond each end of the
    # data (REACH): the cells no step fell in and the reach nodes are the fitted form's and say so
    dec = profile["curves"]["forward.decode"]
    assert dec["grid"][0] == [1.0, 4.0, 8.0, 32.0] and len(dec["grid"][1]) <= 3 + 2
    filled = [s for s in profile["samples"] if s.get("filled")]
    assert {s["point"]["num_reqs"] for s in filled if s["curve"] == "forward.decode"} >= {1.0, 32.0}
    assert curves["process.decode"](8) == pytest.approx((300 + 160) * 1e-6, rel=0.02)
    # beyond the data the form (a + b B + c B C) is the trace's own law: B = 16 at C = 1000
    assert curves["forward.decode"](16, 1000) == pytest.approx((2000 + 100 * 16 + 2.0 * 16 * 1000) * 1e-6, rel=0.02)
    assert curves["process.decode"](24) == pytest.approx((300 + 20 * 24) * 1e-6, rel=0.02)
    fits = profile["metadata"]["trace"]["fits"]["forward.decode"]
    assert fits["coef_s"]["per_kv_token"] == pytest.approx(2.0e-6, rel=0.02)
    cover = profile["metadata"]["coverage"]
    assert cover["forward.decode"]["num_reqs"] == [4.0, 8.0] and cover["reach"] == 4.0
    assert not profile["metadata"]["trace"]["slowdown"]["removed"]  # no server log: said, not removed


def test_a_gpu_trace_without_launch_events_uses_the_device_annotation(tmp_path):
    events = [{"ph": "X", "cat": "user_annotation", "name": "step[DECODE bs=2 g_sk=100]", "ts": 10.0, "dur": 50.0},
              {"ph": "X", "cat": "gpu_user_annotation", "name": "step[DECODE bs=2 g_sk=100]", "ts": 30.0,
               "dur": 1234.0},
              {"ph": "X", "cat": "kernel", "name": "k", "ts": 30.0, "dur": 1234.0}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    read = read_trace(path)
    assert read.steps[0].forward_s == pytest.approx(1234e-6) and read.device == "cuda"


# ---------------------------------------------------------------------------------------------
# bad traces


def _bad(tmp_path, name: str, content) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def _step(**over) -> dict:
    e = {"ph": "X", "cat": "user_annotation", "name": "step[DECODE bs=2 g_sk=100]", "ts": 10.0, "dur": 50.0}
    e.update(over)
    return {k: v for k, v in e.items() if v is not None}


BAD = {
    "not-json": ("t.json", "{\"traceEvents\": [", "not valid Chrome trace JSON"),
    "truncated-gzip": ("t.json.gz", gzip.compress(b'{"traceEvents": []}')[:12], "truncated"),
    "no-events": ("t.json", {"foo": 1}, "traceEvents"),
    "no-steps": ("t.json", {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2}]},
                 "traceEvents: no ModelRunner.forward step spans"),
    "step-without-dur": ("t.json", {"traceEvents": [_step(dur=None)]}, "traceEvents[0].dur"),
    "step-with-bad-ts": ("t.json", {"traceEvents": [_step(ts="x")]}, "traceEvents[0].ts"),
    "no-token-counts": ("t.json", {"traceEvents": [_step(name="step[DECODE bs=2]"),
                                                   _step(name="step[EXTEND bs=1 toks=5]", ts=100.0)]},
                        "detailed_annotations"),
    "no-extend": ("t.json", {"traceEvents": [_step()]}, "forward.extend: no EXTEND step"),
    "no-stacks": ("t.json", {"traceEvents": [_step(), _step(name="step[EXTEND bs=1 toks=5 c_sq=5 c_sk=5]",
                                                            ts=100.0)]}, "with_stack"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_trace_is_one_line_and_exit_2_with_nothing_written(tmp_path, capsys, case):
    name, content, expect = BAD[case]
    path = _bad(tmp_path, name, content)
    out = tmp_path / "out" / "p.json"
    assert main(["calibrate", "--from-trace", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and expect in err[0], err
    assert "Traceback" not in err[0]
    assert not out.exists() and not (tmp_path / "out").exists()


def test_a_missing_server_log_or_a_log_flag_alone_is_one_line(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["calibrate", "--from-trace", str(TRACES["normal"]), "--server-log", str(tmp_path / "no.log"),
                 "--out", str(out)]) == 2
    assert main(["calibrate", "--server-log", str(tmp_path / "no.log"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "no.log" in err[0] and "--server-log" in err[1]
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# the recording, where SGLang is installed

SGLANG_PYTHON = Path(os.environ.get("OVERLAP_SIM_SGLANG_PYTHON", REPO / ".venvs" / "sglang" / "bin" / "python"))
MODEL = REPO / ".venvs" / "models" / "tiny-llama"


@pytest.mark.skipif(not SGLANG_PYTHON.exists() or not MODEL.exists(),
                    reason="no SGLang environment (realengines/sglang/setup.sh) or test model "
                           "(python -m realengines.model)")
def test_a_real_server_records_a_trace_that_imports(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "realengines" / "sglang" / "shims"), str(REPO)]),
               OMP_NUM_THREADS="1")
    proc = subprocess.run([str(SGLANG_PYTHON), "-m", "realengines.sglang.record_profile", str(tmp_path / "rec"),
                           "--requests", "4", "--output-len", "16", "--num-steps", "8", "--port", "30131"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    trace = Path(proc.stdout.strip().splitlines()[-1])
    out = tmp_path / "p.json"
    assert main(["calibrate", "--from-trace", str(trace), "--server-log", str(tmp_path / "rec" / "server.log"),
                 "--out", str(out)]) == 0
    check = load_profile(out)["metadata"]["server_log_check"]
    # the log's line averages its interval, the trace times each step: on a busy 2-core machine
    # they differed by 6.4% (0.2-0.3% when quiet), so the bound is a sanity check, not a target
    assert check["matched"] >= 3 and check["median_abs_rel_diff"] < 0.15


def test_a_trace_without_token_counts_takes_them_from_the_flags(tmp_path, capsys):
    """SGLang's default /start_profile request has no detailed_annotations: the step names say
    only the batch size (and a prefill's tokens); --trace-context / --trace-prefix state the rest."""
    import re

    data = json.loads(gzip.decompress(TRACES["normal"].read_bytes()))
    for e in data["traceEvents"]:
        if str(e.get("name", "")).startswith("step["):
            e["name"] = re.sub(r"^(step\[\w+ bs=\d+(?: toks=\d+)?).*\]$", r"\1]", e["name"])
    path = tmp_path / "plain.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    out = tmp_path / "p.json"
    assert main(["calibrate", "--from-trace", str(path), "--out", str(out)]) == 2
    assert "--trace-context" in capsys.readouterr().err and not out.exists()
    assert main(["calibrate", "--from-trace", str(path), "--server-log", str(DATA / "normal-c4.server.log"),
                 "--trace-context", "140", "--trace-prefix", "0", "--out", str(out)]) == 0
    profile = load_profile(out)
    assert profile["metadata"]["grid"]["assumed"] == {"steps": 24, "decode_context": 140.0, "extend_prefix": 0.0}
    assert profile["curves"]["forward.decode"]["grid"] == [[4.0], [140.0]]
    dec = [s.forward_s for s in read_trace(TRACES["normal"]).steps if s.kind == "decode"]
    f = profile["metadata"]["trace"]["slowdown"]["host_slowdown"]  # the log's slowdown, divided out
    assert profile_curves(profile)["forward.decode"](4, 140) == pytest.approx(statistics.median(dec) / f, rel=0.02)
    assert profile["metadata"]["server_log_check"]["median_abs_rel_diff"] < 0.02  # matched by batch size alone
    capsys.readouterr()
    assert main(["calibrate", "--from-trace", str(path), "--trace-context", "-3", "--out", str(out)]) == 2
    assert main(["calibrate", "--trace-context", "100", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].count("--trace-context") >= 1 and "only with --from-trace" in err[1]


def test_the_model_is_read_from_the_server_logs_server_args(tmp_path):
    """SGLang logs its ServerArgs at start-up: the profile's model is the served name, a local
    directory shortened to its last part; a log without the line names none."""
    from calibrate.real.from_trace.profile import server_log_model

    assert server_log_model(Path(__file__).parent / "data" / "sglang" / "session" / "server.log") == "tiny-llama"
    log = tmp_path / "s.log"
    log.write_text("[2026-12-01 11:10:44] server_args={'model_path': 'meta-llama/Llama-3.2-1B', 'port': 30000}\n")
    assert server_log_model(log) == "meta-llama/Llama-3.2-1B"  # a hub id is kept whole
    log.write_text("[t] server_args={'model_path': '/m/x', 'served_model_name': 'my-model'}\n")
    assert server_log_model(log) == "my-model"
    assert server_log_model(DATA / "normal-c4.server.log") is None  # (this recorded log starts after the line)
