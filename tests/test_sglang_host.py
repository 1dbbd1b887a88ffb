"""Host costs from SGLang's scheduler with the forward stubbed (calibrate.host.sglang), read
from small recorded runs (tests/data/sglang/host/, recorded by the test at the end with the
engine); the end-to-end command runs only where the SGLang environment is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.host.compose import compose
from calibrate.errors import CalibrationInputError
from calibrate.real.environment import Engine
from calibrate.host.sglang import HOST_FUNCTIONS, SglangHostGrid, host_costs
from sim.model.profile import SGLANG_HOST_CURVES, validate_profile
from tests.calibrate_helpers import synthetic_profile

DATA = Path(__file__).resolve().parent / "data" / "sglang" / "host"
# the grid the fixture was recorded with (record_fixture below)
GRID = SglangHostGrid(decode_batch_sizes=(1, 4), decode_contexts=(128,), decode_steps=8, decode_waves=1,
                      extend_tokens=(1, 16), extend_prefixes=(0, 64), extend_repeats=1, context_length=1024,
                      max_running_requests=8)
ORDER = [("normal", "normal"), ("overlap", "overlap")]
ENGINE = Engine("sglang", Path("python"), "0.5.23")


def traces() -> list[Path]:
    return [DATA / f"host-{name}.jsonl" for _, name in ORDER]


def test_recorded_runs_build_a_host_costs_file():
    ruler = json.loads((DATA / "yardstick.json").read_text())
    host = host_costs(ENGINE, GRID, ORDER, traces(), ruler)
    validate_profile(host, "<host>", SGLANG_HOST_CURVES)
    meta = host["metadata"]
    assert meta["kind"] == "host" and meta["device"] == "host"
    assert not any(name.startswith("forward") for name in host["curves"])
    assert set(host["curves"]) == set(HOST_FUNCTIONS)
    assert host["curves"]["launch.decode"]["grid"] == [[1.0, 4.0]]
    assert host["curves"]["launch.extend"]["grid"] == [[1.0, 16.0]]
    assert "overlap" in host["setting_curves"]
    assert set(meta["curve_sources"]) == set(HOST_FUNCTIONS)
    assert all(s["forward"] == "stubbed" for s in meta["curve_sources"].values())
    assert meta["stub"]["replaced"].startswith("sglang.srt.model_executor.model_runner.ModelRunner._forward_raw")
    assert {r["num_reqs"] for r in meta["context_dependence"]["normal"]} == {1, 4}
    assert meta["yardstick"]["readings"] and meta["yardstick"]["version"]
    for c in host["curves"].values():  # host times, not a model's: well under a second here
        assert all(0 < v < 1.0 for v in c["values_s"])


def test_an_unstubbed_trace_is_refused(tmp_path):
    lines = traces()[0].read_text().splitlines()
    meta = json.loads(lines[0])
    meta["stub_forward"] = False
    bad = tmp_path / "host-normal.jsonl"
    bad.write_text("\n".join([json.dumps(meta), *lines[1:]]) + "\n")
    with pytest.raises(RuntimeError, match="not a stubbed run"):
        host_costs(ENGINE, GRID, ORDER[:1], [bad], None, settings=("normal",))


def test_a_grid_point_without_samples_is_named():
    wider = SglangHostGrid(**{**GRID.__dict__, "decode_batch_sizes": (1, 4, 8)})
    with pytest.raises(CalibrationInputError, match="host points"):
        host_costs(ENGINE, wider, ORDER, traces(), None)


@pytest.mark.parametrize("change, flag", [({"decode_batch_sizes": (1, 4096), "max_running_requests": 4096}, "--batch-sizes"),
                                          ({"decode_contexts": (1 << 19,), "context_length": 1 << 20}, "--contexts")])
def test_host_grid_refuses_waves_past_its_kv_budget(change, flag):
    with pytest.raises(CalibrationInputError) as err:
        SglangHostGrid(**{**GRID.__dict__, **change}).check()
    assert err.value.source == flag


def test_recorded_host_costs_compose_with_a_device_profile():
    host = host_costs(ENGINE, GRID, ORDER, traces(), None)
    device = synthetic_profile({"launch.decode": lambda n: 2e-4})
    out = compose(device, host, host_speed=1.0)
    validate_profile(out, "<composed>")
    host_launch = host["curves"]["launch.decode"]["values_s"]
    # the composed launch is the host part plus the device's 0.2 ms at the host file's nodes
    assert out["curves"]["launch.decode"]["values_s"] == pytest.approx([v + 2e-4 for v in host_launch], rel=1e-9)


def _engine_or_skip() -> Engine:
    from calibrate.real.environment import find_engine

    try:
        return find_engine("sglang")
    except CalibrationInputError as err:
        pytest.skip(f"no SGLang environment ({err})")


def test_host_calibration_end_to_end(tmp_path, run_cli):
    """The command on a tiny grid in the real SGLang environment (about 90 s here)."""
    _engine_or_skip()
    out = tmp_path / "host.json"
    code, stdout, stderr = run_cli(["calibrate", "--engine", "sglang", "--host-only", "--out", out, "--work",
                                    tmp_path / "work", "--batch-sizes", "1,4", "--contexts", "128",
                                    "--extend-tokens", "1,16", "--prefixes", "0,64"])
    assert code == 0, stderr
    host = json.loads(out.read_text())
    validate_profile(host, str(out), SGLANG_HOST_CURVES)
    assert host["metadata"]["kind"] == "host"


def record_fixture() -> None:  # pragma: no cover - run by hand: python -m tests.test_sglang_host
    """Record tests/data/sglang/host/ with the SGLang environment (about a minute)."""
    import shutil
    import tempfile

    from calibrate.real.environment import REPO, find_engine, test_model
    from calibrate.host.sglang import calibrate_sglang_host

    engine = find_engine("sglang")
    model = test_model(engine, REPO / ".venvs" / "models" / "tiny-llama")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        calibrate_sglang_host(engine, model, GRID, work)
        DATA.mkdir(parents=True, exist_ok=True)
        for _, name in ORDER:
            shutil.copy(work / f"host-{name}.jsonl", DATA / f"host-{name}.jsonl")
        ruler = json.loads((work / "yardstick.json").read_text())
        ruler["readings"] = [r for r in ruler["readings"] if r["point"]["num_reqs"] <= 8]  # small
        (DATA / "yardstick.json").write_text(json.dumps(ruler) + "\n")


if __name__ == "__main__":  # pragma: no cover
    record_fixture()
