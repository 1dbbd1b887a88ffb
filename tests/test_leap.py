"""The leap over steady decode runs (:mod:`sim.engines.sglang.leap`) changes no answer.

Every case runs twice, with the leap and step by step (``leap=False``), and compares the outputs
byte for byte: the summary (as JSON), and with ``tables='steps'`` the steps, requests and ITL
tables as CSV text. Hand-checked cases first (where the leap must and must not apply), then a
hypothesis-generated family: arrivals (Poisson, closed loop, warm-up before the benchmark),
lengths, finishes by EOS and by length, KV pressure with each retraction policy, prefix hits,
pages, sync latency, the after-wait scale, jitter and every SGLang setting (vLLM's leap:
``tests/test_vllm_leap.py``).
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import sim
from sim.engines.sglang import leap as leap_module

ROOT = Path(__file__).resolve().parents[1]
_TMP = tempfile.TemporaryDirectory(prefix="leap-test-")  # the generated family's submission-block profile
SGLANG_SETTINGS = ["normal", "overlap", "overlap_mlx", "thread_overlap"]


def outputs(scenario, setting: str, tables: str, leap: bool) -> dict:
    """What a run gives a user: the summary, the outcome and, with tables, the three tables as CSV."""
    res = sim.simulate(scenario, setting, tables=tables, leap=leap)
    out = {"summary": json.dumps(res.summary(), sort_keys=True, default=str),
           "outcome": json.dumps(res.outcome, sort_keys=True, default=str),
           "stats": (res.stats["steps"], res.stats.get("decode_steps"), repr(res.stats["sim_time_s"]))}
    if tables == "steps":
        out.update(steps=res.steps.to_csv(), requests=res.requests.to_csv(), itl=res.itl.to_csv())
    return out


def assert_same(scenario, setting: str, tables: str = "steps") -> None:
    leapt, stepped = outputs(scenario, setting, tables, True), outputs(scenario, setting, tables, False)
    for key in stepped:
        assert leapt[key] == stepped[key], f"{setting} tables={tables}: {key} differs with the leap"


def closed_loop(**workload) -> dict:
    base = {"arrival": "closed_loop", "concurrency": 4, "num_requests": 16, "warmup_requests": 2,
            "input_len": 64, "output_len": 40, "finish": "length"}
    return {"name": "leap", "seed": 1, "workload": {**base, **workload},
            "server": {"settings": ["overlap", "normal"], "kv_pool_tokens": 100_000}}


# --- hand-checked cases --------------------------------------------------------------------------
def test_a_lone_request_is_leapt_over_all_its_decodes():
    """One request of 40 output tokens, closed loop: a prefill, then 39 decodes. The prefill's
    iteration runs through the loop; the leap takes every decode iteration (the first merges the
    prefilled request and carries it as a fresh member). Under overlap the loop's last iteration,
    which only processes decode 38 (the request leaves by length, so no decode 39 is scheduled),
    is the loop's own too."""
    scenario = sim.load_scenario(closed_loop(concurrency=1, num_requests=1, warmup_requests=0))
    for setting in ("normal", "overlap"):
        res = sim.simulate(scenario, setting, leap=True)
        assert (res.stats["steps"], res.stats["decode_steps"], res.stats["leapt_steps"]) == (40, 39, 39)
        assert sim.simulate(scenario, setting, leap=False).stats["leapt_steps"] == 0
        assert_same(scenario, setting)


def test_the_mlx_chain_leaps_while_it_holds():
    """The same request under ``overlap_mlx``: the prefill's iteration, the one that processes it
    (the chain breaks on a prefill) and the one that schedules decode 0 are the loop's; the leap
    takes the chained iterations that schedule decodes 1-38 (each processing the decode before).
    The loop's last two: one schedules decode 39 on the lazy tokens (the request finished in
    decode 38, not yet processed: its token there is discarded) and processes decode 38; the chain
    then breaks and the last processes decode 39. 41 steps, 40 decodes, 38 leapt."""
    scenario = sim.load_scenario(closed_loop(concurrency=1, num_requests=1, warmup_requests=0))
    res = sim.simulate(scenario, "overlap_mlx", leap=True)
    assert (res.stats["steps"], res.stats["decode_steps"], res.stats["leapt_steps"]) == (41, 40, 38)
    assert_same(scenario, "overlap_mlx")


