"""What each part of a vLLM V1 engine step costs: the cost models that price a simulated step from
a vLLM profile (:mod:`sim.engines.vllm.profile`: its curves and what they time) or from the
scenario's inline terms.

A shared prefix (``workload.prefix_sharing: shared``): when m requests of a decode step hold the
same cached prefix of p tokens, the forward is priced at the mean context
``(sum_ctx - f (m - 1) p) / num_reqs``: a share ``f`` of the attention over the prefix's KV is
counted once rather than m times. ``f`` is the profile's ``metadata.shared_prefix.by_setting``
for the simulated setting (else its ``saving``, both settings' steps together; per setting
because the calibration of 1 December 2026 measured 1.0 synchronously and 0.72 under async
scheduling, and both validations of that day saw async's decode forward over a shared prefix
x1.15-1.2 slower than sync's, where over distinct contexts the two were alike), measured by the
calibration (decode waves whose requests share a cached prefix, against the
forward curve of distinct contexts; :mod:`calibrate.real.vllm.profile`); 0 without it (each
request's context priced in full, the model before this was measured). Steps that prefill are
priced in full (not measured; a prefill's many queries per request reuse what they read).

A mixed step (vLLM V1 schedules the running requests' decode tokens and new prompts' prefill
tokens into one step): by default priced like any step, at (``num_tokens``, the mean context over
all its requests). A profile with ``metadata.mixed_steps: "sum_of_parts"`` (the CPU
calibration writes it) prices it as its prefill part, (prefill tokens, their requests' mean
context), plus its decode part, (decode requests, their mean context), each read from the forward
curve as a step of its own. vLLM 0.32's CPU attention runs one kernel over the requests' own query
ranges and KV lengths (``CPUAttentionBackendImpl.forward`` -> ``ops.cpu_attention_with_kv_cache``
with ``query_start_loc`` and ``seq_lens``, ``vllm/v1/attention/backends/cpu_attn.py``), so what a
request costs follows its own query and context, which a mean over a mixed step's requests does
not keep: the calibration's prefill points are one or a few prompts of 128 or more tokens, and a
step of one 170-token prompt and 7 decodes sits among them as about 1.4 prompts. Found in the
validation traces of 1 December 2026 (21:00 UTC, interleaved run): such steps took 1.03 to 1.21
times (ratio of sums, by load) what the mean-context price gave; priced by parts, 0.94 to 1.07.
The sum counts the forward's fixed cost (about 4 ms here, the decode curve's intercept) twice and
still comes out about right, so mixed steps cost more than the per-token and per-request terms
alone explain; why is not known. A transfer to a GPU drops the rule (a GPU forward reads the
weights once per step, so the parts' sum would count that twice).

The inline model (no ``costs.profile``) maps the scenario's linear terms onto these: the forward
is ``costs.gpu.decode`` for a step of single decode tokens, else ``costs.gpu.prefill``
(``num_reqs``, ``num_tokens``, ``sum_ctx``); ``add_request`` is ``costs.cpu.recv``,
``schedule`` ``costs.cpu.schedule``, ``dispatch`` ``costs.cpu.launch``, ``update``
``costs.cpu.process``; ``prepare``, ``roundtrip``, ``sample`` and ``collect`` are 0. Either
way ``costs.gpu.scale`` multiplies the forward and ``costs.cpu.scale`` everything else;
``costs.gpu.overlap_residue``, ``sync_latency`` and ``gil`` are SGLang's and not used.
"""

from __future__ import annotations

import math

from sim.engines.vllm.profile import MIXED_SUM_OF_PARTS, VLLM_CURVES, check_tensor_parallel, load_vllm_profile
from sim.engines.vllm.structured import GrammarCosts
from sim.errors import ScenarioError
from sim.model.costs import DECODE, LinearCostModel
from sim.model.profile import profile_curves
from sim.model.reach import (BOUNDED_MAX, ReachMeter, below_share, bound_below, distance, distances,
                             farthest_axis, hulls)

PHASES = ("add_request", "schedule", "dispatch", "prepare", "roundtrip", "sample", "collect", "update")
SPEC_PHASES = ("schedule", "prepare", "sample", "update")  # with a ``vllm.spec_<phase>`` curve


