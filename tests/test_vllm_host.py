"""Host costs from vLLM's server with the forward stubbed (calibrate.host.vllm), read from small
recorded sessions (tests/data/vllm/host/, recorded by record_fixture at the end with the engine);
the end-to-end command runs only where the vLLM environment is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.errors import CalibrationInputError
from calibrate.host.compose import compose
from calibrate.host.vllm import (FRONTEND_HOLD_S, HOST_FUNCTIONS, VllmHostGrid, context_dependence, frontend_design,
                                 host_costs, host_design)
from calibrate.real.vllm import trace as vllm_trace
from calibrate.real.environment import Engine
from sim.engines.vllm.profile import VLLM_CURVES, VLLM_HOST_CURVES
from sim.model.profile import validate_profile
from tests.calibrate_helpers import synthetic_profile

DATA = Path(__file__).resolve().parent / "data" / "vllm" / "host"
# the grid the fixture was recorded with (record_fixture below)
GRID = VllmHostGrid(decode_batch_sizes=(1, 4), contexts=(128,), prefill_tokens=(128,), decode_steps=8, waves=1,
                    prefill_repeats=1, max_model_len=1024)
ORDER = [("sync", "sync"), ("async", "async")]
ENGINE = Engine("vllm", Path("python"), "0.32.0")


def outs() -> list[Path]:
    return [DATA / f"host-{name}" for _, name in ORDER]


def test_recorded_sessions_build_a_host_costs_file():
    ruler = json.loads((DATA / "yardstick.json").read_text())
    host = host_costs(ENGINE, GRID, ORDER, outs(), ruler)
    validate_profile(host, "<host>", VLLM_HOST_CURVES)
    meta = host["metadata"]
    assert meta["kind"] == "host" and meta["engine"] == "vllm" and meta["device"] == "host"
    assert "vllm.forward" not in host["curves"]
    for name in ("vllm.schedule", "vllm.prepare", "vllm.sample", "vllm.update", "vllm.dispatch", "vllm.collect"):
        assert host["curves"][name]["grid"] == [[1.0, 4.0]], name
    # async keeps its own curves; dispatch and roundtrip are measured synchronously only
    own = host["setting_curves"]["async"]
    assert {"vllm.schedule", "vllm.prepare", "vllm.sample", "vllm.update"} <= set(own)
    assert "vllm.dispatch" not in own and "vllm.roundtrip" not in own
    assert set(meta["curve_sources"]) == set(HOST_FUNCTIONS)
    assert all(s["forward"] == "stubbed" for s in meta["curve_sources"].values())
    assert meta["stub"]["replaced"].endswith("GPUModelRunner._model_forward (vLLM 0.32)")
    # the stub sleeps its hold: the forward records time it, and the worker's prepare excludes it
    assert meta["stub"]["stub_forward_median_ms"] == pytest.approx(meta["stub"]["hold_s"] * 1e3, rel=0.5)
    assert {r["num_reqs"] for r in meta["context_dependence"]["host-sync"]} == {1, 4}
    for ratios in meta["contention"].values():
        assert set(ratios) == {"vllm.schedule", "vllm.prepare", "vllm.sample", "vllm.update"}
        assert all(0 < r <= 1.5 for r in ratios.values())
    assert meta["yardstick"]["readings"] and meta["yardstick"]["version"]
    for c in host["curves"].values():  # host times, not a model's: well under a second here
        assert all(0 < v < 1.0 for v in c["values_s"])


def test_context_dependence_counts_only_full_decode_steps():
    steps = vllm_trace.steps_of_session(outs()[0])
    rows = context_dependence(steps)
    full = [s for s in steps if s.is_decode and s.reqs and s.reqs[0].split("-")[1].startswith("h4x")
            and s.num_reqs == 4]
    assert {(r["num_reqs"], r["ctx"]) for r in rows} == {(1, 128), (4, 128)}
    assert next(r for r in rows if r["num_reqs"] == 4)["steps"] == len(full)


def test_a_grid_point_without_samples_is_named():
    wider = VllmHostGrid(**{**GRID.__dict__, "decode_batch_sizes": (1, 4, 8)})
    with pytest.raises(CalibrationInputError, match="host points"):
        host_costs(ENGINE, wider, ORDER, outs(), None)


def test_host_design_caps_waves_and_lasts_past_the_ramp():
    grid = VllmHostGrid()
    loads = host_design(grid)
    waves = [ld for ld in loads if ld["name"].startswith("h")]
    for ld in waves:
        b, c = (int(x) for x in ld["name"][1:].split("x"))
        assert b * c <= grid.max_wave_tokens and ld["concurrency"] == b
        out = ld["requests"][0]["max_new_tokens"]
        # every request decodes together for decode_steps after its wave's prefill steps
        assert out >= grid.decode_steps + b * c / grid.max_num_batched_tokens
        assert all(len(r["input_ids"]) + r["max_new_tokens"] <= grid.max_model_len for r in ld["requests"])
    assert {ld["concurrency"] for ld in waves} == set(grid.decode_batch_sizes)
    assert any(ld["name"].startswith("prefill-n8192") for ld in loads)  # prefills to 8k tokens
    assert sum(len(ld["requests"]) for ld in loads) < 5000  # minutes, not hours


def test_the_frontend_design_is_a_wave_of_each_batch_size_at_the_shortest_context():
    grid = VllmHostGrid()
    loads = frontend_design(grid)
    assert [ld["concurrency"] for ld in loads] == list(grid.decode_batch_sizes)
    for ld in loads:
        b = ld["concurrency"]
        assert ld["name"] == f"f{b}x128" and len(ld["requests"]) == b * grid.waves
        # decode_steps with all b decoding, after the prefill steps and the admission at the longer hold
        want = grid.decode_steps + -(-b * 128 // grid.max_num_batched_tokens) + -(-b * 1 // int(FRONTEND_HOLD_S * 1e3))
        assert all(r["max_new_tokens"] == want for r in ld["requests"])
        assert all(len(r["input_ids"]) == 128 - grid.decode_steps // 2 for r in ld["requests"])


def fronts() -> list[Path]:
    return [DATA / f"frontend-{name}" for _, name in ORDER]


def test_the_output_side_comes_from_the_frontend_sessions():
    """With frontend sessions, frontend_out and frontend_work are theirs (the host sessions' are
    dropped), the rest of the curves the host sessions'; the metadata says so."""
    if not all(f.exists() for f in fronts()):
        pytest.skip("fixture recorded before the frontend sessions (python -m tests.test_vllm_host)")
    plain = host_costs(ENGINE, GRID, ORDER, outs(), None)
    host = host_costs(ENGINE, GRID, ORDER, outs(), None, fronts=fronts())
    validate_profile(host, "<host>", VLLM_HOST_CURVES)
    assert host["metadata"]["frontend"]["sessions"] == "frontend"
    assert host["metadata"]["frontend"]["hold_s"] == FRONTEND_HOLD_S
    assert plain["metadata"]["frontend"]["sessions"] == "host"
    for name in ("vllm.schedule", "vllm.prepare", "vllm.update", "vllm.frontend_in"):
        assert host["curves"][name] == plain["curves"][name], name
    assert "vllm.frontend_work" in host["curves"]
    assert host["curves"]["vllm.frontend_out"] != plain["curves"]["vllm.frontend_out"]
    assert all(k.startswith("frontend-") for k in host["metadata"]["frontend"]["left_out"])