def test_a_finish_the_mlx_leap_did_not_foresee_breaks_the_chain_as_the_loop_does(monkeypatch):
    """The MLX leap stops before processing a batch in which ``finishing_at`` says requests
    finish; should a finish come unannounced, it ends the run after that iteration with the
    loop's ``finished_last`` set, the batch it scheduled in flight. Forced here by hiding the
    finishes from every lookup (``finishing_at.get``, the leap's and the policy's alike, so the
    step-by-step run sees the same policy): the outputs stay step by step's."""
    from sim.engines.sglang.policy import scheduler as scheduler_module

    class Unannounced(dict):
        def get(self, key, default=None):
            return default

    init = scheduler_module.Scheduler.__init__

    def hiding(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.finishing_at = Unannounced()

    monkeypatch.setattr(scheduler_module.Scheduler, "__init__", hiding)
    guarded = []
    run = leap_module.Leap._run

    def counted(self, *args, **kwargs):
        out = run(self, *args, **kwargs)
        guarded.append(self.finished_last)
        return out

    monkeypatch.setattr(leap_module.Leap, "_run", counted)
    for raw in (closed_loop(concurrency=3, num_requests=12, output_len=30),
                closed_loop(concurrency=1, num_requests=1, warmup_requests=0)):
        assert_same(sim.load_scenario(raw), "overlap_mlx")
    assert any(guarded)


def submit_profile(tmp_dir: Path) -> Path:
    """The H200 profile with MLX's submission block added (``submit.*``: 85% of the forward, so a
    decode's launch returns near its forward's end), written to ``tmp_dir`` (once)."""
    path = tmp_dir / "submit-profile.json"
    if path.exists():
        return path
    prof = json.loads((ROOT / "scenarios" / "profiles" / "h200-llama-3.2-1b.json").read_text())
    for kind in ("decode", "extend"):
        curve = dict(prof["curves"][f"forward.{kind}"])
        curve["values_s"] = [[v * 0.85 for v in row] for row in curve["values_s"]]
        prof["curves"][f"submit.{kind}"] = curve
    path.write_text(json.dumps(prof))
    return path


def test_a_submission_block_is_leapt_as_the_loops_take_it(tmp_path, monkeypatch):
    """A profile with ``submit.decode`` (an MLX calibration): each decode's launch blocks until
    85% of its forward, which moves the timeline (the throughput differs from the same profile
    without the block); the three loops leap over it with the loops' answers, noise on and off,
    the normal loop's and the MLX chain's long runs through numpy (the chain's with the device
    idle at each launch's end: the block and the CPU's phases outlast a forward)."""
    from sim.engines.sglang import leap_runs

    taken = {"normal": 0, "mlx": 0}
    for name in taken:
        original = getattr(leap_runs, f"{name}_run")

        def counted(*args, _original=original, _name=name):
            out = _original(*args)
            taken[_name] += 0 if out is None else out[0]
            return out

        monkeypatch.setattr(leap_module, f"{name}_run", counted)
    raw = closed_loop(concurrency=8, num_requests=48, output_len=150)
    raw["costs"] = {"profile": str(submit_profile(tmp_path))}
    plain = closed_loop(concurrency=8, num_requests=48, output_len=150)
    plain["costs"] = {"profile": str(ROOT / "scenarios" / "profiles" / "h200-llama-3.2-1b.json")}
    for setting in ("overlap_mlx", "normal", "overlap"):
        blocked = sim.simulate(sim.load_scenario(raw), setting, tables="none")
        assert blocked.stats["leapt_steps"] > 0.9 * blocked.stats["steps"]
        assert blocked.summary() != sim.simulate(sim.load_scenario(plain), setting, tables="none").summary()
        assert_same(sim.load_scenario(raw), setting)
    assert taken["normal"] > 0 and taken["mlx"] > 0
    raw["costs"]["noise"] = {"gpu_cv": 0.1, "cpu_cv": 0.2}
    for setting in ("overlap_mlx", "normal", "overlap"):
        assert_same(sim.load_scenario(raw), setting)


def test_a_host_bound_mlx_chain_goes_to_numpy(monkeypatch):
    """The MLX chain with the host slower than the device (process 6 ms a step, forward 4 ms):
    the device idles at each launch's end and each forward starts there; the numpy runs take
    that regime too (each iteration's length summed from the run's start), with the loop's
    answers."""
    from sim.engines.sglang import leap_runs

    taken = []

    def counted(*args):
        out = leap_runs.mlx_run(*args)
        taken.append(0 if out is None else out[0])
        return out

    monkeypatch.setattr(leap_module, "mlx_run", counted)
    scenario = sim.load_scenario(ROOT / "scenarios" / "mlx-disable-overlap.yaml",
                                 ["workload.num_requests=24", "server.settings=[overlap_mlx]",
                                  "costs.cpu.process.base=0.006", "costs.gpu.sync_latency=2.0e-5"])
    res = sim.simulate(scenario, "overlap_mlx", tables="steps")
    steps = res.steps[res.steps["kind"] == "decode"]
    assert (steps["forward_start"].to_numpy()[1:] > steps["forward_end"].to_numpy()[:-1]).mean() > 0.9  # idle
    assert sum(taken) > 0.8 * res.stats["steps"]
    assert_same(scenario, "overlap_mlx")


def test_no_leap_where_the_loop_has_none():
    """thread_overlap and SGLang's CPU engine run step by step throughout."""
    assert sim.simulate(sim.load_scenario(closed_loop()), "thread_overlap").stats["leapt_steps"] == 0
    cpu = closed_loop()
    cpu["server"]["device"] = "cpu"
    for setting in ("normal", "overlap"):
        assert sim.simulate(sim.load_scenario(cpu), setting).stats["leapt_steps"] == 0


def test_the_leap_takes_most_steps_of_a_steady_closed_loop():
    scenario = sim.load_scenario(closed_loop(concurrency=8, num_requests=64, output_len=200))
    res = sim.simulate(scenario, "overlap", tables="none")
    assert res.stats["leapt_steps"] > 0.9 * res.stats["steps"]


# the shipped scenarios (a user's own files in scenarios/ are not the project's to hold)
SHIPPED = ("kv-pressure", "mlx-disable-overlap", "quickstart", "thread-overlap", "vllm-cpu", "vllm-h200",
           "vllm-h200-eagle")


@pytest.mark.parametrize("path", [ROOT / "scenarios" / f"{name}.yaml" for name in SHIPPED], ids=lambda p: p.stem)
def test_shipped_scenarios_are_unchanged(path):
    scenario = sim.load_scenario(path)
    for setting in scenario.server.settings:
        assert_same(scenario, setting)
        assert_same(scenario, setting, tables="none")


def test_kv_pressure_with_retraction_is_unchanged():
    """Pages, a pool that forces retraction, each retraction policy (the naive one kills the server)."""
    for policy in ("naive", "v0.5.10", "v0.5.22"):
        raw = closed_loop(concurrency=16, num_requests=48, input_len=200, output_len=300, finish="length")
        raw["server"].update(kv_pool_tokens=4096, page_size=16, retraction=policy)
        scenario = sim.load_scenario(raw)
        for setting in ("normal", "overlap"):
            assert_same(scenario, setting)


@pytest.mark.parametrize("setting", ["overlap", "normal", "overlap_mlx"])
def test_the_farthest_step_is_named_alike_with_and_without_the_leap(setting):
    # contexts beyond the H200 profile's decode data (128-4096 tokens): 6000-token prompts
    scenario = sim.load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                                 ["workload.num_requests=24", "workload.input_len=6000", "workload.output_len=300"])
    assert_same(scenario, setting, "none")
    summary = sim.simulate(scenario, setting, tables="none").summary()
    assert summary["max_extrapolation_at"].startswith("forward.decode at ctx 6")
    assert summary["max_extrapolation_at"].endswith(", measured 128-4096")
    assert summary["max_extrapolation"] == pytest.approx((6299 + 1) / 4097, rel=1e-3)  # the last token's context


