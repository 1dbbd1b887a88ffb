"""SGLang launch arguments, read as the loop-selection rules need them.

A server command such as ``SGLANG_USE_MLX=1 python -m sglang.launch_server --model-path X
--disable-overlap-schedule --pp-size 2`` becomes a :class:`LaunchConfig`: the ServerArgs
fields the rules read (``sglang_rules.yaml`` beside this module, section ``flags``), the environment
variables (``NAME=VALUE`` tokens), the platform and the release. Arguments the table does
not know are passed over with a note, as the issue asks: they do not change which loop runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version

from sim.errors import UserInputError

PLATFORMS = ("cuda", "mlx", "mps", "cpu")
_ENV_TOKEN = re.compile(r"^([A-Z][A-Z0-9_]*)=(.*)$")
_LAUNCHER_TOKENS = {"-m", "sglang.launch_server", "env"}
_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n", ""}


@lru_cache(maxsize=1)
def rules_table() -> dict:
    """The parsed rules file ``sglang_rules.yaml`` of this package (flags, env, defaults, rules)."""
    text = resources.files("sim.engines.sglang.rules").joinpath("sglang_rules.yaml").read_text()
    # libyaml's parser where PyYAML has it (the same safe constructor, about 8x faster on this
    # file: it is read on every run), else PyYAML's pure-Python one
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


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
    """

    platform: str
    version: str
    fields: dict[str, Any]
    env: dict[str, str]
    server: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


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
        UserInputError: unknown platform, bad version, or a known flag with a bad value.
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
            notes.append(f"argument {tok!r} passed over (not a --flag)")
            continue
        name, eq, inline = tok.partition("=")
        raw = inline if eq else None
        spec = index.get(name)
        if spec is None:
            if raw is None and i < len(tokens) and not tokens[i].startswith("-"):
                raw = tokens[i]
                i += 1
            shown = name if raw is None else f"{name} {raw}"
            notes.append(f"{shown}: not read by the rules (no effect on the event loop): passed over")
            continue
        if raw is None and spec["type"] != "bool":
            if i >= len(tokens):
                raise UserInputError(source, name, f"expected a value after {name}")
            raw = tokens[i]
            i += 1
        value = _convert(spec, name, raw, source)
        fields[spec["field"]] = value
        if "server" in spec:
            server[spec["server"]] = value
    if "init_new_token_ratio" in server:  # SGLang: init ratio = min(0.7 * conservativeness, 1)
        server["init_new_token_ratio"] = min(0.7 * server["init_new_token_ratio"], 1.0)
    if env_truthy(env.get("SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP")):
        server["disable_consecutive_prefill_overlap"] = True
    platform = _resolve_platform(platform, fields, env, notes)
    return LaunchConfig(platform, str(ver), fields, env, server, tuple(notes))


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
    return device if device in PLATFORMS else platform
