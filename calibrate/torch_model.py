"""A Llama-style decoder in torch (CPU and CUDA, one code path) with a KV cache indexed by
request slot, and its decode step captured as a CUDA graph.

The cache is SGLang's ``ReqToTokenPool`` layout collapsed into the tensor itself: request slot
``s`` owns row ``s`` of ``[max_slots, kv_heads, max_ctx, head_dim]`` per layer, and token ``p``
of that request lives at column ``p``. Decode attention gathers the batch's rows (like SGLang's
``torch_native`` attention backend) and treats the query heads of a KV group as rows of two batched matmuls (grouped-query attention without repeating
K/V); prefill attention uses ``scaled_dot_product_attention`` (flash attention on CUDA). A
serving loop can drive it directly: ``extend`` for prefills (one request or several), ``decode``
for a batch of running requests whose input tokens may still be on the device (a FutureMap).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from calibrate.shapes import ModelShape
from calibrate.weights import INIT_STD, is_norm, rope_tables, weight_shapes


class TorchLlama:
    """Random-weight decoder of ``shape`` on ``device``.

    Args:
        shape: the sizes. device: ``"cpu"`` or ``"cuda"``. dtype: parameter/activation type.
        seed: seed of the on-device initialisation. weights: optional numpy weights by name
            (:func:`calibrate.weights.random_weights`) instead of on-device random ones.
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
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        self.max_slots = self.max_ctx = 0
        self.use_sdpa = True

    def check_attention(self) -> str:
        """Run a tiny decode and extend once; if ``scaled_dot_product_attention`` refuses these
        shapes on this device, switch to plain matmul-softmax attention. Returns the mode in
        words. Leaves a 1 x 16 KV cache allocated."""
        self.allocate_kv(1, 16)
        one = torch.zeros(1, dtype=torch.int64, device=self.device)
        try:
            self.decode(one, one, one + 3, 8)
            self.extend(torch.zeros(4, dtype=torch.int64, device=self.device), [0], [0], [4])
            self.extend(torch.zeros(4, dtype=torch.int64, device=self.device), [0], [4], [4])
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            return "scaled_dot_product_attention"
        except RuntimeError as err:
            self.use_sdpa = False
            return f"matmul-softmax (scaled_dot_product_attention failed: {str(err)[:200]})"

    @staticmethod
    def _decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # q [B, kv_heads, group, d] (a KV group's query heads as rows), k/v [B, kv_heads, L, d]:
        # two batched matmuls with a float32 softmax, capturable in a CUDA graph on any GPU
        scores = torch.matmul(q, k.transpose(-1, -2)).float() * (q.shape[-1] ** -0.5)
        probs = scores.masked_fill(~mask, float("-inf")).softmax(-1).to(v.dtype)
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

    def allocate_kv(self, max_slots: int, max_ctx: int) -> None:
        """(Re)allocate the KV cache for ``max_slots`` requests of up to ``max_ctx`` tokens (zeros),
        and the RoPE tables for ``max_ctx`` positions. Frees the previous cache first."""
        s = self.shape
        self.k_cache = self.v_cache = []
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        dims = (max_slots, s.kv_heads, max_ctx, s.head_dim)
        self.k_cache = [torch.zeros(dims, device=self.device, dtype=self.dtype) for _ in range(s.layers)]
        self.v_cache = [torch.zeros(dims, device=self.device, dtype=self.dtype) for _ in range(s.layers)]
        cos, sin = rope_tables(s, max_ctx)
        self.cos = torch.from_numpy(cos).to(self.device, self.dtype)
        self.sin = torch.from_numpy(sin).to(self.device, self.dtype)
        self.max_slots, self.max_ctx = max_slots, max_ctx

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
                      ctx_len: int | None = None) -> torch.Tensor:
        """One decode step for a batch of B running requests.

        Args:
            input_ids: [B] int64 on the device, the token each request feeds (its last sampled one).
            slots: [B] int64 request slots. positions: [B] int64, each token's position (= tokens
                already in the request's cache); its K/V is written there.
            ctx_len: keys attended per request, a static bound >= max(positions) + 1 (CUDA-graph
                friendly; default the whole cache row).

        Returns:
            [B, vocab] logits. No host synchronisation happens inside (capturable).
        """
        s = self.shape
        b = input_ids.shape[0]
        length = ctx_len or self.max_ctx
        x = self.w["embed"][input_ids]
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        mask = (torch.arange(length, device=self.device)[None, :] <= positions[:, None])[:, None, None, :]
        group = s.heads // s.kv_heads
        for i in range(s.layers):
            q, k, v = self._qkv(i, x, cos, sin)
            kc, vc = self.k_cache[i], self.v_cache[i]
            kc[slots, :, positions] = k
            vc[slots, :, positions] = v
            keys, vals = kc[slots, :, :length], vc[slots, :, :length]  # [B, kv_heads, L, d]
            o = self._decode_attention(q.view(b, s.kv_heads, group, s.head_dim), keys, vals, mask)
            x = self._mlp(i, x, o.reshape(b, s.heads * s.head_dim))
        return self._logits(x)

    def decode(self, input_ids, slots, positions, ctx_len: int | None = None) -> torch.Tensor:
        """:meth:`decode_logits` followed by greedy sampling: [B] int64 next tokens on the device."""
        return torch.argmax(self.decode_logits(input_ids, slots, positions, ctx_len), dim=-1)

    @torch.no_grad()
    def extend_logits(self, input_ids: torch.Tensor, slots: list[int], prefix_lens: list[int],
                      extend_lens: list[int]) -> torch.Tensor:
        """One prefill (EXTEND) batch: request r computes ``extend_lens[r]`` new tokens after
        ``prefix_lens[r]`` tokens already in its cache row ``slots[r]`` (a radix-cache hit or an
        earlier chunk).

        Args:
            input_ids: [sum(extend_lens)] int64 on the device, the requests' new tokens back to back.
            slots, prefix_lens, extend_lens: host integers, one per request.

        Returns:
            [R, vocab] logits of each request's last token (what its first output is sampled from).
        """
        s = self.shape
        # built on the device from host ints: no pageable host-to-device copy inside the forward
        aranges = [torch.arange(p, p + e, device=self.device) for p, e in zip(prefix_lens, extend_lens)]
        positions = torch.cat(aranges) if len(aranges) > 1 else aranges[0]
        x = self.w["embed"][input_ids]
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        masks = []
        for p, e in zip(prefix_lens, extend_lens):
            if p == 0:
                masks.append(None)
            else:  # bottom-right causal: new token j sees the prefix and new tokens <= j
                key = torch.arange(p + e, device=self.device)
                masks.append(key[None, :] <= (p + torch.arange(e, device=self.device))[:, None])
        for i in range(s.layers):
            q, k, v = self._qkv(i, x, cos, sin)
            outs, off = [], 0
            for slot, p, e, mask in zip(slots, prefix_lens, extend_lens, masks):
                kc, vc = self.k_cache[i], self.v_cache[i]
                kc[slot, :, p:p + e] = k[off:off + e].transpose(0, 1)
                vc[slot, :, p:p + e] = v[off:off + e].transpose(0, 1)
                qr = q[off:off + e].transpose(0, 1)[None]
                o = self._attention(qr, kc[slot, :, :p + e][None], vc[slot, :, :p + e][None], mask,
                                    causal=mask is None, gqa=True)
                outs.append(o[0].transpose(0, 1).reshape(e, s.heads * s.head_dim))
                off += e
            x = self._mlp(i, x, torch.cat(outs) if len(outs) > 1 else outs[0])
        ends = np.cumsum(extend_lens).tolist()
        last = torch.cat([x[e - 1:e] for e in ends]) if len(ends) > 1 else x[ends[0] - 1:ends[0]]
        return self._logits(last)

    def extend(self, input_ids, slots, prefix_lens, extend_lens) -> torch.Tensor:
        """:meth:`extend_logits` followed by greedy sampling: [R] int64 first tokens on the device."""
        return torch.argmax(self.extend_logits(input_ids, slots, prefix_lens, extend_lens), dim=-1)