# vLLM 0.32's API server processes a step's outputs in slices of this many requests
# (``envs.VLLM_V1_OUTPUT_PROC_CHUNK_SIZE``, default 128; ``AsyncLLM.output_handler`` in
# ``vllm/v1/engine/async_llm.py`` calls ``OutputProcessor.process_outputs`` once a slice, yielding
# the event loop between them): ``vllm.frontend_work`` is timed a call, so a step of 256 requests
# is two calls of 128
OUTPUT_CHUNK = 128


def read_at(curve: str, num_reqs: int) -> int:
    """Where a step of ``num_reqs`` requests reads ``curve`` (a phase or output curve over
    ``num_reqs``): ``vllm.frontend_work`` at its largest slice (:data:`OUTPUT_CHUNK`), the others
    at the step's size; for the data's reach (:mod:`sim.model.reach`)."""
    return min(num_reqs, OUTPUT_CHUNK) if curve == "vllm.frontend_work" else num_reqs


class VllmProfileCosts:
    """Step costs from a vLLM profile.

    Args:
        profile: a validated vLLM profile (:func:`sim.engines.vllm.profile.load_vllm_profile`: its
            metadata checked).
        setting: ``sync`` or ``async``: that setting's ``setting_curves`` replace the base curves.
        gpu_scale, cpu_scale: multipliers of the forward and of every other curve.
        statistic: ``median`` or ``mean`` (see :func:`sim.model.profile.profile_curves`).
        source: where the profile came from (for :meth:`describe`).
        speculative: the server drafts (``server.speculative``): the phases of
            :data:`SPEC_PHASES` are read from their ``vllm.spec_<phase>`` curves where the profile
            has them, and :meth:`draft_host_s` from ``vllm.draft_host``.
    """

    grammar = None  # structured output's costs (make_vllm_costs sets them)

    def __init__(self, profile: dict, setting: str, gpu_scale: float = 1.0, cpu_scale: float = 1.0,
                 statistic: str = "median", source: str = "<dict>", speculative: bool = False):
        self.curves = profile_curves(profile, statistic, setting, VLLM_CURVES, source)
        self.profile, self.setting, self.source, self.statistic = profile, setting, source, statistic
        self.gpu_scale, self.cpu_scale = gpu_scale, cpu_scale
        self.reach = ReachMeter()
        self._cpu = {name: self.curves[f"vllm.{name}"] for name in PHASES}
        if speculative:
            self._cpu.update({name: self.curves[f"vllm.spec_{name}"] for name in SPEC_PHASES
                              if f"vllm.spec_{name}" in self.curves})
        self._draft_host = self.curves.get("vllm.draft_host") if speculative else None
        self._take_drafts = self.curves.get("vllm.take_drafts") if speculative else None
        self._verify_forward = self.curves.get("vllm.spec_forward") if speculative else None
        # the k the drafter's host work was measured at (metadata.speculative; 0: not known)
        self._draft_k = int((profile["metadata"].get("speculative") or {}).get("num_speculative_tokens", 0))
        self._forward = self.curves["vllm.forward"]
        self._frontend = {k: self.curves.get(f"vllm.frontend_{k}") for k in ("in", "out", "work")}
        self._pickup = self.curves.get("vllm.pickup")
        shared = profile["metadata"].get("shared_prefix") or {}  # (null: none measured)
        self.shared_prefix_saving = float(shared.get("by_setting", {}).get(setting, shared.get("saving", 0.0)))
        self.mixed_sum_of_parts = profile["metadata"].get("mixed_steps") == MIXED_SUM_OF_PARTS
        h = hulls(profile, self.curves)
        self._hull_forward = h["vllm.forward"]
        self._hull_verify = h.get("vllm.spec_forward")
        # the phases priced at a step's num_reqs, and the API server's output side (frontend_out,
        # frontend_work: a step's tokens for its num_reqs requests; frontend_in is over the requests
        # sent together, not a step's size)
        self._phase_curves = tuple(f"vllm.{name}" for name in PHASES if name != "add_request") + tuple(
            name for name in ("vllm.frontend_out", "vllm.frontend_work") if name in h)
        self._hull_phases = tuple((h[name], name) for name in self._phase_curves)
        self._hulls = h
        self._farthest: tuple | None = None  # the farthest step's (forward curve, its points, num_reqs)
        # the bounded step of the largest share's (forward curve, points, lowest context)
        self._bounded: tuple | None = None
        # the largest step the API server's output side was measured at (frontend_s holds it there)
        self._frontend_reach = {k: h[f"vllm.frontend_{k}"][1][0] for k in ("out", "work") if f"vllm.frontend_{k}" in h}
        self._phases_memo: dict[int, float] = {}  # num_reqs -> the phases' distance from the data

    @property
    def extrapolated_steps(self) -> int:
        """Steps priced beyond the measured data (:mod:`sim.model.reach`)."""
        return self.reach.extrapolated_steps

    def pickup_s(self, num_reqs: int) -> float:
        """The worker taking an already queued RPC (``vllm.pickup``); 0 without the curve."""
        return self._pickup(num_reqs) * self.cpu_scale if self._pickup is not None else 0.0

    def draft_host_s(self, num_reqs: int, k: int) -> float:
        """The drafter's host work in a step of ``num_reqs`` requests drafting ``k`` tokens each
        (``vllm.draft_host``, measured at the calibration's k: scaled by k over it when they
        differ, an assumption :meth:`sim.engines.vllm.speculative.Speculative.caveats` states);
        0 without the curve."""
        if self._draft_host is None:
            return 0.0
        return self._draft_host(num_reqs) * self.cpu_scale * (k / self._draft_k if self._draft_k else 1.0)

    def take_drafts_s(self, num_reqs: int) -> float:
        """Synchronous speculative decoding's ``post_step`` (``take_draft_token_ids`` and
        ``update_draft_token_ids``): ``vllm.take_drafts``, or ``vllm.roundtrip`` (another RPC
        round trip to the idle worker) without it."""
        if self._take_drafts is None:
            return self.phase_s("roundtrip", num_reqs)
        return self._take_drafts(num_reqs) * self.cpu_scale

    def frontend_s(self, kind: str, num_reqs: int) -> float:
        """The API server's latency for ``num_reqs`` requests sent together (``kind`` "in") or a
        step's outputs for ``num_reqs`` requests ("out"), or its own work on those outputs
        ("work": ``process_outputs``); 0 when the profile has no such curve (for "work": inf, so
        that :meth:`sim.engines.vllm.frontend.ApiServer.egress`, which caps the work at the "out"
        latency, takes all of it in turn, as before the curve was measured). A step's outputs
        ("out", "work") beyond the largest step the curve was measured at (its data's hull,
        :func:`sim.model.reach.hulls`) are priced as that step's: held, not extended
        (:mod:`sim.engines.vllm.frontend`); :meth:`forward_s` counts such a step as extrapolated.
        "work" is summed over the slices the API server processes a step's outputs in
        (:data:`OUTPUT_CHUNK` requests each, the last the rest), as the curve is measured: one
        ``process_outputs`` call a slice."""
        curve = self._frontend[kind]
        if curve is None and kind == "work":
            return math.inf
        if curve is None:
            return 0.0
        if kind == "in":
            return curve(num_reqs) * self.cpu_scale
        reach = self._frontend_reach[kind]  # a step's outputs: not extrapolated beyond the largest step measured
        if kind == "out":
            return curve(min(num_reqs, reach)) * self.cpu_scale
        full, rest = divmod(num_reqs, OUTPUT_CHUNK)
        work = full * curve(min(OUTPUT_CHUNK, reach)) if full else 0.0
        return (work + (curve(min(rest, reach)) if rest else 0.0)) * self.cpu_scale

    def frontend_in_line(self) -> tuple[float, float]:
        """``(L, w)`` seconds of :mod:`sim.engines.vllm.frontend`: the line through
        ``frontend_in`` at 1 and at the largest measured burst n (``L + w``, ``L + n w``), each
        at least 0; one measured point: ``(0, frontend_in(1))``; no curve: ``(0, 0)``."""
        curve = self._frontend["in"]
        if curve is None:
            return 0.0, 0.0
        one = self.frontend_s("in", 1)
        n = self.frontend_in_edge() if len(curve.grid[0]) > 1 else 1
        if n <= 1:
            return 0.0, one
        w = max(0.0, (self.frontend_s("in", n) - one) / (n - 1))
        w = min(w, one)
        return one - w, w

    def frontend_in_edge(self) -> int | None:
        """The largest burst ``vllm.frontend_in`` was measured at (requests sent together), the
        end of the data :meth:`frontend_in_line` draws its line through; None without the curve."""
        curve = self._frontend["in"]
        return None if curve is None else int(max(curve.grid[0]))

    def phase_s(self, name: str, num_reqs: int) -> float:
        """CPU (or latency) time of phase ``name`` (one of :data:`PHASES`) for ``num_reqs`` requests."""
        return self._cpu[name](num_reqs) * self.cpu_scale

    def forward_s(self, kind: int, num_reqs: int, num_tokens: int, sum_ctx: int, shared_kv: int = 0,
                  decode_reqs: int = 0, decode_sum_ctx: int = 0, decode_tokens: int = 0, count: bool = True,
                  verify: bool = False) -> float:
        """The model forward of a step; ``shared_kv``: tokens of the step's contexts that repeat a
        prefix another of its requests holds ((m - 1) p, module docstring). ``decode_reqs``,
        ``decode_sum_ctx``, ``decode_tokens``: how many of the step's requests run one token (plus
        their drafts, speculative decoding), their summed context and their tokens (0: one each);
        when some do and others prefill (a mixed step) and the profile says
        ``metadata.mixed_steps: "sum_of_parts"``, the step costs its prefill part plus its decode
        part, each priced as a step of its own (module docstring). Counts the step in
        :attr:`reach` with its distance from the data (unless ``count`` is False: a draft pass
        of a step already counted): the forward (or each part of it) and every phase curve at
        ``num_reqs`` (the API server's output curves too: a step's tokens pass through them).
        ``verify``: a speculative verify step (every request one token plus its
        drafts), priced by ``vllm.spec_forward`` where the profile has it and the server drafts."""
        if self.mixed_sum_of_parts and 0 < decode_reqs < num_reqs:
            decode_tokens = decode_tokens or decode_reqs
            parts = ((num_tokens - decode_tokens, (sum_ctx - decode_sum_ctx) / (num_reqs - decode_reqs)),
                     (decode_tokens, decode_sum_ctx / decode_reqs))
            if count:
                self._count(("vllm.forward", self._forward, self._hull_forward), parts, num_reqs)
            return sum(self._forward(n, c) for n, c in parts) * self.gpu_scale
        ctx = (sum_ctx - self.shared_prefix_saving * shared_kv) / num_reqs
        curve, hull, name = self._forward, self._hull_forward, "vllm.forward"
        if verify and self._verify_forward is not None:  # a verify step, measured as such
            curve, hull, name = self._verify_forward, self._hull_verify, "vllm.spec_forward"
        if count:
            if ctx < hull[0][1]:  # below the data's contexts (rare): perhaps bounded
                self._count((name, curve, hull), ((num_tokens, ctx),), num_reqs)
            elif self.reach.step(max(distance(hull, num_tokens, ctx), self._phases_distance(num_reqs))):
                self._farthest = (name, ((num_tokens, ctx),), num_reqs)
        return curve(num_tokens, ctx) * self.gpu_scale

    def _count(self, forward: tuple, points, num_reqs: int) -> None:
        """Count a step in :attr:`reach`: its forward (``(name, curve, hull)``) at each of
        ``points`` (tokens, context per request) and its phases at ``num_reqs``. A context below
        the data whose price lies within :data:`sim.model.reach.BOUNDED_MAX` of the lowest
        measured context's is bounded, not extrapolated (:mod:`sim.model.reach`): such a step
        counts as bounded where nothing else lies beyond the data, else at its other distances."""
        name, curve, hull = forward
        lo_c = hull[0][1]
        d, share, kept = self._phases_distance(num_reqs), -1.0, []
        for n, c in points:
            if c < lo_c:
                s = below_share(curve(n, c), curve(n, lo_c))
                if s <= BOUNDED_MAX:
                    share, c = max(share, s), lo_c  # (the point's context taken as the edge's)
            kept.append((n, c))
            d = max(d, distance(hull, n, c))
        if d > 1.0:
            if self.reach.step(d):
                self._farthest = (name, tuple(kept), num_reqs)
        elif share >= 0.0 and self.reach.bounded(share):
            self._bounded = (name, points, lo_c)

    def decode_forward_at(self, num_reqs: int, shared_kv: int):
        """:meth:`forward_s` of decode steps of ``num_reqs`` single-token requests (``shared_kv``
        tokens of shared prefix) as a function of the summed context (tokens): each value the
        float :meth:`forward_s` gives, without counting the step (the leap prices a run's steps
        with it)."""
        at, saving, scale = self._forward.at(num_reqs), self.shared_prefix_saving * shared_kv, self.gpu_scale
        return lambda sum_ctx: at((sum_ctx - saving) / num_reqs) * scale

    def decode_forward_array(self, num_reqs: int, sum_ctx, shared_kv: int):
        """:meth:`forward_s` of decode steps of ``num_reqs`` single-token requests over an array of
        summed contexts ``sum_ctx`` (int64, tokens), without counting them (:meth:`count_decode_steps`
        does, for the steps that run): a float64 array, each value the float the scalar path gives
        (the same operations elementwise; :meth:`sim.model.curve.Curve.along`)."""
        ctx = (sum_ctx - self.shared_prefix_saving * shared_kv) / num_reqs
        return self._forward.along(num_reqs, ctx) * self.gpu_scale

    def count_decode_steps(self, num_reqs: int, sum_ctx0: int, steps: int, shared_kv: int) -> None:
        """Count ``steps`` decode steps of ``num_reqs`` requests, the first at the summed context
        ``sum_ctx0``, each the one before plus ``num_reqs`` tokens, in :attr:`reach`, as
        :meth:`forward_s` counts each (its distance: the forward's at the step's coordinates and
        the phases' at ``num_reqs``). The contexts grow step by step, so when the first and the
        last lie inside the data every step lies at the batch size's distance (1: nothing to count)."""
        saving = self.shared_prefix_saving * shared_kv
        first, last = (sum_ctx0 - saving) / num_reqs, (sum_ctx0 + (steps - 1) * num_reqs - saving) / num_reqs
        (lo_n, lo_c), (hi_n, hi_c) = self._hull_forward
        size = max(distance(((lo_n,), (hi_n,)), num_reqs), self._phases_distance(num_reqs))
        if lo_c <= first and last <= hi_c:  # every context inside the data: each step at the size's distance
            if self.reach.same_steps(size, steps):
                self._farthest = ("vllm.forward", ((num_reqs, first),), num_reqs)
            return
        import numpy as np

        ctx = (sum_ctx0 + np.arange(steps, dtype=np.int64) * num_reqs - saving) / num_reqs
        d = np.maximum(distances(lo_c, hi_c, ctx), size)
        # below the data's contexts: bounded where the price is near the edge's (_count)
        if (widest := bound_below(self.reach, self._forward, num_reqs, ctx, lo_c, d, size)) is not None:
            self._bounded = ("vllm.forward", ((num_reqs, widest),), lo_c)
        if (i := self.reach.steps(d)) >= 0:
            self._farthest = ("vllm.forward", ((num_reqs, float(ctx[i])),), num_reqs)

    def farthest_at(self) -> str:
        """Where the run's farthest step from the profile's data lies: the curve and axis
        (:func:`sim.model.reach.farthest_axis` over the forward's points and the phases priced at
        the step's requests), "" when none lay beyond."""
        if self._farthest is None:
            return ""
        name, points, num_reqs = self._farthest
        c, h = self.curves, self._hulls
        return farthest_axis([(name, c[name].axes, h[name], x) for x in points]
                             + [(p, c[p].axes, h[p], (read_at(p, num_reqs),)) for p in self._phase_curves])

    def bounded_at(self) -> str:
        """Where the run's bounded step of the largest share lies (:mod:`sim.model.reach`), in
        words: ``"vllm.forward at ctx 16, measured from 128"``; "" when none was bounded."""
        if self._bounded is None:
            return ""
        name, points, lo_c = self._bounded
        ctx = min(c for _, c in points)
        return f"{name} at ctx {ctx:.4g}, measured from {lo_c:.6g}"

    def _phases_distance(self, num_reqs: int) -> float:
        # add_request is priced per drained request, not at the step's num_reqs; kept per batch size
        d = self._phases_memo.get(num_reqs)
        if d is None:
            d = self._phases_memo[num_reqs] = max(distance(h, read_at(name, num_reqs)) for h, name in self._hull_phases)
        return d

    def describe(self) -> dict:
        m = self.profile["metadata"]
        return {"kind": "profile", "engine": "vllm", "path": self.source, "device": m.get("device"),
                "model": m.get("model", {}).get("name"), "setting": self.setting, "statistic": self.statistic,
                "gpu_scale": self.gpu_scale, "cpu_scale": self.cpu_scale}


