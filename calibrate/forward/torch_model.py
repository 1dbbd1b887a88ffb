"""A Llama-style decoder in torch (CPU and CUDA, one code path) over SGLang's KV memory layout,
and its decode step captured as a CUDA graph.

The KV cache is a token pool (SGLang ``MHATokenToKVPool``): per layer, K and V of
``[kv_heads, pool_tokens + 1, head_dim]``, slot 0 being padding. A request slot's row of the
device table ``req_to_token`` (SGLang ``ReqToTokenPool``) lists the pool slots of its tokens in
order, so requests that share a cached prefix (radix cache) read the same pool slots. A step
writes its new tokens' K/V at ``out_cache_loc``; attention gathers each request's keys through
its row (like SGLang's ``torch_native`` attention backend). Decode treats the query heads of a
KV group as rows of two batched matmuls (grouped-query attention without repeating K/V);
prefill uses ``scaled_dot_product_attention`` (flash attention on CUDA). A serving loop drives
it directly: :meth:`TorchLlama.extend` for prefills, :meth:`TorchLlama.decode` for a batch of
running requests whose input tokens may still be on the device (a FutureMap).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from calibrate.forward.weights import INIT_STD, is_norm, rope_tables, weight_shapes
from calibrate.shapes import ModelShape


class TorchLlama:
    """Random-weight decoder of ``shape`` on ``device``.

    Args:
        shape: the sizes. device: ``"cpu"`` or ``"cuda"``. dtype: parameter/activation type.
        seed: seed of the on-device initialisation. weights: optional numpy weights by name
            (:func:`calibrate.forward.weights.random_weights`) instead of on-device random ones.
    """

    def __init__(self, shape: ModelShape, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 seed: int = 0, weights: dict[str, np.ndarray] | None = None):
        self.shape, self.device, self.dtype = shape, torch.device(device), dtype
        gen = torch.Generator(device=self.device).manual_seed(seed)
        self.w: dict[str, torch.Tensor] = {}
        for name, dims in weight_shapes(shape).items():
            if weights is not None:
                t = torch.from_numpy(weights[name]).to(self.device, dtype)
            elif is_norm(name):
                t = torch.ones(dims, device=self.device, dtype=dtype)
            else:
                t = torch.randn(dims, generator=gen, device=self.device, dtype=dtype) * INIT_STD
            self.w[name] = t
        self.lm_head = self.w["embed"] if shape.tie_embeddings else self.w["lm_head"]
        self.k_pool: list[torch.Tensor] = []
        self.v_pool: list[torch.Tensor] = []
        self.max_slots = self.max_ctx = self.pool_tokens = 0
        self.use_sdpa = True

    def check_attention(self) -> str:
        """Run a tiny decode and extend once; if ``scaled_dot_product_attention`` refuses these
        shapes on this device, switch to plain matmul-softmax attention for prefills. Returns the
        mode in words. Leaves a 1 x 16 KV cache allocated."""
        self.allocate_kv(1, 16)
        dev = self.device
        ar = lambda a, b: torch.arange(a, b, device=dev)  # noqa: E731
        try:
            self.extend(ar(0, 4), [0], [0], [4], ar(1, 5))
            self.extend(ar(0, 4), [0], [4], [4], ar(5, 9))
            self.decode(ar(0, 1), ar(0, 1), ar(8, 9), ar(9, 10), 12)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            return "scaled_dot_product_attention"
        except RuntimeError as err:
            self.use_sdpa = False
            return f"matmul-softmax (scaled_dot_product_attention failed: {str(err)[:200]})"

    @staticmethod
    def _decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # q [kv_heads, B, group, d] (a KV group's query heads as rows), k/v [kv_heads, B, L, d],
        # mask [B, L]: two batched matmuls with a float32 softmax, capturable in a CUDA graph
        scores = torch.matmul(q, k.transpose(-1, -2)).float() * (q.shape[-1] ** -0.5)
        probs = scores.masked_fill(~mask[None, :, None, :], float("-inf")).softmax(-1).to(v.dtype)
        return torch.matmul(probs, v)

    def _attention(self, q, k, v, mask=None, causal: bool = False, gqa: bool = False) -> torch.Tensor:
        if self.use_sdpa:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=gqa)
        if gqa:
            rep = q.shape[-3] // k.shape[-3]
            k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
        scores = (q.float() @ k.float().transpose(-1, -2)) / (q.shape[-1] ** 0.5)
        if causal:
            n, m = scores.shape[-2:]
            mask = torch.ones(n, m, dtype=torch.bool, device=q.device).tril()
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return (scores.softmax(-1) @ v.float()).to(q.dtype)

    def allocate_kv(self, max_slots: int, max_ctx: int, pool_tokens: int | None = None) -> None:
        """(Re)allocate the KV token pool (``pool_tokens`` slots plus padding slot 0; default
        ``max_slots * max_ctx``), zeroed, the ``req_to_token`` table for ``max_slots`` requests of
        up to ``max_ctx`` tokens, and RoPE tables for ``max_ctx`` positions. Frees the old ones."""
        s = self.shape
        self.k_pool = self.v_pool = []
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        size = (pool_tokens or max_slots * max_ctx) + 1
        dims = (s.kv_heads, size, s.head_dim)
        self.k_pool = [torch.zeros(dims, device=self.device, dtype=self.dtype) for _ in range(s.layers)]
        self.v_pool = [torch.zeros(dims, device=self.device, dtype=self.dtype) for _ in range(s.layers)]
        self.req_to_token = torch.zeros((max_slots, max_ctx), dtype=torch.int64, device=self.device)
        cos, sin = rope_tables(s, max_ctx)
        self.cos = torch.from_numpy(cos).to(self.device, self.dtype)
        self.sin = torch.from_numpy(sin).to(self.device, self.dtype)
        self.max_slots, self.max_ctx, self.pool_tokens = max_slots, max_ctx, size - 1

    def set_req_to_token(self, slot: int, start: int, indices) -> None:
        """Write pool slots ``indices`` (host array or device tensor) at positions ``start...`` of
        request ``slot``'s row (SGLang ``ReqToTokenPool.write``; e.g. a radix-cache prefix)."""
        idx = torch.as_tensor(indices, dtype=torch.int64)
        self.req_to_token[slot, start:start + len(idx)] = idx.to(self.device, non_blocking=True)

    # --- building blocks ---------------------------------------------------------------------
    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.shape.rms_eps)).to(x.dtype) * w

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x [N, heads, d]; cos/sin [N, 1, d/2] (rotate-half layout)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def _qkv(self, i: int, x: torch.Tensor, cos, sin):
        s, w = self.shape, self.w
        p = f"layers.{i}."
        n = x.shape[0]
        qkv = F.linear(self._rms(x, w[p + "attn_norm"]), w[p + "qkv"])
        q, k, v = qkv.split([s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1)
        q = q.view(n, s.heads, s.head_dim)
        k = k.view(n, s.kv_heads, s.head_dim)
        v = v.view(n, s.kv_heads, s.head_dim)
        if s.qk_norm:
            q, k = self._rms(q, w[p + "q_norm"]), self._rms(k, w[p + "k_norm"])
        return self._rope(q, cos, sin), self._rope(k, cos, sin), v

    def _mlp(self, i: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        w, p = self.w, f"layers.{i}."
        x = x + F.linear(attn, w[p + "o"])
        gate, up = F.linear(self._rms(x, w[p + "mlp_norm"]), w[p + "gate_up"]).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, w[p + "down"])

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self._rms(x, self.w["final_norm"]), self.lm_head)

    # --- forward passes ------------------------------------------------------------------------
    @torch.no_grad()
    def decode_logits(self, input_ids: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
                      out_cache_loc: torch.Tensor, ctx_len: int | None = None) -> torch.Tensor:
        """One decode step for a batch of B running requests.

        Args:
            input_ids: [B] int64 on the device, the token each request feeds (its last sampled one).
            slots: [B] int64 request slots. positions: [B] int64, each token's position (= tokens
                already in the request's cache). out_cache_loc: [B] int64 pool slots for the new
                K/V (recorded in ``req_to_token`` here, as SGLang's ``prepare_for_decode`` does).
            ctx_len: keys attended per request, a static bound >= max(positions) + 1 (CUDA-graph
                friendly; default the whole row).

        Returns:
            [B, vocab] logits. No host synchronisation happens inside (capturable).
        """
        s = self.shape
        b = input_ids.shape[0]
        length = ctx_len or self.max_ctx
        self.req_to_token[slots, positions] = out_cache_loc
        idx = self.req_to_token[slots, :length]  # [B, L] pool slots of each request's keys
        x = self.w["embed"][input_ids]
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        mask = torch.arange(length, device=self.device)[None, :] <= positions[:, None]
        group = s.heads // s.kv_heads
        for i in range(s.layers):
            q, k, v = self._qkv(i, x, cos, sin)
            kp, vp = self.k_pool[i], self.v_pool[i]
            kp[:, out_cache_loc] = k.transpose(0, 1)
            vp[:, out_cache_loc] = v.transpose(0, 1)
            qg = q.view(b, s.kv_heads, group, s.head_dim).transpose(0, 1)  # [kv_heads, B, group, d]
            o = self._decode_attention(qg, kp[:, idx], vp[:, idx], mask)  # gathered [kv_heads, B, L, d]
            x = self._mlp(i, x, o.transpose(0, 1).reshape(b, s.heads * s.head_dim))
        return self._logits(x)

    def decode(self, input_ids, slots, positions, out_cache_loc, ctx_len: int | None = None) -> torch.Tensor:
        """:meth:`decode_logits` followed by greedy sampling: [B] int64 next tokens on the device."""
        return torch.argmax(self.decode_logits(input_ids, slots, positions, out_cache_loc, ctx_len), dim=-1)

    @torch.no_grad()
    def extend_logits(self, input_ids: torch.Tensor, slots: list[int], prefix_lens: list[int],
                      extend_lens: list[int], out_cache_loc: torch.Tensor,
                      prefix_indices: list | None = None) -> torch.Tensor:
        """One prefill (EXTEND) batch: request r computes ``extend_lens[r]`` new tokens after
        ``prefix_lens[r]`` tokens already in the pool (a radix-cache hit or an earlier chunk).

        Args:
            input_ids: [sum(extend_lens)] int64 on the device, the requests' new tokens back to back.
            slots, prefix_lens, extend_lens: host integers, one per request.
            out_cache_loc: [sum(extend_lens)] int64 pool slots for the new tokens' K/V.
            prefix_indices: per request, the pool slots of its prefix to record in its
                ``req_to_token`` row first (None: the row already holds them).

        Returns:
            [R, vocab] logits of each request's last token (what its first output is sampled from).
        """
        s = self.shape
        dev = self.device
        rows, off = [], 0
        for r, (slot, p, e) in enumerate(zip(slots, prefix_lens, extend_lens)):
            if prefix_indices is not None and p:
                self.set_req_to_token(slot, 0, prefix_indices[r])
            self.req_to_token[slot, p:p + e] = out_cache_loc[off:off + e]
            rows.append(self.req_to_token[slot, :p + e])
            off += e
        # positions and masks built on the device from host ints: no pageable host-to-device copy
        aranges = [torch.arange(p, p + e, device=dev) for p, e in zip(prefix_lens, extend_lens)]
        positions = torch.cat(aranges) if len(aranges) > 1 else aranges[0]
        masks = [None if p == 0 else  # bottom-right causal: new token j sees the prefix and new tokens <= j
                 torch.arange(p + e, device=dev)[None, :] <= (p + torch.arange(e, device=dev))[:, None]
                 for p, e in zip(prefix_lens, extend_lens)]
        x = self.w["embed"][input_ids]
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        for i in range(s.layers):
            q, k, v = self._qkv(i, x, cos, sin)
            kp, vp = self.k_pool[i], self.v_pool[i]
            kp[:, out_cache_loc] = k.transpose(0, 1)
            vp[:, out_cache_loc] = v.transpose(0, 1)
            outs, off = [], 0
            for row, e, mask in zip(rows, extend_lens, masks):
                qr = q[off:off + e].transpose(0, 1)[None]  # [1, heads, e, d]
                o = self._attention(qr, kp[:, row][None], vp[:, row][None], mask, causal=mask is None, gqa=True)
                outs.append(o[0].transpose(0, 1).reshape(e, s.heads * s.head_dim))
                off += e
            x = self._mlp(i, x, torch.cat(outs) if len(outs) > 1 else outs[0])
        ends = np.cumsum(extend_lens).tolist()
        last = torch.cat([x[e - 1:e] for e in ends]) if len(ends) > 1 else x[ends[0] - 1:ends[0]]
        return self._logits(last)

    def extend(self, input_ids, slots, prefix_lens, extend_lens, out_cache_loc, prefix_indices=None) -> torch.Tensor:
        """:meth:`extend_logits` followed by greedy sampling: [R] int64 first tokens on the device."""
        return torch.argmax(self.extend_logits(input_ids, slots, prefix_lens, extend_lens, out_cache_loc,
                                               prefix_indices), dim=-1)


