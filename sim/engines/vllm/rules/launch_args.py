"""vLLM launch arguments, read as the async-scheduling rules need them.

A command such as ``VLLM_USE_V2_MODEL_RUNNER=0 python -m vllm.entrypoints.openai.api_server --model
DIR --async-scheduling -pp 2`` (or ``vllm serve DIR ...``) becomes a :class:`VllmLaunch`: the
engine arguments the rules read (vLLM 0.32.0 names, ``engine/arg_utils.py``), the environment
variables given as ``NAME=VALUE`` tokens, the platform and the release. Arguments the rules do
not read are passed over with a note; they do not change which engine loop runs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from packaging.version import InvalidVersion, Version

from sim.engines.vllm.speculative import MAX_SPEC_TOKENS, MODELLED_METHODS
from sim.errors import UserInputError
from sim.model.known_flags import value_after

PLATFORMS = ("cuda", "cpu")
DEFAULT_VERSION = "0.32.0"
CHECKED_VERSIONS = ("0.32.0",)
_ENV_TOKEN = re.compile(r"^([A-Z][A-Z0-9_]*)=(.*)$")
_LAUNCHER_TOKENS = {"-m", "vllm.entrypoints.openai.api_server", "vllm", "serve", "env"}
_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n", ""}
ENV_READ = ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_RAY_V2_EXECUTOR_BACKEND")

# flag -> (field, type, scenario server field or None); "bool" flags take --no-<name> too
FLAGS: dict[str, tuple[str, str, str | None]] = {
    "--async-scheduling": ("async_scheduling", "bool", None),
    "--pipeline-parallel-size": ("pipeline_parallel_size", "int", None),
    "-pp": ("pipeline_parallel_size", "int", None),
    "--tensor-parallel-size": ("tensor_parallel_size", "int", "tensor_parallel_size"),
    "-tp": ("tensor_parallel_size", "int", "tensor_parallel_size"),
    "--data-parallel-size": ("data_parallel_size", "int", None),
    "-dp": ("data_parallel_size", "int", None),
    "--speculative-config": ("speculative_config", "json", None),
    "--distributed-executor-backend": ("distributed_executor_backend", "str", None),
    "--runner": ("runner", "str", None),
    "--max-num-seqs": ("max_num_seqs", "int", "max_num_seqs"),
    "--max-num-batched-tokens": ("max_num_batched_tokens", "int", "max_num_batched_tokens"),
    "--max-model-len": ("max_model_len", "int", "max_model_len"),
    "--block-size": ("block_size", "int", "block_size"),
    "--num-gpu-blocks-override": ("num_gpu_blocks", "int", "num_gpu_blocks"),
    "--enable-chunked-prefill": ("enable_chunked_prefill", "bool", "enable_chunked_prefill"),
    "--enable-prefix-caching": ("enable_prefix_caching", "bool", "enable_prefix_caching"),
    "--long-prefill-token-threshold": ("long_prefill_token_threshold", "int", "long_prefill_token_threshold"),
    "--enable-lora": ("enable_lora", "bool", None),
}
# the smallest value vLLM's own argument checks accept, per integer field (EngineArgs/ParallelConfig
# validation: sizes and counts are positive; a threshold of 0 turns the feature off)
MIN_INT = {"pipeline_parallel_size": 1, "tensor_parallel_size": 1, "data_parallel_size": 1, "max_num_seqs": 1, "max_num_batched_tokens": 1,
           "max_model_len": 1, "block_size": 1, "num_gpu_blocks": 1, "long_prefill_token_threshold": 0}
DEFAULTS: dict[str, Any] = {"async_scheduling": None, "pipeline_parallel_size": 1, "tensor_parallel_size": 1,
                            "data_parallel_size": 1,
                            "speculative_config": None, "distributed_executor_backend": None, "runner": "auto",
                            "enable_lora": False}


@dataclass(frozen=True)
class VllmLaunch:
    """What a vLLM launch command says, for the rules.

    Attributes:
        platform: 'cuda' | 'cpu'. version: the vLLM release the rules are evaluated for.
        fields: engine argument -> value (defaults filled in; ``async_scheduling`` None = not given).
        env: environment variable -> raw value. server: scenario ``server.*`` field -> value.
        notes: arguments passed over.
        flags: ``(flag as given, status)`` per flag, in order: :data:`MODELLED`, ``refused: not
            modelled (<what>)`` (:func:`unmodelled`) or :data:`NO_EFFECT`.
    """

    platform: str
    version: str
    fields: dict[str, Any]
    env: dict[str, str]
    server: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    flags: tuple[tuple[str, str], ...] = ()

    @property
    def speculative_method(self) -> str | None:
        spec = self.fields.get("speculative_config")
        return spec.get("method") if isinstance(spec, dict) else None


MODELLED = "modelled"
NO_EFFECT = "no effect on the loop"
FLAGS_FILE = "flags-0.32.0.json"  # vLLM's own server flags (realengines/flags.py)


def known_flags():
    """vLLM's OpenAI-server flags (:class:`sim.model.known_flags.KnownFlags`)."""
    from importlib import resources

    from sim.model.known_flags import load

    return load(str(resources.files("sim.engines.vllm.rules").joinpath(FLAGS_FILE)))


