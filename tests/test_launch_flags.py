"""Never a silent answer for a command the simulator does not model: each engine's launch-argument
reader knows its server's own flags (sim/engines/<engine>/rules/flags-<version>.json, read from the
engine's parser by realengines/flags.py), refuses a flag the server would refuse, and gives every
flag a status (modelled, refused: not modelled, no effect on the loop)."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sim.model.known_flags import KnownFlags, is_option
from sim.engines.sglang.rules.launch_args import known_flags as sglang_flags
from sim.engines.sglang.rules.launch_args import parse_launch_args as sglang_args
from sim.engines.vllm.rules.launch_args import known_flags as vllm_flags
from sim.engines.vllm.rules.launch_args import parse_launch_args as vllm_args
from sim.errors import UserInputError
from tests.conftest import ROOT

FLAGS = KnownFlags("x", "1", {"--tp-size": True, "--tokenizer-path": True, "--enable-a": False, "--enable-b": False,
                              "-tp": True})


@pytest.mark.parametrize("name, want", [("--tp-size", ("--tp-size", True)), ("--tp", ("--tp-size", True)),
                                        ("--tok", ("--tokenizer-path", True)), ("--enable-a", ("--enable-a", False)),
                                        ("-tp", ("-tp", True)), ("--enable", None), ("--t", None), ("--nope", None),
                                        ("-t", None), ("--", None)])
def test_flags_resolve_as_argparse_does(name, want):
    # argparse: the exact option, or an unambiguous prefix of one long option
    assert FLAGS.resolve(name) == want


def test_the_shipped_lists_are_the_engines_own():
    assert sglang_flags().version == "0.5.23" and vllm_flags().version == "0.32.0"
    for name in ("--model-path", "--disable-overlap-schedule", "--speculative-algorithm", "--tp-size", "--dp-size"):
        assert sglang_flags().resolve(name), name
    for name in ("--model", "--async-scheduling", "--no-async-scheduling", "--speculative-config", "-tp", "-dp"):
        assert vllm_flags().resolve(name), name


def test_the_rules_tables_read_only_flags_the_engines_know():
    table = yaml.safe_load((ROOT / "sim/engines/sglang/rules/sglang_rules.yaml").read_text())
    unknown = {name for spec in table["flags"] for name in [spec["flag"], *spec.get("aliases", [])]
               if not sglang_flags().resolve(name)}
    # the table's rows reach back to 0.5.3; --enable-beta-spec (0.5.4's spec v2 switch) is gone by
    # 0.5.23, and the reader still takes it for the older releases' rules
    assert unknown == {"--enable-beta-spec"}
    assert sglang_args(["--enable-beta-spec"], version="0.5.4").fields["enable_beta_spec"] is True
    from sim.engines.vllm.rules.launch_args import FLAGS as VLLM_READ

    assert all(vllm_flags().resolve(name) for name in VLLM_READ)


@pytest.mark.parametrize("parse", [sglang_args, vllm_args])
def test_a_flag_the_server_refuses_is_an_error_naming_it(parse):
    with pytest.raises(UserInputError) as err:
        parse(["--frobnicate", "3"])
    assert err.value.field == "--frobnicate" and "unrecognized arguments" in str(err.value)


@pytest.mark.parametrize("version, words", [
    ("0.5.23", "the flags of SGLang 0.5.23)"),
    ("0.5.22", "checked against SGLang 0.5.23's flags, the only release whose flag list is recorded here; "
               "0.5.22's may differ"),
])
def test_a_refused_flag_names_the_release_whose_flags_were_checked(version, words):
    """The flag list is 0.5.23's, used for every release: a refusal at another says so."""
    with pytest.raises(UserInputError) as err:
        sglang_args(["--model-pth", "x"], version=version)
    assert words in str(err.value)


@pytest.mark.parametrize("parse, args, choice", [
    (sglang_args, ["--grammar-backend", "bogus"], "xgrammar"),
    (sglang_args, ["--schedule-policy=lifo"], "fcfs"),
    (vllm_args, ["--scheduling-policy", "lifo"], "priority"),
])
def test_a_value_outside_the_flags_choices_is_refused_as_the_server_would(parse, args, choice):
    with pytest.raises(UserInputError) as err:
        parse(args)
    assert err.value.field == args[0].partition("=")[0] and "invalid choice" in str(err.value)
    assert choice in str(err.value)
    assert parse([args[0].partition("=")[0], choice])  # one of the choices passes


