"""Merging the sessions' samples into one vLLM profile's: which setting a sample belongs to, the
curves pooled over settings, forward rows the grid cannot hold, and where each curve came from."""

from __future__ import annotations

from typing import Callable

# curves priced from the steps of every setting: the model forward is the same code under both
# loops (see calibrate.real.vllm.profile's docstring), the verify forward too
POOLED_CURVES = ("vllm.forward", "vllm.spec_forward")


def merge_sample(merged: dict, smp: dict, setting: str, settings: tuple[str, ...],
                 pooled: tuple[str, ...] = POOLED_CURVES) -> None:
    """Add one session's sample to ``merged`` (key: curve, point, setting): the first setting's
    and the pooled curves' (``pooled``, default :data:`POOLED_CURVES`) as base samples, another
    setting's as its own (``dispatch`` and ``roundtrip`` are measured synchronously only: another
    setting's are dropped)."""
    own = setting != settings[0] and smp["curve"] not in pooled
    if own and smp["curve"] in ("vllm.dispatch", "vllm.roundtrip"):
        return
    key = (smp["curve"], tuple(sorted(smp["point"].items())), setting if own else settings[0])
    into = merged.setdefault(key, {**smp, "times_s": [], **({"setting": setting} if own else {})})
    into["times_s"] = into["times_s"] + smp["times_s"]


def drop_incomplete_rows(merged: dict, contexts, report: Callable[[str], None], setting: str,
                         curve: str = "vllm.forward") -> None:
    """Leave out the samples of ``curve`` (a forward curve over ``num_tokens`` and ``ctx``) of
    ``setting`` at a token count that lacks one of ``contexts`` (a prefill whose prompts the
    server happened to split over two steps; a verify step of a batch size seen at one context
    only): the curve needs a full grid, and steps beyond the largest complete row are then
    priced by extrapolation."""
    fwd = [k for k in merged if k[0] == curve and k[2] == setting]
    seen: dict[int, set] = {}
    for k in fwd:
        p = dict(k[1])
        seen.setdefault(p["num_tokens"], set()).add(p["ctx"])
    for n, ctxs in sorted(seen.items()):
        if set(contexts) - ctxs:
            report(f"{curve} ({setting}): no step of {n} tokens at context(s) "
                   f"{sorted(set(contexts) - ctxs)}; the {n}-token row is left out")
            for k in fwd:
                if dict(k[1])["num_tokens"] == n:
                    del merged[k]


def note_sources(meta: dict, functions: dict[str, str], version: str) -> None:
    """Record in ``meta["curve_sources"]`` that each curve of ``functions`` (curve -> the vLLM
    function it times) was measured on vLLM ``version``."""
    for name, fn in functions.items():
        meta["curve_sources"][name] = {"source": "measured", "engine": f"vllm {version}", "function": fn}