def speculative_server(spec_config) -> dict | str:
    """What a ``--speculative-config`` gives the scenario: its ``server.speculative`` fields
    (``method``, ``num_speculative_tokens``) when the simulator models it (a method of
    :data:`sim.engines.vllm.speculative.MODELLED_METHODS` with k an integer from 1 to 64), else
    what it turns on that is not modelled, in words. The acceptance law and the draft's cost are
    not in the command: the scenario gives them."""
    method = spec_config.get("method") if isinstance(spec_config, dict) else None
    if method not in MODELLED_METHODS:
        modelled = f"{', '.join(MODELLED_METHODS[:-1])} and {MODELLED_METHODS[-1]}"
        return (f"speculative decoding by {method}: modelled are {modelled} with num_speculative_tokens" if method
                else "speculative decoding without a method")
    k = spec_config.get("num_speculative_tokens")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPEC_TOKENS:
        return (f"speculative decoding by {method} without num_speculative_tokens from 1 to {MAX_SPEC_TOKENS}: "
                "the simulator needs k")
    return {"method": method, "num_speculative_tokens": k}


def unmodelled(fields: dict) -> dict[str, str]:
    """Engine argument -> what it turns on, for each launch setting that changes the timeline in a
    way the simulator does not model (one engine core, one worker): speculative decoding other than
    a device drafter's k drafts per step (:func:`speculative_server`: n-gram and suffix proposers,
    parallel drafters, or no ``num_speculative_tokens``), pipeline and data parallelism (a
    pipeline of batches; several engine cores), LoRA adapters (``--enable-lora``). Tensor parallelism is modelled through a profile
    measured at that size (``server.tensor_parallel_size``)."""
    out = {}
    spec = fields.get("speculative_config")
    if spec and isinstance(why := speculative_server(spec), str):
        out["speculative_config"] = why
    for name, what in (("pipeline_parallel_size", "pipeline parallelism"), ("data_parallel_size", "data parallelism")):
        if isinstance(fields.get(name), int) and fields[name] > 1:
            out[name] = what
    if fields.get("enable_lora") is True:
        out["enable_lora"] = "LoRA adapters (the adapters' mapping in the worker's input preparation and their matmuls in every forward)"
    return out


def env_flag(value: str | None) -> bool | None:
    """vLLM's reading of a boolean environment variable (None when unset)."""
    return None if value is None else value.strip().lower() in _TRUE


