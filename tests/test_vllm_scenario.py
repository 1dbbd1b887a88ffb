"""The vLLM engine as a scenario choice: `server.engine`, its keys and their errors (one line naming
file and field, exit 2), profiles of the right engine, and `run`/`sweep` naming vLLM's settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import sim
from sim.cli import main
from sim.errors import ProfileError, ScenarioError
from tests.vllm_helpers import vllm_scenario, write_profile

ROOT = Path(__file__).resolve().parents[1]
SGLANG_PROFILE = ROOT / "scenarios" / "profiles" / "cpu-sglang-tiny.json"


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("server,field,words", [
    ({"engine": "trtllm"}, "server.engine", "expected one of sglang, vllm (got 'trtllm')"),
    ({"engine": "vllm", "max_num_seq": 4}, "server.max_num_seq", "did you mean 'max_num_seqs'"),
    ({"engine": "vllm", "page_size": 16}, "server.page_size", "unknown key"),  # an SGLang key
    ({"engine": "vllm", "settings": ["normal"]}, "server.settings.0", "'sync' or 'async'"),
    ({"engine": "vllm", "max_num_seqs": 64, "max_num_batched_tokens": 32}, "server.max_num_batched_tokens",
     "must be >= max_num_seqs 64"),
    ({"engine": "vllm", "enable_chunked_prefill": False, "max_num_batched_tokens": 2048},
     "server.max_num_batched_tokens", "without chunked prefill"),
    ({"engine": "vllm", "num_gpu_blocks": 64, "block_size": 16}, "server.num_gpu_blocks", "refuses to start"),
    ({"engine": "vllm", "long_prefill_token_threshold": 9000}, "server.long_prefill_token_threshold", "max_model_len"),
    ({"engine": "vllm", "max_model_len": 256}, "server.max_model_len", "every request would fail"),
    ({"engine": "vllm", "block_size": 10**9}, "server.block_size", "larger than max_model_len 8192"),
])
def test_bad_vllm_server_one_line_exit_2(tmp_path, capsys, server, field, words):
    path = write(tmp_path, {"name": "v", "workload": {"input_len": 512}, "server": server})
    code = main(["run", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert str(path) in err and f": {field}:" in err and words in err, err
    assert not (tmp_path / "out").exists()


def test_profiles_must_be_of_the_scenario_engine(tmp_path):
    """A profile of the other engine's curves: the scenario's server.engine is blamed, with the
    profile's engine named (an SGLang scenario's engine may be the default, unnamed)."""
    with pytest.raises(ScenarioError) as err:
        sim.load_scenario(vllm_scenario(profile=str(SGLANG_PROFILE)))
    assert err.value.field == "server.engine" and err.value.expected.startswith("is vllm, but costs.profile")
    assert "is a sglang profile" in err.value.expected
    vllm_profile = write_profile(tmp_path)
    with pytest.raises(ScenarioError) as err:
        sim.load_scenario({"name": "s", "costs": {"profile": vllm_profile}})
    assert err.value.field == "server.engine" and "is sglang (the default" in err.value.expected
    assert "is a vllm profile" in err.value.expected
    with pytest.raises(ProfileError) as err:  # the profile loader itself still names its field
        from sim.model.profile import load_profile_read_only

        load_profile_read_only(vllm_profile)
    assert err.value.field == "metadata.engine" and "'sglang'" in err.value.expected


def test_sglang_scenarios_are_unchanged():
    scen = sim.load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    assert "engine" not in scen.model_dump()["server"]  # summary.json's scenario_config as before
    assert sim.load_scenario({"name": "s", "server": {"engine": "sglang"}}).server == sim.load_scenario({"name": "s"}).server
    with pytest.raises(ValueError, match="unknown setting 'async'"):
        sim.simulate({"name": "s"}, "async")
    with pytest.raises(ValueError, match="unknown setting 'overlap' for a vLLM scenario"):
        sim.simulate(vllm_scenario(), "overlap")


def test_defaults_follow_the_platform():
    cpu = sim.load_scenario({"name": "v", "server": {"engine": "vllm", "device": "cpu"}}).server
    gpu = sim.load_scenario({"name": "v", "server": {"engine": "vllm"}}).server
    assert (cpu.resolved_block_size, cpu.seqs_limit, cpu.blocking_forward) == (128, 128, True)
    assert (gpu.resolved_block_size, gpu.seqs_limit, gpu.blocking_forward) == (16, 256, False)
    assert cpu.settings == ["async", "sync"] and cpu.max_num_batched_tokens == 2048
    assert (gpu.kv_blocks - 1) * 16 >= 400_000


def test_overrides_and_a_trace_of_too_long_prompts(tmp_path, write_trace):
    scen = sim.load_scenario(vllm_scenario(), ["server.max_num_seqs=2", "server.settings=sync"])
    assert scen.server.max_num_seqs == 2 and scen.server.settings == ["sync"]
    with pytest.raises(ScenarioError) as err:
        sim.load_scenario(vllm_scenario(), ["server.max_num_seqs=0"])
    assert err.value.source == "--set server.max_num_seqs=0"
    trace = write_trace([(0.0, 100, 5), (0.0, 3000, 5)])  # the second is over max_model_len 2048
    res = sim.simulate(vllm_scenario(workload__arrival="trace", workload__trace=trace), "async")
    assert list(res.requests["status"]) == ["completed", "failed"] and res.requests["failure"][1] == "too_long"
    bad = write_trace([(0.0, 3000, 5)], name="long.jsonl")
    with pytest.raises(ScenarioError, match="server.max_model_len"):
        sim.load_scenario(vllm_scenario(workload__arrival="trace", workload__trace=bad))


def test_run_names_the_ratio_async_over_sync(tmp_path, capsys):
    path = write(tmp_path, vllm_scenario(profile=write_profile(tmp_path), c=4, n=8, output_len=16))
    out = tmp_path / "res"
    assert main(["run", str(path), "--out", str(out), "--json", "--no-plots"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload["settings"]) == {"async", "sync"} and list(payload["ratios"]) == ["async/sync"]
    assert main(["run", str(path), "--out", str(out), "--no-plots"]) == 0
    text = capsys.readouterr().out
    assert "async/sync" in text and "ratios: setting / sync" in text
    assert {"steps_async.parquet", "steps_sync.parquet", "summary.json"} <= {p.name for p in out.iterdir()}


def test_sweep_pairs_async_with_sync(tmp_path):
    table = sim.sweep(vllm_scenario(profile=write_profile(tmp_path), c=2, n=4, output_len=8),
                      {"workload.concurrency": [1, 2]}, repeats=2, workers=1)
    from sim.whatif.variance import ratio_ci

    ci = ratio_ci(table, num="async", den="sync")
    assert len(ci) == 2 and (ci["ratio"] > 1).all()


def test_outputs_beyond_max_model_len_are_said_to_stop_there():
    from sim.output.report import load_warnings

    scen = sim.load_scenario(ROOT / "scenarios" / "vllm-h200.yaml", ["workload.output_len=9000"])
    lines = [w for w in load_warnings(scen) if "input_len + output_len" in w]
    assert len(lines) == 1 and "server.max_model_len" in lines[0] and "vLLM stops a request at max_model_len" in lines[0]
    assert not [w for w in load_warnings(sim.load_scenario(ROOT / "scenarios" / "vllm-h200.yaml"))
                if "input_len + output_len" in w]


@pytest.mark.parametrize("costs,field", [
    ({"cpu": {"after_wait_scale": 1000}}, "costs.cpu.after_wait_scale"),
    ({"gil": {"ops_per_forward": 500}}, "costs.gil.ops_per_forward"),
    ({"gpu": {"sync_latency": 0.001}}, "costs.gpu.sync_latency"),
    ({"gpu": {"overlap_residue": 0.0}}, "costs.gpu.overlap_residue"),
])
def test_sglang_only_costs_are_refused_on_vllm(tmp_path, capsys, costs, field):
    """Costs of SGLang's loops that vLLM's loops do not read: given, they would change nothing."""
    path = write(tmp_path, {"name": "v", "server": {"engine": "vllm"}, "costs": costs})
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f": {field}: a cost of another engine's loops" in err, err
    assert not (tmp_path / "out").exists()
