"""The vLLM profile: the curves that time each part of a vLLM V1 engine step, how a profile is
read (its metadata checked) and the tensor-parallel size it prices. The cost models that price a
simulated step from it are :mod:`sim.engines.vllm.costs`.

A vLLM profile is an overlap-sim calibration profile (:mod:`sim.model.profile`: same format,
samples, ``setting_curves`` per setting ``sync``/``async``) with ``metadata.engine: "vllm"`` and
the curves of :data:`VLLM_CURVE_AXES`. Each curve is the time of real functions of vLLM 0.32.0
(process: E = engine core, W = worker), timed with ``time.perf_counter`` (system-wide monotonic,
so timestamps compare across processes) by wrapping them at start-up, per call, one sample per
engine step; ``num_reqs`` = requests scheduled in the step (``len(scheduler_output.
num_scheduled_tokens)``), ``num_tokens`` = their scheduled tokens (``total_num_scheduled_tokens``),
``ctx`` = the mean over those requests of ``num_computed_tokens + num_scheduled_tokens``
(``num_computed_tokens`` as the step was scheduled, before ``_update_after_schedule``):

===================  ===============  =====================================================
curve                axes             the time of (process)
===================  ===============  =====================================================
``vllm.add_request`` num_reqs         the ``EngineCore.add_request`` calls of one drain of the
                                      input queue (``_process_input_queue``), summed; num_reqs =
                                      requests added (E)
``vllm.schedule``    num_reqs         ``Scheduler.schedule`` (E)
``vllm.dispatch``    num_reqs         from the end of ``Scheduler.schedule`` to the start of the
                                      worker's ``execute_model`` for that step: the engine core's
                                      ``execute_model`` RPC (serialize, shm broadcast) and the
                                      worker's wake-up; charged to E (sync runs)
``vllm.prepare``     num_reqs         the worker's ``execute_model`` (``GPUModelRunner.execute_model``)
                                      minus the model forward inside it: ``_update_states``,
                                      ``_prepare_inputs``, logits (W); an empty step: the whole call
``vllm.forward``     num_tokens, ctx  the model forward: the model's ``forward`` (e.g.
                                      ``LlamaForCausalLM.forward``), called by the V1 runner's
                                      ``GPUModelRunner._model_forward`` (``gpu_model_runner.py:3620``)
                                      or the V2 runner's ``execute_model``
                                      (``v1/worker/gpu/model_runner.py:2044``) (W, or the GPU)
``vllm.roundtrip``   num_reqs         sync only: from the end of the worker's ``execute_model`` to
                                      the start of its ``sample_tokens`` (the None reply reaching
                                      ``EngineCore.step`` and its blocking ``sample_tokens`` RPC);
                                      under async scheduling both RPCs are sent back to back (0)
``vllm.sample``      num_reqs         the worker's ``sample_tokens`` (``_sample``,
                                      ``_bookkeeping_sync``, the output) (W)
``vllm.collect``     num_reqs         from the end of the worker's ``sample_tokens`` to the start
                                      of ``Scheduler.update_from_output`` for that step (the reply
                                      travelling back and ``future.result()`` returning) (sync
                                      runs; async keeps its own, from the steps whose output the
                                      engine core was already waiting for)
``vllm.update``      num_reqs         ``Scheduler.update_from_output`` (E)
``vllm.pickup``      num_reqs         optional, async only: the worker taking an RPC that was
                                      already queued for it (``sample_tokens`` behind
                                      ``execute_model``; the next step's ``execute_model``): from
                                      the end of its previous call to the start of the next (W);
                                      synchronously this is inside ``dispatch`` and ``roundtrip``
``vllm.frontend_in``  num_reqs       optional: from the client's send to the first
                                      ``EngineCore.add_request`` of num_reqs requests sent together
                                      to an idle server (the API server; 1: a lone request)
``vllm.frontend_out`` num_reqs        optional: from the end of ``update_from_output`` to the
                                      client's receipt of the step's tokens (engine core output
                                      thread, API server, stream) (:mod:`sim.engines.vllm.frontend`)
``vllm.frontend_work`` num_reqs       optional: ``OutputProcessor.process_outputs`` of a step's
                                      outputs (API server): the part of ``frontend_out`` that
                                      steps take in turn; the rest is latency (without the curve
                                      all of ``frontend_out`` is taken in turn)
``vllm.spec_schedule`` num_reqs       optional, speculative decoding: ``schedule``, ``prepare``,
``vllm.spec_prepare``                 ``sample`` (less the drafter) and ``update`` timed with drafts
``vllm.spec_sample``                  in the batch (:mod:`calibrate.real.vllm.speculative`); a
``vllm.spec_update``                  scenario with ``server.speculative`` uses them in place of
                                      the plain ones where the profile has them
``vllm.draft_host``   num_reqs        optional, speculative decoding: ``propose_draft_token_ids``
                                      less its passes as priced: the drafter's host work (W)
``vllm.spec_forward`` num_tokens, ctx optional, speculative decoding: the model forward of verify
                                      steps (every request 1 + k tokens); used for them in place of
                                      ``vllm.forward`` where the profile has it (W, or the GPU)
``vllm.grammar_bitmask`` num_reqs     optional, structured output: ``Scheduler.get_grammar_bitmask``
``vllm.grammar_sample``               (E), ``sample_tokens`` (W) and ``update_from_output`` (E)
``vllm.grammar_update``               with every request constrained (:mod:`sim.engines.vllm.structured`)
``vllm.take_drafts``  num_reqs        optional, synchronous speculative decoding: ``post_step``'s
                                      ``take_draft_token_ids`` RPC and ``update_draft_token_ids``
                                      (E); without it priced as ``vllm.roundtrip``
===================  ===============  =====================================================

What the calibration must record per engine step: ``scheduler_output.num_scheduled_tokens``
(request id -> scheduled tokens) and each scheduled request's ``num_computed_tokens`` before the
step, plus the start and end of each function above in that step (the worker's with the step's
id); with them every curve's samples and axes follow. ``EngineCore.step`` /
``step_with_batch_queue`` (E) bound each step and check the sum: a synchronous step is
``schedule + dispatch + prepare + forward + roundtrip + sample + collect + update`` plus what is
left of ``step`` (grammar bitmask, output queue put: not modelled).
"""