def parse_version(text: str | None) -> Version:
    """A vLLM release ('0.32.0', 'v0.32.0'); None -> :data:`DEFAULT_VERSION`.

    Raises:
        UserInputError: not a version.
    """
    text = DEFAULT_VERSION if text is None else str(text)
    try:
        return Version(text.lstrip("vV"))
    except InvalidVersion:
        raise UserInputError("--version", "", f"expected a vLLM release such as {DEFAULT_VERSION} (got {text!r})") from None


def _convert(kind: str, flag: str, raw: str | None, source: str, name: str = ""):
    if kind == "bool":
        low = "true" if raw is None else raw.strip().lower()
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise UserInputError(source, flag, f"expected true or false (got {raw!r})")
    if raw is None:
        raise UserInputError(source, flag, f"expected a value after {flag}")
    if kind == "int":
        try:
            value = int(raw)
        except ValueError:
            raise UserInputError(source, flag, f"expected an integer (got {raw!r})") from None
        if name in MIN_INT and value < MIN_INT[name]:
            raise UserInputError(source, flag, f"expected an integer >= {MIN_INT[name]} (got {raw!r}); vLLM refuses "
                                 "to start")
        return value
    if kind == "json":
        try:
            value = json.loads(raw)
        except ValueError:
            raise UserInputError(source, flag, f"expected a JSON object (got {raw!r})") from None
        if not isinstance(value, dict):
            raise UserInputError(source, flag, f"expected a JSON object (got {raw!r})")
        return value
    return raw


