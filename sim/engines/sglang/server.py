"""The scenario's ``server`` section for SGLang: the server flags that change scheduling, and the
event loops (``settings``) the simulator models.

A scenario may give an SGLang launch command (``launch_args``) and release (``version``)
instead; the rules table (:mod:`sim.engines.sglang.rules`) turns them into these fields.
"""

from __future__ import annotations

import math
from typing import Literal, Optional

from pydantic import Field, PrivateAttr, field_validator, model_validator

from sim.engines.sglang.structured import StructuredOutput
from sim.errors import shown
from sim.model.profile import ParallelPricing, model_caveat
from sim.model.schema import MAX_POOL_TOKENS, MAX_REQUESTS, MAX_TOKENS, StrictModel

SETTINGS = ("normal", "overlap", "overlap_mlx", "thread_overlap")
# tensor parallelism priced through a profile measured at that size (Server's docstring)
TP_PRICING = ParallelPricing(
    "sglang", "tp_size", "server.tp_size", "its receive and forward carry that many ranks' broadcast and all-reduces",
    "the request broadcast in recv, the all-reduces in the forward",
    "each rank is taken to have cores of its own (docs/real-engines.md#tensor-parallelism-sglang)")
Setting = Literal["normal", "overlap", "overlap_mlx", "thread_overlap"]


