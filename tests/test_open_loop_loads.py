"""Open-loop loads for the real engines and the engines' own benchmark clients (vLLM's ``vllm
bench serve``, SGLang's ``sglang.benchmark.serving``): the send instants a workload draws, the
client's open loop, the benchmarks' records, the held-out grid, the host-use
snapshot. Closed forms first, then invariants (hypothesis), then the client against a local
stand-in server."""

from __future__ import annotations

import asyncio
import json
import math
import os
import statistics
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibrate.errors import CalibrationInputError
from calibrate.real.jobs import Workload
from calibrate.real.validate import GRIDS, HELDOUT, Plan, scenario
from realengines import procstat
from realengines.sglang import bench as sglang_bench
from realengines.vllm import bench


def test_a_closed_loop_has_no_send_instants_and_its_requests_none():
    w = Workload("c", num_requests=5, warmup_requests=1, concurrency=2)
    assert w.arrivals_s() == [] and all("arrival_s" not in r for r in w.requests())


def test_an_open_loop_sends_its_first_measured_request_at_zero_and_the_warm_up_without_an_instant():
    w = Workload("p", num_requests=6, warmup_requests=2, concurrency=0, rate_per_s=10.0)
    reqs = w.requests()
    assert all("arrival_s" not in r for r in reqs[:2])
    assert reqs[2]["arrival_s"] == 0.0 and [r["arrival_s"] for r in reqs[2:]] == w.arrivals_s()


def test_the_send_instants_leave_the_lengths_as_the_closed_loop_draws_them():
    closed = Workload("x", num_requests=12, input_len=(10, 90), output_len=(5, 50), seed=4)
    opened = Workload("x", num_requests=12, input_len=(10, 90), output_len=(5, 50), seed=4, rate_per_s=3.0)
    strip = [{k: v for k, v in r.items() if k != "arrival_s"} for r in opened.requests()]
    assert strip == closed.requests()


@pytest.mark.parametrize("burstiness", [1.0, 0.25, 4.0])
def test_poisson_and_gamma_gaps_have_the_rate_and_the_shape_asked_for(burstiness):
    # gamma(shape k, scale 1/(rate k)): mean 1/rate, squared coefficient of variation 1/k
    w = Workload("g", num_requests=40_001, warmup_requests=1, rate_per_s=20.0, burstiness=burstiness)
    gaps = np.diff(w.arrivals_s())
    assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.03)
    assert gaps.var() / gaps.mean() ** 2 == pytest.approx(1 / burstiness, rel=0.08)


@settings(max_examples=60, deadline=None)
@given(rate=st.floats(1e-3, 1e4), burst=st.floats(0.05, 20.0), n=st.integers(2, 200), seed=st.integers(0, 2**31))
def test_send_instants_start_at_zero_never_decrease_and_stay_finite(rate, burst, n, seed):
    times = Workload("h", num_requests=n, rate_per_s=rate, burstiness=burst, seed=seed).arrivals_s()
    assert len(times) == n and times[0] == 0.0
    assert all(math.isfinite(t) for t in times) and all(b >= a for a, b in zip(times, times[1:]))


def test_the_engine_client_takes_the_benchmarks_lengths_and_refuses_what_it_cannot_send():
    w = Workload("e", num_requests=10, warmup_requests=2, concurrency=4, input_len=(72, 120),
                 output_len=(120, 200), client="engine", rate_per_s=5.0, burstiness=0.5, seed=9)
    assert w.engine_load() == {"name": "e", "client": "engine", "num_requests": 8, "warmup_requests": 2,
                               "concurrency": 4, "rate_per_s": 5.0, "burstiness": 0.5, "input_len": 96,
                               "output_len": 160, "range_ratio": 0.25, "input_range": [72, 120],
                               "output_range": [120, 200], "seed": 9}
    with pytest.raises(ValueError, match="one range ratio"):
        Workload("e", input_len=(64, 64), output_len=(16, 96), client="engine")
    with pytest.raises(ValueError, match="no shared_prefix"):
        Workload("e", input_len=(64, 64), output_len=(64, 64), shared_prefix=128, client="engine")
    with pytest.raises(ValueError, match="client"):
        Workload("e", client="locust")


