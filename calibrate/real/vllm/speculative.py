"""The host curves of speculative decoding, from the real vLLM server drafting on this CPU.

``overlap-sim calibrate --engine vllm --speculative JSON`` (and the interleaved validation's
calibration rounds with ``--speculative``) run, beside each plain session, one more session of
the same setting with ``--speculative-config`` (:func:`speculative_args`) over decode waves
(:func:`design`: B clients, B = 1..16, prompts of C - 16 tokens, C = 128 and 512, 32 output
tokens). From its steps (every request verifying its last token and its drafts, no prefill):

- ``vllm.spec_forward`` (``num_tokens``, ``ctx``; :func:`verify_forward_samples`): the target's
  forward of the verify steps (B requests x (1 + k) tokens at mean context C), priced from the
  steps of every session as ``vllm.forward`` is: a verify step has few tokens per request, a
  shape between the forward curve's decode rows and its prefill rows (on 4 December 2026 the
  curve's interpolation priced 48-token verify steps 20-30% short);

and per ``num_reqs`` (:func:`samples`):

- ``vllm.spec_schedule``, ``vllm.spec_prepare``, ``vllm.spec_update``: ``Scheduler.schedule``,
  ``execute_model`` less the forward, and ``update_from_output`` as the plain curves are timed,
  with drafts in the batch (vLLM 0.32: ``num_tokens_with_spec`` scheduling, the spec-decode
  metadata in ``_prepare_inputs``, the rollback of rejected drafts in ``update_from_output``);
- ``vllm.spec_sample``: ``GPUModelRunner.sample_tokens`` less the drafter inside it
  (``propose_draft_token_ids``): the rejection sampler and the bookkeeping of 1 + k tokens;
- ``vllm.draft_host``: ``propose_draft_token_ids`` (``v1/worker/gpu_model_runner.py``, calling
  ``SpecDecodeBaseProposer.propose``, ``v1/spec_decode/llm_base_proposer.py``) less its passes as
  the simulator prices them (:func:`sim.engines.vllm.speculative.draft_passes_s`:
  ``draft_cost_ratio`` x (the verify step's forward + (k - 1) one-token passes), each read from
  the profile's forward curve): the drafter's own host work (its inputs, attention metadata,
  sampling of the drafts). The split between host work and passes rests on that pricing (the
  passes are not timed on their own: the draft model is the target's class, whose forward the
  tracer cannot tell apart without wrapping a compiled module); their sum is the measured
  proposal at the calibrated points. A difference below 0 (a pass priced above the whole
  proposal) is kept as 0;
- ``vllm.take_drafts`` (``sync`` only): from the end of ``update_from_output`` to the next
  ``Scheduler.schedule`` when the next step runs the same requests: ``EngineCore.post_step``'s
  ``take_draft_token_ids`` RPC to the worker and ``update_draft_token_ids`` (``v1/engine/core.py``
  l.693; without drafting this interval measured 0.06 ms, with drafting 1.1-1.9 ms on 4 December
  2026).

Under ``async`` the curves are the setting's own (``setting_curves``). The profile records what
was measured in ``metadata.speculative`` (method, k, draft model, ratio), which the simulator
names on every run (:meth:`sim.engines.vllm.speculative.Speculative.caveats`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from calibrate.errors import CalibrationInputError
from calibrate.profile import build_profile
from calibrate.real.vllm import trace as vllm_trace
from calibrate.real.jobs import decode_waves
from calibrate.real.vllm.merge import drop_incomplete_rows, merge_sample
from sim.engines.vllm.profile import VLLM_CURVES
from sim.engines.vllm.speculative import MODELLED_METHODS, draft_passes_s
from sim.model.profile import profile_curves

CONTEXTS = (128, 512)
SPEC_LOAD = "spec-"  # the loads' names and request ids start with this
SPEC_PHASE_CURVES = ("vllm.spec_schedule", "vllm.spec_prepare", "vllm.spec_sample", "vllm.spec_update")
# the vLLM 0.32 function each curve is timed from (E: engine core, W: worker), with drafts in the batch
FUNCTIONS = {
    "vllm.spec_forward": "GPUModelRunner._model_forward of verify steps (W, the CPU forward)",
    "vllm.spec_schedule": "Scheduler.schedule (E), drafting",
    "vllm.spec_prepare": "GPUModelRunner.execute_model less _model_forward (W), drafting",
    "vllm.spec_sample": "GPUModelRunner.sample_tokens less propose_draft_token_ids (W): the rejection sampler",
    "vllm.spec_update": "Scheduler.update_from_output (E), drafting",
    "vllm.draft_host": "GPUModelRunner.propose_draft_token_ids less its passes priced from vllm.forward (W)",
    "vllm.take_drafts": "sync: end of update_from_output to the next Scheduler.schedule (E: EngineCore.post_step's "
                        "take_draft_token_ids RPC and update_draft_token_ids)",
}


def check_config(spec: object, where: str = "--speculative") -> dict:
    """``spec`` as a calibration's speculative config: a JSON object with ``method``,
    ``num_speculative_tokens`` (an integer from 1 to 64) and ``draft_cost_ratio`` (a number >= 0:
    the draft model's pass against the target's of the same shape; 1.0 when the target drafts
    for itself), and ``model`` for a draft-model method.

    Raises:
        CalibrationInputError: naming ``where`` and the field.
    """
    if not isinstance(spec, dict):
        raise CalibrationInputError(where, "", "a JSON object with method, num_speculative_tokens and draft_cost_ratio")
    for key in ("method", "num_speculative_tokens", "draft_cost_ratio"):
        if key not in spec:
            raise CalibrationInputError(where, key, "missing")
    k, ratio = spec["num_speculative_tokens"], spec["draft_cost_ratio"]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 64:
        raise CalibrationInputError(where, "num_speculative_tokens", f"an integer from 1 to 64 (got {k!r})")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 100:
        raise CalibrationInputError(where, "draft_cost_ratio", f"a number from 0 to 100 (got {ratio!r})")
    if spec["method"] not in MODELLED_METHODS:
        raise CalibrationInputError(where, "method", f"one of {', '.join(MODELLED_METHODS)} (got {spec['method']!r})")
    if spec["method"] == "draft_model" and not spec.get("model"):
        raise CalibrationInputError(where, "model", "draft_model needs the draft model's path")
    return spec


def speculative_args(spec: dict) -> list[str]:
    """The server's ``--speculative-config`` for ``spec`` (``draft_cost_ratio`` is ours, not vLLM's)."""
    return ["--speculative-config", json.dumps({k: v for k, v in spec.items() if k != "draft_cost_ratio"})]


def design(decode_batch_sizes: tuple[int, ...], decode_steps: int, waves: int, seed: int,
           client: str = "own") -> list[dict]:
    """The loads of one speculative session: decode waves of B clients at each context of
    :data:`CONTEXTS` (:func:`calibrate.real.jobs.decode_waves`, prompts of ``seed + 1``), sent by
    this project's client (``own``) or by vLLM's own benchmark client (``engine``)."""
    return decode_waves(SPEC_LOAD, CONTEXTS, decode_batch_sizes, decode_steps, waves, seed + 1, client)


def verify_forward_samples(steps: list[vllm_trace.VllmStep], spec: dict, sizes: set[int],
                           decode_steps: int) -> list[dict]:
    """Samples of ``vllm.spec_forward`` (``num_tokens``, ``ctx``): the target's forward of the
    verify steps in which every request runs 1 + k tokens, at ``num_reqs`` in ``sizes`` and a
    mean context within ``decode_steps / 2`` of one of :data:`CONTEXTS` (the point's ``ctx``)."""
    k = int(spec["num_speculative_tokens"])
    acc: dict[tuple, list[float]] = {}
    for s in steps:
        if s.num_reqs not in sizes or s.forward != s.forward or not all(t == 1 + k for t in s.tok):
            continue
        c = min(CONTEXTS, key=lambda x: abs(x - s.ctx))
        if abs(c - s.ctx) <= decode_steps // 2:
            acc.setdefault((s.num_tokens, c), []).append(s.forward)
    return [{"curve": "vllm.spec_forward", "point": {"num_tokens": n, "ctx": c}, "times_s": ts}
            for (n, c), ts in sorted(acc.items())]


def samples(steps: list[vllm_trace.VllmStep], forward: Callable[[float, float], float], spec: dict,
            sizes: set[int], setting: str = "sync",
            verify_forward: Callable[[float, float], float] | None = None) -> list[dict]:
    """Profile samples (``{"curve", "point", "times_s"}``) of the speculative curves from one speculative session's steps: those with a
    drafter record in which every request runs 1 to 1 + k tokens (no prefill) and whose
    ``num_reqs`` is one of ``sizes``.

    Args:
        steps: the session's steps (:func:`calibrate.real.vllm.trace.steps`).
        forward: the profile's forward curve, ``(num_tokens, ctx) -> s`` (the one-token passes).
        verify_forward: its verify-step curve (``vllm.spec_forward``) for the first pass, which
            has the verify step's shape; None: ``forward``.
        spec: the config (:func:`check_config`).
        sizes: the batch sizes the curves are sampled at.
        setting: ``sync`` or ``async`` (``vllm.take_drafts`` is sampled from ``sync`` only).
    """
    k, ratio = int(spec["num_speculative_tokens"]), float(spec["draft_cost_ratio"])
    acc: dict[tuple, list[float]] = {}

    def add(curve: str, m: int, t: float) -> None:
        if t == t:
            acc.setdefault((curve, m), []).append(max(t, 0.0))

    by_k = {s.k: s for s in steps}
    for s in steps:
        if (s.draft is None or s.sample is None or s.execute is None or s.update is None or s.num_reqs not in sizes
                or not all(1 <= t <= 1 + k for t in s.tok) or s.forward != s.forward):
            continue
        m = s.num_reqs
        passes = draft_passes_s(k, ratio, (verify_forward or forward)(s.num_tokens, s.ctx), forward(m, s.ctx))
        add("vllm.spec_schedule", m, s.schedule["dur"])
        add("vllm.spec_prepare", m, s.execute["dur"] - s.forward)
        add("vllm.spec_sample", m, s.sample["dur"] - s.draft["dur"])
        add("vllm.spec_update", m, s.update["dur"])
        add("vllm.draft_host", m, s.draft["dur"] - passes)
        nxt = by_k.get(s.k + 1)
        if setting == "sync" and nxt is not None and nxt.reqs == s.reqs:  # the next step follows at once
            add("vllm.take_drafts", m, nxt.schedule["t0"] - (s.update["t0"] + s.update["dur"]))
    return [{"curve": c, "point": {"num_reqs": m}, "times_s": ts} for (c, m), ts in sorted(acc.items())]


def add_samples(merged: dict, meta: dict, order: list[tuple[str, str]], outs: list[Path], spec: dict,
                sizes: set[int], decode_steps: int, settings: tuple[str, ...],
                report: Callable[[str], None]) -> dict:
    """Merge the drafting sessions' samples (``outs``, one per ``(setting, name)`` of ``order``)
    into ``merged`` (:func:`calibrate.real.vllm.merge.merge_sample`): the verify forward first,
    then the host curves, whose drafter passes are priced from the forward curves of everything
    merged so far (a profile built with ``meta``). Returns ``metadata.speculative``."""
    steps = [vllm_trace.steps_of_session(out) for out in outs]
    for (setting, _), steps_ in zip(order, steps):
        for smp in verify_forward_samples(steps_, spec, sizes, decode_steps):
            merge_sample(merged, smp, setting, settings)
    drop_incomplete_rows(merged, CONTEXTS, report, settings[0], "vllm.spec_forward")
    curves = profile_curves(build_profile(meta, list(merged.values()), VLLM_CURVES), "median", None, VLLM_CURVES)
    for (setting, _), steps_ in zip(order, steps):
        for smp in samples(steps_, curves["vllm.forward"], spec, sizes, setting, curves.get("vllm.spec_forward")):
            merge_sample(merged, smp, setting, settings)
    return metadata(spec, [o.name for o in outs])


def metadata(spec: dict, sessions: list[str]) -> dict:
    """``metadata.speculative`` of a profile with these curves."""
    return {"method": spec["method"], "num_speculative_tokens": int(spec["num_speculative_tokens"]),
            "model": spec.get("model"), "draft_cost_ratio": float(spec["draft_cost_ratio"]), "sessions": sessions,
            "curves": list(FUNCTIONS)}
