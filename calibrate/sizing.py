"""Sizing a calibration to the device: the grid that fits its free memory, and how long it will take.

Memory (bytes) of a calibration with model shape ``s`` in a dtype of ``w`` bytes:

- weights: ``s.num_params * w``;
- decode: the KV pool the decode points share (``max batch x (max context + DECODE_ROW_PAD)``
  tokens of ``s.kv_bytes_per_token(w)`` = layers x kv_heads x head_dim x 2 x w bytes each, as
  :meth:`calibrate.measure.Measurer._model_with_kv` allocates it) plus the largest point's
  transients (:func:`decode_transient_bytes`);
- prefill: the pool of one request (``max tokens + max prefix``) plus its transients
  (:func:`extend_transient_bytes`).

The grid fits when weights plus the larger of the two is at most ``share`` of the memory
available (``KV_MEMORY_SHARE`` of the device's free memory, or ``MEMORY_SHARE`` of a CPU or Apple
host's physical memory, which the model shares with everything else). When it does not, the
decode grid (batch sizes x contexts) and the prefill grid (tokens x prefixes) are each cut to the
rectangle of their smallest values that fits with the most points (the fitted curves need a full
rectangle); ties go to the larger largest point. Only a model whose weights and smallest points
do not fit is refused.

Duration (seconds), an estimate printed before measuring: every timed point runs
``warmup + repeats`` steps (decode points on CUDA also ``CAPTURE_RUNS`` to capture their CUDA
graph), each step priced at its roofline time on the card (:mod:`sim.model.transfer`, at
:data:`ESTIMATE_EFFICIENCY` of peak, decode keys read :data:`KV_GATHER_TRAFFIC` times), plus :data:`LAYER_OVERHEAD_S` per layer, plus a per-step overhead (:data:`STEP_OVERHEAD_S`: on CUDA the stream hold of the timing
method, at least 1 ms, launch and sync), bookkeeping points at :data:`BOOKKEEPING_BASE_S` +
``n x`` :data:`BOOKKEEPING_PER_REQ_S` per step, plus :data:`SETUP_S`. Retried points (a busy
machine: up to 3 attempts) are not counted. The constants were read off calibrations on this
project's 2-core VM and off the shipped H200 profiles (docs/calibration.md); on a GPU the whole
estimate was checked once, on the lent H200 of 5 December 2026: 38 s and 57 s (1B, 8B) against
50 s and 59 s of wall time.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Optional

from calibrate.config import CalibrationConfig, Grid
from calibrate.errors import CalibrationInputError
from calibrate.shapes import ModelShape

DECODE_ROW_PAD = 64  # decode rows are longer than the longest context (calibrate.measure)
KV_MEMORY_SHARE = 0.85  # of the device's free memory a calibration may take
MEMORY_SHARE = 0.8  # of a CPU or Apple host's physical memory
GRAPH_CAPTURE_FACTOR = 2  # a captured decode graph keeps its own copy of the step's transients
CAPTURE_RUNS = 3  # two warm-up steps and the capture of a CUDA graph
STEP_OVERHEAD_S = {"cuda": 2.0e-3, "gpu": 1.0e-3, "cpu": 2.0e-4}
# device time per layer beyond the roofline (small kernels, the KV gather): the shipped H200
# profiles' one-request decode, (measured - roofline) / layers: 0.14 ms (1B), 0.10 ms (8B)
LAYER_OVERHEAD_S = {"cuda": 1.0e-4, "gpu": 1.0e-4, "cpu": 0.0}
BOOKKEEPING_BASE_S, BOOKKEEPING_PER_REQ_S = 2.0e-4, 5.0e-5
SETUP_S = {"cuda": 20.0, "gpu": 10.0, "cpu": 3.0}
# the estimate's share of peak and the calibration model's KV traffic per key, both fitted: the
# decode gathers each request's keys through req_to_token (rows of head_dim scattered over the
# token pool) into a copy it then reads, which the H200 measured at about twice the three passes
# (read the pool, write the copy, read it) at this share of peak. With them the estimated forward
# time summed over the grid is 0.84 to 1.00 of the measured sum in the shipped H200 profiles
# (measured 5 December 2026, revision 71ffb3a: decode 0.88 / 1.01, prefill 0.79 / 1.00, 1B / 8B;
# 3 passes fitted the profiles of 29 November, measured before the token pool)
ESTIMATE_EFFICIENCY, KV_GATHER_TRAFFIC = 0.5, 6
# a host without a card of the table (CPU runs): the peaks of one torch thread on this project's 2-core VM,
# read off a full CPU calibration of the small shape (docs/calibration.md)
HOST_BANDWIDTH_BYTES_S, HOST_FLOPS = 5.0e9, 20.0e9
GIB = 2**30


def dtype_bytes(cfg: CalibrationConfig) -> int:
    return 4 if cfg.resolved_dtype == "float32" else 2


def decode_transient_bytes(shape: ModelShape, w: int, batch: int, keys: int) -> int:
    """Bytes a decode step of ``batch`` requests over ``keys`` keys allocates beside the pool: one
    layer's gathered K and V (``2 kv_heads x batch x keys x head_dim x w``), its float32 scores,
    their masked copy and probabilities (``heads x batch x keys x (4 + 4 + w)``) and the logits
    (``batch x vocab x (w + 4)``), times :data:`GRAPH_CAPTURE_FACTOR`."""
    gathered = 2 * shape.kv_heads * batch * keys * shape.head_dim * w
    scores = shape.heads * batch * keys * (8 + w)
    logits = batch * shape.vocab * (w + 4)
    return GRAPH_CAPTURE_FACTOR * (gathered + scores + logits)


def extend_transient_bytes(shape: ModelShape, w: int, tokens: int, prefix: int) -> int:
    """Bytes a prefill of ``tokens`` new tokens after ``prefix`` cached allocates beside the pool:
    activations (``tokens x (3 intermediate + (heads + 2 kv_heads) head_dim + 2 hidden) x w``),
    the gathered K and V of the request's row, and the attention mask (``tokens x keys x (1 + w)``)."""
    keys = tokens + prefix
    acts = tokens * (3 * shape.intermediate + (shape.heads + 2 * shape.kv_heads) * shape.head_dim
                     + 2 * shape.hidden) * w
    gathered = 2 * shape.kv_heads * keys * shape.head_dim * w
    mask = tokens * keys * (1 + w)
    return acts + gathered + mask


