"""The same Llama-style decoder in MLX (CPU via ``mlx[cpu]``, Metal on a Mac), lazily evaluated.

Mirrors :mod:`calibrate.forward.torch_model`: same weight names and layouts, same KV token pool
(``[kv_heads, pool_tokens + 1, head_dim]`` per layer) addressed through a ``req_to_token``
table, same ``extend`` and ``decode`` API. Calls only build the lazy graph; ``mx.eval`` / ``mx.async_eval`` on the result
runs it (what SGLang's ``event_loop_overlap_mlx`` chains). Attention uses
``mx.fast.scaled_dot_product_attention``, which handles grouped-query heads itself.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from calibrate.forward.weights import INIT_STD, is_norm, rope_tables, weight_shapes
from calibrate.shapes import ModelShape


class MlxLlama:
    """Random-weight decoder of ``shape`` on MLX's default device (set it with ``mx.set_default_device``).

    Args:
        shape: the sizes. dtype: ``mx.float32``, ``mx.float16`` or ``mx.bfloat16``.
        seed: seed of MLX's random initialisation. weights: optional numpy weights by name.
    """

    def __init__(self, shape: ModelShape, dtype=mx.float32, seed: int = 0,
                 weights: dict[str, np.ndarray] | None = None):
        self.shape, self.dtype = shape, dtype
        key = mx.random.key(seed)
        self.w: dict[str, mx.array] = {}
        for name, dims in weight_shapes(shape).items():
            if weights is not None:
                t = mx.array(weights[name]).astype(dtype)
            elif is_norm(name):
                t = mx.ones(dims, dtype=dtype)
            else:
                key, sub = mx.random.split(key)
                t = (mx.random.normal(dims, key=sub) * INIT_STD).astype(dtype)
            self.w[name] = t
        mx.eval(list(self.w.values()))
        self.lm_head = self.w["embed"] if shape.tie_embeddings else self.w["lm_head"]
        self.scale = 1.0 / math.sqrt(shape.head_dim)
        self.k_pool: list[mx.array] = []
        self.v_pool: list[mx.array] = []
        self.max_slots = self.max_ctx = self.pool_tokens = 0

    def allocate_kv(self, max_slots: int, max_ctx: int, pool_tokens: int | None = None) -> None:
        """(Re)allocate a zeroed KV token pool (``pool_tokens`` slots + padding slot 0; default
        ``max_slots * max_ctx``) and the ``req_to_token`` table, as
        :meth:`calibrate.forward.torch_model.TorchLlama.allocate_kv`."""
        s = self.shape
        self.k_pool = self.v_pool = []
        size = (pool_tokens or max_slots * max_ctx) + 1
        dims = (s.kv_heads, size, s.head_dim)
        self.k_pool = [mx.zeros(dims, dtype=self.dtype) for _ in range(s.layers)]
        self.v_pool = [mx.zeros(dims, dtype=self.dtype) for _ in range(s.layers)]
        self.req_to_token = mx.zeros((max_slots, max_ctx), dtype=mx.int32)
        cos, sin = rope_tables(s, max_ctx)
        self.cos, self.sin = mx.array(cos).astype(self.dtype), mx.array(sin).astype(self.dtype)
        mx.eval(self.k_pool, self.v_pool, self.req_to_token, self.cos, self.sin)
        self.max_slots, self.max_ctx, self.pool_tokens = max_slots, max_ctx, size - 1

    def set_req_to_token(self, slot: int, start: int, indices) -> None:
        """Write pool slots ``indices`` at positions ``start...`` of request ``slot``'s row."""
        idx = mx.array(np.asarray(indices, dtype=np.int32)) if not isinstance(indices, mx.array) else indices
        self.req_to_token[slot, start:start + idx.shape[0]] = idx

    # --- building blocks ---------------------------------------------------------------------
    def _rms(self, x: mx.array, w: mx.array) -> mx.array:
        return mx.fast.rms_norm(x, w, self.shape.rms_eps)

    @staticmethod
    def _rope(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return mx.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def _qkv(self, i: int, x: mx.array, cos, sin):
        s, w, p = self.shape, self.w, f"layers.{i}."
        n = x.shape[0]
        qkv = self._rms(x, w[p + "attn_norm"]) @ w[p + "qkv"].T
        hq, hk = s.heads * s.head_dim, s.kv_heads * s.head_dim
        q = qkv[:, :hq].reshape(n, s.heads, s.head_dim)
        k = qkv[:, hq:hq + hk].reshape(n, s.kv_heads, s.head_dim)
        v = qkv[:, hq + hk:].reshape(n, s.kv_heads, s.head_dim)
        if s.qk_norm:
            q, k = self._rms(q, w[p + "q_norm"]), self._rms(k, w[p + "k_norm"])
        return self._rope(q, cos, sin), self._rope(k, cos, sin), v

    def _mlp(self, i: int, x: mx.array, attn: mx.array) -> mx.array:
        w, p = self.w, f"layers.{i}."
        x = x + attn @ w[p + "o"].T
        gu = self._rms(x, w[p + "mlp_norm"]) @ w[p + "gate_up"].T
        inter = self.shape.intermediate
        gate, up = gu[:, :inter], gu[:, inter:]
        return x + (gate * mx.sigmoid(gate) * up) @ w[p + "down"].T

    def _logits(self, x: mx.array) -> mx.array:
        return self._rms(x, self.w["final_norm"]) @ self.lm_head.T

    # --- forward passes ------------------------------------------------------------------------
    def decode_logits(self, input_ids: mx.array, slots: mx.array, positions: mx.array, out_cache_loc: mx.array,
                      ctx_len: int | None = None) -> mx.array:
        """One decode step for B running requests (lazy). Arguments as
        :meth:`calibrate.forward.torch_model.TorchLlama.decode_logits` (int32 arrays). Returns [B, vocab]."""
        s = self.shape
        b = input_ids.shape[0]
        length = ctx_len or self.max_ctx
        self.req_to_token[slots, positions] = out_cache_loc
        idx = self.req_to_token[slots, :length]
        x = self.w["embed"][input_ids]
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        mask = (mx.arange(length)[None, :] <= positions[:, None])[:, None, None, :]
        for i in range(s.layers):
            q, k, v = self._qkv(i, x, cos, sin)
            self.k_pool[i][:, out_cache_loc] = k.transpose(1, 0, 2)
            self.v_pool[i][:, out_cache_loc] = v.transpose(1, 0, 2)
            keys = self.k_pool[i][:, idx].transpose(1, 0, 2, 3)  # [B, kv_heads, L, d]
            vals = self.v_pool[i][:, idx].transpose(1, 0, 2, 3)
            o = mx.fast.scaled_dot_product_attention(q[:, :, None, :], keys, vals, scale=self.scale, mask=mask)
            x = self._mlp(i, x, o.reshape(b, s.heads * s.head_dim))
        return self._logits(x)

    def decode(self, input_ids, slots, positions, out_cache_loc, ctx_len: int | None = None) -> mx.array:
        """:meth:`decode_logits` then greedy sampling: [B] next tokens (lazy)."""
        return mx.argmax(self.decode_logits(input_ids, slots, positions, out_cache_loc, ctx_len), axis=-1)

    def extend_logits(self, input_ids: mx.array, slots: list[int], prefix_lens: list[int], extend_lens: list[int],
                      out_cache_loc: mx.array, prefix_indices: list | None = None) -> mx.array:
        """One prefill batch (lazy); arguments as :meth:`TorchLlama.extend_logits`. Returns [R, vocab]."""
        s = self.shape
        rows, off = [], 0
        for r, (slot, p, e) in enumerate(zip(slots, prefix_lens, extend_lens)):
            if prefix_indices is not None and p:
                self.set_req_to_token(slot, 0, prefix_indices[r])
            self.req_to_token[slot, p:p + e] = out_cache_loc[off:off + e]
            rows.append(self.req_to_token[slot, :p + e])
            off += e
        pos = mx.array(np.concatenate([np.arange(p, p + e) for p, e in zip(prefix_lens, extend_lens)]))
        x = self.w["embed"][input_ids]
        cos, sin = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        masks = ["causal" if p == 0 else mx.arange(p + e)[None, :] <= (p + mx.arange(e))[:, None]
                 for p, e in zip(prefix_lens, extend_lens)]
        for i in range(s.layers):
            q, k, v = self._qkv(i, x, cos, sin)
            self.k_pool[i][:, out_cache_loc] = k.transpose(1, 0, 2)
            self.v_pool[i][:, out_cache_loc] = v.transpose(1, 0, 2)
            outs, off = [], 0
            for row, e, mask in zip(rows, extend_lens, masks):
                qr = q[off:off + e].transpose(1, 0, 2)[None]
                keys, vals = self.k_pool[i][:, row][None], self.v_pool[i][:, row][None]
                o = mx.fast.scaled_dot_product_attention(qr, keys, vals, scale=self.scale, mask=mask)
                outs.append(o[0].transpose(1, 0, 2).reshape(e, s.heads * s.head_dim))
                off += e
            x = self._mlp(i, x, mx.concatenate(outs) if len(outs) > 1 else outs[0])
        last = mx.array(np.cumsum(extend_lens) - 1)
        return self._logits(x[last])

    def extend(self, input_ids, slots, prefix_lens, extend_lens, out_cache_loc, prefix_indices=None) -> mx.array:
        """:meth:`extend_logits` then greedy sampling: [R] first tokens (lazy)."""
        return mx.argmax(self.extend_logits(input_ids, slots, prefix_lens, extend_lens, out_cache_loc,
                                            prefix_indices), axis=-1)