def test_the_held_out_grid_has_open_loops_and_each_engine_sends_what_its_client_can_draw():
    assert len(HELDOUT) >= 8 and sum(w.open_loop for w in HELDOUT) >= 2
    assert any(w.burstiness != 1.0 for w in HELDOUT if w.open_loop)
    assert {w.name for w in HELDOUT}.isdisjoint(w.name for w in GRIDS["default"])
    assert Plan.for_engine("vllm", "heldout").configs == HELDOUT
    sglang = Plan.for_engine("sglang", "heldout")
    # SGLang 0.5.23's benchmark draws only Poisson gaps: its bursty load goes through the own client
    assert [c.name for c in sglang.configs] == [c.name for c in HELDOUT]
    assert all((c.client == "own") == (c.burstiness != 1.0) for c in sglang.configs)
    assert sum(c.client == "engine" and c.open_loop for c in sglang.configs) >= 2
    with pytest.raises(CalibrationInputError, match="--grid"):
        Plan.for_engine("vllm", "huge")
    with pytest.raises(CalibrationInputError, match="--engine"):
        Plan.for_engine("trt", "heldout")


def test_the_benchmark_command_names_rate_and_cap_only_when_set(tmp_path):
    base = {"name": "b", "num_requests": 8, "warmup_requests": 2, "input_len": 64, "output_len": 32}
    closed = bench.command({**base, "concurrency": 4}, "http://h:1", "/m", tmp_path / "b.bench.json", "default")
    assert "--request-rate" not in closed and closed[closed.index("--max-concurrency") + 1] == "4"
    assert closed[closed.index("--num-prompts") + 1] == "8" and closed[closed.index("--num-warmups") + 1] == "2"
    assert closed[closed.index("--request-id-prefix") + 1] == "b-" and "--ignore-eos" in closed
    opened = bench.command({**base, "concurrency": 0, "rate_per_s": 2.5, "burstiness": 0.5}, "http://h:1", "/m",
                           tmp_path / "b.bench.json", "default")
    assert opened[opened.index("--request-rate") + 1] == "2.5" and opened[opened.index("--burstiness") + 1] == "0.5"
    assert "--max-concurrency" not in opened


def test_the_benchmarks_detailed_result_becomes_the_clients_records():
    result = {"start_times": [10.0, 10.5, 11.0], "ttfts": [0.02, 0.03, 0.0], "itls": [[0.01, 0.01], [0.02], []],
              "latencies": [0.04, 0.05, 0.0], "output_lens": [3, 3, 0], "input_lens": [64, 65, 64],
              "errors": ["", "", "HTTP 500"]}
    out = bench.records(result, "p")
    a, b, c = out["requests"]
    assert a["rid"] == "p-0" and a["first_s"] == pytest.approx(10.02) and a["end_s"] == pytest.approx(10.04)
    assert a["token_times_s"] == pytest.approx([10.02, 10.03, 10.04])
    # a chunk holding two tokens: the rest of the count at the last chunk
    assert b["token_times_s"] == pytest.approx([10.53, 10.55, 10.55]) and b["input_len"] == 65
    assert c["error"] == "HTTP 500" and c["end_s"] is None
    assert out["start_s"] == 10.0 and out["end_s"] == pytest.approx(10.55)
    assert not any(r["warmup"] for r in out["requests"])


def test_a_favoured_client_is_refused_before_anything_starts_where_the_process_may_not_renice(monkeypatch):
    import os
    import resource

    from calibrate.real.validate import check_client_nice

    plan = Plan.for_engine("sglang", "heldout")
    assert plan.client_nice == -10
    check_client_nice(Plan.for_engine("sglang", "default"))  # niceness 0: nothing to check
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "getpriority", lambda which, who: 0)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (0, 0))  # the default: no raising of priority
    with pytest.raises(CalibrationInputError, match=r"--grid.*niceness -10.*RLIMIT_NICE of at least 30"):
        check_client_nice(plan)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (30, 30))  # 20 - 30 = -10: allowed
    check_client_nice(plan)