def parse_launch_args(args: list[str], platform: str = "cuda", version: str | None = None,
                      source: str = "launch arguments") -> VllmLaunch:
    """Read a vLLM launch command (the launcher prefix, the model and ``NAME=VALUE`` environment
    tokens allowed; ``--flag value``, ``--flag=value``, ``--no-flag`` for booleans,
    ``--speculative-config.method X`` for one key of a JSON argument).

    Raises:
        UserInputError: a platform vLLM's model here does not cover, a bad version, a flag vLLM's
            server does not know, a known flag with a bad value.
    """
    if platform not in PLATFORMS:
        raise UserInputError(source, "device", f"expected one of {', '.join(PLATFORMS)} for vLLM (got {platform!r})")
    ver = parse_version(version)
    fields: dict[str, Any] = dict(DEFAULTS)
    env: dict[str, str] = {}
    server: dict[str, Any] = {}
    notes: list[str] = []
    statuses: list[tuple[str, str]] = []  # (flag as given, field read, or NO_EFFECT)
    tokens = [str(t) for t in args]
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        m = _ENV_TOKEN.match(tok)
        if m:
            env[m.group(1)] = m.group(2)
            if m.group(1) not in ENV_READ:
                notes.append(f"environment variable {m.group(1)} is not read by the rules: passed over")
            continue
        if tok in _LAUNCHER_TOKENS or re.fullmatch(r"(.*/)?python[0-9.]*", tok) or not tok.startswith("-"):
            if i >= 2 and known_flags().gives_switch_a_value(tokens[i - 2].replace("_", "-").partition(".")[0], tok):
                raise UserInputError(source, tokens[i - 2], f"takes no value (vllm serve refuses {tokens[i - 2]} "
                                     f"{tok}: unrecognized arguments; --no-<flag> turns a switch off)")
            continue  # the launcher, or the model (vllm serve MODEL)
        name, eq, raw = tok.partition("=")
        raw = raw if eq else None
        head, dot_, tail = name.partition(".")
        name = head.replace("_", "-") if head.startswith("--") else head  # FlexibleArgumentParser: _ as -
        name = name + dot_ + tail
        negated = name.startswith("--no-") and f"--{name[5:]}" in FLAGS and FLAGS[f"--{name[5:]}"][1] == "bool"
        key = f"--{name[5:]}" if negated else name
        base, dot, sub = key.partition(".")
        known = known_flags().resolve(name.partition(".")[0])
        if known is not None and eq and not known[1] and not dot_:  # a switch given a value: argparse refuses it
            raise UserInputError(source, name, f"takes no value (vllm serve refuses {tok!r}: ignored explicit "
                                 "argument; --no-<flag> turns a switch off)")
        spec = FLAGS.get(base) or (FLAGS.get(known[0]) if known and not negated else None)
        if spec is None:
            if known is None:
                raise UserInputError(source, name, f"not a flag of vLLM's server (vllm serve refuses it: unrecognized "
                                     f"arguments; the flags of vLLM {known_flags().version})")
            if raw is None and known[1]:
                raw = value_after(tokens, i, name, source, "vllm serve")
                i += 1
            shown = name if raw is None else f"{name} {raw}"
            if (allowed := known_flags().refuses(known[0], raw)) is not None:
                raise UserInputError(source, name, f"{raw!r} is not one of {', '.join(allowed)} (vllm serve refuses "
                                     f"it: invalid choice; the flags of vLLM {known_flags().version})")
            if known[0] == "--structured-outputs-config":  # the grammars' backend; grammars are per request
                notes.append(f"{shown}: the backend of per-request grammars; the simulator models grammars from "
                             "the scenario's server.structured_output (the share of constrained requests and "
                             "their costs: docs/vllm.md#structured-output)")
            else:
                notes.append(f"{shown}: not read by the rules: passed over")
            statuses.append((shown, NO_EFFECT))
            continue
        if raw is None and spec[1] != "bool":
            raw = value_after(tokens, i, name, source, "vllm serve")
            i += 1
        if dot and spec[1] == "json":  # --speculative-config.method ngram
            fields[spec[0]] = {**(fields[spec[0]] or {}), sub: _json_scalar(raw)}
            statuses.append((f"{name} {raw}", spec[0]))
            continue
        value = _convert(spec[1], name, raw, source, spec[0])
        fields[spec[0]] = (not value) if negated else value
        statuses.append((name if raw is None else f"{name} {raw}", spec[0]))
        if spec[2] is not None:
            server[spec[2]] = fields[spec[0]]
    spec_config = fields.get("speculative_config")
    if isinstance(spec_config, dict) and "method" in spec_config and not isinstance(spec_config["method"], str):
        raise UserInputError(source, "--speculative-config", f"a method name (a string) as its method (got "
                             f"{spec_config['method']!r})")
    refused = unmodelled(fields)
    tp = fields.get("tensor_parallel_size", 1)
    if isinstance(tp, int) and tp > 1 and platform != "cpu":
        refused["tensor_parallel_size"] = (f"tensor parallelism on {platform}: no card profile at TP {tp} can be "
                                           "measured yet; the TP calibration runs vLLM's CPU server")
    if spec_config and "speculative_config" not in refused:
        server["speculative"] = speculative_server(spec_config)
        notes.append("--speculative-config: modelled given what the command does not say: the scenario's "
                     "server.speculative acceptance (per_position_acceptance, acceptance_rate or accepted_histogram) "
                     "and draft_cost_ratio")
    if tp > 1 and "tensor_parallel_size" not in refused:
        notes.append(f"tensor parallel size {tp}: modelled through a profile measured at TP {tp} (one engine core, "
                     f"{tp} workers in lockstep: the broadcast in its dispatch, the all-reduces in its forward; "
                     f"overlap-sim calibrate --engine vllm --tensor-parallel-size {tp}); a run whose profile was "
                     "measured at another size is refused")
    flags = tuple((shown, NO_EFFECT if what == NO_EFFECT else
                   f"refused: not modelled ({refused[what]})" if what in refused else MODELLED)
                  for shown, what in statuses)
    return VllmLaunch(platform, str(ver), fields, env, server, tuple(notes), flags)


def _json_scalar(raw: str | None):
    if raw is None:
        return True
    try:
        return json.loads(raw)
    except ValueError:
        return raw
