"""Which event loop SGLang selects for a launch command, whether overlap is on, which rule
turned it off, and the known hazards of that path, evaluated from the rules table
(``sglang_rules.yaml`` beside this module).

Selection follows SGLang's scheduler (``_dispatch_event_loop_once`` in 0.5.22,
``run_scheduler_process`` in 0.5.3): ServerArgs resolution first turns overlap off where it
cannot work (pipeline parallel, speculative decoding without spec v2, dLLM, MPS without
MLX, ...); then the first matching loop row wins (pdmux -> pipeline parallel -> overlap_mlx ->
overlap -> normal). The code only interprets rows; every rule, release bound and source
lives in the table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from packaging.version import Version

from sim.engines.sglang.rules.launch_args import LaunchConfig, env_truthy, parse_launch_args, rules_table
from sim.engines.sglang.rules.specifiers import version_in


@dataclass(frozen=True)
class RuleHit:
    """One matching row: its id, what it says, where it comes from, and for hazards the
    severity ('fault' | 'risk' | 'info') and the simulator effect (``sim``), if any."""

    id: str
    text: str
    source: str
    severity: str = ""
    checked: tuple[str, ...] = ()
    note: str = ""
    sim: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Advice:
    """The answer of ``overlap-sim advise``.

    Attributes:
        config: the parsed launch command.
        loop: SGLang event loop name, e.g. 'event_loop_overlap'.
        setting: the simulator setting that models it ('overlap', 'overlap_mlx', 'normal',
            'thread_overlap'), or None when the simulator does not model that loop or refuses
            a flag of the command (``refused: not modelled``: it gives no answer for it).
        overlap: whether the overlap schedule is on.
        disabled_by: the rows (and the user flag) that turned overlap off, in order.
        selected_by: the loop row that chose the loop.
        hazards: hazard rows that apply to this path and release.
        notes: arguments passed over, version caveats.
    """

    config: LaunchConfig
    loop: str
    setting: str | None
    overlap: bool
    disabled_by: tuple[RuleHit, ...]
    selected_by: RuleHit
    hazards: tuple[RuleHit, ...]
    notes: tuple[str, ...]

    def faults(self) -> tuple[RuleHit, ...]:
        """Hazards with a simulator effect (``sim`` key), e.g. the MLX crash."""
        return tuple(h for h in self.hazards if h.sim)

    def to_dict(self) -> dict:
        """JSON-able form (``advise --json``)."""
        def hit(h: RuleHit) -> dict:
            d = {"id": h.id, "text": h.text, "source": h.source}
            if h.severity:
                d["severity"] = h.severity
            if h.note:
                d["note"] = h.note
            return d
        return {
            "platform": self.config.platform, "version": self.config.version, "loop": self.loop,
            "setting": self.setting, "overlap": self.overlap,
            "disabled_by": [hit(h) for h in self.disabled_by], "selected_by": hit(self.selected_by),
            "hazards": [hit(h) for h in self.hazards], "notes": list(self.notes),
            "flags": [{"flag": f, "status": st} for f, st in self.config.flags],
        }


def _value(ctx: dict, key: str):
    if key.startswith("env."):
        return ctx["env"].get(key[4:])
    return ctx.get(key)


def _test(actual, expected, is_env: bool) -> bool:
    if isinstance(expected, dict):
        (op, arg), = expected.items()
        if op == "in":
            return actual in arg
        if op == "gt":
            return actual is not None and actual > arg
        if op == "set":
            present = actual is not None and actual != ""
            return present == bool(arg)
        if op == "not":
            return not _test(actual, arg, is_env)
        raise ValueError(f"unknown test {op!r} in the rules table")
    if is_env and isinstance(expected, bool):
        return env_truthy(actual) == expected
    return actual == expected


def _holds(cond: dict | None, ctx: dict) -> bool:
    return all(_test(_value(ctx, k), v, k.startswith("env.")) for k, v in (cond or {}).items())


def _applies(row: dict, ctx: dict, version: Version) -> bool:
    if not version_in(row.get("versions", ""), version):
        return False
    if not _holds(row.get("when"), ctx):
        return False
    unless = row.get("unless")
    return not (unless and _holds(unless, ctx))


def _hit(row: dict, text: str) -> RuleHit:
    return RuleHit(row["id"], text, row.get("source", ""), row.get("severity", ""),
                   tuple(str(v) for v in row.get("checked", [])), row.get("note", ""), dict(row.get("sim") or {}))


def newest_checked() -> Version:
    """The newest SGLang release any row of the rules table was checked against."""
    return max(Version(str(v)) for r in rules_table()["rules"] for v in r.get("checked", []))


def oldest_checked() -> Version:
    """The oldest SGLang release any row of the rules table was checked against."""
    return min(Version(str(v)) for r in rules_table()["rules"] for v in r.get("checked", []))


def evaluate(config: LaunchConfig) -> Advice:
    """Evaluate the rules table for a parsed launch command. See :class:`Advice`."""
    rows = rules_table()["rules"]
    version = Version(config.version)
    ctx: dict[str, Any] = dict(config.fields)
    ctx["env"] = config.env
    ctx["platform"] = config.platform
    disabled: list[RuleHit] = []
    if config.fields.get("disable_overlap_schedule"):
        disabled.append(RuleHit("user_flag", "--disable-overlap-schedule given", "launch arguments"))
    for row in rows:
        if row["kind"] == "disable_overlap" and _applies(row, ctx, version):
            disabled.append(_hit(row, row["reason"]))
    ctx["overlap"] = not disabled
    ctx["overlap_or_normal"] = "overlap" if ctx["overlap"] else "normal"
    selected = next(r for r in rows if r["kind"] == "loop" and _applies(r, ctx, version))
    loop = selected["loop"].format(**{k: v for k, v in ctx.items() if isinstance(v, (str, int, float))})
    detail = selected.get("detail")
    if config.platform == "cpu" and selected.get("setting") == "overlap":
        # SGLang's CPU engine: Scheduler.run_batch calls the model on the scheduler's thread
        detail = ("the CPU engine runs the forward on the scheduler's thread, so nothing overlaps it; the loop "
                  "still processes each result one step late")
    text = loop + (f" ({detail})" if detail else "")
    ctx["loop"], ctx["setting"] = loop, selected.get("setting")
    hazards = tuple(_hit(r, " ".join(r["text"].split())) for r in rows
                    if r["kind"] == "hazard" and _applies(r, ctx, version))
    notes = list(config.notes)
    newest = newest_checked()
    if version > newest:
        notes.append(f"release {version} is newer than any checked ({newest}): rows without an upper bound are assumed to still hold")
    for h in (*disabled, *hazards):
        if h.checked and config.version not in h.checked and h.severity != "info":
            notes.append(f"{h.id}: {config.version} was not checked (checked: {', '.join(h.checked)})")
    sizes = _unmodelled_sizes(config)
    if sizes is not None:
        notes.insert(0, f"not modelled by the simulator (SGLang may start): {sizes}")
    # a flag refused, or sizes the scenario's server section refuses: the simulator gives no answer
    refused = sizes is not None or any(status.startswith("refused") for _, status in config.flags)
    return Advice(config, loop, None if refused else selected.get("setting"), bool(ctx["overlap"]), tuple(disabled),
                  _hit(selected, text), hazards, tuple(notes))


def _unmodelled_sizes(config: LaunchConfig) -> str | None:
    """The first refusal the scenario's server section (:class:`sim.engines.sglang.server.Server`)
    makes of the fields the command sets (a pool that is not a whole number of pages, a chunk
    below the page size ...), as ``field: why``; None where it takes them."""
    from pydantic import ValidationError

    from sim.engines.sglang.server import Server  # here: the server section is the scenario's
    from sim.model.schema import first_error

    try:
        Server(**config.server)
    except ValidationError as err:
        return first_error(err)
    return None


def advise(args: list[str], platform: str = "cuda", version: str | None = None,
           source: str = "launch arguments") -> Advice:
    """Parse an SGLang launch command and evaluate the rules (see :func:`evaluate`).

    Raises:
        UserInputError: bad platform, version or flag value.
    """
    return evaluate(parse_launch_args(args, platform, version, source))


SETTING_LOOPS = {"normal": "event_loop_normal", "overlap": "event_loop_overlap",
                 "overlap_mlx": "event_loop_overlap_mlx", "thread_overlap": "event_loop_overlap"}


def setting_faults(platform: str, setting: str, version: str | None = None) -> tuple[RuleHit, ...]:
    """Hazard rows with a simulator effect (``sim``) for running ``setting`` on ``platform`` at
    ``version`` (None: the table's default release), whatever launch command chose it.

    Example: ('mlx', 'normal', '0.5.22') -> the FutureMap device-mismatch crash.
    """
    config = parse_launch_args([], platform, version)
    version_v = Version(config.version)
    ctx: dict[str, Any] = dict(config.fields)
    ctx.update(env=config.env, platform=config.platform, loop=SETTING_LOOPS[setting], setting=setting,
               overlap=setting != "normal")
    return tuple(_hit(r, " ".join(r["text"].split())) for r in rules_table()["rules"]
                 if r["kind"] == "hazard" and r.get("sim") and _applies(r, ctx, version_v))


def admission_policy(version: str | None = None) -> str:
    """The ``server.admission`` rules of an SGLang release ('v0.5.4' | 'v0.5.22')."""
    v = Version(parse_launch_args([], "cuda", version).version)
    return next(r["policy"] for r in rules_table()["rules"] if r["kind"] == "admission" and _applies(r, {}, v))


def retraction_policy(version: str | None = None) -> str:
    """The ``server.retraction`` policy of an SGLang release ('naive' | 'v0.5.10' | 'v0.5.22')."""
    v = Version(parse_launch_args([], "cuda", version).version)
    return next(r["policy"] for r in rules_table()["rules"] if r["kind"] == "retraction" and _applies(r, {}, v))
