"""The scheduler's per-step CPU work, implemented for real over the radix cache, the KV
allocators and the requests: what the simulator's phases ``recv``, ``schedule``, ``launch``
(host part) and ``process`` charge for.

A serving loop calls, once per step: :meth:`Bookkeeper.recv` (new requests),
:meth:`Bookkeeper.schedule_extend` or :meth:`Bookkeeper.schedule_decode` (the next batch),
:meth:`Bookkeeper.extend_inputs` / :meth:`Bookkeeper.decode_inputs` (the batch's host arrays,
which the backend copies to the device and launches), then :meth:`Bookkeeper.process_extend` /
:meth:`Bookkeeper.process_decode` with the sampled token ids. Calibration times each in
isolation (:mod:`calibrate.bench_bookkeeping`).
"""

from __future__ import annotations

import pickle
from collections import deque
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from calibrate.kv_pool import ReqSlotAllocator, TokenSlotAllocator
from calibrate.radix import RadixCache
from calibrate.requests import EOS, Req


@dataclass
class ExtendBatch:
    """A prefill batch: requests with their cached prefix and new-token counts."""

    reqs: list[Req]
    prefix_lens: list[int]
    extend_lens: list[int]
    out_cache_loc: np.ndarray


@dataclass
class DecodeBatch:
    """A decode batch: the running requests, one new KV slot each."""

    reqs: list[Req]
    out_cache_loc: np.ndarray


@dataclass
class StepInputs:
    """Host arrays of one forward (SGLang ``ForwardBatch`` fields), int64.

    ``input_ids``: tokens to compute; ``slots``: request slots; ``positions``: decode: each
    token's position; extend: per-request prefix lengths (also in ``prefix_lens``), new-token
    counts in ``extend_lens`` and the KV pool slots of each cached prefix in
    ``prefix_indices``; ``out_cache_loc``: the KV pool slots the new tokens are written to."""

    input_ids: np.ndarray
    slots: np.ndarray
    positions: np.ndarray
    out_cache_loc: np.ndarray
    prefix_lens: list[int] | None = None
    extend_lens: list[int] | None = None
    prefix_indices: list[np.ndarray] | None = None