def test_jitter_draws_are_the_step_by_step_ones():
    raw = closed_loop(concurrency=6, num_requests=30)
    raw["costs"] = {"noise": {"gpu_cv": 0.2, "cpu_cv": 0.3}, "cpu": {"after_wait_scale": 1.7},
                    "gpu": {"sync_latency": 2.0e-5}}
    scenario = sim.load_scenario(raw)
    for setting in ("normal", "overlap", "overlap_mlx"):
        assert_same(scenario, setting)
        assert_same(scenario, setting, tables="summary")


# --- a generated family ------------------------------------------------------------------------
lengths = st.one_of(st.integers(1, 300), st.fixed_dictionaries(
    {"dist": st.just("lognormal"), "mean": st.integers(20, 200), "sigma": st.floats(0.1, 1.0), "max": st.just(600)}))


def draw_workload(draw) -> dict:
    """A workload of the generated families (here and ``tests/test_vllm_leap.py``): closed or open
    loop, warm-up (before the benchmark or not), lengths, prefix hits, finishes by EOS or length."""
    arrival = draw(st.sampled_from(["closed_loop", "poisson"]))
    n = draw(st.integers(2, 40))
    input_len = draw(st.integers(1, 400))
    return {"arrival": arrival, "num_requests": n, "warmup_requests": draw(st.integers(0, n - 1)),
            "concurrency": draw(st.integers(1, 16)), "rate_per_s": draw(st.floats(1.0, 400.0)),
            "input_len": input_len, "cached_len": draw(st.integers(0, input_len)),
            "output_len": draw(lengths), "finish": draw(st.sampled_from(["length", "eos"])),
            "warmup_before_benchmark": arrival == "closed_loop" and draw(st.booleans())}