def test_sglangs_range_ratio_is_low_over_high_as_its_benchmark_draws_lengths():
    # compute_random_lens: uniform integers on [int(hi * ratio), hi]
    assert sglang_bench.range_ratio([128, 128]) == 1.0
    assert sglang_bench.range_ratio([72, 120]) == pytest.approx(0.6)
    assert int(120 * sglang_bench.range_ratio([72, 120])) == 72
    with pytest.raises(ValueError):
        sglang_bench.range_ratio([0, 10])
    with pytest.raises(ValueError):
        sglang_bench.range_ratio([20, 10])


def test_the_sglang_benchmark_command_sends_its_own_client_and_refuses_burstiness(tmp_path):
    base = {"name": "s", "num_requests": 8, "warmup_requests": 2, "input_range": [72, 120],
            "output_range": [120, 200], "seed": 4}
    closed = sglang_bench.command({**base, "concurrency": 4}, "http://h:1", "/m", tmp_path / "s.bench.json")
    assert closed[closed.index("--dataset-name") + 1] == "random-ids" and "--request-rate" not in closed
    assert closed[closed.index("--random-input-len") + 1] == "120"
    assert closed[closed.index("--random-output-len") + 1] == "200"
    assert float(closed[closed.index("--random-range-ratio") + 1]) == pytest.approx(0.6)
    assert closed[closed.index("--max-concurrency") + 1] == "4" and closed[closed.index("--warmup-requests") + 1] == "2"
    assert closed[closed.index("--backend") + 1] == "sglang"
    opened = sglang_bench.command({**base, "concurrency": 0, "rate_per_s": 2.5}, "http://h:1", "/m",
                                  tmp_path / "s.bench.json")
    assert opened[opened.index("--request-rate") + 1] == "2.5" and "--max-concurrency" not in opened
    with pytest.raises(ValueError, match="Poisson"):
        sglang_bench.command({**base, "rate_per_s": 2.5, "burstiness": 0.25}, "http://h:1", "/m", tmp_path / "x")
    with pytest.raises(ValueError, match="range-ratio"):
        sglang_bench.command({**base, "output_range": [16, 96]}, "http://h:1", "/m", tmp_path / "x")


def test_what_the_sglang_wrapper_kept_becomes_the_clients_records():
    kept = [{"drawn_s": 9.9, "start_time": 10.0, "success": True, "error": "", "ttft": 0.02, "itl": [0.01, 0.01],
             "latency": 0.04, "output_len": 3, "prompt_len": 70},
            # a chunk of two tokens arrives as two equal gaps (the benchmark's own rule); one token short
            {"drawn_s": 10.5, "start_time": 10.5, "success": True, "error": "", "ttft": 0.03, "itl": [0.01],
             "latency": 0.05, "output_len": 3, "prompt_len": 66},
            {"drawn_s": None, "start_time": 11.0, "success": False, "error": "HTTP 500", "ttft": 0.0, "itl": [],
             "latency": 0.0, "output_len": 0, "prompt_len": 64}]
    out = sglang_bench.records(kept, "p")
    a, b, c = out["requests"]
    assert a["rid"] == "p-0" and a["send_lag_s"] == pytest.approx(0.1) and a["input_len"] == 70
    assert a["token_times_s"] == pytest.approx([10.02, 10.03, 10.04]) and a["end_s"] == pytest.approx(10.04)
    assert b["token_times_s"] == pytest.approx([10.53, 10.54, 10.54]) and b["send_lag_s"] == 0.0
    assert c["error"] == "HTTP 500" and c["end_s"] is None and c["send_lag_s"] is None
    assert out["start_s"] == 10.0 and out["end_s"] == pytest.approx(10.55)
    assert out["client"] == "sglang.benchmark.serving" and not any(r["warmup"] for r in out["requests"])


