"""`overlap-sim advise --engine vllm`: where vLLM 0.32.0 turns async scheduling off or refuses it
(CPU platform, pipeline parallel, speculative decoding, executor backends), with sources."""

from __future__ import annotations

import json

import pytest

from sim.cli import main
from sim.engines.vllm.rules.async_rules import RULES, advise
from sim.errors import UserInputError


def ids(adv) -> list[str]:
    return [r.id for r in adv.decided_by]


@pytest.mark.parametrize("platform,args,on,setting,decided", [
    ("cuda", [], True, "async", []),  # on by default (None resolves to True)
    ("cuda", ["--no-async-scheduling"], False, "sync", []),
    ("cpu", [], False, "sync", ["cpu_platform"]),
    ("cpu", ["--async-scheduling"], False, "sync", ["cpu_platform"]),  # accepted, then forced off
    ("cuda", ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'], False, None,
     ["spec_method_default"]),
    ("cuda", ["--speculative-config.method", "eagle3"], True, None, []),  # supported, but not modelled
    ("cuda", ["--runner", "pooling"], False, "sync", ["pooling_model"]),
    ("cuda", ["--distributed-executor-backend", "ray"], True, "async", []),  # Ray's V2 executor
    ("cuda", ["VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0", "--distributed-executor-backend", "ray"], False, "sync",
     ["executor_default"]),
    ("cuda", ["-pp", "2"], True, None, []),  # the V2 model runner: PP with async, not modelled
    ("cuda", ["VLLM_USE_V2_MODEL_RUNNER=0", "--pipeline-parallel-size", "2"], False, None, ["pp_v1_runner_default"]),
    ("cpu", ["VLLM_USE_V2_MODEL_RUNNER=0", "-pp", "2", "--async-scheduling"], False, None, ["cpu_platform"]),
])
def test_resolution(platform, args, on, setting, decided):
    adv = advise(["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", *args], platform)
    assert (adv.async_scheduling, adv.setting, ids(adv), adv.refused) == (on, setting, decided, False)


@pytest.mark.parametrize("args,refused_by", [
    (["--async-scheduling", "--speculative-config", '{"method": "medusa"}'], "spec_method"),
    (["--async-scheduling", "--speculative-config", '{"method": "eagle", "disable_padded_drafter_batch": true}'],
     "padded_drafter"),
    (["VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0", "--async-scheduling", "--distributed-executor-backend=ray"], "executor"),
    (["VLLM_USE_V2_MODEL_RUNNER=0", "--async-scheduling", "-pp", "2"], "pp_v1_runner"),
])
def test_explicit_async_scheduling_is_refused(args, refused_by):
    adv = advise(args, "cuda")
    assert adv.refused and adv.async_scheduling is None and adv.setting is None and ids(adv) == [refused_by]


def test_every_rule_cites_its_source():
    assert all(r.source and r.checked == ("0.32.0",) for r in RULES)
    cpu = next(r for r in RULES if r.id == "cpu_platform")
    assert "platforms/cpu.py" in cpu.source


def test_server_fields_notes_and_versions():
    adv = advise(["vllm", "serve", "m", "--max-num-seqs", "16", "--no-enable-prefix-caching", "--block-size=32",
                  "--gpu-memory-utilization", "0.8", "FOO=1"], "cpu")
    assert adv.config.server == {"max_num_seqs": 16, "enable_prefix_caching": False, "block_size": 32}
    assert any("--gpu-memory-utilization 0.8" in n for n in adv.notes)
    assert any("FOO" in n for n in adv.notes)
    assert any("newer than any checked" in n for n in advise([], "cuda", "0.40.0").notes)
    on = advise([], "cuda")
    assert any(n.startswith("async_tokens_late") for n in on.notes)
    with pytest.raises(UserInputError):
        advise([], "mlx")
    with pytest.raises(UserInputError):
        advise(["--max-num-seqs", "many"], "cuda")
    with pytest.raises(UserInputError):
        advise([], "cuda", "not-a-version")


def test_cli(capsys):
    assert main(["advise", "--engine", "vllm", "--device", "cpu", "--", "--model", "m", "--async-scheduling"]) == 0
    out = capsys.readouterr().out
    assert "vLLM 0.32.0 on cpu" in out and "cpu_platform" in out and "simulator setting: sync" in out
    assert main(["advise", "--engine", "vllm", "--json", "--", "VLLM_USE_V2_MODEL_RUNNER=0", "--async-scheduling",
                 "-pp", "2"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["refused"] and payload["decided_by"][0]["id"] == "pp_v1_runner"
    assert main(["advise", "--engine", "vllm", "--device", "mps"]) == 2
    assert "for vLLM" in capsys.readouterr().err
    assert main(["advise", "--device", "cpu", "--", "--disable-overlap-schedule"]) == 0  # SGLang as before
    assert "SGLang" in capsys.readouterr().out


def test_a_size_the_simulator_does_not_model_is_not_a_vllm_refusal():
    """A block larger than the context is the simulator's limit, not vLLM's start-up check: the
    async answer stands, the setting is unmodelled and a note says why; a size vLLM's own
    ``verify_max_model_len`` refuses is still a refusal."""
    adv = advise(["--model", "m", "--block-size", "4096", "--max-model-len", "2048"])
    assert not adv.refused and adv.async_scheduling is True and adv.setting is None
    assert any(n.startswith("not modelled by the simulator (vLLM may start): block_size") for n in adv.notes)
    adv = advise(["--model", "m", "--max-num-batched-tokens", "8", "--max-num-seqs", "64"])
    assert adv.refused and adv.setting is None and adv.decided_by[0].kind == "refuse_resolved"


def test_a_refused_flag_leaves_no_simulator_setting():
    """Tensor parallelism on a card is refused by the simulator (no card profile at that size):
    the answer names no setting, as for pipeline parallelism, on both engines."""
    from sim.engines.sglang.rules.loop_rules import advise as advise_sglang

    assert advise(["--model", "m", "-tp", "2"]).setting is None
    assert advise(["--model", "m", "-tp", "2"], "cpu").setting == "sync"
    assert advise_sglang(["--tp-size", "2"]).setting is None
