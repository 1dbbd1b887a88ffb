"""The scheduler's per-step CPU work, implemented for real over the radix cache, the KV
allocators and the requests: what the simulator's phases ``recv``, ``schedule``, ``launch``
(host part) and ``process`` charge for.

A serving loop calls, once per step: :meth:`Bookkeeper.recv` (new requests),
:meth:`Bookkeeper.schedule_extend` or :meth:`Bookkeeper.schedule_decode` (the next batch),
:meth:`Bookkeeper.extend_inputs` / :meth:`Bookkeeper.decode_inputs` (the batch's host arrays,
which the backend copies to the device and launches), then :meth:`Bookkeeper.process_extend` /
:meth:`Bookkeeper.process_decode` with the sampled token ids. Calibration times each in
isolation (:mod:`calibrate.bookkeeping.bench`); the ground-truth harness
(:mod:`calibrate.harness`) runs the same methods in its serving loop.

Serving semantics, as SGLang's scheduler: a prefill may be chunked (``token_budget``, SGLang's
``chunked_prefill_size``; the chunked request continues first in the next prefill); requests
whose last chunk was launched join the running batch at the next ``schedule_*`` call, before
their first token is processed (under overlap that token is still on the device); positions
count tokens in flight (``Req.inflight``), so a decode can be scheduled while the previous
batch runs; a request that finished in the previous batch but was already put in the next
one (overlap overshoot) has that token discarded and its extra KV slot freed.
"""

from __future__ import annotations

import pickle
from collections import deque
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from calibrate.bookkeeping.kv_pool import ReqSlotAllocator, TokenSlotAllocator
from calibrate.bookkeeping.radix import RadixCache
from calibrate.bookkeeping.requests import EOS, Req


@dataclass
class ExtendBatch:
    """A prefill batch: requests with their cached prefix and new-token counts.

    ``is_last`` (None: all True): whether the request's prompt ends in this batch (else it is a
    chunk of a chunked prefill, whose sampled token is ignored). ``prefix_indices``: per
    request, the KV pool slots of the tokens before this batch's (None: each request's radix
    prefix, ``Req.prefix_indices``)."""

    reqs: list[Req]
    prefix_lens: list[int]
    extend_lens: list[int]
    out_cache_loc: np.ndarray
    is_last: list[bool] | None = None
    prefix_indices: list[np.ndarray] | None = None


