"""Where running is right but the answer is approximate, the output says so, naming the value
(the warning channel: ``run`` and ``sweep`` print it, ``summary.json`` carries it), and what
cannot be written stops with one line (sim.atomic)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.errors import UserInputError
from tests.helpers import unwrapped, verdict_of

BASE = {"name": "w", "seed": 0,
        "workload": {"arrival": "closed_loop", "concurrency": 2, "num_requests": 4, "input_len": 16, "output_len": 4},
        "server": {"settings": ["overlap", "normal"], "kv_pool_tokens": 4096}}


def _scenario(tmp_path, **server) -> str:
    d = json.loads(json.dumps(BASE))
    d["server"].update(server.pop("server", {}))
    d["workload"].update(server.pop("workload", {}))
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


@pytest.mark.parametrize("change, words", [
    ({"server": {"launch_args": ["--log-level", "debug"]}}, "server.launch_args: --log-level debug"),
    ({"server": {"settings": ["overlap_mlx", "normal"], "device": "cuda"}}, "overlap_mlx on server.device cuda"),
    ({"server": {"settings": ["thread_overlap", "normal"], "device": "mlx"}}, "thread_overlap on server.device mlx"),
    ({"workload": {"output_len": 0}}, "workload.output_len 0"),
    ({"workload": {"input_len": {"dist": "choice", "values": [0, 64]}}}, "workload.input_len can be 0"),
    ({"server": {"version": "9.9.9"}}, "server.version 9.9.9 is newer than any release checked"),
    ({"server": {"version": "0.0.1"}}, "server.version 0.0.1 is older than any release checked (0.5.3)"),
    ({"workload": {"output_len": 4100}}, "reach 4116 tokens, beyond the 4094 that server.kv_pool_tokens"),
    ({"server": {"context_length": 20}}, "beyond the 18 that server.context_length lets one request reach"),
    ({"workload": {"num_requests": 3}}, "workload.concurrency 2 with 3 measured requests: each client sends fewer "
                                        "than 2 of them, so the run is about one wave"),
])
def test_approximate_answers_say_so(run_cli, tmp_path, change, words):
    path = _scenario(tmp_path, **change)
    code, out, err = run_cli(["run", path, "--out", tmp_path / "r", "--no-plots"])
    assert code in (0, 3), err
    assert any(line.startswith("warning:") and words in line for line in unwrapped(out))
    assert any(words in w for w in json.loads((tmp_path / "r" / "summary.json").read_text())["warnings"])
    code, out, err = run_cli(["sweep", path, "--grid", "workload.concurrency=1,2", "--out", tmp_path / "sw",
                              "--workers", "1", "--no-plots"])
    assert code == 0, err
    assert words in out


def test_a_plain_scenario_has_no_warnings(run_cli, tmp_path):
    code, out, _ = run_cli(["run", _scenario(tmp_path), "--out", tmp_path / "r", "--no-plots"])
    assert code == 0 and "warning:" not in out
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["warnings"] == []  # as --json gives them


def test_summary_json_carries_what_json_prints(run_cli, tmp_path):
    """The quickstart's profile (CPU phases from the bookkeeping re-implementation) warns under
    the table: ``--json`` and ``summary.json`` carry the same lines."""
    quickstart = os.path.join(os.path.dirname(__file__), "..", "scenarios", "quickstart.yaml")
    args = ["run", quickstart, "--set", "workload.num_requests=12", "--set",
            "workload.warmup_requests=2", "--no-plots", "--tables", "none", "--no-range"]
    code, out, err = run_cli(args + ["--json", "--out", tmp_path / "j"])
    assert code == 0, err
    printed = json.loads(out)["warnings"]
    assert printed and printed == json.loads((tmp_path / "j" / "summary.json").read_text())["warnings"]


def test_a_cut_log_line_is_named_not_parsed(run_cli, tmp_path):
    from tests.conftest import ROOT

    log = tmp_path / "cut.log"
    log.write_text((ROOT / "docs/examples/sglang-server.log").read_text()
                   + "[2026-11-20 10:00:03] Decode batch, #running-req: 8, #token: 4096, gen throughput (tok\n")
    code, out, err = run_cli(["log", log, "--out", tmp_path / "l"])
    assert code == 0 and "1 'Prefill/Decode batch' line(s) cut short" in err


def test_another_grid_in_a_used_sweep_folder_is_said_and_the_manifest_follows_the_table(run_cli, tmp_path):
    path = _scenario(tmp_path)
    out = tmp_path / "sw"
    assert run_cli(["sweep", path, "--grid", "workload.concurrency=1,2", "--out", out, "--workers", "1",
                    "--no-plots"])[0] == 0
    code, stdout, _ = run_cli(["sweep", path, "--grid", "workload.concurrency=1,3", "--out", out, "--workers", "1",
                               "--no-plots"])
    assert code == 0 and "holds a finished sweep of another grid" in stdout
    manifest = json.loads((out / "sweep.json").read_text())
    import pandas as pd

    table = pd.read_csv(out / "sweep.csv")
    assert manifest["grid"] == {"workload.concurrency": [1, 3]}
    assert sorted(table["workload.concurrency"].unique()) == [1, 3]
    code, stdout, _ = run_cli(["sweep", path, "--grid", "workload.concurrency=1,3", "--out", out, "--workers", "1",
                               "--no-plots"])
    assert code == 0 and "another grid" not in stdout  # the same sweep again: a resume


def test_a_write_the_system_refuses_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    from sim import atomic

    def refuse(src, dst):
        raise OSError(30, "Read-only file system", str(dst))

    monkeypatch.setattr(atomic.os, "replace", refuse)
    target = tmp_path / "f.json"
    with pytest.raises(UserInputError) as err:
        with atomic.atomic_path(target) as tmp:
            tmp.write_text("x")
    assert str(target) in str(err.value) and "Read-only" in str(err.value)
    assert os.listdir(tmp_path) == []


def test_the_probe_leaves_the_folder_as_it_was(tmp_path):
    from sim.atomic import check_output_dir

    before = os.stat(tmp_path)
    check_output_dir(tmp_path, "--out")
    after = os.stat(tmp_path)
    assert os.listdir(tmp_path) == [] and after.st_mtime_ns == before.st_mtime_ns


@settings(max_examples=60, deadline=None)
@given(st.integers(-10**6, 10**6), st.sampled_from(["-tp", "-pp", "--max-num-seqs", "--block-size"]))
def test_vllm_launch_ranges_are_the_engines(value, flag):
    from sim.engines.vllm.rules.launch_args import parse_launch_args

    if value >= 1:
        assert parse_launch_args([flag, str(value)]).fields
    else:
        with pytest.raises(UserInputError, match=">= 1"):
            parse_launch_args([flag, str(value)])


@settings(max_examples=60, deadline=None)
@given(st.integers(-10**6, 10**6), st.sampled_from(["--tp-size", "--pp-size", "--max-running-requests"]))
def test_sglang_launch_ranges_are_the_engines(value, flag):
    from sim.engines.sglang.rules.launch_args import parse_launch_args

    if value >= 1:
        assert parse_launch_args([flag, str(value)]).fields
    else:
        with pytest.raises(UserInputError, match=">= 1"):
            parse_launch_args([flag, str(value)])


def test_an_unreachable_dask_scheduler_leaves_nothing(run_cli, tmp_path):
    pytest.importorskip("dask.distributed")
    out = tmp_path / "sw"
    code, _, err = run_cli(["sweep", _scenario(tmp_path), "--grid", "workload.concurrency=1,2", "--executor", "dask",
                            "--scheduler", "tcp://127.0.0.1:1", "--out", out, "--no-plots"])
    assert code == 2 and "--scheduler" in err.strip().splitlines()[-1] and "Traceback" not in err
    assert not out.exists() or not any(out.rglob("*"))


def test_a_relative_engine_python_is_taken_from_the_working_directory(tmp_path, monkeypatch):
    """A relative --engine-python names a file under the working directory, not under the
    repository the modules run in (it was a traceback)."""
    from calibrate.real.environment import find_engine

    fake = tmp_path / "venv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho 0.5.23\n")
    fake.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    engine = find_engine("sglang", "venv/bin/python")
    assert engine.python == fake and engine.python.is_absolute() and engine.version == "0.5.23"


def test_the_verdict_names_placeholders_and_extrapolation(run_cli, tmp_path):
    from tests.conftest import SCENARIOS

    code, out, _ = run_cli(["run", _scenario(tmp_path), "--out", tmp_path / "p", "--no-plots"])
    line = verdict_of(out)
    assert code == 0 and "placeholders: no device was measured" in line
    # 300 clients on the H200 profile: decode batches past its grid of 256
    code, out, _ = run_cli(["run", SCENARIOS / "quickstart.yaml", "--set", "workload.concurrency=300", "--set",
                            "workload.num_requests=600", "--set", "workload.output_len=16", "--set",
                            "server.max_running_requests=300", "--out", tmp_path / "x", "--no-plots", "--json"])
    verdict = json.loads(out)["verdict"]
    assert code == 0 and verdict["extrapolated_share"] > 0
    assert "beyond the profile's measured data" in verdict["line"]


def test_a_moved_profile_states_a_wider_range_than_the_measured_one(run_cli, tmp_path):
    """The H200 profile moved to an H100 by transfer states the forward's ±30% beside the host
    phases' range, and its range is wider than the measured profile's; moved to its own card (the
    forward unchanged, since 6 December 2026) it states none and its range is the measured one's."""
    from tests.conftest import ROOT, SCENARIOS

    measured = ROOT / "scenarios/profiles/h200-llama-3.2-1b.json"
    spans, sources = {}, {}
    for card in ("h100", "h200"):
        assert run_cli(["transfer", measured, "--to", card, "--out", tmp_path / f"{card}.json"])[0] == 0
    for name, prof in (("measured", measured), ("h100", tmp_path / "h100.json"), ("h200", tmp_path / "h200.json")):
        code, out, _ = run_cli(["run", SCENARIOS / "quickstart.yaml", "--set", f"costs.profile={prof}", "--out",
                                tmp_path / name, "--no-plots", "--json"])
        r = json.loads(out)["verdict"]["stated_range"]
        spans[name] = r["ratio_high"] - r["ratio_low"]
        sources[name] = " ".join(r["sources"])
    assert spans["h100"] > spans["measured"] > 0 and "forward ±30%" in sources["h100"]
    assert spans["h200"] == pytest.approx(spans["measured"]) and "forward" not in sources["h200"]