class CudaGraphDecode:
    """:meth:`TorchLlama.decode` for one batch size and context bound, captured as a CUDA graph
    (SGLang's ``CudaGraphRunner``: static input buffers, one ``replay()`` per step).

    Args:
        model: a CUDA :class:`TorchLlama` with its KV cache allocated.
        batch_size, ctx_len: the captured shape. pool: a graph memory pool to share with other
            graphs that stay alive (torch 2.11 asserts when a pool is reused after the graphs
            that held it were freed; calibration captures one graph at a time with pool None).

    Capturing runs the step on dummy inputs: it writes K/V into the padding pool slot 0 and
    ``req_to_token[0..batch_size-1, 0] = 0``; capture before serving, as SGLang does at start-up.
    """

    def __init__(self, model: TorchLlama, batch_size: int, ctx_len: int, pool=None):
        dev = model.device
        self.input_ids = torch.zeros(batch_size, dtype=torch.int64, device=dev)
        self.slots = torch.arange(batch_size, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(batch_size, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(batch_size, dtype=torch.int64, device=dev)  # padding slot 0
        args = (self.input_ids, self.slots, self.positions, self.out_cache_loc, ctx_len)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                model.decode(*args)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = model.decode(*args)

    def launch(self, input_ids: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
               out_cache_loc: torch.Tensor) -> torch.Tensor:
        """Copy the step's inputs into the static buffers and replay; returns the static [B] output."""
        self.input_ids.copy_(input_ids, non_blocking=True)
        self.slots.copy_(slots, non_blocking=True)
        self.positions.copy_(positions, non_blocking=True)
        self.out_cache_loc.copy_(out_cache_loc, non_blocking=True)
        self.graph.replay()
        return self.out