@dataclass
class DecodeBatch:
    """A decode batch: the running requests, one new KV slot each. ``positions`` (None: each
    request's last token, nothing in flight): the position of the token each request feeds."""

    reqs: list[Req]
    out_cache_loc: np.ndarray
    positions: np.ndarray | None = None


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
        self.chunked_req: Req | None = None  # a request whose prefill continues in the next prefill batch
        self._launched: list[Req] = []  # last prefill chunks scheduled, not yet merged into the running batch
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

    def merge_prefilled(self) -> None:
        """Requests whose last prefill chunk was launched join the running batch (SGLang
        ``get_next_batch_to_run`` merging the last batch), unless they already finished or
        have a single output token (that comes from the prefill). Called by ``schedule_*``."""
        for req in self._launched:
            if not req.in_running and req.finished_reason is None and req.max_new_tokens > 1:
                self.running.append(req)
                req.in_running = True
        self._launched.clear()

    def schedule_extend(self, max_running: int = 1 << 30, token_budget: int = 1 << 30) -> ExtendBatch | None:
        """Phase schedule, prefill. SGLang ``get_new_batch_prefill`` (``PrefillAdder``) and
        ``ScheduleBatch.prepare_for_extend``: the chunked request first, then FCFS over the
        waiting queue while the running batch plus this batch stay under ``max_running``: radix
        prefix match (at most ``len - 1`` tokens, one must be computed), lock the matched path, a
        request slot, KV slots for the new tokens (evicting LRU cache if needed), the request's
        token map. At most ``token_budget`` new tokens: the request that does not fit is chunked
        (it continues first in the next prefill batch). Returns None when nothing fits."""
        self.merge_prefilled()
        reqs, prefix_lens, extend_lens, locs, last, prefixes = [], [], [], [], [], []
        req = self.chunked_req
        if req is not None:
            p = req.extend_done
            take = min(len(req.input_ids) - p, token_budget)
            loc = self.alloc_tokens(take) if take > 0 else None
            if loc is None:
                return None
            row = self.req_to_token[req.req_slot]
            prefixes.append(row[:p].copy())
            row[p:p + take] = loc
            self._add_chunk(req, p, take, loc, reqs, prefix_lens, extend_lens, locs, last)
            token_budget -= take
        while self.waiting and token_budget > 0 and self.chunked_req is None \
                and len(self.running) + len(reqs) < max_running:
            req = self.waiting[0]
            prefix, node = self.tree.match_prefix(req.input_ids[:-1])
            take = min(len(req.input_ids) - len(prefix), token_budget)
            slot = self.req_slots.alloc()
            if slot is None:
                break
            loc = self.alloc_tokens(take)
            if loc is None:
                self.req_slots.free(slot)
                break
            self.waiting.popleft()
            self.tree.inc_lock_ref(node)
            req.req_slot, req.prefix_indices, req.last_node = slot, prefix, node
            row = self.req_to_token[slot]
            row[:len(prefix)] = prefix
            row[len(prefix):len(prefix) + take] = loc
            prefixes.append(prefix)
            self._add_chunk(req, len(prefix), take, loc, reqs, prefix_lens, extend_lens, locs, last)
            token_budget -= take
        if not reqs:
            return None
        return ExtendBatch(reqs, prefix_lens, extend_lens, np.concatenate(locs), last, prefixes)

    def _add_chunk(self, req: Req, prefix: int, take: int, loc, reqs, prefix_lens, extend_lens, locs, last) -> None:
        req.extend_done = prefix + take
        done = req.extend_done == len(req.input_ids)
        self.chunked_req = None if done else req
        if done:
            req.inflight += 1  # the prefill samples the first output token
            self._launched.append(req)
        reqs.append(req)
        prefix_lens.append(prefix)
        extend_lens.append(take)
        locs.append(loc)
        last.append(done)

    def schedule_decode(self, exclude_finishing: bool = False) -> DecodeBatch | None:
        """Phase schedule, decode. SGLang ``update_running_batch``: ``check_decode_mem`` (one
        free KV slot per running request, evicting cache if short), ``prepare_for_decode``
        (allocate them, write the token map). Positions count tokens still in flight, so this
        may run while the previous batch is on the device (overlap). ``exclude_finishing``:
        leave out requests whose in-flight tokens reach their length limit (SGLang 0.5.22's
        ``_reqs_finishing_inflight`` under ``event_loop_overlap``). Returns None with nothing
        to run.

        Raises:
            MemoryError: the pool cannot hold the batch even after eviction (SGLang would retract).
        """
        self.merge_prefilled()
        reqs = self.running
        if exclude_finishing:
            reqs = [r for r in reqs if len(r.output_ids) + r.inflight < r.max_new_tokens]
        if not reqs:
            return None
        n = len(reqs)
        loc = self.alloc_tokens(n)
        if loc is None:
            raise MemoryError(f"KV pool exhausted: decode needs {n} slots")
        slots = np.fromiter((r.req_slot for r in reqs), dtype=np.int64, count=n)
        pos = np.fromiter((r.seqlen - 1 + r.inflight for r in reqs), dtype=np.int64, count=n)
        self.req_to_token[slots, pos] = loc
        for r in reqs:
            r.inflight += 1
        return DecodeBatch(list(reqs), loc, pos)

    # --- launch (host part) ------------------------------------------------------------------
    @staticmethod
    def decode_inputs(batch: DecodeBatch) -> StepInputs:
        """Phase launch, host part of a decode. SGLang ``ScheduleBatch.get_model_worker_batch``
        / ``ForwardBatch.init_new``: the last token, slot and position of every request as
        arrays (the backend copies them to the device). Under overlap the host does not have the
        tokens still on the device: ``input_ids`` then holds stale values the device replaces
        from its token buffer (FutureMap)."""
        reqs, n = batch.reqs, len(batch.reqs)
        ids = np.fromiter((r.output_ids[-1] if r.output_ids else r.input_ids[-1] for r in reqs), np.int64, n)
        slots = np.fromiter((r.req_slot for r in reqs), np.int64, n)
        pos = batch.positions if batch.positions is not None else \
            np.fromiter((r.seqlen - 1 for r in reqs), np.int64, n)
        return StepInputs(ids, slots, pos, batch.out_cache_loc)

    @staticmethod
    def extend_inputs(batch: ExtendBatch) -> StepInputs:
        """Phase launch, host part of a prefill: the new tokens back to back, slots, prefix and
        extend lengths, prefix pool slots (SGLang ``ForwardBatch.init_new`` for EXTEND)."""
        ids = np.concatenate([np.asarray(r.input_ids[p:p + e], dtype=np.int64)
                              for r, p, e in zip(batch.reqs, batch.prefix_lens, batch.extend_lens)])
        slots = np.fromiter((r.req_slot for r in batch.reqs), np.int64, len(batch.reqs))
        prefixes = batch.prefix_indices if batch.prefix_indices is not None else [r.prefix_indices for r in batch.reqs]
        return StepInputs(ids, slots, np.asarray(batch.prefix_lens, np.int64), batch.out_cache_loc,
                          batch.prefix_lens, batch.extend_lens, prefixes)

    # --- process -----------------------------------------------------------------------------
    def process_extend(self, batch: ExtendBatch, next_ids: list[int]) -> list[Req]:
        """Phase process, prefill. SGLang ``process_batch_result_prefill``: a chunk caches its
        computed prefix (``cache_unfinished_req(chunked=True)``); a finished prompt appends its
        first token (detokenize, finish checks), is inserted into the radix cache
        (``cache_unfinished_req``: free duplicate KV, re-lock the longer prefix) and joins the
        running batch if it has not yet, or finishes; the tokens are streamed out. Returns the
        finished requests."""
        finished = []
        last = batch.is_last
        done = batch.reqs if last is None else []
        for i, (req, tok) in enumerate(zip(batch.reqs, next_ids)):
            if last is not None:
                if not last[i]:
                    self._cache_unfinished(req, batch.prefix_lens[i] + batch.extend_lens[i])
                    continue
                done.append(req)
            req.inflight -= 1
            req.append_token(tok, self.tokenizer)
            if req.finished_reason:
                self._cache_finished(req)
                finished.append(req)
                if req.in_running:
                    self.running.remove(req)
                continue
            self._cache_unfinished(req)
            if not req.in_running:
                self.running.append(req)
                req.in_running = True
        if done:
            self._stream_out(done)
        return finished

    def process_decode(self, batch: DecodeBatch, next_ids: list[int]) -> list[Req]:
        """Phase process, decode. SGLang ``process_batch_result_decode``: append each token
        (incremental detokenization, EOS / stop string / length checks), release finished
        requests (``cache_finished_req``: radix insert, free KV and the request slot), stream
        the batch's output (``send_pyobj``). A member that already finished in the previous
        batch (overlap overshoot) has its token discarded and this batch's KV slot freed.
        Returns the finished requests."""
        finished = []
        for i, (req, tok) in enumerate(zip(batch.reqs, next_ids)):
            if req.finished_reason:
                self.kv.free(batch.out_cache_loc[i:i + 1])
                continue
            req.inflight -= 1
            req.append_token(tok, self.tokenizer)
            if req.finished_reason:
                self._cache_finished(req)
                finished.append(req)
        if finished:
            done = set(map(id, finished))
            self.running = [r for r in self.running if id(r) not in done]
        self._stream_out(batch.reqs)
        return finished

    def _cache_unfinished(self, req: Req, upto: int | None = None) -> None:
        n = len(req.input_ids) if upto is None else upto
        key = req.input_ids if upto is None else req.input_ids[:n]
        kv = self.req_to_token[req.req_slot, :n]
        new_prefix = self.tree.insert(key, kv.copy())
        old = len(req.prefix_indices)
        if new_prefix > old:
            self.kv.free(kv[old:new_prefix].copy())
        indices, node = self.tree.match_prefix(key)
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
