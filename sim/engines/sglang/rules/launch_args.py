"""SGLang launch arguments, read as the loop-selection rules need them.

A server command such as ``SGLANG_USE_MLX=1 python -m sglang.launch_server --model-path X
--disable-overlap-schedule --pp-size 2`` becomes a :class:`LaunchConfig`: the ServerArgs
fields the rules read (``sglang_rules.yaml`` beside this module, section ``flags``), the environment
variables (``NAME=VALUE`` tokens), the platform and the release. Arguments the table does
not read but SGLang's own parser knows (``flags-0.5.23.json``, read from
``ServerArgs.add_cli_args`` by ``realengines/flags.py``) are passed over with a note ("no effect
on the loop"); a flag SGLang's parser does not know is an error, as it is for
``sglang.launch_server``. Each flag gets a status (:attr:`LaunchConfig.flags`): ``modelled``,
``refused: not modelled`` (:func:`unmodelled`) or ``no effect on the loop``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version

from sim.errors import UserInputError
from sim.model.known_flags import value_after

PLATFORMS = ("cuda", "mlx", "mps", "cpu")
_ENV_TOKEN = re.compile(r"^([A-Z][A-Z0-9_]*)=(.*)$")
_LAUNCHER_TOKENS = {"-m", "sglang.launch_server", "env"}
_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n", ""}


RULES_FILE = "sglang_rules.yaml"  # the rules, written and commented by hand
RULES_JSON = "sglang_rules.json"  # the same table as JSON, what a run reads (write_rules_json)


@lru_cache(maxsize=1)
def rules_table() -> dict:
    """The rules table of this package (flags, env, defaults, rules): ``sglang_rules.yaml`` as
    parsed, read from its JSON copy ``sglang_rules.json`` (PyYAML's C parser took 7 ms of every
    run's start on the development VM, JSON 0.2 ms; ``tests/test_launch_flags.py`` holds the copy
    to the YAML, and :func:`write_rules_json` writes it after an edit)."""
    return json.loads(resources.files("sim.engines.sglang.rules").joinpath(RULES_JSON).read_text())


def write_rules_json() -> Path:
    """Write ``sglang_rules.json`` from ``sglang_rules.yaml`` (after editing the YAML:
    ``python -c "from sim.engines.sglang.rules.launch_args import write_rules_json; write_rules_json()"``).
    Returns the path written."""
    here = Path(__file__).resolve().parent
    table = yaml.load((here / RULES_FILE).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    path = here / RULES_JSON
    path.write_text(json.dumps(table, indent=1) + "\n")
    return path


@dataclass(frozen=True)
class LaunchConfig:
    """What a launch command says, for the rules.

    Attributes:
        platform: 'cuda' | 'mlx' | 'mps' | 'cpu' ('mlx' is the MPS device with SGLANG_USE_MLX set).
        version: the SGLang release the rules are evaluated for.
        fields: ServerArgs field -> value (defaults filled in), e.g. ``{'pp_size': 2, ...}``.
        env: environment variable -> raw string value.
        server: scenario ``server.*`` field -> value, for the flags that map onto one.
        notes: human-readable notes (arguments passed over, conflicts resolved).
        flags: ``(flag as given, status)`` per flag, in order; status is :data:`MODELLED`,
            ``refused: not modelled (<what>)`` or :data:`NO_EFFECT`.
        model: the model the command serves (``--model-path``), None where it names none: the
            costs stand for it (:mod:`sim.model.profile` compares it with the profile's).
    """

    platform: str
    version: str
    fields: dict[str, Any]
    env: dict[str, str]
    server: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    flags: tuple[tuple[str, str], ...] = ()
    model: str | None = None


MODELLED = "modelled"
NO_EFFECT = "no effect on the loop"
FLAGS_FILE = "flags-0.5.23.json"  # SGLang's own flags (realengines/flags.py), used for every release


def known_flags():
    """SGLang's server flags (:class:`sim.model.known_flags.KnownFlags`)."""
    from sim.model.known_flags import load

    return load(str(resources.files("sim.engines.sglang.rules").joinpath(FLAGS_FILE)))


def _flags_words(release: Version) -> str:
    """Which release's flag list a refused flag was checked against: the recorded one
    (:data:`FLAGS_FILE`, used for every release), and where ``release`` is another, that its own
    list may differ."""
    recorded = known_flags().version
    if str(release) == str(recorded):
        return f"the flags of SGLang {recorded}"
    return (f"checked against SGLang {recorded}'s flags, the only release whose flag list is recorded here; "
            f"{release}'s may differ")


def unmodelled(fields: dict) -> dict[str, str]:
    """ServerArgs field -> what it turns on, for each launch setting that changes the timeline in
    a way the simulator does not model (it runs one scheduler on one device decoding one token
    per step): speculative decoding (a draft and a verify forward per step), pipeline parallelism
    (``event_loop_pp``), data parallelism (a controller over several schedulers), DP attention
    (an all-gather of batch shapes before each launch), PD disaggregation (the disaggregation
    loops), LoRA adapters (``prepare_lora_batch`` on the host and the adapters' matmuls in every
    forward, per batch's adapters), multimodal inputs (the encoder's forward and the inputs'
    processing before a prefill). Tensor parallelism (a scheduler per rank in lockstep, all-reduces in the forward) is
    modelled on the CPU server through a profile measured at that size (``server.tp_size``);
    :func:`parse_launch_args` refuses it on other platforms."""
    out = {}
    spec = fields.get("speculative_algorithm")
    if isinstance(spec, str) and spec.strip() and spec.strip().upper() != "NONE":
        out["speculative_algorithm"] = "speculative decoding"
    for name, what in (("pp_size", "pipeline parallelism"), ("dp_size", "data parallelism")):
        if isinstance(fields.get(name), int) and fields[name] > 1:
            out[name] = what
    if fields.get("enable_dp_attention") is True:
        out["enable_dp_attention"] = "DP attention"
    if str(fields.get("disaggregation_mode", "null")).lower() not in ("null", "none", ""):
        out["disaggregation_mode"] = "PD disaggregation"
    if fields.get("enable_lora") is True:
        out["enable_lora"] = "LoRA adapters"
    if isinstance(fields.get("lora_paths"), str) and fields["lora_paths"].strip():
        out["lora_paths"] = "LoRA adapters"
    if fields.get("enable_multimodal") is True:
        out["enable_multimodal"] = "multimodal inputs"
    return out


def env_truthy(value: str | None) -> bool:
    """SGLang's ``EnvBool`` reading of an environment variable (unset -> False)."""
    return value is not None and value.strip().lower() in _TRUE


def parse_version(text: str | None, source: str = "--version") -> Version:
    """A release string ('0.5.22', 'v0.5.3.post1') as a PEP 440 version; None -> the table's default.

    Raises:
        UserInputError: not a version.
    """
    text = rules_table()["default_version"] if text is None else str(text)
    try:
        return Version(text.lstrip("vV"))
    except InvalidVersion:
        raise UserInputError(source, "", f"expected an SGLang release such as 0.5.22 (got {text!r})") from None


def _flag_index() -> dict[str, dict]:
    index = {}
    for spec in rules_table()["flags"]:
        for name in [spec["flag"], *spec.get("aliases", [])]:
            index[name] = spec
    return index


def _convert(spec: dict, flag: str, raw: str | None, source: str):
    kind = spec["type"]
    if kind == "bool":
        if raw is None:
            return True
        low = raw.strip().lower()
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise UserInputError(source, flag, f"expected true or false (got {raw!r})")
    if raw is None:
        raise UserInputError(source, flag, f"expected a value after {flag}")
    try:
        value = {"int": int, "float": float, "str": str}[kind](raw)
    except ValueError:
        raise UserInputError(source, flag, f"expected {'an integer' if kind == 'int' else 'a number'} (got {raw!r})") from None
    if kind == "float" and not math.isfinite(value):  # float("inf") parses; no SGLang setting means it
        raise UserInputError(source, flag, f"expected a finite number (got {raw!r})")
    low = spec.get("min")  # the range SGLang's own ServerArgs checks accept (the rules table's `min`)
    if low is not None and not value >= low:  # NaN fails too
        raise UserInputError(source, flag, f"expected {'an integer' if kind == 'int' else 'a number'} >= {low} "
                             f"(got {raw!r}); SGLang refuses to start")
    return value


def parse_launch_args(args: list[str], platform: str = "cuda", version: str | None = None,
                      source: str = "launch arguments") -> LaunchConfig:
    """Read an SGLang launch command (the ``python -m sglang.launch_server`` prefix and
    ``NAME=VALUE`` environment tokens allowed) for the rules.

    Args:
        args: the command split into tokens (``--flag value`` or ``--flag=value``).
        platform: 'cuda' | 'mlx' | 'mps' | 'cpu'; 'mlx' means ``--device mps`` with SGLANG_USE_MLX=1.
        version: SGLang release, None for the table's default (the seed document's 0.5.22).
        source: where the arguments came from, for error messages.

    Returns:
        The :class:`LaunchConfig`.

    Raises:
        UserInputError: unknown platform, bad version, a flag SGLang's server does not know, or
            a known flag with a bad value.
    """
    if platform not in PLATFORMS:
        raise UserInputError(source, "device", f"expected one of {', '.join(PLATFORMS)} (got {platform!r})")
    table = rules_table()
    ver = parse_version(version, "--version" if source == "launch arguments" else "server.version")
    index = _flag_index()
    fields: dict[str, Any] = dict(table["defaults"])
    env: dict[str, str] = {}
    server: dict[str, Any] = {}
    notes: list[str] = []
    statuses: list[tuple[str, str]] = []  # (flag as given, field read, or NO_EFFECT)
    model = None  # --model-path's value
    known_env = set(table["env"])
    tokens = [str(t) for t in args]
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        m = _ENV_TOKEN.match(tok)
        if m:
            env[m.group(1)] = m.group(2)
            if m.group(1) not in known_env:
                notes.append(f"environment variable {m.group(1)} is not read by the rules: passed over")
            continue
        if tok in _LAUNCHER_TOKENS or re.fullmatch(r"(.*/)?python[0-9.]*", tok):
            continue
        if not tok.startswith("--"):
            if i >= 2 and known_flags().gives_switch_a_value(tokens[i - 2], tok):
                raise UserInputError(source, tokens[i - 2], f"takes no value (python -m sglang.launch_server refuses "
                                     f"{tokens[i - 2]} {tok}: unrecognized arguments: {tok}; leave the flag out to "
                                     "keep its default)")
            notes.append(f"argument {tok!r} passed over (not a --flag)")
            continue
        name, eq, inline = tok.partition("=")
        raw = inline if eq else None
        known = known_flags().resolve(name)
        if known is not None and eq and not known[1]:  # a switch given a value: argparse refuses it
            raise UserInputError(source, name, f"takes no value (python -m sglang.launch_server refuses "
                                 f"{tok!r}: ignored explicit argument; leave the flag out to keep its default)")
        spec = index.get(name) or (index.get(known[0]) if known else None)
        if spec is None:
            if known is None:
                raise UserInputError(source, name, f"not a flag of SGLang's server (python -m sglang.launch_server "
                                     f"refuses it: unrecognized arguments; {_flags_words(ver)})")
            if raw is None and known[1]:
                raw = value_after(tokens, i, name, source, "python -m sglang.launch_server")
                i += 1
            shown = name if raw is None else f"{name} {raw}"
            if (allowed := known_flags().refuses(known[0], raw)) is not None:
                raise UserInputError(source, name, f"{raw!r} is not one of {', '.join(allowed)} (SGLang's server "
                                     f"refuses it: invalid choice; {_flags_words(ver)})")
            if known[0] == "--model-path":  # the model: what the costs stand for, not a rule's input
                model = raw
                notes.append(f"{shown}: the model served, which the costs stand for (the profile's or the "
                             "scenario's; no effect on the event loop)")
            elif known[0] == "--grammar-backend":  # grammars are per request (SamplingParams.json_schema, ...)
                notes.append(f"{shown}: the backend of per-request grammars; the simulator models grammars from the "
                             "scenario's server.structured_output (the share of constrained requests and their "
                             "costs: docs/model.md#structured-output)")
            else:
                notes.append(f"{shown}: not read by the rules (no effect on the event loop): passed over")
            statuses.append((shown, NO_EFFECT))
            continue
        if raw is None and spec["type"] != "bool":
            raw = value_after(tokens, i, name, source, "python -m sglang.launch_server")
            i += 1
        value = _convert(spec, name, raw, source)
        fields[spec["field"]] = value
        statuses.append((name if spec["type"] == "bool" and not eq else f"{name} {raw}", spec["field"]))
        if "server" in spec:
            server[spec["server"]] = value
    if "init_new_token_ratio" in server:  # SGLang: init ratio = min(0.7 * conservativeness, 1)
        server["init_new_token_ratio"] = min(0.7 * server["init_new_token_ratio"], 1.0)
    if env_truthy(env.get("SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP")):
        server["disable_consecutive_prefill_overlap"] = True
    device = fields.get("device")
    if device is not None and device not in ("cuda", "cpu", "mps"):  # npu, xpu, hpu...: another platform's backend
        raise UserInputError(source, "--device", f"{device!r} is not modelled (the simulator models cuda, cpu and mps, "
                             "with SGLANG_USE_MLX=1 the MLX backend): no answer for this command")
    platform = _resolve_platform(platform, fields, env, notes)
    refused = unmodelled(fields)
    tp = fields.get("tp_size", 1)
    if isinstance(tp, int) and tp > 1 and platform != "cpu":
        refused["tp_size"] = (f"tensor parallelism on {platform}: no card profile at TP {tp} can be measured yet; "
                              "the TP calibration runs SGLang's CPU server")
    elif isinstance(tp, int) and tp > 1:
        notes.append(f"--tp-size {tp}: modelled through a profile measured at that size (calibrate --engine sglang "
                     f"--tensor-parallel-size {tp}): rank 0's phases, which hold the request broadcast and the "
                     "forward's all-reduces")
    flags = tuple((shown, NO_EFFECT if what == NO_EFFECT else
                   f"refused: not modelled ({refused[what]})" if what in refused else MODELLED)
                  for shown, what in statuses)
    return LaunchConfig(platform, str(ver), fields, env, server, tuple(notes), flags, model)


def _resolve_platform(platform: str, fields: dict, env: dict, notes: list[str]) -> str:
    # --device from the arguments wins over the platform; 'mlx' is MPS with SGLANG_USE_MLX set.
    default_device = {"cuda": "cuda", "cpu": "cpu", "mps": "mps", "mlx": "mps"}[platform]
    if platform == "mlx" and "SGLANG_USE_MLX" not in env:
        env["SGLANG_USE_MLX"] = "1"
    device = fields.get("device")
    if device is None:
        fields["device"] = device = default_device
    elif device != default_device:
        notes.append(f"--device {device} overrides the platform {platform}")
    if device == "mps":
        if env_truthy(env.get("SGLANG_USE_MLX")):
            return "mlx"
        if platform == "mlx":
            notes.append("SGLANG_USE_MLX is set false: MPS without MLX")
        return "mps"
    if platform == "mlx" and device != "mps":
        env.pop("SGLANG_USE_MLX", None)
    elif env_truthy(env.get("SGLANG_USE_MLX")):  # (SGLang reads it on the MPS device only)
        notes.append(f"SGLANG_USE_MLX is set, but the device is {device}: MLX runs on Apple's MPS device only, so "
                     "it has no effect here (passed over)")
    return device if device in PLATFORMS else platform
