"""Moving a measured SGLang calibration profile from the card it was measured on to another card
(``overlap-sim transfer``), from the cards' public specs (:mod:`sim.model.cards`).

Every forward point of the profile (``forward.decode`` at batch size x context, ``forward.extend``
at new tokens x cached prefix) has a floating-point work ``F`` and a memory traffic ``B`` computed
from the model's shape in ``metadata.model`` (``P`` parameters of ``w`` bytes each, ``L`` layers,
``H`` query heads of width ``d``, ``kv`` bytes of K and V per token over all layers):

- decode of ``n`` requests over ``c`` keys each: ``F = 2 P n + 4 L H d n c``,
  ``B = P w + n c kv`` (every weight and every request's cache read once);
- prefill of ``t`` new tokens after ``p`` cached: ``F = 2 P t + 4 L H d t (p + (t + 1) / 2)``,
  ``B = P w + (p + t) kv``.

Its roofline time on a card of peak bandwidth ``BW`` and peak dense BF16 throughput ``C`` is
``R = max(F / (eta C), B / (eta BW))``, ``eta`` (default :data:`EFFICIENCY`) the share of peak a
well-tuned kernel reaches. Two methods:

- ``roofline`` (default): the measured time ``t`` is roofline time plus a rest (kernel launches,
  synchronisation, small kernels) that does not depend on the card: ``t' = (t - R) + R'``; where
  ``t < R`` (the step ran faster than ``eta`` of peak) all of it scales: ``t' = t R' / R``. A
  memory-bound step (decode) thus scales by the bandwidth ratio, a compute-bound one (a long
  prefill) by the compute ratio, and a latency-bound one barely.
- ``ratio``: the whole forward scales: decode by ``BW / BW'``, prefill by ``C / C'``.

Host phases (``recv``, ``schedule.*``, ``launch.*``, ``process.*``, ``submit.*``) are divided by
``host_speed``, the target host's single-thread speed over the source host's (default 1: the
same host CPU; a stated input, not looked up). Samples and ``setting_curves`` are scaled alike.
A card without a published compute figure (Apple) is given ``C' = C BW' / BW``. The metadata
records the transfer (``metadata.transfer``) with its stated relative uncertainty
(:data:`UNCERTAINTY_REL`, docs/transfer.md gives the reasoning) and how far the two methods are
apart on this profile's grid (``method_spread_rel``).

A vLLM profile (``metadata.engine: "vllm"``, :data:`sim.engines.vllm.profile.VLLM_CURVES`) has one
forward curve, ``vllm.forward`` over ``num_tokens`` x ``ctx`` (scheduled tokens of the step x the
mean over its requests of the context after the step), which does not say how many requests the
step held. :func:`vllm_forward_point` maps a node onto the two shapes above by the fewest and the
most requests the point allows, as vLLM's calibration (:mod:`calibrate.real.vllm.profile`)
measured it: ``n`` tokens up to the largest decode batch of the profile (``metadata.grid``'s
``decode_batch_sizes``, else ``max_num_seqs``) are a decode of ``n`` requests over ``ctx`` keys
(``forward.decode`` at ``n x ctx``); more tokens are prefills of ``r = max(1, n / ctx)`` requests
of ``t = min(n, ctx)`` new tokens after ``p = ctx - t`` cached each (``forward.extend`` at
``t x p``, ``r`` of them in one step: flops and cache traffic ``r`` times, the weights read once).
Simplification: a step that mixes decodes and a prefill chunk, or a short prefill of no more tokens
than the decode batch, is moved as the curve's node it falls on, which is one of these two shapes.
Every other vLLM curve (``vllm.schedule``, ``dispatch``, ``prepare``, ``roundtrip``, ``sample``,
``collect``, ``update``, ``add_request``, ``pickup``, ``frontend_in``, ``frontend_out``: the engine
core's, the worker's and the API server's host time, IPC latencies included) is divided by
``host_speed``, in ``setting_curves`` too.
"""

from __future__ import annotations

import copy
import math
from typing import Optional

from sim.errors import ProfileError, shown
from sim.jsonio import is_number
from sim.model.cards import CARDS, Card, find_card
from sim.model.profile import SGLANG_CURVES, CurveTable, measured_size, validate_profile