@st.composite
def scenarios(draw) -> dict:
    workload = draw_workload(draw)
    page = draw(st.sampled_from([1, 1, 4, 16]))
    pool = draw(st.sampled_from([200_000, 8_192, 3_072, 1_600]))
    server = {"settings": ["overlap"], "kv_pool_tokens": pool // page * page, "page_size": page,
              "max_running_requests": draw(st.integers(1, 32)),
              "chunked_prefill_size": draw(st.sampled_from([64, 512, 8192])),
              "retraction": draw(st.sampled_from(["naive", "v0.5.10", "v0.5.22"]))}
    costs = {"noise": {"gpu_cv": draw(st.sampled_from([0.0, 0.0, 0.1])), "cpu_cv": draw(st.sampled_from([0.0, 0.2]))},
             "gpu": {"decode": {"base": draw(st.floats(1e-4, 0.03)), "per_req": draw(st.floats(0, 1e-4)),
                                "per_ctx_token": draw(st.floats(0, 1e-7))},
                     "sync_latency": draw(st.sampled_from([0.0, 3e-5]))},
             "cpu": {"process": {"base": draw(st.floats(1e-5, 5e-3)), "per_req": draw(st.floats(0, 5e-5))},
                     "after_wait_scale": draw(st.sampled_from([1.0, 1.0, 1.5]))}}
    if draw(st.integers(0, 3)) == 0:  # a calibration profile (curves, reach counters) instead of inline terms,
        profile = draw(st.sampled_from([ROOT / "scenarios" / "profiles" / "h200-llama-3.2-1b.json",
                                        submit_profile(Path(_TMP.name))]))  # with MLX's submission block or not
        costs = {"profile": str(profile), "noise": costs["noise"], "gpu": {"sync_latency": costs["gpu"]["sync_latency"]}}
    return {"name": "leap-family", "seed": draw(st.integers(0, 3)), "workload": workload, "server": server,
            "costs": costs}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=scenarios(), setting=st.sampled_from(SGLANG_SETTINGS), tables=st.sampled_from(["steps", "none"]))
def test_generated_sglang_runs_are_unchanged(raw, setting, tables):
    scenario = sim.load_scenario(raw)
    assert_same(scenario, setting, tables)




# --- the numpy runs (sim.engines.sglang.leap_runs) --------------------------------------------
def test_long_runs_go_to_numpy_and_change_nothing(monkeypatch):
    """Long steady runs (inline costs and a calibration profile, contexts far beyond the profile's
    data so that the reach counters move) are computed by the numpy runs, with the same outputs."""
    from sim.engines.sglang import leap_runs

    calls = {"overlap": 0, "normal": 0, "mlx": 0}
    for name in calls:
        original = getattr(leap_runs, f"{name}_run")

        def counted(*args, _original=original, _name=name):
            out = _original(*args)
            calls[_name] += out is not None
            return out

        monkeypatch.setattr(leap_module, f"{name}_run", counted)
    inline = sim.load_scenario(closed_loop(concurrency=8, num_requests=48, output_len=300))
    profiled = sim.load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                                 ["workload.concurrency=4", "workload.num_requests=12", "workload.output_len=3000",
                                  "workload.input_len=30000", "workload.cached_len=0"])
    assert sim.simulate(profiled, "overlap", tables="none").summary()["extrapolated_steps"] > 1000
    for scenario in (inline, profiled):
        for setting in ("overlap", "normal", "overlap_mlx"):
            assert_same(scenario, setting)
            assert_same(scenario, setting, tables="none")
    assert calls["overlap"] > 0 and calls["normal"] > 0 and calls["mlx"] > 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(raw=scenarios(), setting=st.sampled_from(["normal", "overlap", "overlap_mlx"]),
       tables=st.sampled_from(["steps", "none"]))
def test_generated_runs_through_numpy_are_unchanged(monkeypatch, raw, setting, tables):
    """The generated family with every stretch of two or more steps offered to the numpy runs
    (their closed forms and fixed points meet short runs, arrivals, finishes and the submission
    block far more often than at the real threshold)."""
    from sim.engines.sglang import leap_runs

    monkeypatch.setattr(leap_runs, "MIN_RUN", 2)
    monkeypatch.setattr(leap_module, "MIN_RUN", 2)
    assert_same(sim.load_scenario(raw), setting, tables)