class VllmInlineCosts:
    """Step costs from the scenario's inline linear terms (mapping in the module docstring)."""

    grammar = None  # structured output's costs (make_vllm_costs sets them)

    def __init__(self, costs):
        self._linear = LinearCostModel(costs)
        self.extrapolated_steps = 0

    def frontend_s(self, kind: str, num_reqs: int) -> float:
        """The inline terms have no API server: 0."""
        return 0.0

    def frontend_in_line(self) -> tuple[float, float]:
        return 0.0, 0.0

    def frontend_in_edge(self) -> None:
        """The inline terms measured no burst: None."""
        return None

    def pickup_s(self, num_reqs: int) -> float:
        """The inline terms have no RPC pickup: 0."""
        return 0.0

    def draft_host_s(self, num_reqs: int, k: int) -> float:
        """The inline terms have no drafter host work: 0."""
        return 0.0

    def take_drafts_s(self, num_reqs: int) -> float:
        """The inline terms price ``post_step``'s RPC as the round trip (0 here)."""
        return self.phase_s("roundtrip", num_reqs)

    _TERMS = {"schedule": "schedule_s", "dispatch": "launch_s", "update": "process_s"}  # phase -> inline term

    def phase_s(self, name: str, num_reqs: int) -> float:
        lin = self._linear
        if name == "add_request":
            return lin.recv_s(num_reqs)
        term = self._TERMS.get(name)
        return getattr(lin, term)(DECODE, num_reqs, num_reqs, 0) if term is not None else 0.0

    shared_prefix_saving = 0.0  # the inline terms price each request's context in full
    mixed_sum_of_parts = False  # and a mixed step as one prefill

    def forward_s(self, kind: int, num_reqs: int, num_tokens: int, sum_ctx: int, shared_kv: int = 0,
                  decode_reqs: int = 0, decode_sum_ctx: int = 0, decode_tokens: int = 0, count: bool = True,
                  verify: bool = False) -> float:
        """The inline prefill or decode term over the whole step (a mixed step is a prefill; a
        speculative verify step of one token plus drafts per request is a decode)."""
        return self._linear.forward_s(kind, num_reqs, num_tokens, sum_ctx)

    def decode_forward_at(self, num_reqs: int, shared_kv: int):
        """:meth:`forward_s` of decode steps of ``num_reqs`` requests as a function of the summed
        context: the same expression, the same floats."""
        return lambda sum_ctx: self._linear.forward_s(DECODE, num_reqs, num_reqs, sum_ctx)

    def decode_forward_array(self, num_reqs: int, sum_ctx, shared_kv: int):
        """:meth:`forward_s` of decode steps over an array of summed contexts (int64): the same
        expression elementwise, a float64 array of the same floats."""
        return self._linear.forward_s(DECODE, num_reqs, num_reqs, sum_ctx)

    def count_decode_steps(self, num_reqs: int, sum_ctx0: int, steps: int, shared_kv: int) -> None:
        """The inline terms have no data to lie beyond: nothing to count."""

    def describe(self) -> dict:
        return {**self._linear.describe(), "engine": "vllm"}


