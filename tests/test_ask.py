"""``overlap-sim ask``: the user's question in one command, on the shipped profiles."""

from __future__ import annotations

import json

import pytest
import yaml

from sim.scenario import load_scenario
from tests.helpers import unwrapped, verdict_of


def _verdict(out: str) -> str:
    return verdict_of(out)


def test_sglang_on_an_l4_is_one_command_with_a_range(run_cli, tmp_path):
    code, out, err = run_cli(["ask", "--engine", "sglang", "--card", "L4", "--model", "Llama-3.1-8B", "--concurrency",
                              "16", "--input-len", "1000", "--output-len", "300", "--out", tmp_path, "--no-plots"])
    assert code == 0, err
    assert load_scenario(tmp_path / "scenario.yaml").name == "ask-sglang-l4-llama-3.1-8b-c16-1000-300"  # (any case)
    line = _verdict(out)
    assert "overlap/normal" in line and "forward ±30%" in line and "host phases ±" in line
    summary = json.loads((tmp_path / "summary.json").read_text())
    r = summary["verdict"]["stated_range"]
    assert r["ratio_low"] <= summary["verdict"]["throughput_ratio"] <= r["ratio_high"]
    # the scenario it ran is written beside the results, runs again as it is, and carries no cap
    # of a shipped scenario: the engine's own sizing for that card
    sc = load_scenario(tmp_path / "scenario.yaml")
    assert sc.workload.concurrency == 16 and sc.workload.input_len == 1000 and sc.workload.cached_len == 0
    assert sc.server.max_running_requests >= 2048 and sc.server.kv_pool_tokens < 100_000  # 24 GB less 16 GB
    assert json.loads((tmp_path / "profile.json").read_text())["metadata"]["transfer"]["to_card"] == "l4"


def test_vllm_on_an_h100_is_one_command(run_cli, tmp_path):
    code, out, err = run_cli(["ask", "--engine", "vllm", "--card", "h100", "--model", "llama-3.2-1b", "--concurrency",
                              "16", "--input-len", "1000", "--output-len", "300", "--out", tmp_path, "--no-plots"])
    assert code == 0, err
    assert "async/sync" in _verdict(out)
    server = yaml.safe_load((tmp_path / "scenario.yaml").read_text())["server"]
    assert server["engine"] == "vllm"
    assert (server["max_num_seqs"], server["max_num_batched_tokens"]) == (1024, 8192)  # an H100's defaults


@pytest.mark.parametrize("card, want", [("h100", (1024, 8192)), ("h200", (1024, 8192)), ("b200", (1024, 16384)),
                                        ("a100-80gb", (256, 2048)), ("a100-40gb", (256, 2048)), ("l4", (256, 2048)),
                                        ("rtx-4090", (256, 2048))])
def test_vllm_batch_defaults_follow_the_card_as_get_batch_defaults_does(card, want):
    # vLLM 0.32.0 EngineArgs.get_batch_defaults (OpenAI API server): >= 160 GiB: 1024 / 16384;
    # >= 70 GiB and not an A100: 1024 / 8192; else 256 / 2048
    from sim.engines.vllm.ask import batch_defaults
    from sim.model.cards import find_card

    assert batch_defaults(find_card(card)) == want