def test_the_mlx_chain_in_numpy_settles_its_clocks(monkeypatch):
    """The MLX chain's numpy runs (:func:`sim.engines.sglang.leap_runs.mlx_run`) solve each
    iteration's start as a fixed point of the loop's expressions. On the shipped MLX scenario at 8
    clients (device-bound: each forward 4 ms, the CPU's phases under 1 ms) numpy takes nearly every
    step, each run whole, and the outputs are step by step's, with a sync latency too."""
    from sim.engines.sglang import leap_runs

    taken = []

    def counted(*args):
        out = leap_runs.mlx_run(*args)
        taken.append((0 if out is None else out[0], args[2]))
        return out

    monkeypatch.setattr(leap_module, "mlx_run", counted)
    for latency in (None, 3e-5):
        sets = ["workload.num_requests=40", "workload.warmup_requests=0", "server.settings=[overlap_mlx]"]
        if latency is not None:
            sets.append(f"costs.gpu.sync_latency={latency}")
        scenario = sim.load_scenario(ROOT / "scenarios" / "mlx-disable-overlap.yaml", sets)
        res = sim.simulate(scenario, "overlap_mlx", tables="none")
        assert sum(k for k, _ in taken) > 0.9 * res.stats["steps"]
        assert all(k == asked for k, asked in taken)  # no run cut short by its clocks
        assert_same(scenario, "overlap_mlx")
        taken.clear()


def test_a_saturated_server_leaps_with_requests_waiting():
    """More clients than ``max_running_requests`` (and an open loop beyond the server's pace):
    requests wait while the running batch is full, admission latched shut, and every iteration
    is a decode until a request leaves. The leap takes those iterations (numpy runs included),
    stops before the admission pass a leaving request opens, and writes each step's
    ``num_queued`` as the loop does: the outputs of step by step."""
    for arrival in ("closed_loop", "poisson"):
        raw = closed_loop(concurrency=12, num_requests=60, output_len=120, input_len=64)
        raw["workload"].update(arrival=arrival, rate_per_s=400.0)
        raw["server"]["max_running_requests"] = 4
        scenario = sim.load_scenario(raw)
        for setting in ("overlap", "normal"):
            res = sim.simulate(scenario, setting)
            queued = res.steps["num_queued"] > 0
            assert queued.mean() > 0.5  # requests wait at most steps
            assert res.stats["leapt_steps"] > 0.8 * res.stats["steps"]
            assert_same(scenario, setting)
            assert_same(scenario, setting, tables="none")


def test_short_open_loop_runs_go_through_the_leap_loop():
    """An open loop whose arrivals and finishes come every few steps: its runs are too short for
    numpy (40 output tokens: no run without a finish reaches MIN_RUN), so the leap's own loop
    takes them, warm-up members and an after-wait scale included, with the same outputs as step
    by step."""
    assert leap_module.MIN_RUN > 40
    raw = {"name": "short-runs", "seed": 3,
           "workload": {"arrival": "poisson", "rate_per_s": 40.0, "num_requests": 60, "warmup_requests": 5,
                        "input_len": 64, "output_len": 40, "finish": "length"},
           "server": {"settings": ["overlap", "normal"], "max_running_requests": 16},
           "costs": {"cpu": {"after_wait_scale": 1.5}}}
    scenario = sim.load_scenario(raw)
    for setting in ("overlap", "normal"):
        assert_same(scenario, setting)
        assert_same(scenario, setting, tables="none")
        stats = sim.simulate(scenario, setting, tables="none").stats
        assert stats["leapt_steps"] > stats["steps"] / 2


@pytest.mark.parametrize("arrival", ["poisson", "closed_loop"])
def test_a_new_requests_iteration_stays_in_the_run(monkeypatch, arrival):
    """Where no SimPy process but the loop's submits requests (an open loop's pulled arrivals, a
    closed loop's clients), the run executes a new request's iteration itself and goes on: 200
    requests, an arrival every few steps, take a handful of calls into the leap (an open loop
    under overlap: its whole run in one, the decode in flight processed there without the batch
    object built for the loop), and give the step-by-step outputs. A closed loop under overlap
    whose whole batch leaves at once ends its runs there (the loop schedules the next prefill)."""
    calls = {"run": 0, "in_flight": 0}
    run, in_flight = leap_module.Leap._run, leap_module.Leap._in_flight

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(leap_module.Leap, "_run", counted("run", run))
    monkeypatch.setattr(leap_module.Leap, "_in_flight", counted("in_flight", in_flight))
    load = {"rate_per_s": 40.0} if arrival == "poisson" else {"concurrency": 6}
    scenario = sim.load_scenario({
        "name": "carried", "seed": 3,
        "workload": {"arrival": arrival, "num_requests": 200, "warmup_requests": 5, "input_len": 64,
                     "output_len": 40, "finish": "length", **load},
        "server": {"settings": ["overlap", "normal"]}})
    for setting in ("normal", "overlap"):
        calls.update(run=0, in_flight=0)
        stats = sim.simulate(scenario, setting, tables="none").stats
        assert stats["leapt_steps"] == stats["decode_steps"]
        if arrival == "poisson" or setting == "normal":
            assert calls["run"] <= 5, calls
            assert calls["in_flight"] <= 2, calls
        assert_same(scenario, setting)
        assert_same(scenario, setting, tables="none")


