"""The KV cache in blocks: ``KVCacheManager.allocate_slots`` and ``free`` for one full-attention
group (vLLM 0.32.0, ``vllm/v1/core/kv_cache_manager.py``, ``single_type_kv_cache_manager.py``,
``block_pool.py``).

The pool holds ``num_gpu_blocks`` blocks of ``block_size`` tokens, one of them held back as the
null block (``BlockPool.__init__``, block_pool.py:187): ``num_gpu_blocks - 1`` are usable. A
request that has ``n`` tokens computed or scheduled holds ``ceil(n / block_size)`` blocks
(``get_num_blocks_to_allocate``: ``cdiv(num_tokens, block_size) - blocks held``).
``allocate_slots`` fails (returns False, nothing allocated) when the new blocks plus the
watermark exceed the free blocks (kv_cache_manager.py:573-579); with
``full_sequence_must_fit`` (the default ``scheduler_reserve_full_isl``) a new admission also
needs the blocks of its whole current sequence (``num_tokens``) free (l.522-539).

Speculative decoding's lookahead (``num_lookahead_tokens``: slots for the drafts the drafter
writes, l.542) is allocated with the request's tokens, the slots capped at ``max_model_len``
(``num_tokens_need_slot = min(... + num_lookahead_tokens, max_model_len)``): a request near
``max_model_len`` needs no block beyond one of ``max_model_len`` tokens, which the cache holds
(the server refuses to start otherwise).

Simplifications, stated: one KV cache group (a full-attention decoder, no sliding window);
prefix-cache hits are the workload's cached prefix only, in whole blocks, and their blocks are
resident and shared (they are not taken from the free pool and never evicted); a request's own
blocks are not found again in the cache after it is preempted or finished (no LRU eviction
model); the watermark is 0 (vLLM's default).
"""

from __future__ import annotations

from sim.engines.vllm.policy.request import Request


def cdiv(a: int, b: int) -> int:
    """``vllm.utils.math_utils.cdiv``: ceil(a / b) for ints."""
    return -(-a // b)


class BlockPool:
    """Free and used KV blocks; per-request holdings live on the :class:`Request`.

    Args:
        num_gpu_blocks: blocks in the pool, the null block included (>= 2).
        block_size: tokens per block (>= 1).
        max_model_len: the most slots a request is given (its tokens and lookahead); None: no cap.

    Raises:
        ValueError: fewer than 2 blocks, or a block size below 1.
    """

    def __init__(self, num_gpu_blocks: int, block_size: int, max_model_len: int | None = None):
        if num_gpu_blocks < 2 or block_size < 1:
            raise ValueError(f"a KV pool needs >= 2 blocks of >= 1 token (got {num_gpu_blocks} x {block_size})")
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.num_usable_blocks = num_gpu_blocks - 1
        self.num_free_blocks = self.num_usable_blocks
        self.peak_used_blocks = 0

    @property
    def num_used_blocks(self) -> int:
        return self.num_usable_blocks - self.num_free_blocks

    def usage(self) -> float:
        """Fraction of the usable blocks in use (``BlockPool.get_usage``)."""
        return self.num_used_blocks / self.num_usable_blocks

    def prefix_hit_tokens(self, req: Request) -> int:
        """Tokens found in the prefix cache for a request with nothing computed: whole blocks of
        its cached prefix, at most ``num_tokens - 1`` (the last token is always computed, to
        sample from: ``get_computed_blocks``, kv_cache_manager.py:295)."""
        usable = min(req.cached_len, req.num_tokens - 1)
        return max(usable, 0) // self.block_size * self.block_size

    def allocate_slots(self, req: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       full_sequence_must_fit: bool = False, num_lookahead_tokens: int = 0) -> bool:
        """Give ``req`` blocks for ``num_new_tokens`` more tokens after its computed ones and
        ``num_new_computed_tokens`` prefix-cache hits (a new admission), plus
        ``num_lookahead_tokens`` slots beyond them (speculative decoding's drafts). Returns False
        (and changes nothing) when the free blocks do not suffice.

        Raises:
            ValueError: ``num_new_tokens`` < 1 (vLLM: "num_new_tokens must be greater than 0").
        """
        if num_new_tokens < 1:
            raise ValueError(f"num_new_tokens must be > 0 (got {num_new_tokens})")
        hit_blocks = num_new_computed_tokens // self.block_size if num_new_computed_tokens else 0
        held = req.num_blocks + hit_blocks
        if full_sequence_must_fit and cdiv(req.num_tokens, self.block_size) - held > self.num_free_blocks:
            return False
        total = req.num_computed_tokens + num_new_computed_tokens + num_new_tokens + num_lookahead_tokens
        if num_lookahead_tokens and self.max_model_len is not None and total > self.max_model_len:
            total = self.max_model_len  # num_tokens_need_slot's cap (kv_cache_manager.py)
        need = max(cdiv(total, self.block_size) - held, 0)
        if need > self.num_free_blocks:
            return False
        self.num_free_blocks -= need
        req.num_hit_blocks += hit_blocks
        req.num_blocks = held + need
        used = self.num_used_blocks
        if used > self.peak_used_blocks:
            self.peak_used_blocks = used
        return True

    def free(self, req: Request) -> None:
        """Return all of ``req``'s own blocks to the pool (``KVCacheManager.free``); its
        prefix-cache hits stay resident."""
        self.num_free_blocks += req.num_blocks - req.num_hit_blocks
        req.num_blocks = req.num_hit_blocks = 0
