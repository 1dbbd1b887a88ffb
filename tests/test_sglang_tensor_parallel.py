"""Tensor parallelism in the SGLang model (``server.tp_size``): closed forms first, then the
refusals, then the calibration's parts (the rank-0 trace, the waves as server loads).

SGLang 0.5.23 at TP N runs one scheduler per rank in lockstep: rank 0 receives and broadcasts the
requests (in ``recv``), every forward waits for its all-reduces. The simulator runs rank 0's loop
with the phases measured at that size, so with constant costs the closed forms of
tests/test_closed_forms.py hold with rank 0's costs: a broadcast b added to recv moves normal's
step by b (cpu + b + gpu) and overlap's only when the CPU becomes the bound
(max(cpu + b, gpu)).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import sim
from sim.errors import ScenarioError
from tests.helpers import constant_scenario
from tests.test_closed_forms import steady_decode

GPU, RECV, SCHEDULE, LAUNCH, PROCESS = 0.004, 1e-4, 2e-4, 3e-4, 4e-4
CPU = RECV + SCHEDULE + LAUNCH + PROCESS


def _summary(res) -> dict:
    return {k: v for k, v in res.summary().items() if k != "wall_s"}


def test_tp_1_is_todays_model_exactly():
    base = constant_scenario(c=6, num_requests=18, output_len=40)
    for setting in ("normal", "overlap"):
        a = _summary(sim.simulate(base, setting))
        b = _summary(sim.simulate({**base, "server": {**base["server"], "tp_size": 1}}, setting))
        assert a == b


@pytest.mark.parametrize("broadcast", [2e-4, 5e-3])  # under the forward's slack, then over it
def test_a_broadcast_in_recv_moves_normal_by_its_sum_and_overlap_by_the_max(broadcast):
    scen = constant_scenario(gpu=GPU, recv=RECV + broadcast, schedule=SCHEDULE, launch=LAUNCH, process=PROCESS,
                             output_len=60, server__tp_size=2)
    normal, _ = steady_decode(sim.simulate(scen, "normal"))
    overlap, _ = steady_decode(sim.simulate(scen, "overlap"))
    np.testing.assert_allclose(normal, CPU + broadcast + GPU, rtol=1e-9)
    np.testing.assert_allclose(overlap, max(CPU + broadcast, GPU), rtol=1e-9)


def test_inline_costs_at_tp_2_are_said_to_be_given_and_the_verdict_says_what_is_not_validated(tmp_path, run_cli):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(constant_scenario(server__tp_size=2)))
    code, out, _ = run_cli(["run", str(path), "--out", str(tmp_path / "o"), "--no-plots"])
    assert code == 0
    flat = " ".join(out.split())
    assert "server.tp_size 2: the inline costs are taken as those of the TP-2 server as given" in flat
    verdict = flat[flat.index("verdict:"):]
    assert "tp_size 2: the overlap/normal ratio at TP > 1 is not validated" in verdict


# --- refusals --------------------------------------------------------------------------------

def test_a_profile_of_another_tp_size_is_refused_by_field(tmp_path):
    from tests.calibrate_helpers import synthetic_profile

    prof = synthetic_profile()
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    scen = constant_scenario(server__tp_size=2, server__device="cpu", costs={"profile": str(path)})
    with pytest.raises(ScenarioError) as err:
        sim.simulate(scen, "overlap")
    msg = str(err.value)
    assert "server.tp_size" in msg and "measured at tensor parallel size 1" in msg and "--tensor-parallel-size 2" in msg
    prof["metadata"]["tp_size"] = 2
    path.write_text(json.dumps(prof))
    assert sim.simulate(scen, "overlap").summary()["completed"] == 4
    with pytest.raises(ScenarioError):  # and a TP-2 profile for a TP-1 scenario
        sim.simulate(constant_scenario(server__device="cpu", costs={"profile": str(path)}), "overlap")


@pytest.mark.parametrize("written, size", [(2.0, 2), ("2", None), (0, None), (True, None), (1.5, None), (-1, None)])
def test_a_profiles_tp_size_is_a_whole_number_or_the_profile_is_refused(tmp_path, written, size):
    from sim.errors import ProfileError
    from tests.calibrate_helpers import synthetic_profile

    prof = synthetic_profile()
    prof["metadata"]["tp_size"] = written
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    scen = constant_scenario(server__tp_size=2, server__device="cpu", costs={"profile": str(path)})
    if size is None:  # not silently TP 1: the profile is refused, naming its field
        with pytest.raises(ProfileError, match="metadata.tp_size"):
            sim.simulate(scen, "overlap")
    else:
        assert sim.simulate(scen, "overlap").summary()["completed"] == 4


def test_the_launch_flag_sets_tp_size_on_the_cpu_server_and_is_refused_on_a_card():
    scen = constant_scenario(server__device="cpu", server__launch_args=["--model-path", "m", "--tp-size", "2"])
    scen["server"].pop("settings")
    assert sim.load_scenario(scen).server.tp_size == 2
    card = constant_scenario(server__launch_args=["--model-path", "m", "--tp", "2"])
    card["server"].pop("settings")
    with pytest.raises(ScenarioError) as err:
        sim.load_scenario(card)
    assert "tensor parallelism on cuda" in str(err.value)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "two", 65])
def test_bad_tp_sizes_are_refused_by_field(bad):
    with pytest.raises(ScenarioError) as err:
        sim.load_scenario(constant_scenario(server__tp_size=bad))
    assert "tp_size" in str(err.value)


# --- the calibration's parts -------------------------------------------------------------------

def _trace(path, rank, scheduler=True):
    recs = [{"ph": "init", "t0": 0.0, "dur": 0.1, "cpu": 0.1, "tp_rank": rank, "tp_size": 2}]
    if scheduler:
        recs.append({"ph": "schedule", "t0": 1.0, "dur": 1e-4, "cpu": 1e-4, "batch": None})
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_rank_zeros_trace_is_the_one_priced(tmp_path):
    from calibrate.errors import CalibrationInputError
    from calibrate.real.sglang_trace import rank_zero

    a, b = _trace(tmp_path / "trace.1.jsonl", 1), _trace(tmp_path / "trace.2.jsonl", 0)
    other = tmp_path / "trace.3.jsonl"
    other.write_text(json.dumps({"ph": "recv", "t0": 0.0, "dur": 0.0, "cpu": 0.0}) + "\n")
    assert rank_zero([a, b, other]) == [b, other]
    with pytest.raises(CalibrationInputError):
        rank_zero([a])


def test_the_calibrations_waves_become_server_loads_and_the_ranks_their_cores():
    from calibrate.errors import CalibrationInputError
    from calibrate.real.sglang_profile import SglangGrid, design, design_loads, tp_launch

    grid = SglangGrid(decode_batch_sizes=(1, 4), decode_contexts=(128,), decode_waves=1, extend_tokens=(16,),
                      extend_prefixes=(0, 256), extend_repeats=1)
    d = design(grid)
    loads = design_loads(d)
    assert [(l["concurrency"], len(l["requests"])) for l in loads] == [(1, 1), (4, 4), (1, 3)]
    assert [r["rid"] for r in loads[-1]["requests"]] == [r["rid"] for w in d.waves[2:] for r in w]
    assert tp_launch(1) == ([], {})
    args, env = tp_launch(2)
    assert args == ["--tp-size", "2"] and set(env) == {"SGLANG_CPU_OMP_THREADS_BIND"}
    with pytest.raises(CalibrationInputError):
        tp_launch(10 ** 4)


@pytest.mark.parametrize("args, words", [
    (["--tensor-parallel-size", "2", "--structured-output"], "--structured-output"),
    (["--tensor-parallel-size", "2", "--host-only"], "--host-only"),
    (["--tensor-parallel-size", "0"], ">= 1"),
    (["--tensor-parallel-size", "4096"], "cores"),
])
def test_the_tp_calibrations_bad_flags_are_one_line(tmp_path, capsys, args, words):
    from sim.cli import main

    assert main(["calibrate", "--engine", "sglang", *args, "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tensor-parallel-size" in err[0] and words in err[0]
    assert not (tmp_path / "p.json").exists()


def test_the_committed_tp2_profile_runs_the_readme_example(run_cli, tmp_path):
    """README: quickstart on the CPU server at TP 2 with benchmarks/results/profile-sglang-cpu-tp2.json."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    profile = root / "benchmarks" / "results" / "profile-sglang-cpu-tp2.json"
    assert json.loads(profile.read_text())["metadata"]["tp_size"] == 2
    code, out, _ = run_cli(["run", str(root / "scenarios" / "quickstart.yaml"), "--set", "server.device=cpu",
                            "--set", "server.tp_size=2", "--set", f"costs.profile={profile}", "--tables", "none",
                            "--out", str(tmp_path / "o")])
    assert code == 0 and "not validated on a host with cores for every rank" in " ".join(out.split())
    assert "--tp-size 2" in (root / "README.md").read_text()
