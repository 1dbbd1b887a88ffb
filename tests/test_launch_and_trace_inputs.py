"""What a launch command or a trace says is read as the engines read it, and `advise` and `run`
agree on it (found by a fuzzing round on 5 December 2026): each case is what the engine does with
the input, or the one line that refuses it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import sim

ROOT = Path(__file__).resolve().parents[1]
PLAIN = {"name": "plain", "workload": {"concurrency": 8, "num_requests": 24, "input_len": 300, "output_len": 32},
         "server": {"settings": ["overlap"]}}


def summary(raw: dict, *overrides: str) -> dict:
    return sim.simulate(sim.load_scenario(raw, list(overrides)), "overlap", tables="none").summary()


# --- SGLang's launch arguments -----------------------------------------------------------------
def test_max_prefill_tokens_from_launch_args_is_the_server_field():
    """``--max-prefill-tokens`` fills ``server.max_prefill_tokens`` (it was passed over as having
    no effect, while the field changes the answer)."""
    by_flag = summary(PLAIN, 'server.launch_args=[--max-prefill-tokens,"300"]')
    by_field = summary(PLAIN, "server.max_prefill_tokens=300")
    assert by_flag == by_field and by_flag != summary(PLAIN)


def test_chunked_prefill_off_is_modelled():
    """``--chunked-prefill-size -1`` (or 0): SGLang reads a size <= 0 as chunked prefill off; a
    prompt is prefilled whole, as with a chunk larger than any prompt."""
    off = summary(PLAIN, 'server.launch_args=[--chunked-prefill-size,"-1"]')
    assert off == summary(PLAIN, "server.chunked_prefill_size=0") == summary(PLAIN, "server.chunked_prefill_size=1000000")
    assert off != summary(PLAIN, "server.chunked_prefill_size=64")


def test_a_ratio_the_conservativeness_gives_is_not_a_conflict():
    """0.7 x 0.1 is 0.06999999999999999 in floats: the same ratio as 0.07."""
    summary(PLAIN, 'server.launch_args=[--schedule-conservativeness,"0.1"]', "server.init_new_token_ratio=0.07")


def test_a_sweep_grid_over_launch_args_sets_fields_the_scenario_left_to_default():
    from sim.whatif.sweeps import plan_sweep

    tasks = plan_sweep(sim.load_scenario(PLAIN), {"server.launch_args": [["--page-size", "16"], ["--page-size", "1"]]})
    assert [t.scenario.server.page_size for t in tasks] == [16, 1]


@pytest.mark.parametrize("argv, words", [
    (["advise", "--", "--device", "npu"], "--device: 'npu' is not modelled"),
    (["advise", "--", "--disable-overlap-schedule", "false"], "--disable-overlap-schedule: takes no value"),
    (["advise", "--engine", "vllm", "--", "vllm", "serve", "m", "--async-scheduling", "false"],
     "--async-scheduling: takes no value"),
    (["run", str(ROOT / "scenarios" / "quickstart.yaml"), "--set", "server.page_size=64", "--set",
      "server.chunked_prefill_size=32"], "at least page_size 64"),
])
def test_what_the_engine_refuses_is_one_line(run_cli, argv, words):
    code, _out, err = run_cli(argv)
    assert code == 2 and words in err and err.strip().count("\n") == 0, err


@pytest.mark.parametrize("flags, field", [
    (["--max-num-batched-tokens", "8"], "max_num_batched_tokens"),
    (["--num-gpu-blocks-override", "2"], "num_gpu_blocks"),
    (["--no-enable-chunked-prefill", "--max-num-batched-tokens", "4096"], "max_num_batched_tokens"),
])
def test_vllm_advise_refuses_what_a_scenario_refuses(run_cli, flags, field):
    """The sizes vLLM's start-up refuses are refused by ``advise`` too (it said 'modelled')."""
    code, out, _err = run_cli(["advise", "--engine", "vllm", "--json", "--", "vllm", "serve", "m", *flags])
    answer = json.loads(out)
    assert code == 0 and answer["refused"] and answer["setting"] is None
    assert answer["decided_by"][0]["text"].startswith(f"{field}:")


# --- traces ------------------------------------------------------------------------------------
def trace_scenario(tmp_path: Path, text: str) -> Path:
    (tmp_path / "t.jsonl").write_bytes(text.encode())
    path = tmp_path / "s.yaml"
    path.write_text("name: t\nworkload: {arrival: trace, trace: t.jsonl}\n")
    return path


@pytest.mark.parametrize("line, words", [
    ('{"arrival_s": 0, "input_len": 256, "output_len": 64, "cached_length": 255}',
     "line 1: cached_length: unknown key (did you mean 'cached_len'?)"),
    ('{"arrival_s": 0, "input_len": 256, "output_len": 64, "cached_len": null}', "'cached_len' is null"),
])
def test_a_trace_line_is_read_as_written_or_refused(run_cli, tmp_path, line, words):
    code, _out, err = run_cli(["run", str(trace_scenario(tmp_path, line + "\n")), "--out", str(tmp_path / "o")])
    assert code == 2 and words in err, err


def test_a_trace_with_a_byte_order_mark_is_read(run_cli, tmp_path):
    path = trace_scenario(tmp_path, "\ufeff" + json.dumps({"arrival_s": 0, "input_len": 256, "output_len": 64}) + "\n")
    code, _out, err = run_cli(["run", str(path), "--tables", "none", "--no-plots", "--out", str(tmp_path / "o")])
    assert code == 0, err


def test_fields_a_trace_supplies_are_warned_of(run_cli, tmp_path):
    path = trace_scenario(tmp_path, json.dumps({"arrival_s": 0, "input_len": 256, "output_len": 64}) + "\n")
    code, out, _err = run_cli(["run", str(path), "--set", "workload.num_requests=5", "--tables", "none", "--no-plots",
                               "--out", str(tmp_path / "o")])
    assert code == 0 and "warning: workload.num_requests not used: the trace" in out


def test_plots_of_a_run_without_steps_tables_say_so(run_cli, tmp_path):
    out = tmp_path / "o"
    assert run_cli(["run", str(ROOT / "scenarios" / "quickstart.yaml"), "--tables", "none", "--no-plots",
                    "--out", str(out)])[0] == 0
    code, _out, err = run_cli(["plots", str(out)])
    assert code == 2 and "the run kept no steps table" in err