def test_a_benchmark_client_that_fails_or_writes_nothing_is_an_error_quoting_its_log(tmp_path):
    import sys

    from realengines.launching import run_benchmark

    out, log = tmp_path / "b.bench.json", tmp_path / "b.bench.log"
    run_benchmark([sys.executable, "-c", f"open({str(out)!r}, 'w').write('[]'); print('ok')"], out, log, "stand-in")
    assert out.read_text() == "[]" and log.read_text().strip() == "ok"
    out.unlink()
    with pytest.raises(RuntimeError, match=r"stand-in failed \(exit 3\):\nboom"):
        run_benchmark([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], out, log, "stand-in")
    with pytest.raises(RuntimeError, match="exit 0"):  # exited cleanly but wrote no result
        run_benchmark([sys.executable, "-c", "pass"], out, log, "stand-in")


def _rows(n: int, open_loop: bool) -> list[dict]:
    return [{"input_len": 64, "cached_len": 0, "output_len": 8, "max_new_tokens": 8, "ignore_eos": True,
             "arrival_s": 0.05 * i if open_loop else 0.0} for i in range(n)]


def test_an_open_loop_is_replayed_at_the_instants_the_client_sent_without_its_warm_up(tmp_path):
    config = Workload("p", num_requests=6, warmup_requests=2, concurrency=0, rate_per_s=20.0, input_len=(64, 64),
                      output_len=(8, 8), client="engine")
    sc = scenario(config, _rows(4, True), tmp_path / "p.json", ("async", "sync"), tmp_path, {}, "vllm")
    w = sc["workload"]
    assert w["arrival"] == "trace" and w["warmup_requests"] == 0 and w["num_requests"] == 4
    sent = [json.loads(line)["arrival_s"] for line in open(w["trace"])]
    assert sent == pytest.approx([0.0, 0.05, 0.10, 0.15])


def test_a_closed_loop_of_the_engines_client_is_replayed_without_a_warm_up_its_own_with_it(tmp_path):
    engine = Workload("c", num_requests=6, warmup_requests=2, concurrency=2, input_len=(64, 64), output_len=(8, 8),
                      client="engine")
    own = Workload("c", num_requests=6, warmup_requests=2, concurrency=2, input_len=(64, 64), output_len=(8, 8))
    w = scenario(engine, _rows(4, False), tmp_path / "p.json", ("async", "sync"), tmp_path, {}, "vllm")["workload"]
    assert w["arrival"] == "closed_loop" and w["warmup_requests"] == 0 and not w["warmup_before_benchmark"]
    w = scenario(own, _rows(6, False), tmp_path / "p.json", ("async", "sync"), tmp_path, {}, "vllm")["workload"]
    assert w["warmup_requests"] == 2 and w["warmup_before_benchmark"]


def test_an_open_loop_scenario_runs_in_the_simulator(tmp_path):
    import sim

    config = Workload("p", num_requests=12, warmup_requests=2, concurrency=0, rate_per_s=20.0,
                      input_len=(64, 64), output_len=(8, 8), client="engine")
    sc = scenario(config, _rows(10, True), tmp_path / "unused.json", ("async", "sync"), tmp_path, {}, "vllm")
    sc["costs"] = {}  # the inline cost terms: enough to run the replay
    res = sim.simulate(sc, "sync").summary()
    assert res["completed"] == 10 and res["total_output_tokens"] == 80


# --- the client's open loop, against a stand-in server on the loopback --------------------------