@pytest.mark.parametrize("change, flag", [({"decode_batch_sizes": (1, 4096)}, "--batch-sizes"),
                                          ({"contexts": (1 << 19,)}, "--batch-sizes"),
                                          ({"contexts": (4,)}, "--contexts"),
                                          ({"contexts": (8192,), "decode_batch_sizes": (1,), "max_model_len": 8192},
                                           "--contexts")])
def test_host_grid_refuses_what_the_server_cannot_run(change, flag):
    with pytest.raises(CalibrationInputError) as err:
        VllmHostGrid(**{**GRID.__dict__, **change}).check()
    assert err.value.source == flag


def test_recorded_host_costs_compose_into_a_card_profile():
    host = host_costs(ENGINE, GRID, ORDER, outs(), None)
    device = synthetic_profile({})
    out = compose(device, host, host_speed=2.0)
    validate_profile(out, "<composed>", VLLM_CURVES)
    meta = out["metadata"]
    assert meta["engine"] == "vllm" and "vllm.forward" in out["curves"]
    src = meta["curve_sources"]["vllm.schedule"]
    assert src["function"].startswith("Scheduler.schedule") and src["host_speed"] == 2.0
    assert "forward stubbed" in meta["composed"]["note"] and meta["composed"]["stub"]
    # host phases halved by the move (host speed 2)
    assert out["curves"]["vllm.update"]["values_s"] == pytest.approx(
        [v / 2 for v in host["curves"]["vllm.update"]["values_s"]], rel=1e-9)