def test_no_range_says_the_range_was_not_simulated(run_cli, tmp_path):
    from tests.conftest import SCENARIOS

    code, out, _ = run_cli(["run", SCENARIOS / "quickstart.yaml", "--no-range", "--no-plots", "--json", "--out",
                            tmp_path / "r"])
    verdict = json.loads(out)["verdict"]
    assert code == 0 and "stated_range" not in verdict and verdict["range_not_simulated"]
    assert "(--no-range): the answer's range is unknown" in verdict["line"]


def test_an_answer_resting_on_the_harness_attention_says_so(run_cli, tmp_path):
    """The shipped H200 profiles' decode attention is calibrate's plain torch (keys gathered
    through req_to_token): where the part of a decode forward that grows with context is a large
    share, the verdict says the device's time is overstated against a production backend."""
    import sim
    from sim.model.profile import load_profile
    from sim.whatif.harness import ATTENTION_SHARE_CAVEAT, attention_caveat

    scenarios = Path(__file__).resolve().parents[1] / "scenarios"
    quickstart = sim.load_scenario(scenarios / "quickstart.yaml")
    meta = load_profile(quickstart.resolve_path(quickstart.costs.profile))["metadata"]
    assert meta["attention"] == "scaled_dot_product_attention" and ATTENTION_SHARE_CAVEAT == 0.25
    # the quickstart: 8 requests at 512 + 256 / 2 = 640 tokens: 13% of the forward (no note)
    assert attention_caveat(quickstart, meta, {"overlap": {"mean_decode_batch_size": 8.0}}) is None
    long = sim.load_scenario(scenarios / "quickstart.yaml", ["workload.input_len=4000", "workload.output_len=500"])
    note = attention_caveat(long, meta, {"overlap": {"mean_decode_batch_size": 7.6}, "normal": {}})
    assert "of a decode forward at this load (batches of up to about 8 requests, about 4,250 tokens of context " \
           "each)" in note and note.startswith("the profile's decode attention is calibrate's plain torch")
    assert "FlashInfer, FA3" in note and "outside any range below" in note
    assert attention_caveat(long, {**meta, "attention": "flashinfer"}, {"overlap": {"mean_decode_batch_size": 8.0}}) is None
    assert attention_caveat(long, {**meta, "device": "cpu"}, {"overlap": {"mean_decode_batch_size": 8.0}}) is None
    assert attention_caveat(long, meta, {"overlap": {"mean_decode_batch_size": float("nan")}}) is None
    assert attention_caveat(long, None, {"overlap": {"mean_decode_batch_size": 8.0}}) is None
    vllm = sim.load_scenario(scenarios / "vllm-h200.yaml", ["workload.input_len=4000", "workload.output_len=500"])
    vmeta = json.loads(vllm.resolve_path(vllm.costs.profile).read_text())["metadata"]
    assert attention_caveat(vllm, vmeta, {"async": {"mean_decode_batch_size": 8.0}}) is not None  # its engine's model
    code, out, err = run_cli(["run", scenarios / "quickstart.yaml", "--set", "workload.input_len=4000", "--set",
                              "workload.output_len=64", "--set", "workload.num_requests=24", "--tables", "none",
                              "--no-plots", "--out", tmp_path / "r"])
    assert code == 0, err
    line = verdict_of(out)
    assert "; the profile's decode attention is calibrate's plain torch" in line


