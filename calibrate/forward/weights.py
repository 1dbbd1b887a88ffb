"""Random weights for the calibration models, by name (no downloads).

The names and layouts are shared by the torch and the MLX model (``[out, in]`` matrices, as
``torch.nn.Linear`` stores them), so both can load the same numpy weights and be compared.
Timing does not depend on the values; large models initialise directly on their device instead.
"""

from __future__ import annotations

import numpy as np

from calibrate.shapes import ModelShape

INIT_STD = 0.02


def weight_shapes(shape: ModelShape) -> dict[str, tuple[int, ...]]:
    """Name -> array shape of every weight of ``shape``'s decoder."""
    h, d, inter = shape.hidden, shape.head_dim, shape.intermediate
    out: dict[str, tuple[int, ...]] = {"embed": (shape.vocab, h), "final_norm": (h,)}
    if not shape.tie_embeddings:
        out["lm_head"] = (shape.vocab, h)
    for i in range(shape.layers):
        p = f"layers.{i}."
        out[p + "attn_norm"] = (h,)
        out[p + "qkv"] = ((shape.heads + 2 * shape.kv_heads) * d, h)
        out[p + "o"] = (h, shape.heads * d)
        out[p + "mlp_norm"] = (h,)
        out[p + "gate_up"] = (2 * inter, h)
        out[p + "down"] = (h, inter)
        if shape.qk_norm:
            out[p + "q_norm"] = (d,)
            out[p + "k_norm"] = (d,)
    return out


def is_norm(name: str) -> bool:
    """Norm weights start at 1, matrices are drawn from N(0, INIT_STD^2)."""
    return name.endswith("norm")


def random_weights(shape: ModelShape, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded float32 numpy weights for ``shape`` (for small shapes; 4 bytes per parameter)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, dims in weight_shapes(shape).items():
        if is_norm(name):
            out[name] = np.ones(dims, dtype=np.float32)
        else:
            out[name] = (rng.standard_normal(dims, dtype=np.float32) * INIT_STD)
    return out


def rope_tables(shape: ModelShape, max_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) of RoPE, each [max_pos, head_dim // 2] float32 (Llama's rotate-half layout)."""
    d = shape.head_dim
    inv_freq = 1.0 / (shape.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    ang = np.outer(np.arange(max_pos, dtype=np.float64), inv_freq)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
