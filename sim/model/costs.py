"""Cost models: what each CPU phase and each device forward costs, in seconds.

The simulator asks a :class:`CostModel` for the duration of every phase of every step. The
inline model (:class:`LinearCostModel`) evaluates the scenario's linear terms; a measured
calibration profile is another implementation of the same interface. Per-step jitter is
applied on top by :class:`Jitter`, seeded, so runs stay reproducible.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from sim.errors import ScenarioError
from sim.model.schema import Costs, CostTerm

EXTEND = 0  # SGLang ForwardMode.EXTEND (prefill, possibly a chunk)
DECODE = 1  # SGLang ForwardMode.DECODE
KIND_NAMES = ("extend", "decode")


class CostModel(Protocol):
    """Durations (seconds) of one step's phases.

    Arguments common to the methods: ``kind`` is EXTEND or DECODE; ``num_reqs`` the batch
    size; ``num_tokens`` the tokens computed (extend tokens for a prefill, one per request for
    a decode); ``sum_ctx`` the summed context length (cached + computed tokens) attended over.
    """

    overlap_residue_s: float
    sync_latency_s: float  # from the end of a forward until the host can read its results
    gil: object  # sim.model.schema.GilCosts, read by the thread_overlap loop
    extrapolated_steps: int  # steps priced so far outside measured data (counted by forward_s; 0 inline)
    decode_submits: bool  # submit_s of a decode can be above 0 (MLX profiles); False: never

    def forward_s(self, kind: int, num_reqs: int, num_tokens: int, sum_ctx: int, attn_pairs: int = 0) -> float:
        """Device time of the forward, sampling and device-to-host copy of the batch
        (``attn_pairs``: a prefill's sum over its requests of new x (prefix + new) tokens, 0 when
        not known; read by profiles priced by attention pairs)."""

    def recv_s(self, num_new_reqs: int) -> float:
        """CPU time of ``recv_requests`` + ``process_input_requests`` for that many new requests."""

    def schedule_s(self, kind: int, num_reqs: int, num_tokens: int, sum_ctx: int) -> float:
        """CPU time of ``get_next_batch_to_run`` that produced this batch."""

    def launch_s(self, kind: int, num_reqs: int, num_tokens: int, sum_ctx: int) -> float:
        """CPU time of the launch part of ``run_batch`` (metadata, kernel/graph launch)."""

    def process_s(self, kind: int, num_reqs: int, num_tokens: int, sum_ctx: int) -> float:
        """CPU time of ``process_batch_result_{prefill,decode}`` for this batch."""

    def decode_s(self, num_reqs: int, sum_ctx: int) -> tuple[float, float, float, float]:
        """A decode batch's (schedule, launch, forward, process) seconds: the values of
        :meth:`schedule_s`, :meth:`launch_s`, :meth:`forward_s` and :meth:`process_s` for
        ``DECODE, num_reqs, num_reqs, sum_ctx``, in one call (the leap's hot path)."""

    def eager_share(self, kind: int, num_tokens: int) -> float:
        """The share (0-1) of :meth:`launch_s` that queues the forward's kernels one by one (an
        eager CUDA prefill), which the device runs as they come, ahead of the launch's end; 0: the
        forward is queued at the launch's end (a CUDA-graph replay, MLX, the CPU, or not known)."""

    def submit_s(self, kind: int, num_reqs: int, num_tokens: int, sum_ctx: int) -> float:
        """How long the host stays blocked in the submission of the forward when the device
        was idle (part of the forward, measured from its start): MLX's ``mx.async_eval``
        returns only when the device is within its last tasks. 0: the launch returns at once
        (CUDA)."""

    def describe(self) -> dict:
        """JSON-able description recorded with results."""



def _term(t: CostTerm, scale: float) -> tuple[float, float, float, float]:
    return (t.base * scale, t.per_req * scale, t.per_token * scale, t.per_ctx_token * scale)


class LinearCostModel:
    """The scenario's inline linear terms: base + per_req*reqs + per_token*tokens + per_ctx_token*ctx,
    multiplied by ``costs.gpu.scale`` / ``costs.cpu.scale``."""

    device_launch = None  # no calibration harness's part in a prefill's launch (sim.model.profile_costs)

    def __init__(self, costs: Costs):
        g, c = costs.gpu, costs.cpu
        self._forward = (_term(g.prefill, g.scale), _term(g.decode, g.scale))
        self.overlap_residue_s = g.overlap_residue * g.scale
        self.sync_latency_s = g.sync_latency or 0.0
        self._recv = _term(c.recv, c.scale)
        self._schedule = _term(c.schedule, c.scale)
        self._launch = _term(c.launch, c.scale)
        self._process = _term(c.process, c.scale)
        self.gil = costs.gil  # the thread_overlap loop's GIL parameters
        self.extrapolated_steps = 0
        self.decode_submits = False
        self._costs = costs
        self._decode_part: dict[int, tuple[float, float, float, float]] = {}  # decode_s's per batch size
        self._decode_ctx = tuple(t[3] for t in (self._schedule, self._launch, self._forward[DECODE], self._process))

    def forward_s(self, kind, num_reqs, num_tokens, sum_ctx, attn_pairs=0):
        t = self._forward[kind]
        return t[0] + t[1] * num_reqs + t[2] * num_tokens + t[3] * sum_ctx

    def recv_s(self, num_new_reqs):
        t = self._recv
        return t[0] + t[1] * num_new_reqs

    def schedule_s(self, kind, num_reqs, num_tokens, sum_ctx):
        t = self._schedule
        return t[0] + t[1] * num_reqs + t[2] * num_tokens + t[3] * sum_ctx

    def launch_s(self, kind, num_reqs, num_tokens, sum_ctx):
        t = self._launch
        return t[0] + t[1] * num_reqs + t[2] * num_tokens + t[3] * sum_ctx

    def process_s(self, kind, num_reqs, num_tokens, sum_ctx):
        t = self._process
        return t[0] + t[1] * num_reqs + t[2] * num_tokens + t[3] * sum_ctx

    def decode_arrays(self, num_reqs, sum_ctx):
        """(schedule, launch, forward, process) of a decode batch of ``num_reqs`` requests over
        ``sum_ctx`` context tokens (seconds); over an array of contexts (float64) the same
        expressions give four arrays, the same floats elementwise."""
        s, l, f, p = self._schedule, self._launch, self._forward[DECODE], self._process
        return (s[0] + s[1] * num_reqs + s[2] * num_reqs + s[3] * sum_ctx,
                l[0] + l[1] * num_reqs + l[2] * num_reqs + l[3] * sum_ctx,
                f[0] + f[1] * num_reqs + f[2] * num_reqs + f[3] * sum_ctx,
                p[0] + p[1] * num_reqs + p[2] * num_reqs + p[3] * sum_ctx)

    def decode_s(self, num_reqs, sum_ctx):
        """:meth:`decode_arrays` of one batch, the same floats: each phase's sum is evaluated
        left to right, so its first three terms (``num_reqs``' part) are the same double whenever
        they are computed, and are kept per batch size (the leap prices a step at a time)."""
        part = self._decode_part.get(num_reqs)
        if part is None:
            part = self._decode_part[num_reqs] = tuple(
                t[0] + t[1] * num_reqs + t[2] * num_reqs
                for t in (self._schedule, self._launch, self._forward[DECODE], self._process))
        s, l, f, p = part
        cs, cl, cf, cp = self._decode_ctx
        return s + cs * sum_ctx, l + cl * sum_ctx, f + cf * sum_ctx, p + cp * sum_ctx

    def submit_s(self, kind, num_reqs, num_tokens, sum_ctx):
        return 0.0

    def eager_share(self, kind, num_tokens):
        return 0.0

    def describe(self) -> dict:
        return {"kind": "linear", "gpu": self._costs.gpu.model_dump(), "cpu": self._costs.cpu.model_dump()}


def make_cost_model(scenario, setting: str | None = None) -> CostModel:
    """The cost model a scenario asks for: its calibration profile (``costs.profile``) if it
    names one, else the inline linear terms. ``scenario``: a :class:`sim.scenario.Scenario`
    (its ``costs`` and ``resolve_path`` are read); ``setting``: the event loop to price (a
    profile may hold curves per loop).

    Raises:
        ProfileError: the profile file is unusable (see :func:`sim.model.profile.load_profile`).
        ScenarioError: ``costs.cpu.extend_launch_device_scale`` other than 1 on costs without a
            device part of a prefill's launch.
    """
    c = scenario.costs
    if c.profile:
        from sim.model.profile_costs import ProfileCostModel  # it imports this module

        model = ProfileCostModel.from_file(scenario.resolve_path(c.profile), gpu_scale=c.gpu.scale,
                                           cpu_scale=c.cpu.scale, overlap_residue_s=c.gpu.overlap_residue, gil=c.gil,
                                           sync_latency_s=c.gpu.sync_latency, statistic=c.profile_statistic,
                                           setting=setting, extend_launch_device_scale=c.cpu.extend_launch_device_scale)
    else:
        model = LinearCostModel(c)
    if c.cpu.extend_launch_device_scale != 1.0 and model.device_launch is None:
        raise ScenarioError(scenario.source, "costs.cpu.extend_launch_device_scale", "1 with these costs: they have no "
                            "device part of a prefill's launch to scale (a CUDA torch calibration's profile has one, "
                            "or a composed one's device_launch.extend)")
    return model


def kept(memo: dict, key, make, limit: int):
    """``memo[key]``, made by ``make()`` where it is missing; at most ``limit`` entries kept, the
    oldest dropped. The leaps' numpy runs keep a run's prices by the run's constants (batch size,
    first context, length): a closed loop of equal requests repeats its runs."""
    got = memo.get(key)
    if got is None:
        if len(memo) >= limit:
            del memo[next(iter(memo))]
        got = memo[key] = make()
    return got


class SeededGenerator:
    """``np.random.default_rng(seed)`` made at its first draw (any attribute read is forwarded to
    it): the same stream, and a run that draws nothing (fixed lengths, a closed loop, no noise)
    never imports ``numpy.random`` (about 8 ms of CPU, a third of a first run's start on the
    development VM)."""

    __slots__ = ("_seed", "_rng")

    def __init__(self, seed):
        self._seed = seed
        self._rng = None

    def __getattr__(self, name: str):
        if name.startswith("__"):  # (copy's and pickle's probes: not a draw)
            raise AttributeError(name)
        if self._rng is None:
            self._rng = np.random.default_rng(self._seed)
        return getattr(self._rng, name)


class Jitter:
    """Seeded multiplicative per-step jitter, lognormal with mean 1 and coefficient of variation
    ``cv``; ``cv == 0`` returns exactly 1.0 without drawing. Draws are buffered for speed."""

    _CHUNK = 8192

    def __init__(self, cv: float, rng: np.random.Generator):
        self.cv = cv
        self._rng = rng
        self._buf: list[float] = []
        if cv > 0:
            var = np.log1p(cv * cv)
            self._sigma, self._mu = float(np.sqrt(var)), float(-var / 2)

    def __call__(self) -> float:
        if self.cv == 0:
            return 1.0
        if not self._buf:
            self._buf = self._rng.lognormal(self._mu, self._sigma, self._CHUNK).tolist()
        return self._buf.pop()

    def give_back(self, draws: list[float]) -> None:
        """Undo the last ``len(draws)`` calls, which returned ``draws`` (in order): the next calls
        return them again, then what followed them (a leap that drew for a step it then did not
        take; the generator's state, one buffer ahead, is the one the calls left)."""
        if self.cv != 0:
            self._buf.extend(reversed(draws))