values_s = st.floats(min_value=-1e-3, max_value=10.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(values_s, st.integers(1, 64)), min_size=1, max_size=60))
def test_a_stat_fed_at_once_equals_one_fed_value_by_value(samples):
    """The streamed quantile sketch (sim.trace.streaming) given an array: the same count, total,
    buckets and quantiles as value by value, including zeros, negatives and values that differ
    only in their last digits."""
    import numpy as np

    from sim.trace.sketch import Stat

    one, many = Stat(), Stat()
    for value, weight in samples:
        one.add(value, weight)
    many.add_many(np.array([v for v, _ in samples]), np.array([w for _, w in samples], dtype=np.int64))
    one.fold()
    many.fold()
    assert (one.count, one.total, one.zero, one.bins) == (many.count, many.total, many.zero, many.bins)
    total, keys = 0.0, {}  # value by value, as DDSketch keys them and as a loop sums them
    for value, weight in samples:
        total += value * weight
        if value > one._min_possible:
            key = math.ceil(math.log(value, 2) * one._multiplier)
            keys[key] = keys.get(key, 0) + weight
    assert one.total == total and one.bins == keys
    for q in (0.0, 0.5, 0.99, 1.0):
        assert one.quantile(q) == many.quantile(q)


@st.composite
def traces(draw) -> list[dict]:
    """Requests of a JSON-lines trace: bursts (equal arrival times), gaps, per-request caps and
    ignore_eos, cached prefixes."""
    rows, t = [], 0.0
    for _ in range(draw(st.integers(1, 30))):
        t += draw(st.sampled_from([0.0, 0.0, 0.001, 0.05, 0.4]))
        input_len = draw(st.integers(1, 300))
        output_len = draw(st.integers(1, 200))
        row = {"arrival_s": t, "input_len": input_len, "output_len": output_len,
               "cached_len": draw(st.integers(0, input_len))}
        if draw(st.booleans()):
            row["max_new_tokens"] = output_len + draw(st.integers(0, 50))
            row["ignore_eos"] = draw(st.booleans())
        rows.append(row)
    return rows


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rows=traces(), arrival=st.sampled_from(["trace", "closed_loop"]), finish=st.sampled_from(["length", "eos"]),
       setting=st.sampled_from(["normal", "overlap"]), consecutive_off=st.booleans())
def test_replayed_traces_are_unchanged(tmp_path, rows, arrival, finish, setting, consecutive_off):
    """A trace replayed open-loop or by closed-loop clients, with SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP."""
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path = tmp_path / f"trace-{hash(text) & 0xffffffff:08x}.jsonl"  # one file per example (traces are cached by path)
    path.write_text(text)
    raw = {"name": "leap-trace", "seed": 0,
           "workload": {"arrival": arrival, "trace": str(path), "concurrency": 4, "finish": finish},
           "server": {"settings": [setting], "kv_pool_tokens": 6_000, "page_size": 4, "chunked_prefill_size": 128,
                      "disable_consecutive_prefill_overlap": consecutive_off}}
    assert_same(sim.load_scenario(raw), setting)


@pytest.mark.parametrize("output_len", [1, 2, 3, 6])
@pytest.mark.parametrize("arrival", ["closed_loop", "poisson"])
def test_a_batch_that_empties_ends_the_leap(output_len, arrival):
    """Regression (found by a fresh-clone run): when the last running request left, the leap's
    numpy runs went on over an empty batch (endlessly in a closed loop). A run ends when the
    running batch is empty; the outputs are the loop's."""
    raw = closed_loop(concurrency=1, num_requests=3, warmup_requests=0, input_len=8, output_len=output_len)
    raw["workload"].update(arrival=arrival, rate_per_s=0.5)
    scenario = sim.load_scenario(raw)
    for setting in ("normal", "overlap"):
        res = sim.simulate(scenario, setting, tables="none")
        assert res.stats["decode_steps"] <= 3 * output_len
        assert_same(scenario, setting)


