"""The costs of structured output, from the real vLLM server constraining every request.

``overlap-sim calibrate --engine vllm --structured-output`` (and the interleaved validation's
calibration rounds with ``--grid structured``) follow each plain session with one more of the same
setting whose requests all carry the JSON schema :data:`SCHEMA` (``structured_outputs.json`` of
vLLM 0.32's completions API; the server's default backend, xgrammar) over decode waves
(:func:`design`: B clients, B = 1..16, prompts of C - 16 tokens, C = 128 and 512, 32 output
tokens). From its decode steps in which every request is constrained (:func:`samples`), per
``num_reqs``:

- ``vllm.grammar_bitmask``: ``Scheduler.get_grammar_bitmask`` (``v1/core/sched/scheduler.py:1995``:
  the engine core filling one row per constrained request);
- ``vllm.grammar_sample``: ``GPUModelRunner.sample_tokens`` with the bitmask applied
  (``apply_grammar_bitmask``, ``v1/structured_output/utils.py:101``);
- ``vllm.grammar_update``: ``Scheduler.update_from_output`` with each grammar advancing
  (``StructuredOutputManager.accept_tokens``).

Under ``async`` the curves are the setting's own. ``metadata.structured_output`` records the kind
(``json_schema``), the schema and the grammar compilations' times (``_create_grammar``, first
request of the session; not modelled by the simulator, stated).

The schema holds one free string, so a random-weight model stays inside it for most of its
tokens; a request whose grammar ended (its string and object closed) runs unconstrained in vLLM,
and its steps are left out of the samples (``bitmask`` records count the constrained rows).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from calibrate.real.jobs import GRAMMARS, JSON_SCHEMA, decode_waves
from calibrate.real.vllm.merge import merge_sample
from calibrate.real.vllm import trace as vllm_trace

CONTEXTS = (128, 512)
GRAMMAR_LOAD = "grammar-"
KIND = "json_schema"
SCHEMA = JSON_SCHEMA
CURVES = ("vllm.grammar_bitmask", "vllm.grammar_sample", "vllm.grammar_update")
FUNCTIONS = {
    "vllm.grammar_bitmask": "Scheduler.get_grammar_bitmask (E), every request constrained",
    "vllm.grammar_sample": "GPUModelRunner.sample_tokens with apply_grammar_bitmask (W)",
    "vllm.grammar_update": "Scheduler.update_from_output with StructuredOutputManager.accept_tokens (E)",
}


def design(decode_batch_sizes: tuple[int, ...], decode_steps: int, waves: int, seed: int,
           client: str = "own") -> list[dict]:
    """The loads of one structured-output session: decode waves of B clients at each context of
    :data:`CONTEXTS` whose every request carries :data:`SCHEMA` (:func:`calibrate.real.jobs.decode_waves`,
    prompts of ``seed + 2``), sent by this project's client (``own``) or by vLLM's own benchmark
    client (``engine``: the schema through ``--extra-body``)."""
    return decode_waves(GRAMMAR_LOAD, CONTEXTS, decode_batch_sizes, decode_steps, waves, seed + 2, client,
                        {"structured_outputs": GRAMMARS[KIND]})


def samples(steps: list[vllm_trace.VllmStep], sizes: set[int]) -> list[dict]:
    """Profile samples of :data:`CURVES` from one structured-output session's steps: the decode
    steps whose every request was constrained (the ``bitmask`` record's row count equals
    ``num_reqs``) at ``num_reqs`` in ``sizes``."""
    acc: dict[tuple, list[float]] = {}
    for s in steps:
        if (not s.is_decode or s.num_reqs not in sizes or s.bitmask is None or s.sample is None or s.update is None
                or s.bitmask.get("n") != s.num_reqs):
            continue
        for curve, t in (("vllm.grammar_bitmask", s.bitmask["dur"]), ("vllm.grammar_sample", s.sample["dur"]),
                         ("vllm.grammar_update", s.update["dur"])):
            acc.setdefault((curve, s.num_reqs), []).append(t)
    return [{"curve": c, "point": {"num_reqs": m}, "times_s": ts} for (c, m), ts in sorted(acc.items())]


def add_samples(merged: dict, order: list[tuple[str, str]], outs: list[Path], sizes: set[int],
                settings: tuple[str, ...]) -> dict:
    """Merge the constrained sessions' samples (``outs``, one per ``(setting, name)`` of
    ``order``) into ``merged`` (:func:`calibrate.real.vllm.merge.merge_sample`). Returns
    ``metadata.structured_output`` (with the grammar compilations' times)."""
    compile_s = []
    for (setting, _), out in zip(order, outs):
        eng, wrk = vllm_trace.read_files(sorted(out.glob("trace.*.jsonl")))
        compile_s += [r["dur"] for r in eng if r["ph"] == "compile"]
        for smp in samples(vllm_trace.steps(eng, wrk), sizes):
            merge_sample(merged, smp, setting, settings)
    return metadata(compile_s, [o.name for o in outs])


def metadata(compile_s: list[float], sessions: list[str]) -> dict:
    """``metadata.structured_output`` of a profile with these curves."""
    out = {"kind": KIND, "schema": SCHEMA, "backend": "xgrammar (vLLM's auto)", "sessions": sessions,
           "curves": list(CURVES)}
    if compile_s:
        out["compile_ms_median"] = round(statistics.median(compile_s) * 1e3, 3)
        out["compile_ms_max"] = round(max(compile_s) * 1e3, 3)  # a schema's first compilation
        out["compilations"] = len(compile_s)
    return out