@pytest.mark.parametrize("parse, arg", [(sglang_args, "--disable-overlap-schedule=false"),
                                        (vllm_args, "--async-scheduling=false")])
def test_a_switch_given_a_value_is_refused_as_argparse_refuses_it(parse, arg):
    with pytest.raises(UserInputError) as err:
        parse([arg])
    assert err.value.field == arg.partition("=")[0] and "ignored explicit argument" in str(err.value)


@pytest.mark.parametrize("parse, args, flag", [
    (sglang_args, ["--model-path"], "--model-path"),  # a flag the rules do not read, nothing after it
    (sglang_args, ["--model-path", "--tp", "2"], "--model-path"),  # ... an option after it: not its value
    (sglang_args, ["--tp"], "--tp"),  # a flag the rules read (--tp-size)
    (sglang_args, ["--max-running-requests", "--disable-overlap-schedule"], "--max-running-requests"),
    (vllm_args, ["m", "--model"], "--model"),
    (vllm_args, ["m", "--max-num-seqs", "--async-scheduling"], "--max-num-seqs"),
    (vllm_args, ["m", "--speculative-config.method"], "--speculative-config.method"),
])
def test_a_flag_without_its_value_is_refused_as_argparse_refuses_it(parse, args, flag):
    # argparse: an option that takes a value followed by nothing or by another option: "expected
    # one argument" (the flag after it was once taken as its value, and a --tp after --model-path
    # went unseen)
    with pytest.raises(UserInputError) as err:
        parse(args)
    assert err.value.field == flag and "expected one argument" in str(err.value)


@pytest.mark.parametrize("parse, args, shown", [(sglang_args, ["--random-seed", "-5"], "--random-seed -5"),
                                                (vllm_args, ["m", "--seed", "-1"], "--seed -1")])
def test_a_negative_number_is_a_value_not_an_option(parse, args, shown):
    assert (shown, "no effect on the loop") in parse(args).flags


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="-.=0123456789ab ", max_size=6))
@example("--= ")  # (argparse splits at "=" before it looks for a space: an abbreviation of every long option)
def test_is_option_reads_a_token_as_argparse_does(token):
    # the rule against argparse itself: an option taking a value, then the token
    import argparse
    import contextlib
    import io

    parser = argparse.ArgumentParser(prog="p", add_help=False)
    parser.add_argument("--x")
    with contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            parser.parse_args(["--x", token])
            took = True
        except SystemExit:
            took = "expected one argument" not in err.getvalue()
    assert is_option(token) is not took, (token, err.getvalue())


def test_the_shipped_lists_carry_the_parsers_choices():
    assert sglang_flags().choices["--grammar-backend"] == ("llguidance", "none", "outlines", "xgrammar")
    assert vllm_flags().refuses("--scheduling-policy", "fcfs") is None
    assert sglang_flags().refuses("--model-path", "anything") is None  # no choices: any value


TP4_ON_CARD = ("refused: not modelled (tensor parallelism on cuda: no card profile at TP 4 can be measured yet; the TP "
               "calibration runs SGLang's CPU server)")


def test_each_sglang_flag_gets_a_status():
    cfg = sglang_args(["python", "-m", "sglang.launch_server", "--model-path", "M", "--speculative-algo", "EAGLE",
                       "--tp", "4", "--dp-size", "2", "--enable-dp-attention", "--max-running-requests", "32",
                       "--log-level", "info"])
    assert dict(cfg.flags) == {
        "--model-path M": "no effect on the loop",
        "--speculative-algo EAGLE": "refused: not modelled (speculative decoding)",
        "--tp 4": TP4_ON_CARD,
        "--dp-size 2": "refused: not modelled (data parallelism)",
        "--enable-dp-attention": "refused: not modelled (DP attention)",
        "--max-running-requests 32": "modelled",
        "--log-level info": "no effect on the loop"}
    plain = sglang_args(["--model-path", "M", "--tp", "1", "--disaggregation-mode", "null"])
    assert not any(st.startswith("refused") for _, st in plain.flags)