MAX_MODEL_SIZE = 10**7  # a model dimension (layers, hidden, heads, vocab ...): beyond any model built
MAX_PARAMS = 10**14  # parameters: 100 trillion
EFFICIENCY = 0.8
UNCERTAINTY_REL = 0.3
METHODS = ("roofline", "ratio")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# the engines whose profiles move, and what the error says when the curves given are not the profile's
ENGINES = {"sglang": "an SGLang profile (forward.decode, forward.extend)", "vllm": "a vLLM profile (vllm.forward)"}
# each engine's metadata key of the tensor-parallel size its profile was measured at (the engines'
# TP_PRICING.key: sim.engines.sglang.server, sim.engines.vllm.server, which this module does not import)
TP_KEYS = {"sglang": "tp_size", "vllm": "tensor_parallel_size"}
# what a profile's metadata.device may be (calibrate.config.BACKEND_DEVICES: torch on cpu or cuda,
# MLX on cpu or gpu; the real engines' calibrations and traces: cpu or cuda)
DEVICES = ("cuda", "cpu", "gpu")


def model_terms(meta: dict, source: str) -> dict:
    """``P``, ``w``, ``L``, ``H``, ``d`` and ``kv`` (bytes of K and V per token over all layers) of a
    profile's ``metadata`` (``model`` sizes, ``params`` or computed from the sizes, ``dtype``).

    Raises:
        ProfileError: a size missing or not a positive integer, an unknown dtype."""
    model = meta.get("model")
    if not isinstance(model, dict):
        raise ProfileError(source, "metadata.model", "the model's sizes (layers, hidden, heads, kv_heads, vocab)")
    sizes = {}
    for key in ("layers", "hidden", "heads", "kv_heads", "vocab", "head_dim", "intermediate"):
        v = model.get(key)
        if v is None and key in ("head_dim", "intermediate"):  # optional: from the others
            continue
        if not _is_size(v, MAX_MODEL_SIZE):
            raise ProfileError(source, f"metadata.model.{key}", f"a positive integer up to {MAX_MODEL_SIZE:.0e} "
                                                                f"(got {shown(v)})")
        sizes[key] = v
    d = sizes.get("head_dim") or sizes["hidden"] // sizes["heads"]
    inter = sizes.get("intermediate") or -(-int(8 * sizes["hidden"] / 3) // 64) * 64
    params = meta.get("params")
    if params is not None and not _is_size(params, MAX_PARAMS):
        raise ProfileError(source, "metadata.params", f"the model's parameter count, a positive integer up to "
                                                      f"{MAX_PARAMS:.0e} (got {shown(params)}); or leave it out to have "
                                                      "it computed from metadata.model")
    if params is None:
        h = sizes["hidden"]
        attn = h * (sizes["heads"] + 2 * sizes["kv_heads"]) * d + sizes["heads"] * d * h
        head = 0 if model.get("tie_embeddings") else sizes["vocab"] * h
        params = sizes["layers"] * (attn + 3 * h * inter) + sizes["vocab"] * h + head
    dtype = meta.get("dtype", "bfloat16")
    if dtype not in DTYPE_BYTES:
        raise ProfileError(source, "metadata.dtype", f"one of {', '.join(DTYPE_BYTES)} (got {dtype!r})")
    w = DTYPE_BYTES[dtype]
    return {"P": params, "w": w, "L": sizes["layers"], "H": sizes["heads"], "d": d,
            "kv": 2 * sizes["layers"] * sizes["kv_heads"] * d * w}


def work(curve: str, a: float, b: float, m: dict, requests: float = 1.0) -> tuple[float, float]:
    """(flops, bytes) of one forward point (``curve``: ``forward.decode`` at ``a`` requests x ``b``
    keys, ``forward.extend`` at ``a`` new tokens after ``b`` cached); ``m`` from :func:`model_terms`.
    ``requests``: an extend of that many such requests in one step (each one's flops and cache
    traffic, the weights read once; a vLLM prefill, :func:`vllm_forward_point`)."""
    attn = 4 * m["L"] * m["H"] * m["d"]
    if curve == "forward.decode":
        return 2 * m["P"] * a + attn * a * b, m["P"] * m["w"] + a * b * m["kv"]
    return (requests * (2 * m["P"] * a + attn * a * (b + (a + 1) / 2)),
            m["P"] * m["w"] + requests * (a + b) * m["kv"])


def vllm_decode_max(meta: dict, source: str) -> float:
    """The largest decode batch of a vLLM profile: ``metadata.grid.decode_batch_sizes``' largest,
    else ``metadata.grid.max_num_seqs`` (``vllm.forward`` nodes of up to that many tokens are
    decode steps, :func:`vllm_forward_point`).

    Raises:
        ProfileError: neither is there (a positive number)."""
    grid = meta.get("grid") if isinstance(meta.get("grid"), dict) else {}
    sizes = grid.get("decode_batch_sizes")
    if isinstance(sizes, list) and sizes and all(is_number(v, 0, MAX_MODEL_SIZE, above=True) for v in sizes):
        return max(sizes)
    if is_number(grid.get("max_num_seqs"), 0, MAX_MODEL_SIZE, above=True):
        return grid["max_num_seqs"]
    raise ProfileError(source, "metadata.grid.max_num_seqs", "the largest decode batch (vllm.forward nodes of up "
                       "to that many tokens are decode steps), or metadata.grid.decode_batch_sizes")


def _is_size(v, most: int) -> bool:
    """A positive integer no larger than ``most`` (not a bool, a float or a string)."""
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= most


def vllm_forward_point(num_tokens: float, ctx: float, decode_max: float) -> tuple[str, float, float, float]:
    """``(curve, a, b, requests)``: the SGLang-shaped forward a ``vllm.forward`` node of ``num_tokens``
    scheduled tokens at mean context ``ctx`` is moved as (see the module docstring): up to
    ``decode_max`` tokens a decode of ``num_tokens`` requests over ``ctx`` keys
    (``("forward.decode", n, ctx, 1)``), beyond it ``r = max(1, n / ctx)`` prefills of
    ``t = min(n, ctx)`` tokens after ``ctx - t`` cached (``("forward.extend", t, ctx - t, r)``)."""
    if num_tokens <= decode_max:
        return "forward.decode", num_tokens, ctx, 1.0
    if ctx <= 0:
        return "forward.extend", num_tokens, 0.0, 1.0
    t = min(num_tokens, ctx)
    return "forward.extend", t, ctx - t, num_tokens / t


def roofline_s(flops: float, nbytes: float, bandwidth_bytes_s: float, flops_s: float,
               efficiency: float = EFFICIENCY) -> float:
    """Seconds of a forward doing ``flops`` and moving ``nbytes`` at ``efficiency`` of the peaks."""
    return max(flops / (efficiency * flops_s), nbytes / (efficiency * bandwidth_bytes_s))


def _compute(card: Card, other: Card) -> float:
    if card.bf16_flops is not None and other.bf16_flops is not None:
        return card.bf16_flops
    # no published figure on one side: both cards are given the same compute-to-bandwidth balance
    ref = other if other.bf16_flops is not None else card if card.bf16_flops is not None else None
    if ref is None:
        return card.bandwidth_bytes_s * 100.0  # neither published: 100 flops per byte on both sides
    return ref.bf16_flops * card.bandwidth_bytes_s / ref.bandwidth_bytes_s


def forward_time_s(t_s: float, curve: str, a: float, b: float, m: dict, src: Card, dst: Card,
                   method: str = "roofline", efficiency: float = EFFICIENCY, requests: float = 1.0) -> float:
    """One measured forward time ``t_s`` on ``src`` moved to ``dst`` (see the module docstring;
    ``requests``: see :func:`work`)."""
    c_src, c_dst = _compute(src, dst), _compute(dst, src)
    if method == "ratio":
        if curve == "forward.decode":
            return t_s * src.bandwidth_bytes_s / dst.bandwidth_bytes_s
        return t_s * c_src / c_dst
    flops, nbytes = work(curve, a, b, m, requests)
    r_src = roofline_s(flops, nbytes, src.bandwidth_bytes_s, c_src, efficiency)
    r_dst = roofline_s(flops, nbytes, dst.bandwidth_bytes_s, c_dst, efficiency)
    if t_s < r_src:
        return t_s * r_dst / r_src
    return t_s - r_src + r_dst


def _scale_curve(c: dict, name: str, fn) -> dict:
    """A copy of a stored curve with every node's time ``fn(time, coordinates...)``."""
    out = copy.deepcopy(c)
    grid, values = c["grid"], c["values_s"]
    if len(grid) == 1:
        out["values_s"] = [fn(v, x) for x, v in zip(grid[0], values)]
    else:
        out["values_s"] = [[fn(v, x, y) for y, v in zip(grid[1], row)] for x, row in zip(grid[0], values)]
    out.pop("linear", None)  # the fitted summary no longer describes the values
    return out


def check_metadata(meta: dict, table: CurveTable, source: str) -> None:
    """Refuse the metadata a transfer carries over that cannot say what it was measured with, as
    ``overlap-sim run`` refuses the TP size: the tensor-parallel size (the engine's
    :data:`TP_KEYS` key, :func:`sim.model.profile.measured_size`), ``device`` (one of
    :data:`DEVICES`) and ``composed`` (absent, null, or the object ``overlap-sim compose`` writes,
    which the run's title and stated range read).

    Raises:
        ProfileError: naming ``metadata.<field>`` of ``source``.
    """
    measured_size({"metadata": meta}, TP_KEYS.get(table.engine, "tp_size"), source)
    device = meta.get("device")
    if device not in DEVICES:
        raise ProfileError(source, "metadata.device", f"the kind of device it was measured on, one of "
                                                     f"{', '.join(DEVICES)} (got {shown(device)})")
    composed = meta.get("composed")
    if composed is not None and not isinstance(composed, dict):
        raise ProfileError(source, "metadata.composed", f"the object overlap-sim compose writes (where its host "
                                                       f"phases come from), or absent (got {shown(composed)})")


def transfer_profile(profile: dict, to: str, *, source: str = "<profile>", from_card: Optional[str] = None,
                     host_speed: float = 1.0, method: str = "roofline", efficiency: float = EFFICIENCY,
                     curves: CurveTable = SGLANG_CURVES) -> dict:
    """A copy of a validated SGLang or vLLM ``profile`` moved to card ``to`` (a key of
    :data:`sim.model.cards.CARDS` or a card name).

    Args:
        curves: the profile's engine's curves (SGLang's by default; a vLLM profile:
            :data:`sim.engines.vllm.profile.VLLM_CURVES`, which this engine-neutral module does not
            import: ``overlap-sim transfer`` picks it by ``metadata.engine``).
        from_card: the card it was measured on (default: ``metadata.device_name`` looked up).
        host_speed: target host single-thread speed / source host's (> 0; 2 = phases take half).
        method: ``roofline`` or ``ratio``. efficiency: ``eta``, in (0, 1].

    Returns:
        The new profile: ``metadata.device_name`` the target's name, ``metadata.transfer`` the
        record (from/to, ratios, method, host_speed, ``uncertainty_rel``, ``method_spread_rel``).

    Raises:
        ProfileError: unknown card names (``--to``, ``--from``, or ``metadata.device_name``
            without ``--from``), a ``--from`` card other than the one ``metadata.device_name``
            names, a profile of another engine, bad metadata (:func:`check_metadata`), model sizes
            missing (a vLLM profile: its largest decode batch too, :func:`vllm_decode_max`);
            ValueError: bad ``host_speed``, ``method`` or ``efficiency``.
    """
    if not (math.isfinite(host_speed) and host_speed > 0):
        raise ValueError(f"host_speed must be > 0 (got {host_speed!r})")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS} (got {method!r})")
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1] (got {efficiency!r})")
    meta = profile["metadata"]
    table = curves
    if meta.get("engine", "sglang") != table.engine or table.engine not in ENGINES:
        raise ProfileError(source, "metadata.engine", f"{ENGINES.get(table.engine, 'an SGLang or vLLM profile')}; "
                           f"got {meta.get('engine', 'sglang')!r}")
    check_metadata(meta, table, source)
    dst = find_card(to)
    if dst is None:
        raise ProfileError("--to", "", f"one of {', '.join(CARDS)} (got {to!r})")
    named = find_card(meta.get("device_name", ""))
    if from_card is not None:
        src = find_card(from_card)
        if src is None:
            raise ProfileError("--from", "", f"one of {', '.join(CARDS)} (got {from_card!r})")
        # --from is for a profile whose metadata names no card (a CPU profile read as a card's):
        # one that names a card was measured there, and moving it from another would be wrong
        if named is not None and named is not src:
            raise ProfileError("--from", "", f"{src.key} ({src.name}), but the profile {source} was measured on "
                               f"{named.name} (metadata.device_name): leave --from out, or give {named.key}")
    else:
        src = named
        if src is None:
            raise ProfileError(source, "metadata.device_name", f"a card of the table ({', '.join(CARDS)}); got "
                               f"{meta.get('device_name')!r}: pass --from CARD")
    m = model_terms(meta, source)
    point = _point_map(table, meta, source)
    forward_curves = table.forward
    cpu_curves = [n for n in table.all if n not in forward_curves]

    def fwd(name, method_):
        def moved(t, a, b):
            curve, x, y, r = point(name, a, b)
            return forward_time_s(t, curve, x, y, m, src, dst, method_, efficiency, r)
        return moved

    same = dst is src  # the profile's own card (a host speed alone): the forward is not moved

    def scale_set(curves: dict) -> dict:
        out = {}
        for name, c in curves.items():
            if name in forward_curves and not same:
                out[name] = _scale_curve(c, name, fwd(name, method))
            elif name in cpu_curves:
                out[name] = _scale_curve(c, name, lambda t, *_: t / host_speed)
            else:
                out[name] = copy.deepcopy(c)
        return out

    new = copy.deepcopy(profile)
    new["curves"] = scale_set(profile["curves"])
    if "setting_curves" in profile:
        new["setting_curves"] = {s: scale_set(c) for s, c in profile["setting_curves"].items()}
    for smp in new["samples"]:
        name = smp["curve"]
        if name in forward_curves and not same:
            a, b = (smp["point"][k] for k in table.all[name])
            f = fwd(name, method)
            smp["times_s"] = [f(t, a, b) for t in smp["times_s"]]
        elif name in cpu_curves:
            smp["times_s"] = [t / host_speed for t in smp["times_s"]]
    spread = _method_spread(profile["curves"], forward_curves, point, m, src, dst, efficiency)
    new["metadata"] = {**meta, "device_name": dst.name, "transfer": {
        "from_device_name": src.name, "from_card": src.key, "to_card": dst.key, "method": method,
        "efficiency": efficiency, "bandwidth_ratio": dst.bandwidth_gb_s / src.bandwidth_gb_s,
        "compute_ratio": _compute(dst, src) / _compute(src, dst), "host_speed": host_speed,
        "compute_published": src.bf16_tflops is not None and dst.bf16_tflops is not None,
        # (on the profile's own card the forward is as measured: no uncertainty of a move)
        "uncertainty_rel": 0.0 if same else UNCERTAINTY_REL if method == "roofline" else max(UNCERTAINTY_REL, spread),
        "method_spread_rel": spread, "sources": {src.key: src.source, dst.key: dst.source},
        "from_host_cpu": meta.get("host_cpu"),
        "note": "forward times moved by public peak specs (sim.model.transfer), not measured on this card; "
                "host phases divided by host_speed (1: the source host's speed assumed)"}}
    # the parts' rule for mixed steps is the CPU kernel's (sim.engines.vllm.costs); a card's forward
    # reads the weights once per step, which the sum of two parts would count twice
    new["metadata"].pop("mixed_steps", None)
    validate_profile(new, source, table)
    return new


