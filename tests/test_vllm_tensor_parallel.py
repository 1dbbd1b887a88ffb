"""vLLM tensor parallelism: priced by a profile measured at that size (one engine core, N workers
in lockstep; the broadcast of ``execute_model`` to the ranks in dispatch, the all-reduces in the
forward, rank 0's phases). Closed forms first, then the refusals and the trace's rank choice."""

from __future__ import annotations

import json

import numpy as np
import pytest

import sim
from calibrate.errors import CalibrationInputError
from calibrate.real.vllm import trace as vllm_trace
from calibrate.real.vllm.sessions import VllmGrid, tp_bind
from tests.test_vllm_loops import steady, total
from tests.vllm_helpers import CONSTANT, make_profile, vllm_scenario
from tests.helpers import verdict_of


def tp_profile(tmp_path, tp: int, costs: dict | None = None, name: str = "tp.json") -> str:
    profile = make_profile(costs)
    profile["metadata"]["tensor_parallel_size"] = tp
    path = tmp_path / name
    path.write_text(json.dumps(profile))
    return str(path)


def test_tp_1_is_the_plain_model_exactly(tmp_path):
    """A profile that says TP 1 (or nothing) and a scenario at TP 1 (the default): the same run."""
    plain = sim.simulate(vllm_scenario(profile=tp_profile(tmp_path, 1, name="a.json")), "async").summary()
    said = sim.simulate(vllm_scenario(profile=tp_profile(tmp_path, 1, name="b.json"),
                                      server__tensor_parallel_size=1), "async").summary()
    assert plain == said


@pytest.mark.parametrize("broadcast", [1e-4, 3e-3])
def test_the_broadcast_moves_the_ratio_as_max_against_sum(tmp_path, broadcast):
    """At TP 2 the profile's dispatch carries the broadcast to the ranks: synchronously the step
    is the sum of the engine core's and the worker's work; under async the larger of the engine
    core (schedule + dispatch + update) and the worker (prepare + forward + sample)."""
    c = {**CONSTANT, "dispatch": broadcast}
    path = tp_profile(tmp_path, 2, {"dispatch": broadcast})
    sync, _ = steady(sim.simulate(vllm_scenario(profile=path, server__tensor_parallel_size=2), "sync"))
    async_, _ = steady(sim.simulate(vllm_scenario(profile=path, server__tensor_parallel_size=2), "async"))
    cpu = total(c, "schedule", "dispatch", "prepare", "roundtrip", "sample", "collect", "update")
    np.testing.assert_allclose(sync, cpu + c["forward"], rtol=1e-9)
    core, worker = total(c, "schedule", "dispatch", "update"), total(c, "prepare", "forward", "sample")
    np.testing.assert_allclose(async_, max(core, worker), rtol=1e-9)
    ratio = (cpu + c["forward"]) / max(core, worker)
    assert np.median(sync) / np.median(async_) == pytest.approx(ratio, rel=1e-9)


@pytest.mark.parametrize("scenario_tp, profile_tp", [(2, 1), (1, 2), (4, 2)])
def test_a_tp_the_profile_was_not_measured_at_is_refused_by_field(tmp_path, run_cli, scenario_tp, profile_tp):
    import yaml

    scen = vllm_scenario(profile=tp_profile(tmp_path, profile_tp), server__tensor_parallel_size=scenario_tp)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scen))
    out = tmp_path / "out"
    code, _, err = run_cli(["run", str(path), "--out", str(out)])
    assert code == 2 and "server.tensor_parallel_size" in err and f"size {profile_tp}" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("written", ["2", 0, True, 2.5])
def test_a_profile_whose_tp_size_is_not_a_whole_number_is_refused_not_taken_as_tp_1(tmp_path, run_cli, written):
    import yaml

    scen = vllm_scenario(profile=tp_profile(tmp_path, written))
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scen))
    code, _, err = run_cli(["run", str(path), "--out", str(tmp_path / "out")])
    assert code == 2 and "metadata.tensor_parallel_size" in err and len(err.strip().splitlines()) == 1


def test_inline_costs_at_tp_say_they_are_taken_as_given():
    from sim.engines.vllm.server import VllmServer

    srv = VllmServer(engine="vllm", tensor_parallel_size=2)
    assert any("tensor_parallel_size 2" in w and "none of it measured" in w for w in srv.warnings(None))
    assert any("measured at that size" in w for w in srv.warnings({"tensor_parallel_size": 2}))
    assert VllmServer(engine="vllm").warnings(None) == []


def test_the_launch_flag_sets_the_server_field():
    from sim.engines.vllm.rules.launch_args import parse_launch_args

    launch = parse_launch_args(["vllm", "serve", "M", "-tp", "2"], platform="cpu")
    assert launch.server["tensor_parallel_size"] == 2
    assert dict(launch.flags)["-tp 2"] == "modelled"
    on_card = dict(parse_launch_args(["vllm", "serve", "M", "-tp", "2"], platform="cuda").flags)["-tp 2"]
    assert on_card.startswith("refused: not modelled (tensor parallelism on cuda")
    launch = parse_launch_args(["vllm", "serve", "M", "--pipeline-parallel-size", "2"])
    assert dict(launch.flags)["--pipeline-parallel-size 2"].startswith("refused")