def test_sglang_on_a_mac_runs_the_mlx_loops(run_cli, tmp_path):
    code, out, err = run_cli(["ask", "--card", "m3-max", "--model", "llama-3.2-1b", "--concurrency", "4",
                              "--input-len", "500", "--output-len", "100", "--out", tmp_path, "--no-plots"])
    assert code == 3  # at SGLang 0.5.22 `normal` on MLX dies (the seed document's crash): the run says so
    line = _verdict(out)
    assert "keep overlap on" in line and "died" in line
    assert yaml.safe_load((tmp_path / "scenario.yaml").read_text())["server"]["settings"] == ["overlap_mlx", "normal"]
    # what it assumed of the Mac says so: the memory is the largest M3 Max's, the host its own cores
    asked = next(line for line in unwrapped(out) if line.startswith("asked:"))
    assert "the card's memory 128 GB, the largest configuration's: pass --memory-gb for yours" in asked
    # Apple publishes no compute figure: the H200's balance is taken, and the line and the range say so
    assert "assumed: Apple M3 Max publishes no compute figure, so the other card's compute-to-bandwidth balance " \
           "is taken, which prices the prefill and TTFT beyond the stated range" in asked
    # the death is a release rule's prediction, and the line says on what it rests
    assert "(mlx_normal_futuremap_device_mismatch: batch" in line
    assert "a release rule's prediction: seed document (observed at v0.5.22" in line
    code, out, err = run_cli(["ask", "--card", "m3-max", "--model", "llama-3.2-1b", "--concurrency", "4", "--input-len",
                              "500", "--output-len", "100", "--memory-gb", "36", "--out", tmp_path / "m36", "--no-plots"])
    asked = next(line for line in unwrapped(out) if line.startswith("asked:"))
    assert "the card's memory 36 GB (--memory-gb)" in asked and "(0.88 of 36 GB less" in asked
    assert "largest configuration" not in asked
    assert "the card's host (its own CPU cores (12 performance + 4 efficiency)) assumed as fast as" in asked
    # one request at a time (no batch of two: normal serves): the range over the forward says what it left out
    code, out, err = run_cli(["ask", "--card", "m3-max", "--model", "llama-3.2-1b", "--concurrency", "1", "--input-len",
                              "500", "--output-len", "100", "--out", tmp_path / "c1", "--no-plots"])
    assert code == 0, err
    line = _verdict(out)
    assert "forward ±30%: moved from NVIDIA H200 by public specs (one card publishes no compute figure: the other's " \
           "compute-to-bandwidth balance assumed, which prices the prefill, outside this range)" in line
    # the host and the noise are the Mac's as assumed, not the H200's host or a card's clocks
    assert "moved to the NVIDIA H200's host (" in line and "moved to the device's host" not in line
    assert "(assumed 2.0%, as for a clock-locked card on a quiet host (not measured on an Apple SoC)" in line


def test_an_open_loop_on_the_profiles_own_card_has_only_the_host_range(run_cli, tmp_path):
    code, out, err = run_cli(["ask", "--card", "h200", "--model", "llama-3.2-1b", "--rate", "20", "--input-len", "256",
                              "--output-len", "64", "--out", tmp_path, "--no-plots"])
    assert code == 0, err
    line = _verdict(out)
    assert "host phases ±" in line and "forward ±" not in line
    assert yaml.safe_load((tmp_path / "scenario.yaml").read_text())["workload"]["arrival"] == "poisson"


def test_an_unknown_model_on_a_card_the_engine_refuses_is_refused_for_the_card_first(run_cli, tmp_path):
    """vLLM on a Mac with a model it has no profile of: the card is refused (no recipe for a
    calibration ask would refuse anyway); on a card it runs on, the recipe composes with the
    shipped vLLM host part, not a CPU profile's host costs."""
    code, _, err = run_cli(["ask", "--engine", "vllm", "--card", "m3-max", "--model", "llama-3.1-8b", "--concurrency",
                            "8", "--input-len", "8", "--output-len", "8", "--out", tmp_path / "a"])
    assert code == 2 and "--card" in err and "no Apple platform" in err
    code, _, err = run_cli(["ask", "--engine", "vllm", "--card", "h100", "--model", "llama-3.1-8b", "--concurrency",
                            "8", "--input-len", "8", "--output-len", "8", "--out", tmp_path / "b"])
    assert code == 2 and "parts/vllm-0.32.0-host-intel-xeon.json" in err and "--host-speed X" not in err