class Server(StrictModel):
    """Server flags that change scheduling (names follow SGLang's ServerArgs).

    ``launch_args`` (an SGLang launch command as a list of strings, ``NAME=VALUE`` environment
    tokens allowed) and ``version`` (the SGLang release) decide, through the rules table
    (:mod:`sim.engines.sglang.rules.loop_rules`), which event loop runs: when ``launch_args`` is given and
    ``settings`` is not, ``settings`` becomes that one loop; flags that map onto a field here
    (``--page-size``, ``--max-running-requests``, ``--chunked-prefill-size``,
    ``--max-prefill-tokens``, ``--max-total-tokens``, ``--schedule-conservativeness``,
    SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP) fill it, and a field given both ways must agree.
    ``device`` is the platform ('mlx' = MPS with SGLANG_USE_MLX). ``version`` (default: the
    seed document's 0.5.22) also decides the release-specific faults the simulator predicts and,
    when ``retraction`` / ``admission`` are not given, the retraction policy and the prefill
    admission rules of that release (``admission``: ``v0.5.22`` reserves ``ignore_eos``
    requests' whole output and a page per admitted request; ``v0.5.4`` weights every running
    request by the new-token ratio). ``max_prefill_tokens``: SGLang's second per-pass prefill
    budget (``--max-prefill-tokens``, 16384). ``chunked_prefill_size`` <= 0 (SGLang's -1) turns chunked
    prefill off, as SGLang's scheduler reads a size <= 0 (``Scheduler.__init__``, 0.5.23: no chunk budget;
    a prompt is prefilled whole).

    ``forward_on_scheduler_thread``: the forward runs inside ``run_batch`` on the scheduler's own
    thread, so nothing can overlap it and every loop pays it in full. None (default): True on
    ``device: cpu`` (SGLang's CPU engine: ``Scheduler.run_batch`` calls the model on the thread
    that schedules, 0.5.23, ``managers/scheduler.py``; ``event_loop_overlap`` still runs and
    still processes each result one step late), False on accelerators. The ground-truth
    harness, whose "device" is a separate process, sets False.

    ``structured_output``: the share of requests with a grammar and its costs
    (:mod:`sim.engines.sglang.structured`; None: none), under ``normal`` and ``overlap`` only.

    ``tp_size`` (``--tp-size``): tensor parallelism. SGLang 0.5.23 runs one scheduler per rank
    in lockstep (``run_scheduler_process`` per TP rank); rank 0 receives the requests and
    broadcasts them to the others (``broadcast_pyobj`` in the receive path), and every forward
    waits for its all-reduces. The simulator runs rank 0's loop with the phases a profile
    measured at that size (``metadata.tp_size``, ``calibrate --engine sglang
    --tensor-parallel-size N``: the broadcast in ``recv``, the all-reduces in the forward); a
    profile of another size is refused; inline costs are taken as the TP server's (said on every
    run). No all-reduce model: a size is not extrapolated from another.
    """

    engine: Literal["sglang"] = Field(default="sglang", exclude=True)  # the scenario's engine (sim.scenario)
    device: Literal["cuda", "mlx", "mps", "cpu"] = "cuda"
    settings: list[Setting] = Field(default_factory=lambda: ["overlap", "normal"], min_length=1)
    max_running_requests: int = Field(default=64, ge=1, le=MAX_REQUESTS)
    chunked_prefill_size: int = Field(default=8192, ge=-MAX_TOKENS, le=MAX_TOKENS)  # <= 0: chunked prefill off
    kv_pool_tokens: int = Field(default=400_000, ge=1, le=MAX_POOL_TOKENS)
    page_size: int = Field(default=1, ge=1, le=MAX_TOKENS)
    init_new_token_ratio: float = Field(default=0.7, ge=0, le=1)
    retraction: Literal["naive", "v0.5.10", "v0.5.22"] = "v0.5.22"
    admission: Literal["v0.5.4", "v0.5.22"] = "v0.5.22"
    max_prefill_tokens: int = Field(default=16384, ge=1, le=MAX_TOKENS)
    disable_consecutive_prefill_overlap: bool = False
    launch_args: Optional[list[str]] = None
    version: Optional[str] = None
    forward_on_scheduler_thread: Optional[bool] = None
    structured_output: Optional[StructuredOutput] = None
    tp_size: int = Field(default=1, ge=1, le=64)
    # --context-length; None: no bound. Below 2 SGLang 0.5.23 does not start (TpModelWorker: max_req_len > 0)
    context_length: Optional[int] = Field(default=None, ge=2, le=MAX_TOKENS)
    allow_auto_truncate: bool = False  # --allow-auto-truncate: cut a request to the context instead of refusing it
    _from_launch_args: tuple = PrivateAttr(default=())
    _launch_notes: tuple = PrivateAttr(default=())  # launch arguments the rules passed over
    _launch_model: Optional[str] = PrivateAttr(default=None)  # --model-path of launch_args

    @property
    def running_cap(self) -> tuple[str, int]:
        """(the field, its value) that caps the requests running at once."""
        return "server.max_running_requests", self.max_running_requests

    @property
    def length_cap(self) -> tuple[str, int, str] | tuple[str, int, str, str]:
        """(the field, the most tokens a request's prompt and output may reach, how the engine
        stops it there[, what becomes of such a request]): ``init_req_max_new_tokens`` (0.5.23)
        clips ``max_new_tokens`` so that the request fits the KV pool; with ``context_length``
        below that, the tokenizer manager refuses a request whose prompt and ``max_new_tokens``
        exceed it (``--allow-auto-truncate``: cuts it there)
        (:meth:`sim.engines.sglang.policy.scheduler.Scheduler.recv`)."""
        pool = self.kv_pool_tokens - self.page_size - 1
        most = None if self.context_length is None else max(0, self.context_length - 2)
        if most is None or most >= pool:
            return ("server.kv_pool_tokens", pool, "SGLang clips max_new_tokens so that a request fits the KV pool")
        if self.allow_auto_truncate:
            return ("server.context_length", most,
                    "with --allow-auto-truncate SGLang cuts the prompt and max_new_tokens to the context length, "
                    "a cut to 0 new tokens priced as 1", "such requests finish there, with fewer tokens than asked")
        return ("server.context_length", most, "SGLang's tokenizer manager refuses a request "
                "whose prompt and max_new_tokens exceed --context-length, its scheduler cuts max_new_tokens to "
                "context_length - 2 less the prompt", "such requests fail (too_long, the server's error answer) or "
                "finish with fewer output tokens than asked")

    def verdict_caveats(self, profile_meta: dict | None = None) -> list[str]:
        """Clauses the verdict carries beyond the profile's own: a launch command serving another
        model than the profile measured (by name, :mod:`sim.model.profile`); at tensor
        parallelism, how far the TP model has been held against the real server
        (docs/real-engines.md); none otherwise (what the section answers approximately is in
        :meth:`warnings`)."""
        out = [] if (model := self._model_caveat(profile_meta, brief=True)) is None else [model]
        if self.tp_size <= 1:
            return out
        return out + [f"tp_size {self.tp_size}: the overlap/normal ratio at TP > 1 is not validated on a host with "
                      "cores for every rank, the tokenizer and the client (held against SGLang's CPU server at TP 2 "
                      "on a 2-core VM only: docs/real-engines.md#tensor-parallelism-sglang)"]

    def rests_on_another_model(self, profile_meta: dict | None) -> bool:
        """Whether ``launch_args`` serve a model other than the one the profile (metadata
        ``profile_meta``) measured, by name: the verdict cannot tell then (its forward and host
        phases are another model's)."""
        return self._model_caveat(profile_meta) is not None

    def _model_caveat(self, profile_meta: dict | None, brief: bool = False) -> str | None:
        """Where ``launch_args`` name a model (``--model-path``) that the profile (metadata
        ``profile_meta``) did not measure, by name: a clause saying so (``brief``: the verdict's;
        :func:`sim.model.profile.model_caveat`); else None."""
        if self._launch_model is None:
            return None
        return model_caveat("--model-path", self._launch_model, profile_meta, brief)

    @property
    def grammar(self) -> Optional[StructuredOutput]:
        """The structured-output section when some requests carry a grammar, else None."""
        so = self.structured_output
        return so if so is not None and so.share > 0 else None

    def warnings(self, profile_meta: dict | None = None) -> list[str]:
        """What this server section asks for that the simulator answers only approximately, in
        words that name the value: a launch argument the rules do not read (SGLang would act on
        it or refuse it), a model (``--model-path``) other than the one the profile (metadata
        ``profile_meta``) measured, by name, a loop selected on a device its engine does not run it on (the MLX
        chain on a CUDA card, the thread-era forward thread under MLX), structured output (its
        costs measured, from the profile's metadata ``profile_meta``, or given)."""
        out = [f"warning: server.launch_args: {note}" for note in self._launch_notes]
        if (model := self._model_caveat(profile_meta)) is not None:
            out.append(f"warning: server.launch_args: {model}")
        if self.grammar is not None:
            measured = (profile_meta or {}).get("structured_output") if isinstance(profile_meta, dict) else None
            out += self.grammar.caveats(measured if isinstance(measured, dict) else None)
        if tp := TP_PRICING.caveat(self.tp_size, measured=profile_meta is not None):
            out.append(f"warning: server.{tp}")
        if self.version is not None:
            from sim.engines.sglang.rules.launch_args import parse_version
            from sim.engines.sglang.rules.loop_rules import newest_checked, oldest_checked

            if parse_version(self.version) > (newest := newest_checked()):
                out.append(f"warning: server.version {self.version} is newer than any release checked ({newest}): "
                           f"its loops, policies and release faults are taken as {newest}'s")
            elif parse_version(self.version) < (oldest := oldest_checked()):
                out.append(f"warning: server.version {self.version} is older than any release checked ({oldest}): "
                           f"its loops, policies and release faults are taken from the rules table's oldest "
                           f"ranges, which no one checked against it")
        if "overlap_mlx" in self.settings and self.device != "mlx":
            out.append(f"warning: server.settings overlap_mlx on server.device {self.device}: SGLang runs "
                       "event_loop_overlap_mlx only on MLX; the chain is simulated as asked")
        if "thread_overlap" in self.settings and self.device in ("mlx", "mps"):
            out.append(f"warning: server.settings thread_overlap on server.device {self.device}: the forward "
                       "thread (TpModelWorkerClient) was a CUDA path; it is simulated as asked")
        return out

    @field_validator("version", mode="before")
    @classmethod
    def _version_as_text(cls, value):
        if isinstance(value, (int, float)) and not isinstance(value, bool):  # `version: 0.5` in YAML: a number
            raise ValueError(f"a release as text (YAML read {value!r} as a number, which can drop a trailing zero: "
                             "1.10 reads as 1.1): put it in quotes, as in version: \"0.5.23\" (on the command line "
                             "--set 'server.version=\"0.5.23\"')")
        return value

    @field_validator("settings", mode="before")
    @classmethod
    def _one_setting(cls, value):
        return [value] if isinstance(value, str) else value  # `--set server.settings=overlap`: a one-item list

    @model_validator(mode="wrap")
    @classmethod
    def _apply_launch_args(cls, data, handler):
        derived: tuple = ()
        notes: tuple = ()
        model = None
        if isinstance(data, dict) and isinstance(data.get("launch_args"), list):
            # YAML reads `--pp-size, 2` as a number: launch arguments are strings, a number taken as
            # its text; anything else (a list, a map, null, true) is not an argument
            for i, a in enumerate(data["launch_args"]):
                if not isinstance(a, (str, int, float)) or isinstance(a, bool):
                    raise ValueError(f"launch_args.{i}: expected a string (a launch argument), got {shown(a)}")
            data = {**data, "launch_args": [a if isinstance(a, str) else str(a) for a in data["launch_args"]]}
            data, derived, notes, model = _resolve_launch_args(data)
        if isinstance(data, dict) and data.get("version") is not None:
            from sim.engines.sglang.rules.loop_rules import admission_policy, retraction_policy
            from sim.errors import UserInputError
            for key, policy in (("retraction", retraction_policy), ("admission", admission_policy)):
                if key in data:
                    continue
                try:
                    data = {**data, key: policy(str(data["version"]))}
                    derived = (*derived, key)
                except UserInputError:
                    pass  # the version check below reports it
        server = handler(data)
        server._from_launch_args = derived
        server._launch_notes = notes
        server._launch_model = model
        return server

    @property
    def blocking_forward(self) -> bool:
        """Whether the forward blocks the scheduler's thread (see ``forward_on_scheduler_thread``)."""
        if self.forward_on_scheduler_thread is None:
            return self.device == "cpu"
        return self.forward_on_scheduler_thread

    @model_validator(mode="after")
    def _unique(self):
        if len(set(self.settings)) != len(self.settings):
            raise ValueError(f"settings: must not repeat a loop (got {self.settings})")
        unmodelled = [s for s in self.settings if s in ("overlap_mlx", "thread_overlap")]
        if self.grammar is not None and unmodelled:
            raise ValueError(f"structured_output: not modelled under {', '.join(unmodelled)} (SGLang 0.5.23's "
                             "delayed sampling is event_loop_overlap's; set settings to overlap and/or normal)")
        if self.version is not None:
            from sim.engines.sglang.rules.launch_args import parse_version
            from sim.errors import UserInputError
            try:
                parse_version(self.version)
            except UserInputError as err:
                raise ValueError(f"version: {err.expected}") from None
        if self.page_size > 1 and self.kv_pool_tokens % self.page_size:
            raise ValueError(f"kv_pool_tokens: must be a multiple of page_size {self.page_size} "
                             f"(got {self.kv_pool_tokens})")
        if 0 < self.chunked_prefill_size < self.page_size:  # PrefillAdder ends a chunk on a page boundary
            raise ValueError(f"chunked_prefill_size: at least page_size {self.page_size} (got "
                             f"{self.chunked_prefill_size}): a chunk ends on a page boundary, so a smaller one "
                             "takes no token and the prefill never ends")
        return self