def test_each_vllm_flag_gets_a_status():
    cfg = vllm_args(["vllm", "serve", "M", "-tp", "2", "--speculative-config.method", "ngram", "--max_num_seqs", "64",
                     "--gpu-memory-utilization", "0.8", "-dp", "1"])
    assert dict(cfg.flags) == {
        "-tp 2": "refused: not modelled (tensor parallelism on cuda: no card profile at TP 2 can be measured yet; "
                 "the TP calibration runs vLLM's CPU server)",  # on cpu: modelled (test_vllm_tensor_parallel)
        "--speculative-config.method ngram": "refused: not modelled (speculative decoding by ngram: modelled are "
                                             "draft_model, eagle, eagle3 and mtp with num_speculative_tokens)",
        "--max-num-seqs 64": "modelled",  # vLLM's parser reads _ as -
        "--gpu-memory-utilization 0.8": "no effect on the loop",
        "-dp 1": "modelled"}


@pytest.mark.parametrize("args, word", [(["--dp-size", "2"], "data parallelism"),
                                        (["--enable-dp-attention"], "DP attention"),
                                        (["--pp-size", "2"], "pipeline parallelism"),
                                        (["--disaggregation-mode", "prefill"], "PD disaggregation")])
def test_a_scenario_with_a_refused_flag_gets_no_answer(run_cli, tmp_path, args, word):
    scenario = yaml.safe_load((ROOT / "scenarios/quickstart.yaml").read_text())
    scenario["server"]["launch_args"] = args
    scenario["costs"]["profile"] = str(ROOT / "scenarios" / scenario["costs"]["profile"])
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario))
    code, out, err = run_cli(["run", path, "--out", tmp_path / "r", "--no-plots"])
    assert code == 2 and word in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_advise_lists_each_flag_and_refuses_unknown_ones(run_cli):
    code, out, _ = run_cli(["advise", "--json", "--", "--model-path", "M", "--tp", "4"])
    assert code == 0
    assert json.loads(out)["flags"] == [{"flag": "--model-path M", "status": "no effect on the loop"},
                                        {"flag": "--tp 4", "status": TP4_ON_CARD}]
    code, out, _ = run_cli(["advise", "--", "--model-path", "M", "--speculative-algorithm", "EAGLE"])
    assert code == 0 and "refused: not modelled (speculative decoding)" in out and "refuses this command" in out
    code, _, err = run_cli(["advise", "--engine", "vllm", "--", "--frobnicate"])
    assert code == 2 and "--frobnicate" in err and "Traceback" not in err


@pytest.mark.parametrize("engine, args, what", [
    ("sglang", ["--enable-lora"], "LoRA adapters"),
    ("sglang", ["--lora-paths", "a=/adapters/a"], "LoRA adapters"),
    ("sglang", ["--enable-multimodal"], "multimodal inputs"),
    ("vllm", ["--enable-lora"], "LoRA adapters"),
])
def test_lora_and_multimodal_servers_are_refused_not_answered_as_plain(engine, args, what, tmp_path, run_cli):
    parse = sglang_args if engine == "sglang" else vllm_args
    cfg = parse(["--model-path", "M", *args] if engine == "sglang" else ["serve", "M", *args])
    assert any(status.startswith(f"refused: not modelled ({what}") for _, status in cfg.flags)
    if engine == "vllm":  # a vLLM scenario takes no launch command: advise is where it is read
        return
    scenario = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    scenario["costs"]["profile"] = str(ROOT / "scenarios" / scenario["costs"]["profile"])
    scenario["server"].pop("settings", None)
    scenario["server"]["launch_args"] = ["--model-path", "M", *args]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario))
    code, _, err = run_cli(["run", str(path), "--out", str(tmp_path / "r"), "--no-plots"])
    assert code == 2 and what.split(" (")[0] in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_the_rules_tables_json_copy_is_the_yaml_as_parsed():
    """A run reads ``sglang_rules.json``, the hand-written ``sglang_rules.yaml`` as parsed: after an
    edit of the YAML, ``python -c "from sim.engines.sglang.rules.launch_args import write_rules_json;
    write_rules_json()"`` writes the copy again."""
    from sim.engines.sglang.rules.launch_args import rules_table

    rules = ROOT / "sim/engines/sglang/rules"
    parsed = yaml.safe_load((rules / "sglang_rules.yaml").read_text())
    assert json.loads((rules / "sglang_rules.json").read_text()) == parsed, "sglang_rules.json is stale: run write_rules_json()"
    assert rules_table() == parsed