@pytest.mark.parametrize("rate_per_s,seed", [(8.0, 0), (30.0, 2), (2000.0, 1)])
def test_an_open_loop_whose_server_dies_is_unchanged(rate_per_s, seed):
    """The shipped KV-pressure scenario (naive retraction under overlap: the server dies) with
    Poisson arrivals: with the leap the loop pulls the arrivals (sim.model.workload.PulledArrivals),
    also after the death, while requests that arrive are refused; without it, their SimPy process
    submits them. The same outputs and simulated time."""
    scenario = sim.load_scenario(ROOT / "scenarios" / "kv-pressure.yaml",
                                 ["workload.arrival=poisson", f"workload.rate_per_s={rate_per_s}", f"seed={seed}"])
    assert sim.simulate(scenario, "overlap", tables="none").outcome["status"] == "server_died"
    assert_same(scenario, "overlap")
    assert_same(scenario, "overlap", tables="none")


def test_counts_from_numpy_rows_stay_integers():
    """Regression (found by the generated family): steps that reach the streamed recorder as
    numpy rows before the measured window starts were counted as floats, so the summary said
    ``overshoot_tokens: 0.0`` where step by step it says ``0``."""
    raw = {"name": "leap-window", "seed": 0,
           "workload": {"arrival": "poisson", "num_requests": 5, "warmup_requests": 4, "rate_per_s": 1.0,
                        "input_len": 1, "output_len": 35, "finish": "length"},
           "server": {"settings": ["normal"], "max_running_requests": 1, "retraction": "naive"},
           "costs": {"gpu": {"decode": {"base": 0.001953125, "per_req": 5.5e-05, "per_ctx_token": 0.0}},
                     "cpu": {"process": {"base": 1e-05, "per_req": 0.0}}}}
    scenario = sim.load_scenario(raw)
    assert sim.simulate(scenario, "normal", tables="none").stats["leapt_steps"] > 0
    assert_same(scenario, "normal", tables="none")
    assert type(sim.simulate(scenario, "normal", tables="none").summary()["overshoot_tokens"]) is int


@pytest.mark.parametrize("value, leaps", [("0", False), ("false", False), ("OFF", False), (" no ", False),
                                          ("1", True), ("", True)])
def test_the_environment_turns_the_leap_off_by_any_usual_word(monkeypatch, value, leaps):
    from sim.commands import LEAP_ENV
    from tests.helpers import constant_scenario

    monkeypatch.setenv(LEAP_ENV, value)
    res = sim.simulate(constant_scenario(c=4, num_requests=12, output_len=80), "overlap")
    assert (res.stats["leapt_steps"] > 0) == leaps


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0, allow_subnormal=True), min_size=16, max_size=16),
       st.lists(st.integers(1, 4096), min_size=1, max_size=20), st.integers(0, 10**7))
def test_linear_decode_s_equals_its_array_form(terms, sizes, ctx):
    """The linear model's per-step ``decode_s`` (each batch size's part kept) gives the doubles
    of ``decode_arrays``, the expressions evaluated whole, for every size, asked in any order."""
    from sim.model.costs import LinearCostModel
    from sim.scenario import Costs

    t = [terms[i:i + 4] for i in range(0, 16, 4)]
    term = lambda x: {"base": x[0], "per_req": x[1], "per_token": x[2], "per_ctx_token": x[3]}  # noqa: E731
    t[0][0] += 1e-6  # a forward must take time (the scenario's own check)
    costs = Costs.model_validate({"gpu": {"decode": term(t[0])}, "cpu": {
        "schedule": term(t[1]), "launch": term(t[2]), "process": term(t[3])}})
    model = LinearCostModel(costs)
    for n in sizes + sizes[::-1]:
        got = model.decode_s(n, ctx + n)
        assert got == model.decode_arrays(n, ctx + n), n
        assert got == tuple(float(a[0]) for a in model.decode_arrays(n, np.array([float(ctx + n)]))), n


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1.0, 1e4), min_size=1, max_size=5, unique=True),
       st.lists(st.floats(0.0, 1e6), min_size=1, max_size=6, unique=True),
       st.data())
