"""Your own SGLang server as the source: the designed load's stages and its recording against a
stand-in server (:mod:`calibrate.real.from_trace.record`), the profiler's slowdown by the step's
shape (:func:`calibrate.real.from_trace.log_match.local_slowdown`) and its removal
(:func:`calibrate.real.from_trace.profile.remove_slowdown`).

Closed forms first, then invariants with hypothesis, then the recorded real server
(``tests/data/sglang/own-server/``): the profile built from its four traces and log predicts the
same server's unprofiled loads within the issue's bar.
"""

from __future__ import annotations

import gzip
import json
import shutil
import statistics
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibrate.real.from_trace import record
from calibrate.real.from_trace.forms import fit
from calibrate.real.from_trace.log_match import local_factor, local_slowdown
from calibrate.real.from_trace.profile import remove_slowdown, slowdown_record
from sim.errors import UserInputError

DATA = Path(__file__).parent / "data" / "sglang" / "own-server"


# ---------------------------------------------------------------------------------------------
# the designed load


def test_stages_by_hand():
    stages = record.design(16, 2048, 40)
    assert [(s.batch, s.input_len, s.output_len) for s in stages] == [
        (1, 128, 82), (4, 128, 82), (16, 128, 82), (16, 983, 82)]
    assert [s.profile_id for s in stages] == ["b1-in128", "b4-in128", "b16-in128", "b16-in983"]


def test_stages_up_to_a_large_server_and_a_small_pool():
    stages = record.design(256, 32768, 40, kv_tokens=100_000)
    assert [s.batch for s in stages] == [1, 4, 16, 64, 256, 72]  # 0.8 x 100k / (1024 + 82) = 72
    assert stages[-1].input_len == 1024


def test_a_short_context_has_no_long_stage():
    assert [s.input_len for s in record.design(8, 300, 40)] == [128, 128, 128]


@given(st.integers(1, 4096), st.integers(1, 200_000), st.integers(1, 1000))
@settings(max_examples=200, deadline=None)
def test_stages_fit_the_server(max_batch, context, steps):
    for s in record.design(max_batch, context, steps):
        assert 1 <= s.batch <= max_batch and s.input_len >= 1 and s.output_len == 2 * steps + 2


@pytest.mark.parametrize("bad", [(0, 2048, 40), (4, 0, 40), (4, 2048, 0)])
def test_design_refuses_nonsense(bad):
    with pytest.raises(ValueError):
        record.design(*bad)