@pytest.mark.parametrize("tp, cores, bind", [(1, 2, "0-1"), (2, 2, "0|1"), (2, 8, "0-3|4-7"), (3, 8, "0-1|2-3|4-7")])
def test_each_rank_gets_its_own_cores(tp, cores, bind):
    assert tp_bind(tp, cores) == bind


def test_more_ranks_than_cores_are_refused():
    with pytest.raises(CalibrationInputError, match="--tensor-parallel-size"):
        tp_bind(3, 2)


def test_the_grid_serves_at_its_tp():
    grid = VllmGrid(tensor_parallel_size=2)
    assert grid.server_args()[-2:] == ["--tensor-parallel-size", "2"] and "VLLM_CPU_OMP_THREADS_BIND" in grid.server_env()
    assert "--tensor-parallel-size" not in VllmGrid().server_args() and VllmGrid().server_env() == {}


def _worker_file(path, rank, dur):
    recs = [{"ph": "execute", "t0": 1.0, "dur": dur, "cpu": dur, "n_tok": 1, "n": 1, "rank": rank},
            {"ph": "sample", "t0": 1.0 + dur, "dur": 1e-4, "cpu": 1e-4}]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_the_trace_of_a_tp_server_is_read_at_rank_0(tmp_path):
    (tmp_path / "trace.1.jsonl").write_text(json.dumps({"ph": "schedule", "t0": 0.5, "dur": 1e-4, "reqs": ["a"],
                                                        "tok": [1], "done": [5]}) + "\n")
    _worker_file(tmp_path / "trace.2.jsonl", 1, 0.009)
    _worker_file(tmp_path / "trace.3.jsonl", 0, 0.007)
    _, worker = vllm_trace.read_files(sorted(tmp_path.glob("trace.*.jsonl")))
    assert [r["dur"] for r in worker if r["ph"] == "execute"] == [0.007]
    (tmp_path / "trace.3.jsonl").unlink()
    _worker_file(tmp_path / "trace.4.jsonl", None, 0.007)
    with pytest.raises(CalibrationInputError, match="no rank 0"):
        vllm_trace.read_files(sorted(tmp_path.glob("trace.*.jsonl")))


class _FrontCosts:
    """frontend_out L, frontend_work W (None: no curve, the whole latency taken in turn)."""

    def __init__(self, latency_s, work_s):
        self.latency_s, self.work_s = latency_s, work_s

    def frontend_s(self, kind, num_reqs):
        if kind == "work":
            return self.latency_s if self.work_s is None else self.work_s
        return self.latency_s if kind == "out" else 0.0

    def frontend_in_line(self):
        return 0.0, 0.0

    def frontend_in_edge(self):
        return None


@pytest.mark.parametrize("work", [None, 0.0005])
def test_the_api_server_takes_only_its_own_work_in_turn(work):
    """Steps' outputs 4 ms apart, frontend_out 9 ms: with process_outputs W = 0.5 ms taken in
    turn and the rest latency, each step's tokens arrive 9 ms after its update; with the whole
    9 ms taken in turn (no curve), they queue: the n-th arrives at 9 n ms."""
    import simpy

    from sim.engines.vllm.frontend import ApiServer

    api = ApiServer(simpy.Environment(), _FrontCosts(0.009, work), lambda *a: None)
    done = [api.egress(0.004 * k, 4) for k in range(1, 5)]
    if work is None:
        assert done == pytest.approx([0.004 + 0.009 * k for k in range(1, 5)])
    else:
        assert done == pytest.approx([0.004 * k + 0.009 for k in range(1, 5)])


def test_the_readme_tp_example_runs_on_the_committed_profile(run_cli, tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    assert "--set server.tensor_parallel_size=2 --set costs.profile=benchmarks/results/profile-vllm-cpu-tp2.json" in readme
    profile = root / "benchmarks" / "results" / "profile-vllm-cpu-tp2.json"
    assert json.loads(profile.read_text())["metadata"]["tensor_parallel_size"] == 2
    code, out, err = run_cli(["run", root / "scenarios" / "vllm-cpu.yaml", "--set", "server.tensor_parallel_size=2",
                              "--set", f"costs.profile={profile}", "--set", "workload.num_requests=16",
                              "--out", tmp_path / "r", "--no-plots"])
    assert code == 0, err
    assert "tensor_parallel_size 2: priced by the profile measured at that size" in out + err


def test_the_verdict_of_a_tp_run_says_its_ratio_is_not_validated(run_cli, tmp_path):
    import yaml

    scen = vllm_scenario(profile=tp_profile(tmp_path, 2), server__tensor_parallel_size=2)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scen))
    code, out, err = run_cli(["run", path, "--out", tmp_path / "r", "--no-plots"])
    assert code == 0, err
    line = verdict_of(out)
    assert "tensor parallel size 2: the async/sync ratio at TP > 1 is not validated" in line
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["verdict"]["caveats"] and "not validated" in summary["verdict"]["caveats"][0]
    plain = tmp_path / "p.yaml"
    plain.write_text(yaml.safe_dump(vllm_scenario(profile=tp_profile(tmp_path, 1, name="one.json"))))
    code, out, _ = run_cli(["run", plain, "--out", tmp_path / "q", "--no-plots"])
    assert code == 0 and "tensor parallel size" not in out