def decode_bytes(shape: ModelShape, w: int, batch_sizes, contexts) -> int:
    """Pool plus transients of a decode grid (its largest batch size and context)."""
    b, keys = max(batch_sizes), max(contexts) + DECODE_ROW_PAD
    return b * keys * shape.kv_bytes_per_token(w) + decode_transient_bytes(shape, w, b, keys)


def extend_bytes(shape: ModelShape, w: int, tokens, prefixes) -> int:
    """Pool plus transients of a prefill grid (its largest token count and prefix)."""
    t, p = max(tokens), max(prefixes)
    return (t + p) * shape.kv_bytes_per_token(w) + extend_transient_bytes(shape, w, t, p)


def need_bytes(shape: ModelShape, w: int, grid: Grid) -> int:
    """Peak memory of a calibration of ``grid``: weights + the larger of its decode and prefill parts."""
    return shape.num_params * w + max(decode_bytes(shape, w, grid.decode_batch_sizes, grid.decode_contexts),
                                      extend_bytes(shape, w, grid.extend_tokens, grid.extend_prefixes))


@dataclass(frozen=True)
class SizedGrid:
    """A grid cut to the memory: ``grid`` (what is measured), ``dropped`` (what was cut, in words),
    ``need_bytes`` (its peak), ``budget_bytes`` (share x available) and ``memory_source``."""

    grid: Grid
    dropped: tuple[str, ...]
    need_bytes: int
    budget_bytes: float
    memory_source: str


def _best_rectangle(xs: tuple, ys: tuple, fits) -> Optional[tuple[int, int]]:
    """(i, j): the prefixes ``xs[:i] x ys[:j]`` that fit with the most points (ties: the larger
    ``xs[i-1] * ys[j-1]``, then the larger i); None when not even ``xs[:1] x ys[:1]`` fits."""
    best, key = None, None
    for i in range(1, len(xs) + 1):
        for j in range(1, len(ys) + 1):
            if fits(xs[:i], ys[:j]):
                k = (i * j, xs[i - 1] * max(ys[j - 1], 1), i)
                if key is None or k > key:
                    best, key = (i, j), k
    return best


