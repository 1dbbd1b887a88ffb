"""The costs of structured output, from SGLang 0.5.23's real scheduler constraining every request.

``overlap-sim calibrate --engine sglang --structured-output`` (and the interleaved validation's
calibration rounds with ``--grid structured``) follow each calibration run with one more of the
same loop (:func:`job`, run in-process by :mod:`realengines.sglang.drive`) whose requests all
carry the JSON schema :data:`SCHEMA` (``SamplingParams.json_schema``; the server's default grammar
backend, xgrammar): decode waves of B requests, B in the grid's batch sizes, prompts of
C - 16 tokens, C = 128 and 512, 32 output tokens, sampled at temperature 1 with a seed per
request (greedy decoding on the random-weight model closes the schema's string within about 14
tokens, measured; sampled, it stays inside it). From its records (:func:`samples`), per
``num_reqs``:

- ``grammar.mask``: ``SamplingBatchInfo.update_regex_vocab_mask`` (the tracer's ``mask`` record,
  scheduler-thread CPU time) where every request of the batch had a live grammar (``n == bs``);
- ``grammar.process``: ``Scheduler.process_batch_result`` of its decode batches (every request
  constrained; each grammar accepts its token there);
- ``grammar.sample`` (CPU-engine profiles only: given the plain run beside it): the excess of
  ``ModelRunner.sample`` less its mask over the plain run's ``ModelRunner.sample`` at the same
  batch size (each constrained sample minus the plain median, floored at 0): on the CPU engine
  the masked sampler (the mask applied to the logits over the vocabulary, then sampling at
  temperature 1) runs on the scheduler's thread, 0.3-0.9 ms at 1-16 requests here against
  0.06-0.09 ms for the plain greedy sampler. It includes the temperature: the plain calibration
  decodes greedily. Under ``event_loop_overlap`` the sampling is delayed to
  ``Scheduler.launch_batch_sample_if_needed`` after the previous result is processed, outside
  every phase the tracer times (the trace reader counts that time in the iteration's ``other``
  wall time, :func:`calibrate.real.sglang_trace.iterations`): there each decode iteration's
  ``other`` less the plain run's, less the mask, the plain sampler (in the forward curve) and the
  result copy the plain run's launch already holds (its launch less this run's) is the sample
  (:func:`delayed_excess`): 0.4-1.0 ms at 1-16 requests here.
  A stubbed (host-only) run has no such curve: on a GPU the sampler is device work, taken as
  the forward curve's.

The simulator charges the mask as its own phase and the excess of ``grammar.process`` over the
plain ``process.decode`` as the accept (:mod:`sim.engines.sglang.structured`). A request whose
grammar ended (its string and object closed) finishes in SGLang; such a batch's mask record has
fewer live rows than requests and is left out. ``metadata.structured_output`` records the kind,
the schema and the sessions.
"""

from __future__ import annotations

import statistics

from calibrate.real import sglang_trace
from calibrate.real.jobs import JSON_SCHEMA, Prompts, request

CONTEXTS = (128, 512)
DECODE_STEPS = 32
PREFIX = "json-"
KIND = "json_schema"
SCHEMA = JSON_SCHEMA
CURVES = ("grammar.mask", "grammar.process")
FUNCTIONS = {
    "grammar.mask": "SamplingBatchInfo.update_regex_vocab_mask, every row constrained",
    "grammar.process": "Scheduler.process_batch_result of a decode, every request constrained",
    "grammar.sample": "ModelRunner.sample less its mask, every row constrained, at temperature 1, less the plain "
                      "run's greedy ModelRunner.sample (CPU engine)",
}