from __future__ import annotations

from pathlib import Path

from sim.engines.vllm.server import TP_PRICING
from sim.errors import ProfileError, shown
from sim.jsonio import is_number
from sim.model.profile import CurveTable, load_profile, load_profile_read_only

VLLM_CURVE_AXES: dict[str, tuple[str, ...]] = {
    "vllm.add_request": ("num_reqs",),
    "vllm.schedule": ("num_reqs",),
    "vllm.dispatch": ("num_reqs",),
    "vllm.prepare": ("num_reqs",),
    "vllm.forward": ("num_tokens", "ctx"),
    "vllm.roundtrip": ("num_reqs",),
    "vllm.sample": ("num_reqs",),
    "vllm.collect": ("num_reqs",),
    "vllm.update": ("num_reqs",),
}
# the worker's pickup, and the API server (:mod:`sim.engines.vllm.frontend`); a profile without
# the front end's curves: a front end of no cost
VLLM_OPTIONAL_CURVE_AXES: dict[str, tuple[str, ...]] = {
    "vllm.pickup": ("num_reqs",),  # a profile without it (or a sync run): 0
    "vllm.frontend_in": ("num_reqs",),
    "vllm.frontend_out": ("num_reqs",),
    "vllm.frontend_work": ("num_reqs",),  # without it: frontend_out is all the API server's own work
    # speculative decoding (:mod:`calibrate.real.vllm.speculative`)
    "vllm.spec_schedule": ("num_reqs",),
    "vllm.spec_prepare": ("num_reqs",),
    "vllm.spec_sample": ("num_reqs",),
    "vllm.spec_update": ("num_reqs",),
    "vllm.draft_host": ("num_reqs",),
    "vllm.take_drafts": ("num_reqs",),
    "vllm.spec_forward": ("num_tokens", "ctx"),
    # structured output (:mod:`calibrate.real.vllm.structured`)
    "vllm.grammar_bitmask": ("num_reqs",),
    "vllm.grammar_sample": ("num_reqs",),
    "vllm.grammar_update": ("num_reqs",),
}
VLLM_CURVES = CurveTable("vllm", VLLM_CURVE_AXES, VLLM_OPTIONAL_CURVE_AXES, ("vllm.forward", "vllm.spec_forward"))
# a vLLM host-costs file (``metadata.kind == "host"``: calibrate --engine vllm --host-only, the
# forward stubbed): every curve but the forward; overlap-sim compose joins it to a card's forward
VLLM_HOST_CURVES = CurveTable("vllm", {k: v for k, v in VLLM_CURVE_AXES.items() if k != "vllm.forward"},
                              {k: v for k, v in VLLM_OPTIONAL_CURVE_AXES.items() if k != "vllm.spec_forward"}, ())
MIXED_SUM_OF_PARTS = "sum_of_parts"  # metadata.mixed_steps of a profile whose mixed steps are priced by parts