class CudaGraphDecode:
    """:meth:`TorchLlama.decode` for one batch size and context bound, captured as a CUDA graph
    (SGLang's ``CudaGraphRunner``: static input buffers, one ``replay()`` per step).

    Args:
        model: a CUDA :class:`TorchLlama` with its KV cache allocated.
        batch_size, ctx_len: the captured shape. pool: a graph memory pool to share with other
            graphs that stay alive (torch 2.11 asserts when a pool is reused after the graphs
            that held it were freed; calibration captures one graph at a time with pool None).

    Capturing runs the step on dummy inputs, which writes K/V at position 0 of slots
    0..batch_size-1: capture before serving, as SGLang does at start-up.
    """

    def __init__(self, model: TorchLlama, batch_size: int, ctx_len: int, pool=None):
        dev = model.device
        self.input_ids = torch.zeros(batch_size, dtype=torch.int64, device=dev)
        self.slots = torch.arange(batch_size, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(batch_size, dtype=torch.int64, device=dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                model.decode(self.input_ids, self.slots, self.positions, ctx_len)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = model.decode(self.input_ids, self.slots, self.positions, ctx_len)

    def launch(self, input_ids: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Copy the step's inputs into the static buffers and replay; returns the static [B] output."""
        self.input_ids.copy_(input_ids, non_blocking=True)
        self.slots.copy_(slots, non_blocking=True)
        self.positions.copy_(positions, non_blocking=True)
        self.graph.replay()
        return self.out
