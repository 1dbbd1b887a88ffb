"""Real SGLang as source and judge: recorded traces of its real scheduler (tests/data/sglang/,
written by ``realengines.sglang.drive`` with SGLang 0.5.23 on this kind of machine) through the
importer, the calibration's sample extraction and the conformance replay; and, only where the
SGLang environment exists (``realengines/sglang/setup.sh``), a short run of the real scheduler."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from calibrate.errors import CalibrationInputError
from calibrate.real import conformance, sglang_trace
from calibrate.real.environment import REPO, find_engine
from calibrate.real.sglang_profile import Design, SglangGrid, check_coverage, design, samples

DATA = Path(__file__).parent / "data" / "sglang"


def _fixture(setting):
    meta, records, reqs = sglang_trace.read_records(DATA / f"driver-{setting}.jsonl")
    job = json.loads((DATA / f"driver-{setting}.job.json").read_text())
    return meta, records, reqs, job


@pytest.mark.parametrize("setting", ["normal", "overlap"])
def test_the_trace_reads_into_iterations_with_each_batch_and_its_phases(setting):
    meta, records, reqs, job = _fixture(setting)
    assert meta["sglang"] == "0.5.23" and meta["overlap"] == (setting == "overlap")
    its = sglang_trace.iterations(records)
    steps = sglang_trace.steps(its)
    # every request was sent once, in some receive, and every request finished with its length
    sent = [rid for it in its for rid in it.sent]
    assert sorted(sent) == sorted(r["rid"] for r in job["requests"])
    assert {r["rid"]: len(r["output_ids"]) for r in reqs} == {r["rid"]: r["max_new_tokens"] for r in job["requests"]}
    # launch order, phases non-negative, the forward inside run_batch, processed once each
    assert [s.iter for s in steps] == sorted(s.iter for s in steps)
    for s in steps:
        assert min(s.schedule, s.launch, s.forward) >= 0 and s.forward > 0
        assert s.process == s.process and s.process >= 0  # processed (not NaN)
        assert s.forward_start <= s.forward_end <= s.process_start
    # each prompt is prefilled exactly once over its chunks (chunked_prefill_size 64 here)
    ext: dict[str, int] = {}
    for s in steps:
        for rid, e in zip(s.rids, s.ext):
            ext[rid] = ext.get(rid, 0) + e
    assert ext == {r["rid"]: len(r["input_ids"]) for r in job["requests"]}
    # under overlap a batch's result is processed after the next batch's forward
    if setting == "overlap":
        later = sum(a.process_start > b.forward_start for a, b in zip(steps, steps[1:]))
        assert later >= len(steps) - 3


@pytest.mark.parametrize("setting", ["normal", "overlap"])
def test_the_policy_schedules_the_recorded_batches(setting):
    meta, records, reqs, job = _fixture(setting)
    comp = conformance.compare_run(DATA / f"driver-{setting}.jsonl", job, "fixture")
    assert comp.num_steps == len(sglang_trace.steps(sglang_trace.iterations(records)))
    assert comp.identical == comp.num_steps, comp.first_difference()


def test_a_changed_policy_is_caught_step_by_step():
    _, records, _, job = _fixture("normal")
    its = sglang_trace.iterations(records)
    real = conformance.real_views(its)
    outputs = {r["rid"]: r["max_new_tokens"] for r in job["requests"]}
    meta = {"limits": {"max_running_requests": 2, "chunked_prefill_size": 64, "max_total_num_tokens": 41197}}
    sim = conformance.replay(its, job["requests"], outputs, meta, overlap=False)  # a tighter limit than the real 8
    assert sum(r == s for r, s in zip(real, sim) if r is not None) < sum(r is not None for r in real)


def test_calibration_samples_come_from_the_designed_waves():
    grid = SglangGrid(decode_batch_sizes=(1, 2), decode_contexts=(64, 96), decode_steps=8, decode_waves=1,
                      extend_tokens=(8, 16), extend_prefixes=(0, 32), extend_repeats=1)
    d = design(grid)
    assert [len(w) for w in d.waves[:4]] == [1, 2, 1, 2]
    assert all(len(r["input_ids"]) == 64 - 4 for r in d.waves[0])
    # an extend point with a prefix is a cached request then the same prompt plus new tokens
    with_prefix = [w for w in d.waves if len(w) == 1 and w[0]["rid"] in d.extend_point
                   and d.extend_point[w[0]["rid"]][1] == 32]
    assert with_prefix and len(with_prefix[0][0]["input_ids"]) in (32 + 8, 32 + 16)
    # coverage: a grid point without samples is an error naming it
    with pytest.raises(CalibrationInputError, match="no samples for"):
        check_coverage([], grid)


def test_samples_from_a_real_trace_price_the_phases():
    _, records, _, job = _fixture("normal")
    its = sglang_trace.iterations(records)
    d = Design(decode_point={r["rid"]: (4, 128) for r in job["requests"]})
    got = samples(its, d)
    curves = {s["curve"] for s in got}
    assert {"recv", "forward.decode", "launch.decode", "schedule.decode", "process.decode"} <= curves
    assert all(t >= 0 for s in got for t in s["times_s"])
    recv0 = next(s for s in got if s["curve"] == "recv" and s["point"] == {"num_reqs": 0})
    assert 0 < min(recv0["times_s"]) < 0.01  # an empty receive: microseconds, not seconds


def test_a_corrupt_trace_is_one_line_naming_the_line(tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"ph": "recv", "t0": 1, "dur": 0.1, "cpu": 0.1}\n{not json\n')
    with pytest.raises(CalibrationInputError, match="line 2"):
        sglang_trace.read_records(bad)


def test_a_missing_engine_environment_says_how_to_build_it(tmp_path, capsys):
    from sim.cli import main

    with pytest.raises(CalibrationInputError, match="setup.sh"):
        find_engine("sglang", tmp_path / "no-python")
    assert main(["conform", "--engine-python", str(tmp_path / "no-python"), "--work", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "setup.sh" in err[0]
    assert not (tmp_path / "w").exists()


SGLANG_PYTHON = Path(os.environ.get("OVERLAP_SIM_SGLANG_PYTHON", REPO / ".venvs" / "sglang" / "bin" / "python"))
needs_sglang = pytest.mark.skipif(not SGLANG_PYTHON.exists(), reason="no SGLang environment (realengines/sglang/setup.sh)")


@needs_sglang
def test_the_real_scheduler_and_the_policy_agree_on_a_short_run(tmp_path):
    from calibrate.real.environment import test_model
    from calibrate.real.jobs import Workload

    engine = find_engine("sglang", SGLANG_PYTHON)
    model = test_model(engine, REPO / ".venvs" / "models" / "tiny-llama")
    w = Workload("short", num_requests=6, concurrency=3, input_len=(16, 48), output_len=(2, 6), seed=11)
    comps = conformance.conformance(engine, model, tmp_path, [w], report=lambda m: None)
    assert [c.identical == c.num_steps > 0 for c in comps] == [True, True]


def test_a_recorded_server_session_reads_through_the_simulators_metrics(tmp_path):
    import sim
    from calibrate.real.jobs import Workload
    from calibrate.real.validate import measured_run, scenario, server_limits

    folder = DATA / "session"  # 6 requests, 2 of them warm-up, 2 clients, SGLang 0.5.23 server with the tracer
    config = Workload("tiny", num_requests=6, warmup_requests=2, concurrency=2, input_len=(24, 40),
                      output_len=(6, 10), seed=9)
    summary, rows = measured_run(folder, config)
    assert summary["completed"] == 4 and summary["failed"] == 0
    assert summary["total_output_tokens"] == 9 + 7 + 10 + 10  # what the client counted
    assert summary["median_ttft_ms"] > 0 and summary["median_tpot_ms"] > 0 and summary["output_throughput"] > 0
    assert summary["num_steps"] > 0 and 1 <= summary["mean_decode_batch_size"] <= 2
    assert [r["input_len"] for r in rows] == [len(r["input_ids"]) for r in config.requests(prefix="tiny-")]
    assert server_limits(folder)["max_running_requests"] == 4
    # the client's request ids are the scheduler's, so the trace's batches name the load's requests
    from calibrate.real.validate import _first_prefixes, _trace_records

    assert set(_first_prefixes(_trace_records(folder))) == {r["rid"] for r in config.requests(prefix="tiny-")}
    # the same requests, replayed closed-loop by the simulator on a shipped profile
    sc = scenario(config, rows, REPO / "scenarios" / "profiles" / "cpu-torch-small.json", ("overlap", "normal"),
                  tmp_path, server_limits(folder))
    res = sim.simulate(sc, "normal").summary()
    assert res["completed"] == 4 and res["total_output_tokens"] == sum(r["output_len"] for r in rows[2:])


def test_a_session_whose_trace_names_other_requests_is_refused(tmp_path):
    """A trace recorded before the client sent its request ids (the server made up its own) cannot
    be joined with the load: one line naming the folder, not a silently wrong prefix table."""
    import shutil

    from calibrate.real.jobs import Workload
    from calibrate.real.validate import measured_run

    folder = tmp_path / "session"
    shutil.copytree(DATA / "session", folder)
    for trace in folder.glob("trace.*.jsonl"):
        trace.write_text(trace.read_text().replace('"tiny-', '"server-made-'))
    config = Workload("tiny", num_requests=6, warmup_requests=2, concurrency=2, input_len=(24, 40),
                      output_len=(6, 10), seed=9)
    with pytest.raises(CalibrationInputError, match="names none of the load's requests"):
        measured_run(folder, config)


def test_calibration_sessions_pool_each_settings_runs(tmp_path, monkeypatch):
    """``sessions`` = 2: four runs in the alternating order, the forward from all four, each
    setting's CPU phases from its own two runs (the samples stand in for the runs' traces)."""
    from types import SimpleNamespace

    from calibrate.real import sglang_profile

    ran = []

    def fake_run(engine, job, folder, name, report):
        ran.append(name)
        return folder / f"{name}.jsonl"

    def fake_samples(its, d):
        k = len(ran_read)
        return [{"curve": "forward.decode", "point": {"batch": 1, "ctx": 64}, "times_s": [0.010 + k / 1000]},
                {"curve": "schedule.decode", "point": {"batch": 1}, "times_s": [0.001 * (k + 1)]}]

    ran_read = []
    monkeypatch.setattr(sglang_profile, "run_job", fake_run)
    monkeypatch.setattr(sglang_profile.sglang_trace, "read_records",
                        lambda path: (ran_read.append(path.stem) or {}, [], None))
    monkeypatch.setattr(sglang_profile.sglang_trace, "iterations", lambda records, **kw: [])
    monkeypatch.setattr(sglang_profile, "samples", fake_samples)
    monkeypatch.setattr(sglang_profile, "check_coverage", lambda got, grid: None)
    import calibrate.profile

    monkeypatch.setattr(calibrate.profile, "build_profile", lambda meta, smp: {"metadata": meta, "samples": smp})
    engine = SimpleNamespace(version="0.5.23")
    out = sglang_profile.calibrate_sglang(engine, tmp_path / "model", SglangGrid(), tmp_path, sessions=2,
                                          report=lambda m: None)
    assert ran == ["calibrate-normal-0", "calibrate-overlap-0", "calibrate-overlap-1", "calibrate-normal-1"]
    by = {(s["curve"], s.get("setting")): s["times_s"] for s in out["samples"]}
    assert by[("forward.decode", None)] == pytest.approx([0.011, 0.012, 0.013, 0.014])
    assert by[("schedule.decode", None)] == pytest.approx([0.002, 0.005])  # normal: runs 1 and 4
    assert by[("schedule.decode", "overlap")] == pytest.approx([0.003, 0.004])
    assert out["metadata"]["sessions"] == ran
    with pytest.raises(ValueError, match="sessions"):
        sglang_profile.calibrate_sglang(engine, tmp_path / "model", SglangGrid(), tmp_path, sessions=0)


def test_a_receive_records_request_ids_and_names_control_messages():
    """The tracer's recv record: the generate requests' ids; a control message (no rid, e.g. the
    cache flush between loads) by its type, not as a null id."""
    from types import SimpleNamespace

    from realengines.sglang.tracer import _recv_info

    class FlushCacheReqInput:
        pass

    rec = {}
    _recv_info(rec, None, (), {}, [SimpleNamespace(rid="a"), FlushCacheReqInput(), SimpleNamespace(rid="b")])
    assert rec == {"n": 3, "rids": ["a", "b"], "other": ["FlushCacheReqInput"]}
    rec = {}
    _recv_info(rec, None, (), {}, [])
    assert rec == {"n": 0}