async def _stand_in_server(delay_s: float):
    """An OpenAI-style streaming endpoint on 127.0.0.1 that answers every request with two
    tokens, ``delay_s`` apart; returns (server, url)."""
    from aiohttp import web

    async def completions(request):
        body = await request.json()
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(int(body["max_tokens"])):
            await asyncio.sleep(delay_s)
            await resp.write(b'data: {"choices": [{"text": "x"}]}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp

    return await _serve(completions)


async def _serve(completions):
    """Serve ``completions`` (an aiohttp handler) as ``/v1/completions`` on 127.0.0.1, a free port;
    returns (its runner, its url)."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


def _load_against_stand_in(delay_s: float, reqs: list[dict], cap: int) -> dict:
    """realengines.client's run of ``reqs`` (open loop, at most ``cap`` in flight; 0: no cap)
    against :func:`_stand_in_server`."""
    from realengines.client import run_load

    async def go():
        runner, url = await _stand_in_server(delay_s)
        try:
            return await run_load({"url": url, "api": "openai", "concurrency": cap, "warmup_requests": 0,
                                   "requests": reqs})
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def test_the_client_sends_an_open_loop_at_its_instants_whatever_is_in_flight():
    pytest.importorskip("aiohttp")
    reqs = [{"rid": f"r{i}", "input_ids": [5, 6], "max_new_tokens": 2, "arrival_s": 0.1 * i} for i in range(4)]
    out = _load_against_stand_in(0.75, reqs, cap=0)
    sends = [r["send_s"] - out["start_s"] for r in out["requests"]]
    first_done = min(r["end_s"] for r in out["requests"]) - out["start_s"]
    # each request takes 1.5 s: a closed loop of one client would send them 1.5 s apart; the open
    # loop sends each at its instant (never before it; late only by what a busy machine adds)
    assert all(s >= 0.1 * i - 1e-3 for i, s in enumerate(sends)) and sends == sorted(sends)
    assert max(sends) < first_done
    assert all(r["output_len"] == 2 and not r["error"] for r in out["requests"])


def test_an_open_loop_with_a_cap_holds_the_rest_until_a_slot_frees():
    pytest.importorskip("aiohttp")
    reqs = [{"rid": f"r{i}", "input_ids": [5], "max_new_tokens": 2, "arrival_s": 0.0} for i in range(3)]
    out = _load_against_stand_in(0.1, reqs, cap=1)
    sends = sorted(r["send_s"] - out["start_s"] for r in out["requests"])
    assert sends[1] >= sends[0] + 0.19 and sends[2] >= sends[1] + 0.19  # one at a time, 0.2 s each


# --- where a request waits on its way in: the API server's entry stamp -----------------------------

def test_an_entry_stamp_records_when_a_handler_was_entered_and_keeps_its_result():
    from types import SimpleNamespace

    from realengines.tracing import stamp_entry
    from realengines.vllm.tracer import _api_in_info

    class Handler:
        async def create_completion(self, request, raw_request):
            await asyncio.sleep(0.01)
            return "streamed"

    class Sink(list):
        add = list.append

    sink = Sink()
    stamp_entry(Handler, "create_completion", "api_in", sink, _api_in_info)
    stamp_entry(Handler, "create_completion", "api_in", sink, _api_in_info)  # once only
    raw = SimpleNamespace(headers={"x-request-id": "p20-3"})
    assert asyncio.run(Handler().create_completion(SimpleNamespace(request_id=None), raw)) == "streamed"
    assert asyncio.run(Handler().create_completion(SimpleNamespace(request_id="own-1"), None)) == "streamed"
    assert [(r["ph"], r["rid"], r["dur"]) for r in sink] == [("api_in", "p20-3", 0.0), ("api_in", "own-1", 0.0)]


# --- host use ------------------------------------------------------------------------------------

def test_host_use_is_the_difference_of_two_snapshots_over_the_wall_time():
    before = {"7": {"name": "api", "cpu_s": 1.0, "wait_s": 0.5}, "8": {"name": "gone", "cpu_s": 0.0, "wait_s": 0.0}}
    after = {"7": {"name": "api", "cpu_s": 1.5, "wait_s": 0.75}, "9": {"name": "new", "cpu_s": 3.0, "wait_s": 0.0}}
    assert procstat.usage(before, after, 2.0) == [{"pid": 7, "name": "api", "cpu_cores": 0.25, "wait_cores": 0.125}]
    assert procstat.usage(before, after, 0.0) == []


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task"), reason="no /proc (not Linux)")
def test_a_snapshot_of_this_process_counts_its_own_cpu_time():
    first = procstat.snapshot([os.getpid()])
    statistics.fmean(float(i) ** 0.5 for i in range(200_000))  # burn a little CPU
    second = procstat.snapshot([os.getpid(), 2**22 + 1])  # a pid that does not exist is skipped
    assert list(second) == [str(os.getpid())]
    assert second[str(os.getpid())]["cpu_s"] > first[str(os.getpid())]["cpu_s"]
    assert os.getpid() in procstat.process_tree(os.getpid())


# --- recorded sessions of the real servers with the engines' own clients -------------------------
# tests/data/<engine>/heldout/: one session per setting, both loads below, recorded by record_fixture.

FIXTURES = {e: Path(__file__).parent / "data" / e / "heldout" for e in ("vllm", "sglang")}
SETTINGS = {"vllm": ("sync", "async"), "sglang": ("normal", "overlap")}
PROFILES = {"vllm": "cpu-vllm-tiny.json", "sglang": "cpu-sglang-tiny.json"}
FIXTURE_LOADS = (
    Workload("fx-p20", num_requests=9, warmup_requests=1, concurrency=0, rate_per_s=20.0, input_len=(64, 64),
             output_len=(16, 16), client="engine", seed=31),
    Workload("fx-c2", num_requests=7, warmup_requests=1, concurrency=2, input_len=(96, 96), output_len=(12, 12),
             client="engine", seed=32),
)
CLIENTS = {"vllm": "vllm bench serve", "sglang": "sglang.benchmark.serving"}
SERVER_PROCESSES = {"vllm": {"VLLM::EngineCor", "VLLM::Worker"}, "sglang": {"sglang::schedul"}}


def _fixture_plan(engine: str = "vllm"):
    from dataclasses import replace

    return replace(Plan.for_engine(engine, "heldout", repeats=1), configs=FIXTURE_LOADS)


def _recorded(engine: str) -> Path:
    if not FIXTURES[engine].exists():
        pytest.skip(f"no recorded {engine} fixture (python -m tests.test_open_loop_loads {engine})")
    return FIXTURES[engine]


@pytest.mark.parametrize("engine,setting", [(e, s) for e in SETTINGS for s in SETTINGS[e]])
def test_a_recorded_open_loop_of_the_engines_own_client_reads_through_the_simulators_metrics(engine, setting):
    from calibrate.real.validate import measured_run

    folder = _recorded(engine) / "sessions" / f"{setting}-0"
    summary, rows = measured_run(folder, FIXTURE_LOADS[0], engine)
    assert summary["completed"] == 8 and summary["failed"] == 0 and summary["total_output_tokens"] == 8 * 16
    sent = [r["arrival_s"] for r in rows]
    assert len(rows) == 8 and sent[0] == 0.0 and sent == sorted(sent)
    assert all(r["input_len"] > 0 and r["output_len"] == 16 for r in rows)  # the server's own token counts
    load = json.loads((folder / "fx-p20.json").read_text())
    assert load["client"] == CLIENTS[engine] and all(r["send_lag_s"] >= 0 for r in load["requests"])
    assert {row["name"] for row in load["host_use"]} >= SERVER_PROCESSES[engine]


@pytest.mark.parametrize("engine", list(SETTINGS))
def test_a_recorded_held_out_validation_scores_with_the_speedup_first(engine, tmp_path):
    import shutil

    from calibrate.real.validate import compare

    shutil.copytree(_recorded(engine), tmp_path / "v")
    profile = Path(__file__).parents[1] / "scenarios" / "profiles" / PROFILES[engine]
    result = compare(tmp_path / "v", _fixture_plan(engine), profile)
    assert [c["name"] for c in result["cases"]] == ["fx-p20", "fx-c2"]
    assert result["plan"]["client_nice"] == -10 and len(result["plan"]["loads"]) == 2
    for case in result["cases"]:
        for setting in SETTINGS[engine]:
            v = case["settings"][setting]
            assert v["predicted"]["output_throughput"] > 0 and v["measured"]["output_throughput"] > 0
        assert case["speedup"]["predicted"] > 0
    signs = result["speedup_signs"]
    assert 0 <= signs["right"] <= signs["decided"] <= 2


def record_fixture(engine: str = "vllm") -> None:  # pragma: no cover - run by hand
    """Record tests/data/<engine>/heldout/ with the engine's environment (about 2 minutes):
    ``python -m tests.test_open_loop_loads [vllm|sglang]``."""
    import shutil
    import tempfile

    from calibrate.real.environment import REPO, find_engine, test_model
    from calibrate.real.validate import run_sessions

    found = find_engine(engine)
    model = test_model(found, REPO / ".venvs" / "models" / "tiny-llama")
    with tempfile.TemporaryDirectory() as tmp:
        run_sessions(found, model, _fixture_plan(engine), Path(tmp), print)
        if FIXTURES[engine].exists():
            shutil.rmtree(FIXTURES[engine])
        for setting in SETTINGS[engine]:
            src, dst = Path(tmp) / "sessions" / f"{setting}-0", FIXTURES[engine] / "sessions" / f"{setting}-0"
            dst.mkdir(parents=True)
            for f in src.iterdir():
                if f.suffix in (".json", ".jsonl") and not f.name.startswith("host_speed") and not f.name.endswith(".bench.jsonl"):
                    shutil.copy(f, dst / f.name)
            # the server log: only the lines the validation reads (the KV cache size, SGLang's limits)
            lines = [ln for ln in (src / "server.log").read_text().splitlines()
                     if "KV cache size" in ln or "max_total_num_tokens=" in ln]
            (dst / "server.log").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":  # pragma: no cover
    import sys

    record_fixture(*sys.argv[1:2])


def test_the_client_times_each_token_of_an_empty_text_stream_by_its_token_ids():
    """A stubbed vLLM server streams tokens whose text is empty: the client asks for each chunk's
    token ids (``return_token_ids``) and times each token when its chunk arrives (until 6 December
    2026 it counted none until the usage chunk and spread the times evenly over the request)."""
    pytest.importorskip("aiohttp")
    from aiohttp import web

    from realengines.client import run_load

    gaps = (0.02, 0.25, 0.02)  # uneven: spread evenly, the times would be 0.097 s apart

    async def completions(request):
        body = await request.json()
        assert body["return_token_ids"] is True
        resp = web.StreamResponse()
        await resp.prepare(request)
        for gap in gaps:
            await asyncio.sleep(gap)
            await resp.write(b'data: {"choices": [{"text": "", "token_ids": [7]}]}\n\n')
        await resp.write(b'data: {"choices": [], "usage": {"completion_tokens": 3}}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def go():
        runner, url = await _serve(completions)
        try:
            return await run_load({"url": url, "api": "openai", "concurrency": 1, "warmup_requests": 0,
                                   "requests": [{"rid": "r0", "input_ids": [5], "max_new_tokens": 3}]})
        finally:
            await runner.cleanup()

    rec = asyncio.run(go())["requests"][0]
    assert rec["output_len"] == 3 and not rec["error"]
    times = rec["token_times_s"]
    between = [b - a for a, b in zip(times, times[1:])]
    assert between[0] > 0.15 and between[1] < 0.15  # the long gap where the server made it, not spread


def test_the_openai_count_reads_token_ids_then_text_then_usage():
    from realengines.client import _count_openai, _openai_body

    assert _openai_body({"rid": "r", "input_ids": [1], "max_new_tokens": 2})[1]["return_token_ids"] is True
    assert _count_openai({"choices": [{"text": "", "token_ids": [3, 4]}]}, 5) == 7  # two tokens in one chunk
    assert _count_openai({"choices": [{"text": "", "token_ids": []}]}, 5) == 5  # (the finishing chunk)
    assert _count_openai({"choices": [{"text": "ab"}]}, 5) == 6  # a server that sends no ids
    assert _count_openai({"choices": [{"text": ""}]}, 5) == 5
    assert _count_openai({"choices": [], "usage": {"completion_tokens": 9}}, 5) == 9