def test_the_recipe_for_a_model_without_a_profile_is_a_calibration_calibrate_takes(run_cli, tmp_path):
    """A shape calibrate knows by name is named; another gets a known shape with each dimension set
    to the model's (calibrate refuses an unknown --model)."""
    from sim.commands import CALIBRATE_SHAPES

    args = ["--card", "l4", "--concurrency", "4", "--input-len", "8", "--output-len", "8", "--out", tmp_path / "o"]
    code, _, err = run_cli(["ask", "--model", "qwen3-8b", *args])
    assert code == 2 and "--model qwen3-8b --out dev.json" in err
    assert "qwen3-8b" in CALIBRATE_SHAPES  # (registered by calibrate.command when the parser was built)
    code, _, err = run_cli(["ask", "--model", "gpt-9", *args])
    assert code == 2 and "--model gpt-9 " not in err
    assert f"--model {CALIBRATE_SHAPES[-1]} --layers L --hidden H" in err and "each dimension set to gpt-9's" in err


L4_LOAD = ["--card", "l4", "--model", "llama-3.2-1b", "--concurrency", "4", "--input-len", "8", "--output-len", "8"]


@pytest.mark.parametrize("argv, flag", [
    (["--card", "l4", "--model", "qwen3-8b", "--concurrency", "4", "--input-len", "8", "--output-len", "8"], "--model"),
    (["--card", "tpu", "--model", "llama-3.2-1b", "--concurrency", "4", "--input-len", "8", "--output-len", "8"], "--card"),
    (["--card", "l4", "--model", "llama-3.2-1b", "--concurrency", "0", "--input-len", "8", "--output-len", "8"],
     "--concurrency"),
    ([*L4_LOAD, "--cached-len", "8"], "--cached-len"),
    (["--card", "l4", "--model", "llama-3.2-1b", "--rate", "nan", "--input-len", "8", "--output-len", "8"], "--rate"),
    ([*L4_LOAD, "--host-speed", "-1"], "--host-speed"),
    ([*L4_LOAD, "--memory-gb", "nan"], "--memory-gb"),
    ([*L4_LOAD, "--memory-gb", "2"], "--memory-gb"),  # weights that do not fit the memory given: that flag
    ([*L4_LOAD, "--rate", "2"], "--rate"),
    # beyond the model's context (131,072 tokens: max_position_embeddings): the server would refuse
    (["--card", "h200", "--model", "llama-3.2-1b", "--concurrency", "4", "--input-len", "131000", "--output-len",
      "100"], "context of 131,072 tokens"),
    (["--engine", "vllm", "--card", "m3-max", "--model", "llama-3.2-1b", "--concurrency", "4", "--input-len", "8",
      "--output-len", "8"], "--card"),
    # a prompt longer than the card's KV pool: refused before anything is written, naming the flags
    (["--card", "l4", "--model", "llama-3.1-8b", "--concurrency", "8", "--input-len", "100000", "--output-len",
      "8"], "KV pool (38604 tokens) is too small"),
    (["--engine", "vllm", "--card", "l4", "--model", "llama-3.2-1b", "--concurrency", "8", "--input-len", "700000",
      "--output-len", "100"], "--input-len"),
])
def test_what_it_cannot_answer_is_one_line(run_cli, tmp_path, argv, flag):
    code, out, err = run_cli(["ask", *argv, "--out", tmp_path / "out"])
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and flag in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_users_own_files_in_the_folder_are_not_replaced(run_cli, tmp_path):
    """ask writes scenario.yaml and profile.json: into a folder where they are the user's own it
    refuses (one line, nothing written); over an earlier ask's it goes on."""
    args = ["ask", "--card", "l4", "--model", "llama-3.2-1b", "--concurrency", "8", "--input-len", "512",
            "--output-len", "32", "--no-plots", "--out"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "profile.json").write_text("MINE\n")
    code, _out, err = run_cli([*args, mine])
    assert code == 2 and "profile.json was not written by ask" in err and err.strip().count("\n") == 0
    assert (mine / "profile.json").read_text() == "MINE\n" and sorted(p.name for p in mine.iterdir()) == ["profile.json"]
    again = tmp_path / "again"
    assert run_cli([*args, again])[0] == 0 and run_cli([*args, again])[0] == 0