def size_grid(shape: ModelShape, w: int, grid: Grid, available_bytes: float, share: float,
              memory_source: str, flag: str = "--device-memory-gib") -> SizedGrid:
    """``grid`` cut to ``share x available_bytes`` (see the module docstring).

    Raises:
        CalibrationInputError: naming ``flag``: the weights and the smallest points do not fit."""
    budget = share * available_bytes
    weights = shape.num_params * w
    dec = _best_rectangle(grid.decode_batch_sizes, grid.decode_contexts,
                          lambda b, c: weights + decode_bytes(shape, w, b, c) <= budget)
    ext = _best_rectangle(grid.extend_tokens, grid.extend_prefixes,
                          lambda t, p: weights + extend_bytes(shape, w, t, p) <= budget)
    if dec is None or ext is None:
        raise CalibrationInputError(flag, "", f"{shape.name} needs {weights / GIB:.1f} GiB of weights plus its "
                                    f"smallest grid points, more than {share:.0%} of the {available_bytes / GIB:.1f} "
                                    f"GiB available ({memory_source}); pass a smaller --model shape or dtype")
    new = dataclasses.replace(grid, decode_batch_sizes=grid.decode_batch_sizes[:dec[0]],
                              decode_contexts=grid.decode_contexts[:dec[1]],
                              extend_tokens=grid.extend_tokens[:ext[0]], extend_prefixes=grid.extend_prefixes[:ext[1]])
    dropped = []
    for label, field in (("decode batch sizes", "decode_batch_sizes"), ("decode contexts", "decode_contexts"),
                         ("prefill tokens", "extend_tokens"), ("prefill prefixes", "extend_prefixes")):
        cut = [v for v in getattr(grid, field) if v not in getattr(new, field)]
        if cut:
            dropped.append(f"{label} {','.join(map(str, cut))}")
    return SizedGrid(new, tuple(dropped), need_bytes(shape, w, new), budget, memory_source)


def estimate_duration_s(cfg: CalibrationConfig, card=None) -> float:
    """Seconds a calibration of ``cfg`` is expected to take (see the module docstring); ``card``:
    a :class:`sim.model.cards.Card` (None: the host's stated peaks)."""
    from sim.model.transfer import roofline_s, work

    s, g, w = cfg.shape, cfg.grid, dtype_bytes(cfg)
    m = {"P": s.num_params, "w": w, "L": s.layers, "H": s.heads, "d": s.head_dim, "kv": s.kv_bytes_per_token(w)}
    bw = card.bandwidth_bytes_s if card is not None else HOST_BANDWIDTH_BYTES_S
    flops = card.bf16_flops if card is not None and card.bf16_flops else (
        HOST_FLOPS if card is None else card.bandwidth_bytes_s * 100.0)
    overhead = STEP_OVERHEAD_S.get(cfg.device, STEP_OVERHEAD_S["cpu"])
    steps = g.warmup + g.repeats

    layers = s.layers * LAYER_OVERHEAD_S.get(cfg.device, 0.0)

    def step(curve: str, a: int, b: int) -> float:
        f, nbytes = work(curve, a, b, m)
        if curve == "forward.decode":  # the calibration model gathers each request's keys: 3 passes over them
            nbytes += (KV_GATHER_TRAFFIC - 1) * a * b * m["kv"]
        return roofline_s(f, nbytes, bw, flops, ESTIMATE_EFFICIENCY) + layers + overhead

    graphs = CAPTURE_RUNS if cfg.device == "cuda" and cfg.cuda_graph else 0
    total = SETUP_S.get(cfg.device, SETUP_S["cpu"])
    total += sum((steps + graphs) * step("forward.decode", b, c) for b in g.decode_batch_sizes for c in g.decode_contexts)
    total += sum(steps * step("forward.extend", t, p) for t in g.extend_tokens for p in g.extend_prefixes)
    total += sum(steps * (BOOKKEEPING_BASE_S + n * BOOKKEEPING_PER_REQ_S) for n in (0, *g.bookkeeping_batch_sizes))
    return total


def available_memory(cfg: CalibrationConfig, override_gib: Optional[float], backend=None) -> tuple[float, float, str]:
    """(bytes available, share, where the figure comes from): ``--device-memory-gib`` if given;
    else the CUDA device's free memory (``torch.cuda.mem_get_info`` through ``backend``); else
    the host's physical memory (CPU, and Apple's unified memory)."""
    if override_gib is not None:
        return override_gib * GIB, KV_MEMORY_SHARE, f"--device-memory-gib {override_gib:g}"
    free = backend.free_bytes() if backend is not None else None
    if free is not None:
        return float(free), KV_MEMORY_SHARE, f"free {cfg.device} memory"
    total = host_memory_bytes()
    if total is None:
        return float("inf"), MEMORY_SHARE, "no memory figure from the OS"
    return float(total), MEMORY_SHARE, "host physical memory"


def host_memory_bytes() -> int | None:
    """Physical memory of this machine (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def format_duration(seconds: float) -> str:
    """``"45 s"``, ``"12 min"``, ``"2.3 h"``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