def _point_map(table: CurveTable, meta: dict, source: str):
    """``(curve, x, y) -> (shape, a, b, requests)``: what a forward node is moved as (a vLLM node:
    :func:`vllm_forward_point`; an SGLang one: itself; a prefill node of a profile keyed by the
    keys attended per new token, ``metadata.extend_axis: attended``, at the prefix that gives one
    request of ``x`` tokens the same attention, ``y - (x + 1) / 2``, which :func:`work` reads)."""
    if table.engine == "vllm":
        decode_max = vllm_decode_max(meta, source)
        return lambda name, x, y: vllm_forward_point(x, y, decode_max)
    if meta.get("extend_axis") == "attended":
        return lambda name, x, y: (name, x, y - (x + 1) / 2 if name == "forward.extend" else y, 1.0)
    return lambda name, x, y: (name, x, y, 1.0)


def _method_spread(curves: dict, names, point, m: dict, src: Card, dst: Card, efficiency: float) -> float:
    """The largest relative difference between the two methods' forward times over the grid."""
    worst = 0.0
    for name in (n for n in names if n in curves):
        c = curves[name]
        for x, row in zip(c["grid"][0], c["values_s"]):
            for y, t in zip(c["grid"][1], row):
                shape, a_, b_, r = point(name, x, y)
                a = forward_time_s(t, shape, a_, b_, m, src, dst, "roofline", efficiency, r)
                b = forward_time_s(t, shape, a_, b_, m, src, dst, "ratio", efficiency, r)
                worst = max(worst, abs(b - a) / a)
    return worst