def _resolve_launch_args(data: dict) -> tuple[dict, tuple, tuple, str | None]:
    """Fill server fields from ``launch_args`` (see :class:`Server`); returns (data, derived keys,
    the notes on arguments the rules passed over, the model the command serves or None).

    Raises:
        ValueError: a bad flag, a loop the simulator does not model, or a field set both in
            ``server`` and by a launch argument to different values.
    """
    from sim.engines.sglang.rules.loop_rules import advise
    from sim.errors import UserInputError

    args = data["launch_args"]
    if not isinstance(args, list):
        return data, (), (), None
    device = data.get("device", "cuda")
    if not isinstance(device, str):  # (null, a number: not a device's name)
        from sim.engines.sglang.rules.launch_args import PLATFORMS
        raise ValueError(f"device: expected one of {', '.join(PLATFORMS)} (got {shown(device)})")
    try:
        adv = advise([str(a) for a in args], device, data.get("version"), source="server.launch_args")
    except UserInputError as err:  # the server's own device or version (named as the fields they are), or a flag
        if err.field == "device" or err.source == "server.version":
            raise ValueError(f"{err.field or 'version'}: {err.expected}") from None
        raise ValueError(f"launch_args {err.field}: {err.expected}" if err.field else err.expected) from None
    refused = [(flag, status) for flag, status in adv.config.flags if status.startswith("refused")]
    if refused:
        # never a plain-decoding answer for a command that runs something else
        flag, status = refused[0]
        what = status[status.index("(") + 1:-1]
        raise ValueError(f"launch_args: {flag} turns on {what}, which is not modelled (the simulator runs one "
                         "scheduler on one device decoding one token per step): no answer for this command; "
                         "without the flag the answer is the plain server's")
    wanted: dict = dict(adv.config.server)
    wanted["device"] = adv.config.platform
    if "settings" not in data:
        if adv.setting is None:
            raise ValueError(f"launch_args select {adv.loop}, which the simulator does not model")
        wanted["settings"] = [adv.setting]
    derived = []
    for key, value in wanted.items():
        given = data.get(key)
        if key in data and given != value and not (isinstance(value, float) and isinstance(given, (int, float))
                                                   and math.isclose(given, value, rel_tol=1e-9)):
            # (a float the flag derives, e.g. the ratio 0.7 x conservativeness, may differ in its last digit)
            raise ValueError(f"{key}: {shown(given)} here, but launch_args give {value!r} (set it in one place)")
        if key not in data:
            data[key] = value
            derived.append(key)
    return data, tuple(derived), tuple(n for n in adv.config.notes if "passed over" in n), adv.config.model
