"""Real vLLM as source and judge: recorded traces of the real vLLM 0.32 CPU server
(tests/data/vllm/, written by ``realengines.vllm.tracer`` in the server's processes on this kind
of machine: 6 requests, 2 of them warm-up, 2 clients; server.log keeps the lines the importer reads) through the importer and the calibration's
sample extraction; and, only where the vLLM environment exists (``realengines/vllm/setup.sh``),
the start-up patch that lets async scheduling through on the CPU platform."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibrate.errors import CalibrationInputError
from calibrate.real.vllm import trace as vllm_trace
from calibrate.real.environment import REPO
from calibrate.real.vllm.profile import samples
from calibrate.real.vllm.sessions import VllmGrid, design

DATA = Path(__file__).parent / "data" / "vllm"


def _steps(setting):
    folder = DATA / setting
    return vllm_trace.steps(*vllm_trace.read_files(sorted(folder.glob("trace.*.jsonl")))), folder


@pytest.mark.parametrize("setting", ["sync", "async"])
def test_the_trace_joins_into_engine_steps(setting):
    steps, folder = _steps(setting)
    load = json.loads((folder / "tiny.json").read_text())
    rids = {r["rid"] for r in load["requests"]}
    assert steps and all(s.execute is not None for s in steps)
    # every step that scheduled tokens was sampled and updated; the worker ran exactly those tokens
    for s in steps:
        if s.num_tokens:
            assert s.sample is not None and s.update is not None
            assert s.execute["n_tok"] == s.num_tokens and 0 < s.forward < s.execute["dur"]
    # vLLM's engine ids are the client's request ids (cmpl-<rid>-<n>)
    seen = {vllm_trace.client_rid(r) for s in steps for r in s.reqs}
    assert seen == rids
    # each prompt was prefilled once: the tokens scheduled per request add up to prompt + output - 1
    total: dict[str, int] = {}
    for s in steps:
        for r, t in zip(s.reqs, s.tok):
            total[r] = total.get(r, 0) + t
    out = {r["rid"]: r["output_len"] for r in load["requests"]}
    spec = json.loads((folder / "spec.json").read_text())
    prompt = {r["rid"]: len(r["input_ids"]) for r in spec["loads"][0]["requests"]}
    for r, t in total.items():
        rid = vllm_trace.client_rid(r)
        # async scheduling schedules no step beyond max_tokens: the same count in both settings
        assert t == prompt[rid] + out[rid] - 1


def test_async_scheduling_schedules_the_next_step_before_the_last_ones_output_is_processed():
    steps, _ = _steps("async")
    busy = [s for s in steps if s.num_tokens and s.update is not None]
    ahead = sum(b.schedule["t0"] < a.update["t0"] for a, b in zip(busy, busy[1:]))
    assert ahead >= len(busy) // 2  # step_with_batch_queue: schedule k+1, then update k
    engine_records = vllm_trace.read_files(sorted((DATA / "async").glob("trace.*.jsonl")))[0]
    assert any(r["ph"] == "step_bq" for r in engine_records)  # the batch queue ran: the patch held
    sync_steps, _ = _steps("sync")
    busy = [s for s in sync_steps if s.num_tokens and s.update is not None]
    assert all(b.schedule["t0"] > a.update["t0"] for a, b in zip(busy, busy[1:]))  # EngineCore.step


@pytest.mark.parametrize("setting", ["sync", "async"])
def test_the_calibration_reads_phase_samples_from_the_steps(setting):
    steps, _ = _steps(setting)
    got = samples(steps, VllmGrid(decode_batch_sizes=(1, 2), contexts=(128,)), setting)
    curves = {s["curve"] for s in got}
    assert {"vllm.schedule", "vllm.prepare", "vllm.sample", "vllm.update"} <= curves
    assert ("vllm.dispatch" in curves) == (setting == "sync")
    assert ("vllm.pickup" in curves) == (setting == "async")  # the worker's queued RPCs
    assert all(t >= 0 for s in got for t in s["times_s"])
    if setting == "async":  # taking a queued RPC is much shorter than a synchronous round trip
        pickup = [t for s in got if s["curve"] == "vllm.pickup" for t in s["times_s"]]
        sync_got = samples(_steps("sync")[0], VllmGrid(decode_batch_sizes=(1, 2), contexts=(128,)), "sync")
        roundtrip = [t for s in sync_got if s["curve"] == "vllm.roundtrip" for t in s["times_s"]]
        assert sorted(pickup)[len(pickup) // 2] < sorted(roundtrip)[len(roundtrip) // 2]


def test_calibration_sessions_alternate_the_settings():
    from calibrate.real.environment import session_order

    assert session_order(("sync", "async"), 1) == [("sync", "sync"), ("async", "async")]
    assert session_order(("sync", "async"), 3) == [("sync", "sync-0"), ("async", "async-0"), ("async", "async-1"),
                                                   ("sync", "sync-1"), ("sync", "sync-2"), ("async", "async-2")]
    with pytest.raises(ValueError, match="sessions"):
        session_order(("sync", "async"), 0)


def test_files_that_do_not_hold_both_processes_are_refused(tmp_path):
    only_api = tmp_path / "trace.1.jsonl"
    only_api.write_text(json.dumps({"ph": "output", "t0": 1.0, "dur": 0.001, "cpu": 0.001, "n": 1}) + "\n")
    with pytest.raises(CalibrationInputError, match="engine core's and the worker's"):
        vllm_trace.read_files([only_api])
    broken = tmp_path / "trace.2.jsonl"
    broken.write_text('{"ph": "schedule", "t0": 1.0\n')
    with pytest.raises(CalibrationInputError, match="not JSON"):
        vllm_trace.read_files([broken])


def test_the_design_prefills_whole_blocks_after_a_cached_prefix():
    loads = {ld["name"]: ld for ld in design(VllmGrid())}
    ld = loads["prefill-n128-c512"]  # 384 cached (3 blocks of 128) + 128 new
    warm, *rest = ld["requests"]
    assert ld["warmup_requests"] == 1 and all(r["input_ids"][:384] == warm["input_ids"][:384] for r in rest)
    assert {len(r["input_ids"]) for r in rest} == {512} and {r["max_new_tokens"] for r in rest} == {1}
    assert loads["prefill-n128-c128"]["concurrency"] == 1
    assert {ld["concurrency"] for n, ld in loads.items() if n.startswith("decode-b16")} == {16}


def test_the_design_sends_each_prefill_group_behind_a_blocker():
    """Four 128-token prompts for one 512-token step: each group of four goes out behind a lone
    blocker the engine core prefills while the group arrives; the blocker's step (384 tokens)
    is no prefill point, so it prices nothing."""
    from calibrate.real.vllm.sessions import BLOCKER_TOKENS

    grid = VllmGrid()
    ld = {ld["name"]: ld for ld in design(grid)}["prefill-n512-c128"]
    assert ld["concurrency"] == 5 and ld["warmup_requests"] == 0
    reqs = ld["requests"]
    assert len(reqs) == 5 * grid.prefill_repeats
    for i in range(grid.prefill_repeats):
        blocker, *group = reqs[5 * i:5 * i + 5]
        assert len(blocker["input_ids"]) == BLOCKER_TOKENS and [len(r["input_ids"]) for r in group] == [128] * 4
    assert BLOCKER_TOKENS not in grid.prefill_tokens and BLOCKER_TOKENS not in grid.contexts
    assert {r["max_new_tokens"] for r in reqs} == {1}


VLLM_PYTHON = REPO / ".venvs" / "vllm" / "bin" / "python"


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no vLLM environment (realengines/vllm/setup.sh)")
def test_the_start_up_patch_keeps_async_scheduling_on_the_cpu_platform():
    code = ("from realengines.vllm import startup; startup.install(None, allow_async=True)\n"
            "from vllm.platforms.cpu import CpuPlatform\n"
            "from types import SimpleNamespace as NS\n"
            "import vllm.platforms.cpu as m\n"
            "f = CpuPlatform.check_and_update_config\n"
            "print(getattr(f.__func__, '_overlap_sim_patched', False))\n")
    out = subprocess.run([str(VLLM_PYTHON), "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True"


@pytest.mark.parametrize("setting", ["sync", "async"])
def test_a_recorded_vllm_session_reads_through_the_simulators_metrics(setting, tmp_path):
    from calibrate.real.jobs import Workload
    from calibrate.real.validate import Plan, measured_run, scenario, server_limits

    config = Workload("tiny", num_requests=6, warmup_requests=2, concurrency=2, input_len=(64, 96),
                      output_len=(12, 12))
    folder = DATA / setting
    summary, rows = measured_run(folder, config, "vllm")
    assert summary["completed"] == 4 and summary["failed"] == 0
    assert summary["total_output_tokens"] == 4 * 12
    assert summary["median_ttft_ms"] > 0 and summary["median_tpot_ms"] > 0 and summary["num_steps"] > 0
    assert [r["input_len"] for r in rows] == [len(r["input_ids"]) for r in config.requests(prefix="tiny-")]
    assert server_limits(folder)["kv_cache_tokens"] == 262_144
    plan = Plan.for_engine("vllm")
    assert plan.settings == ("async", "sync") and "--max-num-seqs" in plan.server_args
    sc = scenario(config, rows, Path("unused.json"), plan.settings, tmp_path, server_limits(folder), "vllm")
    assert sc["server"]["engine"] == "vllm" and sc["server"]["num_gpu_blocks"] == 262_144 // 128


def _step(k: int, rids: list[str], tok: list[int], done: list[int], update_end_s: float):
    from calibrate.real.vllm.trace import VllmStep

    return VllmStep(k, rids, tok, done, 0, [], len(rids), 0, None, {"t0": update_end_s - 0.01, "dur": 0.001},
                    update={"t0": update_end_s - 0.001, "dur": 0.001})


def test_the_front_end_latencies_are_read_from_the_client_and_the_engine_core(tmp_path):
    """Hand-made: one request alone (send 10.000 s, add_request 10.006 s: 6 ms in), then two
    requests decoding together whose tokens arrive 3 and 4 ms after each update ends."""
    from calibrate.real.vllm.trace import frontend_samples

    eng = [{"ph": "add", "t0": 10.006, "dur": 1e-5, "rid": "cmpl-one-0-0-aa", "prompt": 4},
           {"ph": "add", "t0": 20.0, "dur": 1e-5, "rid": "cmpl-two-0-0-bb", "prompt": 4},
           {"ph": "add", "t0": 20.0, "dur": 1e-5, "rid": "cmpl-two-1-0-cc", "prompt": 4}]
    steps = [_step(0, ["cmpl-one-0-0-aa"], [4], [0], 10.05),
             _step(1, ["cmpl-two-0-0-bb", "cmpl-two-1-0-cc"], [4, 4], [0, 0], 20.05),
             _step(2, ["cmpl-two-0-0-bb", "cmpl-two-1-0-cc"], [1, 1], [4, 4], 20.06)]
    (tmp_path / "one.json").write_text(json.dumps({"requests": [
        {"rid": "one-0", "send_s": 10.0, "token_times_s": [10.0525], "error": ""}]}))
    (tmp_path / "two.json").write_text(json.dumps({"requests": [
        {"rid": "two-0", "send_s": 19.99, "token_times_s": [20.053, 20.063], "error": ""},
        {"rid": "two-1", "send_s": 19.99, "token_times_s": [20.054, 20.064], "error": ""}]}))
    loads = [{"name": "one", "concurrency": 1}, {"name": "two", "concurrency": 2}]
    got = {(s["curve"], s["point"]["num_reqs"]): s["times_s"] for s in frontend_samples(tmp_path, eng, steps, loads)}
    assert got[("vllm.frontend_in", 1)] == pytest.approx([0.006])
    assert got[("vllm.frontend_out", 1)] == pytest.approx([0.0025])
    assert sorted(got[("vllm.frontend_out", 2)]) == pytest.approx([0.003, 0.003, 0.004, 0.004])


@pytest.mark.parametrize("setting", ["sync", "async"])
def test_a_recorded_session_gives_front_end_latencies_of_milliseconds(setting):
    """The recorded sessions (2 clients): every token's delivery delay after its step's update
    is positive and a few milliseconds (the API server and the stream)."""
    from calibrate.real.vllm import trace as vllm_trace
    from calibrate.real.vllm.trace import frontend_samples

    folder = DATA / setting
    eng, wrk = vllm_trace.read_files(sorted(folder.glob("trace.*.jsonl")))
    loads = json.loads((folder / "spec.json").read_text())["loads"]
    got = frontend_samples(folder, eng, vllm_trace.steps(eng, wrk), loads)
    out = [s for s in got if s["curve"] == "vllm.frontend_out"]
    assert [s["point"] for s in out] == [{"num_reqs": 2}]
    ts = out[0]["times_s"]
    assert len(ts) >= 20 and all(0 < t < 0.05 for t in ts)
    assert 0.0005 < sorted(ts)[len(ts) // 2] < 0.02


def test_the_forward_is_one_curve_from_both_settings_and_the_phases_stay_apart(monkeypatch, tmp_path):
    """calibrate_vllm over recorded sessions (fixtures standing in for the server runs): the model
    forward's samples are those of both settings (the same code under both loops); async keeps
    its own worker phases, collect and pickup."""
    from calibrate.real.vllm import profile as vllm_profile
    from calibrate.real.environment import Engine

    monkeypatch.setattr(vllm_profile, "run_session",
                        lambda engine, model_dir, grid, setting, folder, report, name=None: DATA / setting)
    monkeypatch.setattr(vllm_profile, "frontend_samples", lambda *a, **k: [])
    grid = VllmGrid(decode_batch_sizes=(1, 2), contexts=(88,), prefill_tokens=())  # the fixtures' decode contexts
    profile = vllm_profile.calibrate_vllm(Engine("vllm", Path("python"), "0.32.0"), tmp_path, grid, tmp_path,
                                          report=lambda _m: None)
    own = profile["setting_curves"]["async"]
    assert "vllm.forward" not in own and {"vllm.prepare", "vllm.sample", "vllm.pickup"} <= set(own)
    assert "vllm.pickup" not in profile["curves"]
    by_setting = {st: samples(_steps(st)[0], grid, st) for st in ("sync", "async")}
    for smp in profile["samples"]:
        if smp["curve"] == "vllm.forward":
            assert not smp.get("setting")
            parts = [t for st in ("sync", "async") for s in by_setting[st]
                     if s["curve"] == "vllm.forward" and s["point"] == smp["point"] for t in s["times_s"]]
            assert sorted(smp["times_s"]) == sorted(parts)


def test_the_shared_prefix_saving_inverts_the_forward_curve():
    """With a forward linear in the context, a step measured at F(m, C - f (m-1) p / m) gives back
    f; a step no faster than the full context gives 0, one faster than the repeats removed 1."""
    from calibrate.real.vllm.profile import shared_prefix_saving

    def line(_n, ctx):
        return 1e-3 + 1e-5 * ctx

    p = 384
    steps = [(m, 512.0, line(m, 512.0 - f * (m - 1) * p / m)) for m, f in ((4, 0.25), (8, 0.5), (8, 0.5), (16, 0.75))]
    got = shared_prefix_saving(line, steps, p)
    assert got["by_batch"] == {"4": 0.25, "8": 0.5, "16": 0.75} and got["saving"] == pytest.approx(0.5, abs=1e-6)
    assert got["steps"] == 4
    edges = shared_prefix_saving(line, [(8, 512.0, 1.0), (4, 512.0, 0.0)], p)
    assert edges["by_batch"] == {"4": 1.0, "8": 0.0}
    assert shared_prefix_saving(line, [], p) is None


def test_the_shared_prefix_loads_share_whole_blocks_at_a_mean_context_of_512():
    from calibrate.real.vllm.sessions import SHARED_LOAD, SHARED_PREFIX_TOKENS

    loads = {ld["name"]: ld for ld in design(VllmGrid())}
    shared = [ld for n, ld in loads.items() if n.startswith(SHARED_LOAD)]
    assert [ld["concurrency"] for ld in shared] == [4, 8, 16]
    for ld in shared:
        warm, *rest = ld["requests"]
        assert ld["warmup_requests"] == 1 and SHARED_PREFIX_TOKENS % 128 == 0
        assert all(r["input_ids"][:SHARED_PREFIX_TOKENS] == warm["input_ids"][:SHARED_PREFIX_TOKENS] for r in rest)
        assert {len(r["input_ids"]) + r["max_new_tokens"] // 2 for r in rest} == {512}  # mean context 512


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 64), st.floats(allow_nan=True, allow_infinity=True, width=32),
                          st.floats(allow_nan=True, allow_infinity=True, width=32)), max_size=20),
       st.floats(1e-9, 1e-2), st.floats(0.0, 1e-4))
def test_the_shared_prefix_saving_is_a_share(steps, base, per_ctx):
    """Whatever the steps (NaN, infinities, negative times), the saving is a share in [0, 1]."""
    from calibrate.real.vllm.profile import shared_prefix_saving

    got = shared_prefix_saving(lambda _n, ctx: base + per_ctx * ctx, steps)
    finite = [s for s in steps if s[0] >= 2 and math.isfinite(s[1]) and math.isfinite(s[2])]
    assert (got is None) == (not finite)
    if got is not None:
        assert 0.0 <= got["saving"] <= 1.0 and all(0.0 <= v <= 1.0 for v in got["by_batch"].values())