def test_a_sweep_says_at_which_points_its_answers_rest_on_the_harness_attention(run_cli, tmp_path):
    """A sweep's verdict says, over its points, where the run's attention caveat would be said:
    how many, and the largest share with its point (each point's share as a run computes it)."""
    from sim.whatif.harness import attention_sweep_clause

    assert attention_sweep_clause([(0.1, "a=1"), (0.2, "a=2")], 2) == ""
    clause = attention_sweep_clause([(0.1, "a=1"), (0.89, "a=3"), (0.3, "a=2")], 3)
    assert clause.startswith("at 2 of 3 points the profile's decode attention is calibrate's plain torch")
    assert "over 25% of a decode forward (up to 89%, at a=3): there a production backend" in clause
    assert "the device's time and TPOT are overstated and throughput and the host's share understated" in clause
    scenarios = Path(__file__).resolve().parents[1] / "scenarios"
    code, out, err = run_cli(["sweep", scenarios / "quickstart.yaml", "--grid", "workload.input_len=256,4000",
                              "--set", "workload.output_len=64", "--set", "workload.num_requests=24",
                              "--set", "workload.cached_len=0", "--no-plots", "--out", tmp_path / "s"])
    assert code == 0, err
    text = " ".join(out.split())
    assert "at 1 of 2 points the profile's decode attention is calibrate's plain torch" in text
    assert "(up to " in text and "at workload.input_len=4000)" in text