class _Server(ThreadingHTTPServer):
    """A stand-in for SGLang's HTTP server: ``/server_info``, ``/start_profile`` (remembers the
    request), ``/generate`` (after the window's requests have all been answered, writes the
    window's trace into its ``output_dir``, as the real server does when ``num_steps`` pass)."""

    def __init__(self, info: dict):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.info, self.profiles, self.generated, self.lock = info, [], [], threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _answer(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._answer(self.server.info)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        if self.path == "/start_profile":
            srv.profiles.append(body)
            return self._answer({})
        with srv.lock:
            srv.generated.append((srv.profiles[-1]["profile_id"], len(body["input_ids"]),
                                  body["sampling_params"]["max_new_tokens"]))
            prof = srv.profiles[-1]
            done = sum(1 for g in srv.generated if g[0] == prof["profile_id"])
            batch = int(prof["profile_id"].split("-")[0][1:])
            if done == batch:
                out = Path(prof["output_dir"]) / f"{prof['profile_id']}-TP-0.trace.json.gz"
                with gzip.open(out, "wt") as f:
                    f.write("{}")
        self._answer({"meta_info": {"completion_tokens": body["sampling_params"]["max_new_tokens"]}})


@pytest.fixture
def server():
    srv = _Server({"internal_states": [{"max_running_requests": 4}], "context_length": 1024, "device": "cpu"})
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()


def test_the_recording_sends_each_stage_under_its_window_and_resumes(server, tmp_path):
    url = f"http://127.0.0.1:{server.server_address[1]}"
    limits = record.server_limits(url)
    assert limits == {"max_running_requests": 4, "context_length": 1024, "device": "cpu"}
    stages = record.design(limits["max_running_requests"], limits["context_length"], 8)
    traces = record.record_windows(url, tmp_path, stages, 8, say=lambda _: None)
    assert [t.name for t in traces] == [f"{s.profile_id}-TP-0.trace.json.gz" for s in stages]
    assert all(t.exists() for t in traces)
    assert [p["profile_id"] for p in server.profiles] == [s.profile_id for s in stages]
    assert all(p["num_steps"] == 8 and p["detailed_annotations"] and p["with_stack"] and p["activities"] == ["CPU"]
               for p in server.profiles)
    sent = {(pid, n, out) for pid, n, out in server.generated}
    assert sent == {(s.profile_id, s.input_len, s.output_len) for s in stages}
    assert len(server.generated) == sum(s.batch for s in stages)
    # a second call finds every trace and sends nothing
    before = len(server.generated)
    assert record.record_windows(url, tmp_path, stages, 8, say=lambda _: None) == traces
    assert len(server.generated) == before


def test_no_server_is_one_line_naming_the_flag():
    with pytest.raises(UserInputError) as err:
        record.server_limits("http://127.0.0.1:9", timeout_s=2)
    assert err.value.source == "--profile-server"


def test_a_trace_that_never_appears_names_the_trace_dir(server, tmp_path, monkeypatch):
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setattr(record.Path, "exists", lambda self: False)
    with pytest.raises(UserInputError) as err:
        record.record_windows(url, tmp_path, [record.Stage(1, 8, 10)], 4, timeout_s=0.5, say=lambda _: None)
    assert err.value.source == "--trace-dir"


# ---------------------------------------------------------------------------------------------
# the slowdown by the step's shape


def _law_points(law, shapes):
    return [(b, c, law(b, c)) for b, c in shapes]


def test_the_local_slowdown_is_the_ratio_of_the_two_forms():
    unprof = lambda b, c: 8e-3 + 5e-4 * b + 2e-6 * b * c  # noqa: E731
    prof = lambda b, c: 14e-3 + 8e-4 * b + 2e-6 * b * c  # noqa: E731  a cost per call and per op
    shapes = [(1, 130), (1, 170), (4, 130), (4, 170), (16, 130), (16, 1000), (16, 1040)]
    u, p = fit("forward.decode", _law_points(unprof, shapes)), fit("forward.decode", _law_points(prof, shapes))
    matched = [[(b, c, prof(b, c), 0.0) for b, c in shapes]]
    local = local_slowdown(u, p, matched)
    f = local_factor(local)
    assert f(1, 150) == pytest.approx(prof(1, 150) / unprof(1, 150), rel=1e-6)
    assert f(16, 1000) == pytest.approx(prof(16, 1000) / unprof(16, 1000), rel=1e-6)
    assert f(16, 1000) < f(1, 150)  # the long contexts are slowed less
    assert f(4) == pytest.approx(f(4, local["reference_context"]))
    assert local["uncertainty_rel"] == pytest.approx(0.0, abs=1e-9)  # both laws exact
    assert local["factor_range"] == [pytest.approx(min(f(b, c) for b, c in shapes)),
                                     pytest.approx(max(f(b, c) for b, c in shapes))]


def test_the_profiler_never_speeds_a_step_up():
    form = {"coef_s": {"base": 1e-3, "per_request": 0.0, "per_kv_token": 0.0}}
    local = {"profiled_fit": form, "unprofiled_fit": {"coef_s": {"base": 2e-3, "per_request": 0.0, "per_kv_token": 0.0}},
             "reference_context": 100.0}
    assert local_factor(local)(4, 100) == 1.0


def test_removal_by_hand_on_the_cpu_engine():
    local = {"profiled_fit": {"coef_s": {"base": 15e-3, "per_request": 0.0, "per_kv_token": 0.0}},
             "unprofiled_fit": {"coef_s": {"base": 10e-3, "per_request": 0.0, "per_kv_token": 0.0}},
             "reference_context": 150.0, "forward_overhead_s": 4e-3}
    slow = {"removed": True, "host_slowdown": 1.25, "local": local}
    samples = [{"curve": "forward.decode", "point": {"num_reqs": 4.0, "ctx": 150.0}, "times_s": [0.03]},
               {"curve": "schedule.decode", "point": {"num_reqs": 4.0}, "times_s": [3e-3]},
               {"curve": "forward.extend", "point": {"tokens": 512.0, "prefix": 0.0}, "times_s": [0.1, 0.0045]},
               {"curve": "recv", "point": {"num_reqs": 2.0}, "times_s": [1e-3]}]
    out = remove_slowdown(samples, slow, "cpu")
    assert out[0]["times_s"] == [pytest.approx(0.02)]    # x1.5 at its shape
    assert out[1]["times_s"] == [pytest.approx(2e-3)]    # x1.5 at the reference context
    assert out[2]["times_s"] == [pytest.approx(0.096), pytest.approx(0.0045 / 1.25)]  # less the overhead, or /median
    assert out[3]["times_s"] == [pytest.approx(8e-4)]    # the median factor
    gpu = remove_slowdown(samples, slow, "cuda")
    assert gpu[0]["times_s"] == [0.03] and gpu[2]["times_s"] == [0.1, 0.0045]  # kernels are not slowed
    assert gpu[1]["times_s"] == [pytest.approx(3e-3 / 1.25)]


def test_the_record_states_the_overhead_subtracted_from_a_prefill():
    check = {"host_slowdown": 1.4, "profiler_slowdown": 1.4, "slowdown_uncertainty_rel": 0.2, "unprofiled_lines": 50,
             "log": "server.log", "matched": 40,
             "local": {"profiled_fit": {"coef_s": {"base": 12e-3, "per_request": 0.0, "per_kv_token": 0.0}},
                       "unprofiled_fit": {"coef_s": {"base": 8e-3, "per_request": 0.0, "per_kv_token": 0.0}},
                       "reference_context": 150.0, "uncertainty_rel": 0.1, "factor_range": [1.5, 1.5]}}
    fits = {"forward.decode": {"coef_s": {"base": 9e-3, "per_request": 0.0, "per_kv_token": 0.0}}}
    rec = slowdown_record(check, "cpu", fits)
    assert rec["local"]["forward_overhead_s"] == pytest.approx(9e-3 * (1 - 1 / 1.5))
    assert rec["uncertainty_rel"] == 0.1 and "own shape" in rec["applied_to"]
    assert "local" not in slowdown_record(check, "cuda", fits)


@given(st.floats(1e-4, 1.0), st.floats(0, 1e-2), st.floats(0, 1e-4), st.floats(1.0, 3.0),
       st.floats(1, 512), st.floats(1, 1e5))
@settings(max_examples=200, deadline=None)
def test_the_local_factor_is_at_least_one_and_finite(base, per_req, per_tok, slow, b, c):
    unprof = {"coef_s": {"base": base, "per_request": per_req, "per_kv_token": per_tok}}
    prof = {"coef_s": {"base": base * slow, "per_request": per_req, "per_kv_token": per_tok}}
    f = local_factor({"profiled_fit": prof, "unprofiled_fit": unprof, "reference_context": 100.0})(b, c)
    assert 1.0 <= f <= slow + 1e-9


# ---------------------------------------------------------------------------------------------
# the recorded real server


def test_the_recorded_server_is_predicted_within_the_bar(tmp_path):
    """Four trimmed traces of the designed load and the server's log up to its end
    (``python benchmarks/own_server.py``, 2026-12-03), the profile built from them, and
    ``overlap-sim run`` of the unprofiled loads the same server then served (warm-ups besides the
    measured requests, as the client sent them). Measured: throughput median |error| 6.6%, TPOT
    8.2% (issue 32's bar: 10% each), every load within 13%. Guarded here: both medians within
    10%, every load within 20%."""
    truth = json.loads((DATA / "truth.json").read_text())
    traces = sorted(str(p) for p in DATA.glob("*.trace.json.gz"))
    assert len(traces) == 4
    from calibrate.cli import main as calibrate_main

    work = tmp_path / "w"
    work.mkdir()
    for t in traces:
        shutil.copy(t, work)
    profile = tmp_path / "own.json"
    assert calibrate_main(["--from-trace", *sorted(str(p) for p in work.glob("*.gz")), "--server-log",
                           str(DATA / "recipe.server.log"), "--out", str(profile)]) == 0
    from sim import load_scenario, simulate

    errors = {"output_throughput": [], "median_tpot_ms": []}
    for case in truth["cases"]:
        sc = dict(case["scenario"], costs={"profile": str(profile)})
        path = tmp_path / f"{case['name']}.json"
        path.write_text(json.dumps(sc))
        res = simulate(load_scenario(str(path)), sc["server"]["settings"][0])
        summ = res.summary()
        got = {"output_throughput": summ["output_throughput"], "median_tpot_ms": summ["median_tpot_ms"]}
        for k in errors:
            err = got[k] / case["measured"][k] - 1
            assert abs(err) <= 0.20, (case["name"], k, err)
            errors[k].append(abs(err))
    assert statistics.median(errors["output_throughput"]) <= 0.10, errors
    assert statistics.median(errors["median_tpot_ms"]) <= 0.10, errors