def test_host_only_flags(run_cli, tmp_path):
    code, _, stderr = run_cli(["calibrate", "--host-only", "--backend", "torch", "--device", "cpu", "--out",
                               tmp_path / "h.json"])
    assert code == 2 and "--host-only" in stderr and "Traceback" not in stderr
    code, _, stderr = run_cli(["calibrate", "--engine", "vllm", "--host-only", "--prefixes", "0,64", "--out",
                               tmp_path / "h.json"])
    assert code == 2 and "--prefixes" in stderr and "Traceback" not in stderr
    code, _, stderr = run_cli(["calibrate", "--engine", "vllm", "--host-only", "--batch-sizes", "1,100000",
                               "--out", tmp_path / "h.json"])
    assert code == 2 and "--batch-sizes" in stderr
    assert not (tmp_path / "h.json").exists()


def test_host_calibration_end_to_end(tmp_path, run_cli):
    """The command on a tiny grid in the real vLLM environment (about 2 minutes here)."""
    from calibrate.real.environment import find_engine

    try:
        find_engine("vllm")
    except CalibrationInputError as err:
        pytest.skip(f"no vLLM environment ({err})")
    out = tmp_path / "host.json"
    code, stdout, stderr = run_cli(["calibrate", "--engine", "vllm", "--host-only", "--out", out, "--work",
                                    tmp_path / "work", "--batch-sizes", "1,2", "--contexts", "128",
                                    "--extend-tokens", "128"])
    assert code == 0, stderr
    host = json.loads(out.read_text())
    validate_profile(host, str(out), VLLM_HOST_CURVES)
    assert host["metadata"]["kind"] == "host" and "async" in host["setting_curves"]


def record_fixture() -> None:  # pragma: no cover - run by hand: python -m tests.test_vllm_host
    """Record tests/data/vllm/host/ with the vLLM environment (about 3 minutes: the host and
    frontend sessions of both settings)."""
    import shutil
    import tempfile

    from calibrate.host.vllm import calibrate_vllm_host
    from calibrate.real.environment import REPO, find_engine, test_model

    engine = find_engine("vllm")
    model = test_model(engine, REPO / ".venvs" / "models" / "tiny-llama")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        calibrate_vllm_host(engine, model, GRID, work)
        if DATA.exists():
            shutil.rmtree(DATA)
        DATA.mkdir(parents=True)
        for _, name in ORDER:
            for session in (f"host-{name}", f"frontend-{name}"):
                src, dst = work / session, DATA / session
                dst.mkdir()
                for f in src.iterdir():
                    if f.suffix in (".json", ".jsonl"):
                        shutil.copy(f, dst / f.name)
        ruler = json.loads((work / "yardstick.json").read_text())
        ruler["readings"] = [r for r in ruler["readings"] if r["point"]["num_reqs"] <= 8]  # small
        (DATA / "yardstick.json").write_text(json.dumps(ruler) + "\n")


if __name__ == "__main__":  # pragma: no cover
    record_fixture()


def test_a_vllm_profile_is_not_moved_to_an_apple_card(run_cli, tmp_path):
    from tests.conftest import ROOT

    out = tmp_path / "m3.json"
    code, _, stderr = run_cli(["transfer", ROOT / "scenarios/profiles/h200-vllm-llama-3.2-1b.json", "--to", "m3-max",
                               "--out", out])
    assert code == 2 and "--to" in stderr and "no Apple platform" in stderr and not out.exists()


def test_long_contexts_raise_max_model_len_and_the_wave_cap_names_both_flags(run_cli, tmp_path):
    code, _, stderr = run_cli(["calibrate", "--engine", "vllm", "--host-only", "--contexts", "9000", "--out",
                               tmp_path / "h.json"])
    assert code == 2 and "--batch-sizes" in stderr and "(--contexts)" in stderr and "max_model_len" not in stderr
