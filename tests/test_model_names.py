"""A launch command's model against the profile's (sim.model.profile): compared by words,
and a run on another model's costs says so, in its warnings and its verdict."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.model.profile import model_caveat, model_words, profile_model, same_model
from tests.conftest import ROOT
from tests.helpers import verdict_of

QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"


@pytest.mark.parametrize("launch, profile, same", [
    ("meta-llama/Llama-3.2-1B-Instruct", "llama-3.2-1b", True),
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b", True),
    ("/models/llama-3.2-1b/", "llama-3.2-1b", True),  # a local folder: its name
    ("Llama_3.2_1B", "llama-3.2-1b", True),
    ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-8b", False),  # another size
    ("meta-llama/Llama-3.2-1B", "llama-3.1-8b", False),
    ("Qwen/Qwen3-0.6B", "small", False),
    ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", "tiny-llama", False),  # (the profile's is a 4-layer shape)
    ("Instruct", "llama-3.2-1b", False),  # no word left
    ("llama-3.2-1b", "", False),
])
def test_same_model_by_hand(launch, profile, same):
    assert same_model(launch, profile) is same


def test_model_words_by_hand():
    assert model_words("meta-llama/Meta-Llama-3.1-8B-Instruct") == {"llama", "3.1", "8b"}
    assert model_words("  C:\\models\\Qwen3-8B\\ ") == {"qwen3", "8b"}


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abcLM0123456789.-_/ \\", max_size=30), st.sampled_from(["", "org/", "/models/x/"]))
def test_a_name_is_its_own_model_whatever_its_case_and_folder(name, folder):
    if not model_words(name):
        assert not same_model(name, name)  # nothing to compare: never "the same"
        return
    if "/" in name or "\\" in name:  # (the folder prefix would not be the name's own)
        return
    assert same_model(name, name) and same_model(folder + name.upper(), name.lower())


def test_the_caveat_where_the_models_differ_and_only_there():
    meta = {"model": {"name": "llama-3.2-1b"}, "device_name": "NVIDIA H200"}
    assert model_caveat("--model-path", "meta-llama/Llama-3.2-1B-Instruct", meta) is None
    warn = model_caveat("--model-path", "meta-llama/Llama-3.1-70B", meta)
    assert "measured on llama-3.2-1b, another model" in warn
    assert model_caveat("--model-path", "x", None) is None  # inline costs name no model
    assert "does not name the model" in model_caveat("--model-path", "x", {"model": {"name": "unknown"}})
    assert "a model it does not name" in model_caveat("--model-path", "x", {}, brief=True)
    assert profile_model({"model": "llama-3.2-1b"}) == "llama-3.2-1b" and profile_model({"model": 3}) is None


@pytest.mark.parametrize("model, warned", [("meta-llama/Llama-3.1-70B-Instruct", True),
                                           ("meta-llama/Llama-3.2-1B-Instruct", False)])
def test_a_run_on_another_models_costs_says_so_in_warnings_and_verdict(run_cli, tmp_path, model, warned):
    code, out, err = run_cli(["run", QUICKSTART, "--set", "workload.num_requests=16", "--set",
                              f"server.launch_args=[--model-path,{model}]", "--tables", "none", "--out", tmp_path / "r"])
    assert code == 0, err
    verdict = verdict_of(out)
    warnings = json.loads((tmp_path / "r" / "summary.json").read_text()).get("warnings", [])
    assert (f"on another model's costs (--model-path {model}; the profile measured llama-3.2-1b)" in verdict) is warned
    assert verdict.startswith("verdict: cannot tell from what the profile knows") is warned  # another model's costs
    assert any("another model (by name)" in w for w in warnings) is warned
    assert not any("passed over" in w for w in warnings)  # the model is not an argument the rules passed over


def test_a_sweep_on_another_models_costs_cannot_tell_as_its_run(run_cli, tmp_path):
    model = "meta-llama/Llama-3.1-70B-Instruct"
    code, out, err = run_cli(["sweep", QUICKSTART, "--grid", "workload.concurrency=4", "--set",
                              "workload.num_requests=16", "--set", f"server.launch_args=[--model-path,{model}]",
                              "--no-plots", "--out", tmp_path / "s"])
    assert code == 0, err
    verdict = verdict_of(out)
    assert verdict.startswith("verdict: cannot tell from what the profile knows")
    assert f"on another model's costs (--model-path {model}; the profile measured llama-3.2-1b)" in verdict
    assert "(a sweep runs no corners" in verdict  # the quickstart's stated host range, not simulated


def test_inline_costs_name_no_model_and_get_no_model_warning(run_cli, tmp_path):
    # kv-pressure's launch command names DeepSeek-V2-Lite; its costs are the scenario's own terms
    code, out, err = run_cli(["run", ROOT / "scenarios" / "kv-pressure.yaml", "--set", "workload.num_requests=8",
                              "--tables", "none", "--out", tmp_path / "r"])
    assert code in (0, 3), err
    assert "--model-path" not in out
