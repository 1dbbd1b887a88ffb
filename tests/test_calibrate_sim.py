"""Simulating with a calibration profile (``costs.profile``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from calibrate.profile import save_profile
from sim.cli import main
from sim.errors import ScenarioError
from sim.model.profile_costs import ProfileCostModel
from sim.scenario import load_scenario
from sim.simulate import simulate
from tests.calibrate_helpers import synthetic_profile
from tests.helpers import constant_scenario

ROOT = Path(__file__).resolve().parents[1]
GPU, PREFILL, RECV, SCHED, LAUNCH, PROC = 0.004, 0.002, 1e-4, 2e-4, 3e-4, 4e-4


def _constant_profile(tmp_path) -> Path:
    const = lambda v: (lambda *x: v)  # noqa: E731
    prof = synthetic_profile({"forward.decode": const(GPU), "forward.extend": const(PREFILL), "recv": const(RECV),
                              "schedule.extend": const(SCHED), "schedule.decode": const(SCHED),
                              "launch.extend": const(LAUNCH), "launch.decode": const(LAUNCH),
                              "process.extend": const(PROC), "process.decode": const(PROC)})
    # an MLX calibration's: its launch builds the graph, no eager kernels queued ahead of its end (a
    # CUDA torch profile's prefill would start on the device during its launch: tests/test_prefill_launch.py)
    prof["metadata"].update(backend="mlx", device="gpu")
    path = tmp_path / "const.json"
    save_profile(path, prof)
    return path


@pytest.mark.parametrize("setting", ["normal", "overlap", "overlap_mlx"])
def test_constant_profile_matches_inline_constant_costs(tmp_path, setting):
    inline = constant_scenario(gpu=GPU, prefill=PREFILL, recv=RECV, schedule=SCHED, launch=LAUNCH, process=PROC,
                               c=4, num_requests=12)
    with_profile = constant_scenario(c=4, num_requests=12, costs__profile=str(_constant_profile(tmp_path)))
    a, b = simulate(inline, setting), simulate(with_profile, setting)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert b.summary()["extrapolated_steps"] == 0


def test_normal_loop_step_time_closed_form(tmp_path):
    scen = constant_scenario(c=2, output_len=10, settings=("normal",),
                             costs__profile=str(_constant_profile(tmp_path)))
    steps = simulate(scen, "normal").steps
    dec = steps[steps["kind"] == "decode"]
    # normal loop, steady decode: recv + schedule + launch + forward + process back to back
    period = dec["forward_end"].diff().dropna()
    assert period.to_numpy() == pytest.approx(RECV + SCHED + LAUNCH + GPU + PROC, rel=1e-9)


def test_scales_and_residue_apply_to_the_profile(tmp_path):
    prof = synthetic_profile({"forward.decode": lambda n, c: 1e-3 * n, "process.decode": lambda n: 1e-4 * n})
    m = ProfileCostModel(prof, gpu_scale=2.0, cpu_scale=3.0, overlap_residue_s=1e-5)
    assert m.forward_s(1, 4, 4, 4 * 100) == pytest.approx(2 * 4e-3)
    assert m.process_s(1, 4, 4, 400) == pytest.approx(3 * 4e-4)
    assert m.overlap_residue_s == pytest.approx(2e-5)


def test_extend_is_priced_by_tokens_and_each_requests_prefix():
    prof = synthetic_profile({"forward.extend": lambda t, p: 1e-6 * t + 1e-8 * p})
    m = ProfileCostModel(prof)
    # 2 requests, 64 new tokens, 1000 cached tokens in all (mean prefix 500): the tokens priced as
    # one request without prefix, plus what a 500-token prefix adds to each request's 32 tokens
    assert m.forward_s(0, 2, 64, 1000 + 64) == pytest.approx(1e-6 * 64 + 2 * 1e-8 * 500)
    # one request, or no prefix: the curve at (tokens, prefix)
    assert m.forward_s(0, 1, 64, 500 + 64) == pytest.approx(1e-6 * 64 + 1e-8 * 500)
    assert m.forward_s(0, 4, 64, 64) == pytest.approx(1e-6 * 64)


def test_steps_outside_the_grid_are_counted_and_warned(tmp_path, capsys):
    path = tmp_path / "small-grid.json"
    save_profile(path, synthetic_profile(nodes={"num_reqs": [1, 2]}))
    scen = constant_scenario(c=4, num_requests=8, costs__profile=str(path))
    res = simulate(scen, "overlap")
    n_out = int((res.steps["num_reqs"] > 2).sum())
    assert n_out > 0 and res.summary()["extrapolated_steps"] == n_out
    yaml_path = tmp_path / "s.yaml"
    yaml_path.write_text(yaml.safe_dump({**scen, "costs": {"profile": "small-grid.json"}}))  # relative to the file
    assert main(["run", str(yaml_path), "--out", str(tmp_path / "res"), "--no-plots"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert f"warning: overlap: {n_out} steps" in out and "outside the calibration profile's measured data" in out


def test_missing_profile_names_costs_profile(tmp_path, capsys):
    with pytest.raises(ScenarioError) as info:
        load_scenario(constant_scenario(costs__profile=str(tmp_path / "nope.json")))
    assert info.value.field == "costs.profile"
    rc = main(["run", str(ROOT / "scenarios" / "quickstart.yaml"), "--set", "costs.profile=nope.json"])
    err = capsys.readouterr().err
    assert rc == 2 and "costs.profile" in err and "nope.json" in err


def test_quickstart_runs_on_the_shipped_measured_profile():
    scen = load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    assert scen.costs.profile
    path = scen.resolve_path(scen.costs.profile)
    model = ProfileCostModel.from_file(path)
    assert model.describe()["device"] == scen.server.device == "cuda"
    assert model.profile["samples"] and model.profile["metadata"]["decode_mode"] == "cuda_graph"
    res = simulate(scen.with_overrides(["workload.num_requests=24"]), "overlap")
    assert res.summary()["extrapolated_steps"] == 0 and res.summary()["completed"] == 16


def test_simulating_with_a_profile_needs_no_torch_mlx_or_tokenizers(tmp_path):
    import subprocess
    import sys

    code = ("import sys\n"
            "for m in ('torch', 'mlx', 'mlx.core', 'tokenizers'): sys.modules[m] = None\n"
            "from sim.cli import main\n"
            f"rc = main(['run', 'scenarios/quickstart.yaml', '--set', 'workload.num_requests=12', '--out', "
            f"{str(tmp_path)!r}, '--no-plots', '--json'])\n"
            "assert rc == 0\n"
            "main(['calibrate', '--help'])  # argparse exits 0 after printing\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--backend" in proc.stdout