def load_vllm_profile(path: str | Path, read_only: bool = False) -> dict:
    """Read and validate a vLLM profile (raises :class:`sim.errors.ProfileError` naming the file
    and field, e.g. an SGLang profile given to a vLLM scenario). ``read_only``: the process's
    shared copy (:func:`sim.model.profile.load_profile_read_only`), which must not be changed.
    The metadata the cost models read is checked too (:func:`check_metadata`)."""
    profile = load_profile_read_only(path, VLLM_CURVES) if read_only else load_profile(path, VLLM_CURVES)
    check_metadata(profile, str(path))
    return profile


def check_metadata(profile: dict, source: str) -> None:
    """Refuse the metadata :class:`VllmProfileCosts` reads when it cannot mean what it says
    (before, a string crashed the run and a saving of 5 was used as given):

    - ``shared_prefix``: absent, null, or an object whose ``saving`` and every value of
      ``by_setting`` (an object, setting -> share) are shares in [0, 1]: the share ``f`` of a
      shared prefix's attention the calibration saw counted once (:mod:`sim.engines.vllm.costs`; it measures
      ``f`` in [0, 1], 1 when the repeats cost nothing, as its CPU runs saw). Above 1 the forward
      would be priced at less than the context without the repeats, below 0 at more than all of it.
    - ``speculative``: absent, null, or an object whose ``num_speculative_tokens`` (the ``k`` the
      drafter's host work was measured at) is a whole number from 1 to
      :data:`sim.engines.vllm.speculative.MAX_SPEC_TOKENS`, when given.
    - ``mixed_steps``: absent, null or :data:`MIXED_SUM_OF_PARTS` (another word would price mixed
      steps as one step in silence).

    Raises:
        ProfileError: naming ``metadata.<field>`` of ``source``.
    """
    from sim.engines.vllm.speculative import MAX_SPEC_TOKENS

    meta = profile["metadata"]
    shared = meta.get("shared_prefix")
    if shared is not None:
        if not isinstance(shared, dict):
            raise ProfileError(source, "metadata.shared_prefix", f"an object with saving, the share of a shared "
                               f"prefix's attention counted once (got {shown(shared)})")
        if "saving" in shared and not is_number(shared["saving"], 0, 1):
            raise ProfileError(source, "metadata.shared_prefix.saving", f"a share from 0 to 1 of a shared prefix's "
                               f"attention counted once (got {shown(shared['saving'])})")
        by_setting = shared.get("by_setting", {})
        if not isinstance(by_setting, dict):
            raise ProfileError(source, "metadata.shared_prefix.by_setting", "an object: setting -> share from 0 to 1 "
                               f"(got {shown(by_setting)})")
        for setting, v in by_setting.items():
            if not is_number(v, 0, 1):
                raise ProfileError(source, f"metadata.shared_prefix.by_setting.{setting}", "a share from 0 to 1 of a "
                                   f"shared prefix's attention counted once (got {shown(v)})")
    spec = meta.get("speculative")
    if spec is not None:
        if not isinstance(spec, dict):
            raise ProfileError(source, "metadata.speculative", f"an object with num_speculative_tokens, what the "
                               f"speculative curves were measured with (got {shown(spec)})")
        k = spec.get("num_speculative_tokens", 1)
        if not (isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= MAX_SPEC_TOKENS):
            raise ProfileError(source, "metadata.speculative.num_speculative_tokens", f"a whole number from 1 to "
                               f"{MAX_SPEC_TOKENS}, the k the drafter's host work was measured at (got {shown(k)})")
    if meta.get("mixed_steps") not in (None, MIXED_SUM_OF_PARTS):
        raise ProfileError(source, "metadata.mixed_steps", f"{MIXED_SUM_OF_PARTS!r} or absent "
                           f"(got {shown(meta['mixed_steps'])})")


def check_tensor_parallel(scenario, profile: dict, source: str) -> None:
    """Refuse a scenario whose ``server.tensor_parallel_size`` is not the one ``profile`` was
    measured at: a vLLM 0.32 server at TP N runs one engine core and N workers in lockstep
    (``MultiprocExecutor``: ``execute_model`` broadcast to every rank through a shared-memory
    queue, the output taken from rank 0; the all-reduces inside the forward), which the
    simulator prices through the curves measured at that TP (dispatch, forward, the workers'
    phases of rank 0, which wait for the others), not by a model of the all-reduce.

    Raises:
        ScenarioError: naming ``server.tensor_parallel_size`` (:data:`sim.engines.vllm.server.TP_PRICING`).
        ProfileError: the profile's size is not a positive whole number.
    """
    TP_PRICING.check(profile, scenario.server.tensor_parallel_size, source, scenario.source, scenario.server.device)