def make_vllm_costs(scenario, setting: str):
    """The cost model a vLLM scenario asks for: its profile (``costs.profile``) or the inline terms.

    With ``server.structured_output`` (a share above 0) the model gets ``grammar``, the step's
    grammar costs (:class:`sim.engines.vllm.structured.GrammarCosts`); else ``grammar`` is None.

    Raises:
        ProfileError: the profile is unusable or not a vLLM profile.
        ScenarioError: structured output whose costs neither the profile nor the section give;
            a tensor-parallel size the profile was not measured at (:func:`check_tensor_parallel`).
    """
    c = scenario.costs
    if c.profile:
        path = scenario.resolve_path(c.profile)
        profile = load_vllm_profile(path, read_only=True)
        check_tensor_parallel(scenario, profile, str(path))
        costs = VllmProfileCosts(profile, setting, c.gpu.scale, c.cpu.scale,
                                 c.profile_statistic, str(path), speculative=scenario.server.speculative is not None)
        curves = costs.curves
    else:
        costs, curves = VllmInlineCosts(c), None
    section = scenario.server.structured_output
    if section is not None and section.share > 0:
        try:
            costs.grammar = GrammarCosts(section, curves, c.cpu.scale)
        except ValueError as err:
            raise ScenarioError(scenario.source, "server.structured_output", str(err)) from None
    return costs
