"""The verdict line of run and sweep (sim.whatif.verdict): the threshold by hand, the three answers,
failed settings, the table's title, and invariants of the rule."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.output.report import run_title
from sim.whatif.verdict import (DEFAULT_RUN_CV, KEEP, OFF, UNSEEN, decide, pair_of, resolve_run_cv,
                                threshold_ratio, verdict, verdict_platform_note, visible_cv)
from sim.whatif.sweep_verdict import sweep_verdict_text
from tests.helpers import verdict_of

Z = 1.959963984540054
ROOT = Path(__file__).resolve().parents[1]


def _summ(thr, tpot=3.0, completed=56, outcome="ok"):
    return {"output_throughput": thr, "median_tpot_ms": tpot, "completed": completed, "outcome": outcome}


def test_threshold_by_hand():
    # cv 2%: sigma = sqrt(ln 1.0004) = 0.0199980; T = exp(1.96 * sqrt(2) * sigma) = 1.05700
    sigma = math.sqrt(math.log(1 + 0.02 ** 2))
    assert threshold_ratio(0.02) == pytest.approx(math.exp(Z * math.sqrt(2) * sigma))
    assert threshold_ratio(0.02) == pytest.approx(1.0570, abs=1e-4)
    # cv 10%: sigma = 0.099751; T = exp(0.27649) = 1.3185
    assert threshold_ratio(0.1) == pytest.approx(1.3185, abs=1e-4)
    assert threshold_ratio(0.0) == 1.0


def test_visible_cv_by_hand():
    # the quickstart's 1.099: sigma* = ln(1.099) / (1.96 sqrt 2) = 0.034055; cv* = sqrt(e^(sigma*^2) - 1)
    s = math.log(1.099) / (Z * math.sqrt(2))
    assert visible_cv(1.099) == pytest.approx(math.sqrt(math.exp(s * s) - 1))
    assert visible_cv(1.099) == pytest.approx(0.03406, abs=1e-4)
    assert visible_cv(1.0) == 0.0


def test_three_answers():
    assert decide(1.099, 0.02) == KEEP
    assert decide(1 / 1.099, 0.02) == OFF
    assert decide(1.099, 0.10) == UNSEEN  # the write-up's ~10% spread hides a 1.1x gain
    assert decide(1.0, 0.0) == UNSEEN     # equal settings: nothing to see even without noise
    assert decide(1.001, 0.0) == KEEP     # no noise: any gain shows


def test_verdict_line_sglang_and_vllm():
    v = verdict({"overlap": _summ(2529.7, 3.111), "normal": _summ(2302.6, 3.425)}, 0.02, "test")
    assert v.answer == KEEP and v.throughput_ratio == pytest.approx(2529.7 / 2302.6)
    line = v.line()
    assert line.startswith("verdict: keep overlap on (do not pass --disable-overlap-schedule)")
    assert "1.099x" in line and "TPOT 3.111 vs 3.425 ms" in line and "under 3.4%" in line
    off = verdict({"overlap": _summ(90.0), "normal": _summ(100.0)}, 0.02, "test")
    assert off.answer == OFF and "turn overlap off (--disable-overlap-schedule)" in off.line()
    unseen = verdict({"async": _summ(101.0), "sync": _summ(100.0)}, 0.05, "test")
    assert unseen.answer == UNSEEN
    assert "no difference a single A/B run could see" in unseen.line() and "runs of each setting" in unseen.line()
    keep_vllm = verdict({"async": _summ(120.0), "sync": _summ(100.0)}, 0.02, "test")
    assert "keep async scheduling on (--async-scheduling" in keep_vllm.line()


def test_a_failed_setting_loses():
    v = verdict({"overlap_mlx": _summ(100.0), "normal": _summ(0.0, math.nan, 0, "server_died")}, 0.02, "test")
    assert v.answer == KEEP and v.failed == "normal" and "--disable-overlap-schedule (normal)" in v.line()
    v = verdict({"overlap": _summ(0.0, completed=0), "normal": _summ(100.0)}, 0.02, "test")
    assert v.answer == OFF and v.failed == "overlap"
    assert verdict({"overlap": _summ(0.0, completed=0), "normal": _summ(0.0, completed=0)}, 0.02, "t") is None
    assert verdict({"thread_overlap": _summ(1.0)}, 0.02, "t") is None
    assert pair_of(["normal", "thread_overlap"]) is None


def test_run_cv_source():
    quiet = SimpleNamespace(run_gpu_cv=0.0, run_cpu_cv=0.0)
    assert resolve_run_cv(None, quiet) == (DEFAULT_RUN_CV, "a clock-locked card on a quiet host")
    assert resolve_run_cv(None, quiet, "cpu") == (DEFAULT_RUN_CV, "a dedicated CPU host with nothing else running")
    assert resolve_run_cv(0.1, quiet)[0] == 0.1
    cv, source = resolve_run_cv(None, SimpleNamespace(run_gpu_cv=0.03, run_cpu_cv=0.04))
    assert cv == pytest.approx(0.05) and "costs.noise" in source


def test_sweep_line_groups_points():
    rows = []
    for point, (a, b) in enumerate([(110.0, 100.0), (100.5, 100.0), (80.0, 100.0)]):
        for repeat in range(2):
            for setting, thr in (("overlap", a), ("normal", b)):
                rows.append({"point": point, "workload.concurrency": [1, 8, 64][point], "setting": setting,
                             "repeat": repeat, "seed": repeat, "output_throughput": thr, "median_tpot_ms": 3.0,
                             "completed": 10, "outcome": "ok"})
    line = sweep_verdict_text(pd.DataFrame(rows), SimpleNamespace(run_gpu_cv=0.0, run_cpu_cv=0.0)).line()
    assert line.startswith("verdict (overlap/normal output throughput): keep overlap on")
    assert "workload.concurrency=1 (1.100x)" in line and "workload.concurrency=64 (0.800x)" in line
    assert "no difference a single A/B run could see" in line and "beyond 1.057x" in line


def test_a_sweep_says_where_its_repeats_interval_includes_1_under_a_definite_answer():
    """Two repeats of ratios 1.30 and 0.95: the answer (geometric mean 1.111x against a 2% CV)
    keeps overlap on, while the repeats' 95% t-interval spans 1: the line says both; repeats
    that agree (1.10 and 1.10) add nothing, nor does a sweep without repeats."""
    rows = []
    for point, ratios in enumerate([(1.30, 0.95), (1.10, 1.10)]):
        for repeat, r in enumerate(ratios):
            for setting, thr in (("overlap", 100.0 * r), ("normal", 100.0)):
                rows.append({"point": point, "workload.concurrency": [1, 8][point], "setting": setting,
                             "repeat": repeat, "seed": repeat, "output_throughput": thr, "median_tpot_ms": 3.0,
                             "completed": 10, "outcome": "ok"})
    table = pd.DataFrame(rows)
    quiet = SimpleNamespace(run_gpu_cv=0.0, run_cpu_cv=0.0)
    line = sweep_verdict_text(table, quiet).line()
    assert "keep overlap on" in line and "workload.concurrency=1 (1.111x)" in line
    assert "the 95% interval of the ratio over the repeats includes 1 at workload.concurrency=1 (" in line
    assert "over 2 repeats)" in line and "workload.concurrency=8 (1." not in line.split("includes 1 at")[1]
    assert "includes 1" not in sweep_verdict_text(table[table["repeat"] == 0], quiet).line()


class _Server:
    """A server section as grounded reads it: its caveats and whether it serves another model."""

    def __init__(self, caveats=(), other_model=False):
        self.caveats, self.other_model = list(caveats), other_model

    def verdict_caveats(self, meta):
        return self.caveats

    def rests_on_another_model(self, meta):
        return self.other_model


def _sweep_rows(points, extrapolated=(0, 0, 0), far=(0, 0, 0), farthest=(1.0, 1.0, 1.0)):
    rows = []
    for point, (a, b) in enumerate(points):
        for repeat in range(2):
            for setting, thr in (("overlap", a), ("normal", b)):
                rows.append({"point": point, "workload.concurrency": [1, 8, 64][point], "setting": setting,
                             "repeat": repeat, "seed": repeat, "output_throughput": thr, "median_tpot_ms": 3.0,
                             "completed": 10, "outcome": "ok", "run_steps": 100, "num_steps": 90,
                             "extrapolated_steps": extrapolated[point], "far_steps": far[point],
                             "max_extrapolation": farthest[point]})
    return pd.DataFrame(rows)


def test_a_sweeps_points_are_grounded_as_runs_are():
    # three points of 1.10x: by hand, each setting's 2 repeats x 100 steps; point 1 has 30 of its
    # 400 steps beyond the data (7.5%, up to x2), point 2 has 160 (40%) beyond x4 (FAR_SHARE 10%):
    # cannot tell there
    table = _sweep_rows([(110.0, 100.0)] * 3, extrapolated=(0, 15, 80), far=(0, 0, 80), farthest=(1.0, 2.0, 6.5))
    quiet = SimpleNamespace(run_gpu_cv=0.0, run_cpu_cv=0.0)
    bare = sweep_verdict_text(table, quiet).line()  # (no grounds: the ratio alone, as before)
    assert "cannot tell" not in bare and "beyond" not in bare.split("[")[0]
    grounds = {i: (_Server(), {"model": {"name": "m"}}, False, [], False) for i in range(3)}
    line = sweep_verdict_text(table, quiet, grounds=grounds).line()
    assert "keep overlap on (do not pass --disable-overlap-schedule) at workload.concurrency=1 (1.100x), " \
           "workload.concurrency=8 (1.100x)" in line
    assert "cannot tell from what the profile knows (keep the default: overlap on) at workload.concurrency=64" in line
    assert "at 2 of 3 points steps priced beyond the profile's measured data (up to x6.5 its range, as the ratio " \
           "of x + 1 and the measured edge + 1; at 1 of them, steps beyond x4" in line
    # placeholders, a caveat, the stated uncertainties not simulated, another model's costs
    grounds = {i: (_Server(["a caveat"], other_model=i == 0), None, True, ["host phases ±40%"], False) for i in range(3)}
    line = sweep_verdict_text(_sweep_rows([(110.0, 100.0)] * 3), quiet, grounds=grounds).line()
    assert "cannot tell from what the profile knows (keep the default: overlap on) at workload.concurrency=1 (1.100x)" \
        in line
    assert "; on the scenario's inline cost terms (placeholders" in line and line.count("; a caveat") == 1
    assert "not simulated over host phases ±40% (a sweep runs no corners: `overlap-sim run` of a point gives its " \
           "range): the answers' range is unknown" in line
    one = sweep_verdict_text(_sweep_rows([(110.0, 100.0)]), quiet, grounds={0: grounds[0]}).line()  # one point: a run's line
    assert one.startswith("verdict: cannot tell") and "(a sweep runs no corners" in one and "; a caveat" in one


def test_a_sweep_says_at_which_points_an_open_loops_queue_grew():
    table = _sweep_rows([(110.0, 100.0)] * 3)
    table["duration_s"], table["median_ttft_ms"] = 100.0, 500.0
    table["ttft_growth"] = [0.0] * 4 + [0.3] * 4 + [0.3, 0.0] * 2  # point 1: both settings; point 2: overlap's
    quiet = SimpleNamespace(run_gpu_cv=0.0, run_cpu_cv=0.0)
    grounds = {i: (_Server(), None, False, [], True) for i in range(3)}
    line = sweep_verdict_text(table, quiet, grounds=grounds).line()
    assert "; at 2 of 3 points the queue grew through the run (an open loop near or above capacity" in line
    closed = {i: (_Server(), None, False, [], False) for i in range(3)}  # a closed loop: its arrivals wait
    assert "queue grew" not in sweep_verdict_text(table, quiet, grounds=closed).line()
    one = sweep_verdict_text(table[table["point"] == 2], quiet, grounds=grounds).line()
    assert "the queue grew through the run with overlap (TTFT +300 ms per second of arrivals)" in one
    table["ttft_growth"] = 1.25  # beyond a second a second: in seconds
    assert "(TTFT +1.25 s and +1.25 s per second of arrivals)" in sweep_verdict_text(table[table["point"] == 2], quiet,
                                                                                    grounds=grounds).line()


def test_title_names_card_and_model():
    meta = {"device_name": "NVIDIA H200", "model": {"name": "llama-3.2-1b"}}
    assert run_title("q", 0, "cuda", meta) == "q (seed 0, cuda): NVIDIA H200, llama-3.2-1b"
    meta["transfer"] = {"from_device_name": "NVIDIA H200", "uncertainty_rel": 0.3}
    meta["device_name"] = "NVIDIA L4"
    assert run_title("q", 0, "cuda", meta) == "q (seed 0, cuda): NVIDIA L4 (transferred from NVIDIA H200, ±30%), llama-3.2-1b"
    assert "no calibration profile" in run_title("q", 0, "cuda", None)


def test_run_prints_the_verdict(tmp_path, capsys):
    assert main(["run", "scenarios/quickstart.yaml", "--no-plots", "--tables", "none", "--out", str(tmp_path / "r"),
                 "--run-cv", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "quickstart (seed 0, cuda): NVIDIA H200, llama-3.2-1b" in out
    assert "verdict: no difference a single A/B run could see" in out and "assumed 10.0%, --run-cv" in out


def test_bad_run_cv_is_one_line(tmp_path, capsys):
    assert main(["run", "scenarios/quickstart.yaml", "--out", str(tmp_path / "r"), "--run-cv", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--run-cv" in err and not (tmp_path / "r").exists()


@settings(max_examples=200, deadline=None)
@given(st.floats(0.2, 5.0), st.floats(0.0, 0.5))
def test_rule_is_symmetric_and_monotone(ratio, cv):
    a, b = decide(ratio, cv), decide(1 / ratio, cv)
    assert (a == KEEP) == (b == OFF) and (a == UNSEEN) == (b == UNSEEN)
    if a == UNSEEN:  # more noise never makes a difference visible
        assert decide(ratio, cv * 1.5 + 1e-3) == UNSEEN
    assert visible_cv(ratio) == pytest.approx(visible_cv(1 / ratio), rel=1e-9, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.floats(0.001, 1.0))
def test_visible_cv_inverts_the_threshold(cv):
    t = threshold_ratio(cv)
    assert visible_cv(t) == pytest.approx(cv, rel=1e-9)
    assert decide(t * 1.0001, cv) == KEEP and decide(t / 1.0001, cv) == UNSEEN


def test_the_verdict_is_in_summary_json_and_run_json(tmp_path, capsys):
    import json
    from pathlib import Path

    scenario = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"
    assert main(["run", str(scenario), "--no-plots", "--json", "--out", str(tmp_path / "r")]) == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert printed["verdict"] == saved["verdict"]
    v = saved["verdict"]
    assert v["answer"] == KEEP and v["settings"] == ["overlap", "normal"]
    ratio = saved["settings"]["overlap"]["output_throughput"] / saved["settings"]["normal"]["output_throughput"]
    assert v["throughput_ratio"] == pytest.approx(ratio)
    assert v["threshold_ratio"] == pytest.approx(math.exp(1.96 * math.sqrt(2 * math.log(1 + DEFAULT_RUN_CV ** 2))), rel=1e-5)
    assert v["line"].startswith("verdict: keep overlap on")


def test_vllm_on_cpu_says_the_flag_is_ignored_there(tmp_path, capsys):
    """vLLM 0.32's CPU platform turns async scheduling off whatever the command says
    (platforms/cpu.py:329-331): the run says so under its verdict, and only there."""
    from sim.engines.sglang.server import Server
    from sim.engines.vllm.server import VllmServer

    cpu = VllmServer(engine="vllm", device="cpu", settings=["async", "sync"])
    note = verdict_platform_note(cpu)
    assert note.startswith("note: vLLM 0.32.0 on cpu runs the synchronous loop") and "platforms/cpu.py" in note
    assert verdict_platform_note(VllmServer(engine="vllm", device="cuda", settings=["async", "sync"])) is None
    assert verdict_platform_note(Server(device="cpu")) is None  # SGLang's CPU engine runs its overlap loop

    root = Path(__file__).resolve().parents[1]
    assert main(["run", str(root / "scenarios/vllm-cpu.yaml"), "--out", str(tmp_path / "r"), "--no-plots",
                 "--tables", "none"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("verdict: keep async scheduling on"))
    start = next(i for i in range(at + 1, len(lines)) if not lines[i].startswith("  "))  # (the verdict's clauses)
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("    "))  # (the note, wrapped)
    assert " ".join(lines[start:end]).split() == note.split()
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["verdict"]["platform_note"] == note


def test_a_percentage_given_as_run_cv_is_refused_with_the_fraction(run_cli, tmp_path):
    code, _, err = run_cli(["run", "scenarios/quickstart.yaml", "--out", tmp_path / "r", "--run-cv", "10"])
    assert code == 2 and "0.1 for 10%" in err and err.count("\n") == 1


def test_a_ttft_tail_the_medians_hide_is_said():
    from sim.whatif.verdict import TAIL_RATIO

    a, b = _summ(1016.0), _summ(1000.0)
    a.update(median_ttft_ms=22.06, p99_ttft_ms=102.7)
    b.update(median_ttft_ms=22.08, p99_ttft_ms=25.91)
    line = verdict({"async": a, "sync": b}, 0.02, "t").line()
    assert ", median TTFT 22.06 vs 22.08 ms, p99 TTFT 102.70 vs 25.91 ms;" in line
    assert verdict({"async": a, "sync": b}, 0.02, "t").as_json()["ttft_p99_ms"] == [102.7, 25.91]
    a["p99_ttft_ms"] = 25.91 * TAIL_RATIO  # at the ratio: not beyond it
    assert "p99 TTFT" not in verdict({"async": a, "sync": b}, 0.02, "t").line()
    del a["p99_ttft_ms"]
    assert "p99 TTFT" not in verdict({"async": a, "sync": b}, 0.02, "t").line()


def test_speculative_decoding_without_its_host_curves_is_outside_the_range(run_cli, tmp_path):
    code, out, err = run_cli(["run", ROOT / "scenarios" / "vllm-h200-eagle.yaml", "--tables", "none", "--no-plots",
                              "--set", "workload.num_requests=24", "--set", "workload.warmup_requests=0",
                              "--out", tmp_path / "e"])
    assert code == 0, err
    line = verdict_of(out)
    assert "the drafter's own host work per step is not modelled (the profile has no speculative curves; " \
           "against vLLM's CPU server with a draft model that left throughput 36% high and TPOT 29% low): " \
           "outside any range below; over host phases" in line


def test_the_printed_verdict_is_its_answer_then_a_clause_an_item():
    from sim.output.text import VerdictText

    said = VerdictText("verdict: keep overlap on", ("output throughput 1.2x", "one A/B run shows it"), "CV 2%")
    assert said.line() == "verdict: keep overlap on: output throughput 1.2x; one A/B run shows it [CV 2%]"
    assert said.block(80) == ("verdict: keep overlap on\n  - output throughput 1.2x\n  - one A/B run shows it\n"
                              "  - CV 2%")
    long = VerdictText("verdict: x", ("aaaa " * 20,))  # 100 characters: wrapped at 40, continued by 4 spaces
    lines = long.block(40).splitlines()
    assert lines[1].startswith("  - aaaa") and all(line.startswith("    aaaa") for line in lines[2:])
    assert all(len(line) <= 40 for line in lines) and verdict_of(long.block(40)) == long.line().rstrip()
    assert VerdictText("verdict: x").block(10) == "verdict: x"  # (the width is at least 40)
    from sim.output.text import wrapped

    # a unit stays on its number's line; the line reads back the same
    assert wrapped("a" * 33 + " 25.38 ms", 40) == ["a" * 33, "    25.38 ms"]  # (not "... 25.38" and "ms")
    assert wrapped("a" * 30 + " 3 requests", 40) == ["a" * 30, "    3 requests"]
    assert wrapped("TPOT 4.106 vs 5.962 ms", 100) == ["TPOT 4.106 vs 5.962 ms"]


@settings(max_examples=200, deadline=None)
@given(clauses=st.lists(st.text(st.sampled_from("ab;:(). -x"), min_size=1, max_size=300)
                        .map(lambda t: " ".join(t.split())).filter(bool), max_size=6),
       width=st.integers(min_value=1, max_value=400))
def test_the_printed_verdict_reads_back_as_its_line(clauses, width):
    """Any clauses at any width: no printed line overruns the width but a single word longer than it,
    and the block read back (tests.helpers.verdict_of) is the one-line form."""
    from sim.output.text import VerdictText

    said = VerdictText("verdict: keep overlap on (do not pass --disable-overlap-schedule)", tuple(clauses))
    block = said.block(width)
    for line in block.splitlines():
        assert len(line) <= max(40, width) or " " not in line.strip().removeprefix("- ")
    assert verdict_of(block) == said.line()
