"""Whether vLLM runs with async scheduling for a launch command, which rule decided it, and where
vLLM refuses to start, evaluated from :data:`RULES` (read from vLLM 0.32.0's source).

Resolution follows ``VllmConfig.__post_init__`` (``config/vllm.py``): the ``--async-scheduling``
flag is resolved first (l.1546-1644): given explicitly with an incompatible option, vLLM raises;
not given (None), it turns on unless a ``default_off`` row matches (first match wins). Then the
platform hook has the last word (``current_platform.check_and_update_config``, l.1991): the CPU
platform sets it False unconditionally (``platforms/cpu.py:331``). Then the model runner is
validated (l.2016-2020): the V1 model runner refuses pipeline parallelism with async scheduling.
The V2 model runner is vLLM 0.32's default (``VllmConfig.use_v2_model_runner``, l.703: unless
``VLLM_USE_V2_MODEL_RUNNER=0``, Triton is missing, or a feature it lacks is used; the rules assume
Triton is installed and none of those features).

With async scheduling the engine core uses ``step_with_batch_queue``, batch queue of
``max_concurrent_batches`` (l.577): 2 at pp 1 (the simulator's ``async`` setting); pp + 1 with
the V2 runner (not modelled).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from packaging.version import Version

from sim.engines.vllm.rules.launch_args import CHECKED_VERSIONS, VllmLaunch, env_flag, parse_launch_args, unmodelled

# speculative methods async scheduling refuses (config/vllm.py:1563-1575: only EagleModelTypes,
# NgramGPUTypes, draft_model, dspark, dflash are allowed; config/speculative.py:67-83)
SPEC_WITHOUT_ASYNC = ("ngram", "medusa", "mlp_speculator", "suffix", "custom_class")


def v2_model_runner(c: VllmLaunch) -> bool:
    """``VllmConfig.use_v2_model_runner`` (config/vllm.py:703): the environment variable, else True."""
    flag = env_flag(c.env.get("VLLM_USE_V2_MODEL_RUNNER"))
    return True if flag is None else flag


def executor_supports_async(c: VllmLaunch) -> bool:
    """``Executor.get_class(...).supports_async_scheduling()``: mp, uni, external_launcher and
    Ray's V2 executor (a MultiprocExecutor, the default for ``ray``) do; ``RayDistributedExecutor``
    (``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0``) does not (v1/executor/abstract.py:77-85,442;
    multiproc_executor.py:565; uniproc_executor.py:157; envs.py:944)."""
    if c.fields.get("distributed_executor_backend") != "ray":
        return True
    flag = env_flag(c.env.get("VLLM_USE_RAY_V2_EXECUTOR_BACKEND"))
    return True if flag is None else flag


def _spec_refuses(c: VllmLaunch) -> bool:
    return c.speculative_method in SPEC_WITHOUT_ASYNC


def _padded_drafter_off(c: VllmLaunch) -> bool:
    spec = c.fields.get("speculative_config")
    return isinstance(spec, dict) and bool(spec.get("disable_padded_drafter_batch"))


@dataclass(frozen=True)
class Rule:
    """One row: ``kind`` is ``refuse_explicit`` (``--async-scheduling`` given: vLLM raises at
    start-up), ``default_off`` (not given: resolved off), ``platform_off`` (the platform turns it
    off whatever was resolved), ``refuse_resolved`` (on after resolution: vLLM raises), or ``note``
    (a hazard or fact of the path, no effect)."""

    id: str
    kind: str
    when: Callable[[VllmLaunch], bool]
    text: str
    source: str
    checked: tuple[str, ...] = CHECKED_VERSIONS
    applies_if_async: bool | None = None  # for notes: only when async scheduling ends up on (True) / off (False)


RULES: tuple[Rule, ...] = (
    Rule("spec_method", "refuse_explicit", _spec_refuses,
         "async scheduling supports only EAGLE/MTP/draft-model/NGram-GPU/DSpark/DFlash speculative decoding",
         "config/vllm.py:1563-1575 VllmConfig.__post_init__ (ValueError)"),
    Rule("padded_drafter", "refuse_explicit", _padded_drafter_off,
         "async scheduling is not compatible with disable_padded_drafter_batch=True",
         "config/vllm.py:1576-1580 (ValueError)"),
    Rule("executor", "refuse_explicit", lambda c: not executor_supports_async(c),
         "the distributed executor backend does not support async scheduling (RayDistributedExecutor)",
         "config/vllm.py:1581-1584 (ValueError); v1/executor/abstract.py:442"),
    Rule("pooling_model", "default_off", lambda c: c.fields.get("runner") == "pooling",
         "pooling models: async scheduling off by default (it slows them down)", "config/vllm.py:1587-1596"),
    Rule("spec_method_default", "default_off", _spec_refuses,
         "speculative decoding of a method async scheduling does not support", "config/vllm.py:1597-1610"),
    Rule("padded_drafter_default", "default_off", _padded_drafter_off,
         "disable_padded_drafter_batch=True", "config/vllm.py:1611-1619"),
    Rule("executor_default", "default_off", lambda c: not executor_supports_async(c),
         "the distributed executor backend does not support async scheduling", "config/vllm.py:1620-1626"),
    Rule("pp_v1_runner_default", "default_off",
         lambda c: c.fields["pipeline_parallel_size"] > 1 and not v2_model_runner(c),
         "pipeline parallelism with the V1 model runner", "config/vllm.py:1634-1642"),
    Rule("cpu_platform", "platform_off", lambda c: c.platform == "cpu",
         "the CPU platform sets async_scheduling = False unconditionally, after it was resolved "
         "(\"async scheduling is not required on CPU\"); --async-scheduling is accepted and silently ignored",
         "platforms/cpu.py:329-331 CpuPlatform.check_and_update_config"),
    Rule("pp_v1_runner", "refuse_resolved",
         lambda c: c.fields["pipeline_parallel_size"] > 1 and not v2_model_runner(c),
         "\"Model Runner V1 does not support: pipeline parallelism with async scheduling\"",
         "config/vllm.py:2962-2973 _get_v1_model_runner_unsupported_features, raised at l.3198"),
    Rule("pp_batch_queue", "note", lambda c: c.fields["pipeline_parallel_size"] > 1,
         "pipeline parallelism: the batch queue holds pp_size + 1 batches (V2 model runner); the simulator "
         "models pp_size 1 only", "config/vllm.py:577-587 max_concurrent_batches", applies_if_async=True),
    Rule("async_tokens_late", "note", lambda c: True,
         "each step's output is processed after the next step is scheduled: a request that stops on a stop "
         "token (EOS) gets one more step whose token is dropped; max_tokens stops are foreseen (with speculative "
         "decoding not when a request's last tokens rest on accepted drafts: one more step, dropped)",
         "v1/engine/core.py:698 step_with_batch_queue; v1/core/sched/scheduler.py:659-674",
         applies_if_async=True),
)


@dataclass(frozen=True)
class VllmAdvice:
    """The answer of ``overlap-sim advise --engine vllm``.

    Attributes:
        config: the parsed launch command.
        async_scheduling: on or off after resolution; None when vLLM refuses to start.
        setting: the simulator setting ('async' | 'sync'), or None (refused, or not modelled).
        decided_by: the rows that decided (for off: the default_off or platform row; refusals).
        refused: whether vLLM raises at start-up (``decided_by`` says why).
        notes: hazards and facts of the path, then arguments passed over and version caveats.
    """

    config: VllmLaunch
    async_scheduling: bool | None
    setting: str | None
    decided_by: tuple[Rule, ...]
    refused: bool
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        """JSON-able form (``advise --engine vllm --json``)."""
        return {"engine": "vllm", "platform": self.config.platform, "version": self.config.version,
                "async_scheduling": self.async_scheduling, "setting": self.setting, "refused": self.refused,
                "decided_by": [{"id": r.id, "kind": r.kind, "text": r.text, "source": r.source}
                               for r in self.decided_by],
                "server": dict(self.config.server), "notes": list(self.notes),
                "flags": [{"flag": f, "status": st} for f, st in self.config.flags]}


def evaluate(c: VllmLaunch) -> VllmAdvice:
    """Resolve async scheduling for a parsed launch command (see the module docstring); a command
    whose sizes vLLM's start-up refuses (the checks a scenario's server section makes) is refused."""
    startup = _startup_refusal(c)
    if startup is not None and startup.kind == "refuse_resolved":
        return _advice(c, None, (startup,), True)
    rows = [r for r in RULES if r.when(c)]
    explicit = c.fields.get("async_scheduling")
    refusals = [r for r in rows if r.kind == "refuse_explicit"] if explicit else []
    if refusals:
        return _advice(c, None, tuple(refusals), True)
    decided = [] if explicit is not None else [r for r in rows if r.kind == "default_off"][:1]
    on = bool(explicit) if explicit is not None else not decided
    platform = [r for r in rows if r.kind == "platform_off"]
    if on and platform:
        on, decided = False, platform
    refused = [r for r in rows if r.kind == "refuse_resolved"] if on else []
    if refused:
        return _advice(c, None, tuple(refused), True)
    return _advice(c, on, tuple(decided), False, startup)


def _startup_refusal(c: VllmLaunch) -> Rule | None:
    """The sizes the command sets (``--max-num-batched-tokens``, ``--max-model-len``,
    ``--block-size``, ``--num-gpu-blocks-override`` ...) checked as a scenario's server section
    checks them (:class:`sim.engines.vllm.server.VllmServer`: vLLM's ``SchedulerConfig`` and KV
    cache start-up checks); the first refusal as a row, or None. The row's kind is
    ``refuse_resolved`` where vLLM itself refuses to start (the section's message says so), else
    ``not_modelled``: a size vLLM may accept but the simulator does not model (a block larger than
    the context, a long-prefill threshold beyond it), which leaves the async answer standing."""
    from pydantic import ValidationError

    from sim.engines.vllm.server import VllmServer  # here: the server section is the scenario's
    from sim.model.schema import first_error

    fields = {k: v for k, v in c.server.items() if k != "speculative"}
    try:
        VllmServer(engine="vllm", device=c.platform if c.platform in ("cuda", "cpu") else "cuda", **fields)
    except ValidationError as err:
        text = first_error(err)
        if "vLLM refuses to start" not in text:
            return Rule("startup_sizes", "not_modelled", lambda _c: True, text,
                        "sim.engines.vllm.server.VllmServer: a size the simulator does not model")
        return Rule("startup_sizes", "refuse_resolved", lambda _c: True, text,
                    "vllm/config/scheduler.py verify_max_model_len; v1/core/kv_cache_utils.py "
                    "check_enough_kv_cache_memory (as sim.engines.vllm.server.VllmServer checks them)")
    return None


def _advice(c: VllmLaunch, on: bool | None, decided: tuple, refused: bool,
            not_modelled: Rule | None = None) -> VllmAdvice:
    notes = [f"not modelled by the simulator (vLLM may start): {not_modelled.text}"] if not_modelled else []
    notes += [f"{r.id}: {r.text} ({r.source})" for r in RULES if r.kind == "note" and r.when(c)
             and (r.applies_if_async is None or r.applies_if_async == on)]
    if c.platform == "cpu" and c.fields.get("async_scheduling") and not refused:
        notes.append("to measure async scheduling on CPU, the harness must skip that assignment at start-up "
                     "(a patch, not an edit of the installed file); the simulator's async setting predicts that")
    notes += list(c.notes)
    if Version(c.version) > max(Version(v) for v in CHECKED_VERSIONS):
        notes.append(f"release {c.version} is newer than any checked ({', '.join(CHECKED_VERSIONS)}): "
                     "the rules are assumed to still hold")
    elif c.version not in CHECKED_VERSIONS:
        notes.append(f"release {c.version} was not checked (checked: {', '.join(CHECKED_VERSIONS)})")
    modelled = (not refused and not unmodelled(c.fields) and not_modelled is None
                and not any(status.startswith("refused") for _, status in c.flags))
    setting = None if not modelled else ("async" if on else "sync")
    return VllmAdvice(c, on, setting, decided, refused, tuple(notes))


def advise(args: list[str], platform: str = "cuda", version: str | None = None) -> VllmAdvice:
    """Parse a vLLM launch command and resolve async scheduling (see :func:`evaluate`).

    Raises:
        UserInputError: bad platform, version or flag value.
    """
    return evaluate(parse_launch_args(args, platform, version))


def platform_note(platform: str, version: str | None = None) -> str | None:
    """The line ``run`` prints under its verdict where vLLM ``version`` on ``platform`` turns async
    scheduling off whatever the command says (a ``platform_off`` row: the CPU platform, vLLM 0.32);
    None where ``--async-scheduling`` takes effect.

    Raises:
        UserInputError: a platform or version :func:`advise` refuses.
    """
    advice = advise(["--async-scheduling"], platform, version)
    row = next((r for r in advice.decided_by if r.kind == "platform_off"), None)
    if row is None:
        return None
    return (f"note: vLLM {advice.config.version} on {platform} runs the synchronous loop whatever its command says "
            f"({row.source}: --async-scheduling is accepted and ignored), so the verdict holds for a server patched "
            "to keep async scheduling on (its `async_scheduling = False` skipped at start-up, as this project's "
            "real-engine harness does; docs/vllm.md)")