class Bookkeeper:
    """Scheduler state and its per-step operations (no device work).

    Args:
        tokenizer: detokenizes outputs (stop strings).
        kv_tokens: KV pool size in tokens. max_reqs: request slots. max_ctx: longest request.
    """

    def __init__(self, tokenizer: Tokenizer, kv_tokens: int, max_reqs: int, max_ctx: int):
        self.tokenizer = tokenizer
        self.eos_ids = frozenset({tokenizer.token_to_id(EOS)})
        self.tree = RadixCache()
        self.kv = TokenSlotAllocator(kv_tokens)
        self.req_slots = ReqSlotAllocator(max_reqs)
        self.req_to_token = np.zeros((max_reqs, max_ctx), dtype=np.int64)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.outbox: list[bytes] = []

    # --- recv --------------------------------------------------------------------------------
    def recv(self, messages: list[bytes]) -> int:
        """Phase recv. SGLang ``recv_requests`` (``recv_pyobj``: unpickle) and
        ``process_input_requests`` / ``handle_generate_request`` (build a ``Req``, queue it).
        ``messages`` are pickled ``{"rid", "input_ids", "sampling_params": {"max_new_tokens",
        "stop"}}``. Returns the number of requests queued."""
        for raw in messages:
            m = pickle.loads(raw)
            sp = m["sampling_params"]
            self.waiting.append(Req(m["rid"], m["input_ids"], sp["max_new_tokens"], tuple(sp.get("stop", ())),
                                    self.eos_ids))
        return len(messages)

    # --- schedule ----------------------------------------------------------------------------
    def alloc_tokens(self, n: int) -> np.ndarray | None:
        """``n`` KV token slots, evicting least-recently-used radix cache entries if the pool is
        short (SGLang ``alloc_token_slots`` + ``tree_cache.evict``); None if still short."""
        out = self.kv.alloc(n)
        if out is None:
            self.tree.evict(n - self.kv.available_size(), self.kv.free)
            out = self.kv.alloc(n)
        return out

    def schedule_extend(self, max_batch: int = 1 << 30, token_budget: int = 1 << 30) -> ExtendBatch | None:
        """Phase schedule, prefill. SGLang ``get_new_batch_prefill`` (``PrefillAdder``) and
        ``ScheduleBatch.prepare_for_extend``: FCFS over the waiting queue, radix prefix match
        (at most ``len - 1`` tokens, one must be computed), lock the matched path, a request
        slot, KV slots for the new tokens (evicting LRU cache if needed), the request's token
        map. Returns None when nothing fits."""
        reqs, prefix_lens, extend_lens, locs = [], [], [], []
        while self.waiting and len(reqs) < max_batch:
            req = self.waiting[0]
            prefix, node = self.tree.match_prefix(req.input_ids[:-1])
            need = len(req.input_ids) - len(prefix)
            if need > token_budget:
                break
            slot = self.req_slots.alloc()
            if slot is None:
                break
            loc = self.alloc_tokens(need)
            if loc is None:
                self.req_slots.free(slot)
                break
            self.waiting.popleft()
            self.tree.inc_lock_ref(node)
            req.req_slot, req.prefix_indices, req.last_node = slot, prefix, node
            row = self.req_to_token[slot]
            row[:len(prefix)] = prefix
            row[len(prefix):len(req.input_ids)] = loc
            token_budget -= need
            reqs.append(req)
            prefix_lens.append(len(prefix))
            extend_lens.append(need)
            locs.append(loc)
        if not reqs:
            return None
        return ExtendBatch(reqs, prefix_lens, extend_lens, np.concatenate(locs))

    def schedule_decode(self) -> DecodeBatch | None:
        """Phase schedule, decode. SGLang ``update_running_batch``: ``check_decode_mem`` (one
        free KV slot per running request, evicting cache if short), ``prepare_for_decode``
        (allocate them, write the token map). Returns None with nothing running.

        Raises:
            MemoryError: the pool cannot hold the batch even after eviction (SGLang would retract).
        """
        reqs = self.running
        if not reqs:
            return None
        loc = self.alloc_tokens(len(reqs))
        if loc is None:
            raise MemoryError(f"KV pool exhausted: decode needs {len(reqs)} slots")
        slots = np.fromiter((r.req_slot for r in reqs), dtype=np.int64, count=len(reqs))
        pos = np.fromiter((r.seqlen - 1 for r in reqs), dtype=np.int64, count=len(reqs))
        self.req_to_token[slots, pos] = loc
        return DecodeBatch(list(reqs), loc)

    # --- launch (host part) ------------------------------------------------------------------
    @staticmethod
    def decode_inputs(batch: DecodeBatch) -> StepInputs:
        """Phase launch, host part of a decode. SGLang ``ScheduleBatch.get_model_worker_batch``
        / ``ForwardBatch.init_new``: the last token, slot and position of every request as
        arrays (the backend copies them to the device)."""
        reqs, n = batch.reqs, len(batch.reqs)
        ids = np.fromiter((r.output_ids[-1] if r.output_ids else r.input_ids[-1] for r in reqs), np.int64, n)
        slots = np.fromiter((r.req_slot for r in reqs), np.int64, n)
        pos = np.fromiter((r.seqlen - 1 for r in reqs), np.int64, n)
        return StepInputs(ids, slots, pos, batch.out_cache_loc)

    @staticmethod
    def extend_inputs(batch: ExtendBatch) -> StepInputs:
        """Phase launch, host part of a prefill: the new tokens back to back, slots, prefix and
        extend lengths, prefix pool slots (SGLang ``ForwardBatch.init_new`` for EXTEND)."""
        ids = np.concatenate([np.asarray(r.input_ids[p:], dtype=np.int64)
                              for r, p in zip(batch.reqs, batch.prefix_lens)])
        slots = np.fromiter((r.req_slot for r in batch.reqs), np.int64, len(batch.reqs))
        return StepInputs(ids, slots, np.asarray(batch.prefix_lens, np.int64), batch.out_cache_loc,
                          batch.prefix_lens, batch.extend_lens, [r.prefix_indices for r in batch.reqs])

    # --- process -----------------------------------------------------------------------------
    def process_extend(self, batch: ExtendBatch, next_ids: list[int]) -> list[Req]:
        """Phase process, prefill. SGLang ``process_batch_result_prefill``: append each first
        token (detokenize, finish checks), insert the prompt into the radix cache
        (``cache_unfinished_req``: free duplicate KV, re-lock the longer prefix), join the
        running batch or finish; stream the tokens out. Returns the finished requests."""
        finished = []
        for req, tok in zip(batch.reqs, next_ids):
            req.append_token(tok, self.tokenizer)
            if req.finished_reason:
                self._cache_finished(req)
                finished.append(req)
                continue
            self._cache_unfinished(req)
            self.running.append(req)
        self._stream_out(batch.reqs)
        return finished

    def process_decode(self, batch: DecodeBatch, next_ids: list[int]) -> list[Req]:
        """Phase process, decode. SGLang ``process_batch_result_decode``: append each token
        (incremental detokenization, EOS / stop string / length checks), release finished
        requests (``cache_finished_req``: radix insert, free KV and the request slot), stream
        the batch's output (``send_pyobj``). Returns the finished requests."""
        finished = []
        for req, tok in zip(batch.reqs, next_ids):
            req.append_token(tok, self.tokenizer)
            if req.finished_reason:
                self._cache_finished(req)
                finished.append(req)
        if finished:
            done = set(map(id, finished))
            self.running = [r for r in self.running if id(r) not in done]
        self._stream_out(batch.reqs)
        return finished

    def _cache_unfinished(self, req: Req) -> None:
        n = len(req.input_ids)
        kv = self.req_to_token[req.req_slot, :n]
        new_prefix = self.tree.insert(req.input_ids, kv.copy())
        old = len(req.prefix_indices)
        if new_prefix > old:
            self.kv.free(kv[old:new_prefix].copy())
        indices, node = self.tree.match_prefix(req.input_ids)
        self.req_to_token[req.req_slot, old:len(indices)] = indices[old:]
        self.tree.dec_lock_ref(req.last_node)
        self.tree.inc_lock_ref(node)
        req.prefix_indices, req.last_node = indices, node

    def _cache_finished(self, req: Req) -> None:
        tokens = req.input_ids + req.output_ids[:-1]  # the last sampled token has no KV yet
        kv = self.req_to_token[req.req_slot, :len(tokens)].copy()
        new_prefix = self.tree.insert(tokens, kv)
        old = len(req.prefix_indices)
        if new_prefix > old:
            self.kv.free(kv[old:new_prefix])
        self.tree.dec_lock_ref(req.last_node)
        self.req_slots.free(req.req_slot)
        req.req_slot = -1

    def release(self, req: Req) -> None:
        """Drop a request without caching it (abort): unlock its prefix, free its new KV and slot."""
        if req.req_slot < 0:
            return
        n = req.seqlen - 1 if req.output_ids else len(req.input_ids)
        self.kv.free(self.req_to_token[req.req_slot, len(req.prefix_indices):n].copy())
        self.tree.dec_lock_ref(req.last_node)
        self.req_slots.free(req.req_slot)
        req.req_slot = -1

    def _stream_out(self, reqs: list[Req]) -> None:
        # BatchTokenIDOut to the detokenizer/tokenizer manager: one pickled message per step
        msg = {"rids": [r.rid for r in reqs], "output_ids": [r.output_ids[-1] for r in reqs],
               "texts": [r.text[-16:] for r in reqs], "finished": [r.finished_reason for r in reqs]}
        self.outbox.append(pickle.dumps(msg))
        if len(self.outbox) > 64:
            self.outbox.clear()