def job(model_dir: str, overlap: bool, grid) -> dict:
    """The driver's job of one structured-output run beside a calibration of ``grid`` (an
    :class:`calibrate.real.sglang_profile.SglangGrid` or the host grid: its server arguments,
    decode batch sizes, waves and seed): for each context of :data:`CONTEXTS` and batch size B,
    ``grid.decode_waves`` waves of B constrained requests (ids ``json-d<B>x<C>-<i>``), prompts of
    ``grid.seed + 2``."""
    prompts = Prompts(grid.seed + 2)
    groups = []
    for _ in range(grid.decode_waves):
        for c in CONTEXTS:
            for b in grid.decode_batch_sizes:
                n = len(groups)
                groups.append([{**request(f"{PREFIX}d{b}x{c}-{n}-{i}", prompts.new(c - DECODE_STEPS // 2),
                                          DECODE_STEPS),
                                "json_schema": SCHEMA, "temperature": 1.0, "sampling_seed": 1000 * n + i}
                               for i in range(b)])
    return {"model_dir": model_dir, "overlap": overlap, "server_args": list(grid.server_args()),
            "arrival": {"kind": "waves", "waves": [[r["rid"] for r in g] for g in groups]},
            "requests": [r for g in groups for r in g]}


def samples(records: list[dict], sizes: set[int]) -> list[dict]:
    """Profile samples of :data:`CURVES` (CPU seconds) from one structured-output run's tracer
    records, at ``num_reqs`` in ``sizes``: the mask records whose every row was live, and the
    decode batches' ``process`` records."""
    acc: dict[tuple, list[float]] = {}
    for r in records:
        if r["ph"] == "mask" and r.get("n") == r.get("bs") and r.get("n") in sizes:
            acc.setdefault(("grammar.mask", r["n"]), []).append(r["cpu"])
        elif r["ph"] == "process":
            b = r.get("batch") or {}
            if b.get("mode") == "DECODE" and b.get("bs") in sizes:
                acc.setdefault(("grammar.process", b["bs"]), []).append(r["cpu"])
    return [{"curve": c, "point": {"num_reqs": m}, "times_s": ts} for (c, m), ts in sorted(acc.items())]


def sampler_times(records: list[dict], live: bool) -> dict[int, list[float]]:
    """``ModelRunner.sample``'s CPU seconds per batch size, less the mask it ran (the ``mask``
    record nested in it, which ends just before it): with ``live``, the samples whose every row
    had a live grammar; else those without a grammar (``n == 0``)."""
    out: dict[int, list[float]] = {}
    mask = None
    for r in records:
        if r["ph"] == "mask":
            mask = r
        elif r["ph"] == "sample":
            if mask is not None and mask.get("bs") and (mask.get("n") == mask["bs"] if live else mask.get("n") == 0):
                out.setdefault(mask["bs"], []).append(r["cpu"] - mask["cpu"])
            mask = None
    return out


def sample_excess(records: list[dict], plain_records: list[dict], sizes: set[int]) -> list[dict]:
    """``grammar.sample`` samples: each constrained sample (:func:`sampler_times`) less the plain
    run's median at the same batch size, floored at 0, at batch sizes in ``sizes`` that both
    runs have."""
    plain = {b: statistics.median(v) for b, v in sampler_times(plain_records, live=False).items()}
    return [{"curve": "grammar.sample", "point": {"num_reqs": b}, "times_s": [max(0.0, t - plain[b]) for t in ts]}
            for b, ts in sorted(sampler_times(records, live=True).items()) if b in sizes and b in plain]


def _decode_iterations(records: list[dict]) -> dict[int, list]:
    """The decode iterations of a run by batch size (:func:`calibrate.real.sglang_trace.iterations`)."""
    out: dict[int, list] = {}
    for it in sglang_trace.iterations(records):
        if it.step is not None and it.step.kind == "decode" and it.other == it.other:
            out.setdefault(it.step.num_reqs, []).append(it)
    return out


def delayed_excess(records: list[dict], plain_records: list[dict], sizes: set[int]) -> list[dict]:
    """``grammar.sample`` samples of an ``event_loop_overlap`` run: per constrained decode
    iteration at batch size B, its ``other`` wall time (the delayed sampling) less the plain
    run's median ``other``, the median mask and plain sampler at B (:func:`sampler_times`) and
    the launch the plain run counts and this one does not (the plain median launch less this
    run's), floored at 0."""
    mine, plain = _decode_iterations(records), _decode_iterations(plain_records)
    mask_s: dict[int, list[float]] = {}
    for r in records:
        if r["ph"] == "mask" and r.get("n") == r.get("bs"):
            mask_s.setdefault(r["n"], []).append(r["cpu"])
    out = []
    plain_sample = {b: statistics.median(v) for b, v in sampler_times(plain_records, live=False).items()}
    for b in sorted(sizes):
        if b not in mine or b not in plain or b not in mask_s or b not in plain_sample:
            continue
        base = (statistics.median(it.other for it in plain[b]) + statistics.median(mask_s[b]) + plain_sample[b]
                + max(0.0, statistics.median(it.step.launch for it in plain[b])
                      - statistics.median(it.step.launch for it in mine[b])))
        out.append({"curve": "grammar.sample", "point": {"num_reqs": b},
                    "times_s": [max(0.0, it.other - base) for it in mine[b]]})
    return out


def read_samples(trace, sizes: set[int], plain_trace=None) -> list[dict]:
    """:func:`samples` of the driver's output file ``trace`` and, given the plain run's
    ``plain_trace`` (CPU engine), the ``grammar.sample`` samples: :func:`delayed_excess` for a
    run of ``event_loop_overlap`` (``meta.overlap``), :func:`sample_excess` otherwise.

    Raises:
        CalibrationInputError: an unreadable or corrupt trace.
    """
    meta, records, _ = sglang_trace.read_records(trace)
    out = samples(records, sizes)
    if plain_trace is not None:
        plain = sglang_trace.read_records(plain_trace)[1]
        excess = delayed_excess if (meta or {}).get("overlap") else sample_excess
        out += excess(records, plain, sizes)
    return out


def add_samples(merged: dict, order: list[tuple[str, str]], traces: list, settings: tuple[str, ...], sizes: set[int],
                plain_traces: list | None = None) -> dict:
    """Merge the structured-output runs' samples (``traces``, one per ``(setting, name)`` of
    ``order``) into a calibration's ``merged`` samples (key: curve, point, setting; the first
    setting's as base samples, another's tagged with it), at the batch sizes ``sizes``; given the
    plain runs beside them (``plain_traces``, CPU engine), ``grammar.sample`` too
    (:func:`read_samples`). Returns ``metadata.structured_output``."""
    for i, ((setting, _), trace) in enumerate(zip(order, traces)):
        tag = {} if setting == settings[0] else {"setting": setting}
        for smp in read_samples(trace, sizes, plain_traces[i] if plain_traces else None):
            key = (smp["curve"], tuple(sorted(smp["point"].items())), setting)
            merged.setdefault(key, {**smp, **tag, "times_s": []})["times_s"].extend(smp["times_s"])
    return metadata([t.stem for t in traces], sampler=plain_traces is not None)


def metadata(sessions: list[str], sampler: bool = False) -> dict:
    """``metadata.structured_output`` of a profile with these curves (``sampler``: and
    ``grammar.sample``)."""
    curves = [*CURVES, "grammar.sample"] if sampler else list(CURVES)
    return {"kind": KIND, "schema": SCHEMA, "backend": "xgrammar (SGLang's default)", "sessions": sessions,
            "curves": curves, "functions": {c: FUNCTIONS[c] for c in curves},
            **({"temperature": 1.0} if sampler else {})}
