"""Model shapes: the sizes of the Llama-style decoder that calibration times (no weights, no I/O).

Named shapes copy the published configurations (``config.json``) of real models; ``tiny`` and
``small`` are made-up sizes that run on a laptop CPU in seconds. Any field can be overridden
to describe another model (``--layers``, ``--hidden``, ...).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from calibrate.errors import CalibrationInputError


@dataclass(frozen=True)
class ModelShape:
    """Sizes of a Llama-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU MLP).

    Attributes:
        name: label recorded in profiles.
        layers, hidden, heads, kv_heads, vocab: transformer sizes (``kv_heads`` divides ``heads``).
        intermediate: MLP width (0: ``round(8/3 * hidden)`` rounded up to a multiple of 64).
        head_dim: per-head width (0: ``hidden // heads``).
        rope_theta: RoPE base. tie_embeddings: the LM head reuses the embedding matrix.
        qk_norm: per-head RMSNorm on queries and keys (Qwen3). rms_eps: RMSNorm epsilon.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int
    intermediate: int = 0
    head_dim: int = 0
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    qk_norm: bool = False
    rms_eps: float = 1e-5

    def __post_init__(self):
        for f in ("layers", "hidden", "heads", "kv_heads", "vocab"):
            if getattr(self, f) < 1:
                raise CalibrationInputError("model shape", f, f"a positive integer (got {getattr(self, f)})")
        if self.heads % self.kv_heads:
            raise CalibrationInputError("model shape", "kv_heads",
                                        f"a divisor of heads={self.heads} (got {self.kv_heads})")
        if not self.intermediate:
            object.__setattr__(self, "intermediate", -(-int(8 * self.hidden / 3) // 64) * 64)
        if not self.head_dim:
            if self.hidden % self.heads:
                raise CalibrationInputError("model shape", "heads", f"a divisor of hidden={self.hidden} "
                                            "(or give head_dim)")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.head_dim % 2:
            raise CalibrationInputError("model shape", "head_dim", f"an even number for RoPE (got {self.head_dim})")

    @property
    def num_params(self) -> int:
        """Parameter count (embeddings and LM head included, norms excluded)."""
        h, d = self.hidden, self.head_dim
        attn = h * (self.heads + 2 * self.kv_heads) * d + self.heads * d * h
        mlp = 3 * h * self.intermediate
        head = 0 if self.tie_embeddings else self.vocab * h
        return self.layers * (attn + mlp) + self.vocab * h + head

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V cache one token occupies over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelShape":
        return cls(**d)


NAMED_SHAPES: dict[str, ModelShape] = {s.name: s for s in (
    ModelShape("tiny", layers=2, hidden=64, heads=4, kv_heads=2, vocab=1024, intermediate=128),
    ModelShape("small", layers=4, hidden=256, heads=8, kv_heads=4, vocab=8192, intermediate=704),
    # meta-llama/Llama-3.2-1B
    ModelShape("llama-3.2-1b", layers=16, hidden=2048, heads=32, kv_heads=8, vocab=128256, intermediate=8192,
               head_dim=64, rope_theta=500000.0, tie_embeddings=True),
    # meta-llama/Llama-3.2-3B
    ModelShape("llama-3.2-3b", layers=28, hidden=3072, heads=24, kv_heads=8, vocab=128256, intermediate=8192,
               head_dim=128, rope_theta=500000.0, tie_embeddings=True),
    # meta-llama/Llama-3.1-8B
    ModelShape("llama-3.1-8b", layers=32, hidden=4096, heads=32, kv_heads=8, vocab=128256, intermediate=14336,
               head_dim=128, rope_theta=500000.0),
    # Qwen/Qwen3-0.6B
    ModelShape("qwen3-0.6b", layers=28, hidden=1024, heads=16, kv_heads=8, vocab=151936, intermediate=3072,
               head_dim=128, rope_theta=1000000.0, tie_embeddings=True, qk_norm=True, rms_eps=1e-6),
    # Qwen/Qwen3-8B
    ModelShape("qwen3-8b", layers=36, hidden=4096, heads=32, kv_heads=8, vocab=151936, intermediate=12288,
               head_dim=128, rope_theta=1000000.0, qk_norm=True, rms_eps=1e-6),
)}
OVERRIDABLE = ("layers", "hidden", "heads", "kv_heads", "vocab", "intermediate", "head_dim")


def resolve_shape(name: str, **overrides: int | None) -> ModelShape:
    """The named shape with the given fields replaced (``None`` values are ignored).

    Raises:
        CalibrationInputError: unknown name, or overrides that make an impossible shape.
    """
    key = name.lower()
    if key not in NAMED_SHAPES:
        raise CalibrationInputError("--model", "", f"one of {', '.join(NAMED_SHAPES)} (got {name!r}); "
                                    "or start from one and change it with --layers/--hidden/--heads/...")
    base = NAMED_SHAPES[key]
    changed = {k: v for k, v in overrides.items() if v is not None and k in OVERRIDABLE}
    if not changed:
        return base
    if "hidden" in changed or "heads" in changed:
        changed.setdefault("head_dim", 0)
    if "hidden" in changed:
        changed.setdefault("intermediate", 0)
    label = base.name + "+" + ",".join(f"{k}={v}" for k, v in sorted(changed.items()) if v)
    return dataclasses.replace(base, name=label, **changed)