def test_curve_along_equals_the_curve_at_each_point(axis0, axis1, data):
    """``Curve.along`` (the numpy runs' forward costs) gives, elementwise, the float the scalar
    curve gives at each point, inside the grid and beyond it on either side, on every call (its
    arrays are made once, at the first); so does ``Curve.at`` (vLLM's leap: the curve at one
    batch size, as a function of the context)."""
    from sim.model.curve import Curve

    g0, g1 = sorted(axis0), sorted(axis1)
    values = [[data.draw(st.floats(-1e-3, 1.0)) for _ in g1] for _ in g0]
    curve = Curve(("num_reqs", "ctx"), (g0, g1), values)
    for _ in range(2):
        x0 = data.draw(st.floats(0.0, 2e4))
        x1 = np.array(data.draw(st.lists(st.floats(0.0, 2e6), min_size=1, max_size=20)))
        got = curve.along(x0, x1)
        assert got.tolist() == [curve(x0, float(x)) for x in x1]
        at = curve.at(x0)
        assert [at(float(x)) for x in x1] == [curve(x0, float(x)) for x in x1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1.0, 1e4), min_size=1, max_size=4, unique=True),
       st.lists(st.floats(0.0, 1e4), min_size=1, max_size=6, unique=True),
       st.data())
def test_curve_at_keeps_the_last_segment_bit_for_bit(axis0, axis1, data):
    """``Curve.at``'s function reuses the second axis's last interior segment (the contexts a
    leap asks for grow step by step): every value is the bilinear interpolation through
    ``_segment`` written out here, for contexts that grow within a cell, cross nodes, jump back,
    leave the grid on either side, and are NaN or infinite."""
    from sim.model.curve import Curve, _segment

    g0, g1 = sorted(axis0), sorted(axis1)
    values = [[data.draw(st.floats(-1e-3, 1.0)) for _ in g1] for _ in g0]
    curve = Curve(("num_reqs", "ctx"), (g0, g1), values)
    x0 = data.draw(st.floats(0.0, 2e4))
    i, t = _segment(curve.grid[0], x0)
    r, r1 = curve.values[i], curve.values[i + 1 if len(g0) > 1 else i]
    step = 1 if len(g1) > 1 else 0

    def reference(x1: float) -> float:
        j, u = _segment(curve.grid[1], x1)
        a = r[j] + u * (r[j + step] - r[j])
        b = r1[j] + u * (r1[j + step] - r1[j])
        y = a + t * (b - a)
        return y if y > 0.0 else 0.0

    xs = data.draw(st.lists(st.one_of(st.floats(-1e3, 2e4), st.sampled_from([math.nan, math.inf, -math.inf])),
                            min_size=1, max_size=30))
    start, growth = data.draw(st.floats(-1e3, 2e4)), data.draw(st.floats(0.0, 500.0))
    xs += [start + k * growth for k in range(30)] + [float(v) for v in g1]
    at = curve.at(x0)
    for x in xs:
        got, want = at(x), reference(x)
        assert got == want or (got != got and want != want), x


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 2048), st.integers(0, 10**7), st.integers(1, 200), st.integers(0, 5000))
def test_profile_counts_a_numpy_run_as_its_steps(num_reqs, ctx0, k, growth):
    """``count_decode_steps`` over a run's contexts counts what ``forward_s`` counts step by step:
    the same extrapolated and far steps and the same largest distance, inside the profile's data
    (its shortcut) and beyond it in batch size or context."""
    from sim.model.costs import DECODE
    from sim.model.profile_costs import ProfileCostModel

    path = Path(__file__).resolve().parents[1] / "scenarios" / "profiles" / "h200-llama-3.2-1b.json"
    stepwise, vector = ProfileCostModel.from_file(path), ProfileCostModel.from_file(path)
    ctx = [ctx0 + i * growth for i in range(k)]
    for c in ctx:
        stepwise.forward_s(DECODE, num_reqs, num_reqs, c)
    vector.count_decode_steps(num_reqs, np.array(ctx, dtype=np.float64))
    assert vector.reach.outcome() == stepwise.reach.outcome()
    # both as the definition (sim.model.reach): the largest distance over the curves that price a step;
    # below the data's contexts, where the price lies within BOUNDED_MAX of the edge's, the context
    # counts as inside and the step, if nothing else lies beyond, as bounded
    from sim.model.reach import BOUNDED_MAX, ReachMeter, below_share, distance

    hf, hl, hs, hp = stepwise._hull[DECODE]
    curve, lo = stepwise.curves["forward.decode"], hf[0][1]
    meter = ReachMeter()
    for c in ctx:
        x = c / num_reqs
        share = below_share(curve(num_reqs, x), curve(num_reqs, lo)) if x < lo else math.inf
        d = max(distance(hf, num_reqs, max(x, lo) if share <= BOUNDED_MAX else x), distance(hl, num_reqs),
                distance(hs, num_reqs), distance(hp, num_reqs))
        if d == 1.0 and share <= BOUNDED_MAX:
            meter.bounded(share)
        else:
            meter.step(d)
    assert meter.outcome() == stepwise.reach.outcome()
