"""Prefill admission: which waiting requests (and which chunk of the chunked one) go into the
next prefill batch. SGLang 0.5.23 ``Scheduler._get_new_batch_prefill_raw``
(``managers/scheduler.py``) with ``PrefillAdder`` (``managers/schedule_policy.py``) and its
memory budget (``mem_cache/prefill_budget.py``), in the default configuration (FCFS, radix
cache on, chunked prefill on, no mixed chunk):

- ``batch_is_full`` latches admission shut after the running count reached
  ``max_running_requests`` or a request did not fit; only a request leaving the running batch
  (or an empty running batch) opens it again. Meanwhile only a continuing chunk runs.
- The continuing chunk of a chunked request comes first: ``min(rest of its prompt, chunk budget,
  free KV - running offset)``, or the chunk budget when that is <= 0; it is never refused.
- Then the waiting queue, in order (FCFS: never sorted; head-of-line blocking): a request is
  admitted iff ``rest of its prompt + min(max_new - output, 4096) + page < free KV - offsets``
  (strict), where the offsets are the running batch's (:mod:`sim.engines.sglang.policy.reserve`)
  plus, per request admitted in this pass, a page and its ``min(max_new, 4096)`` (nothing for a
  request being chunked; the last chunk of a chunked request reserves it). A request whose
  prompt exceeds the chunk budget is chunked, its chunk ending on a page boundary. The pass
  stops at the first request that does not fit, when a budget (``chunked_prefill_size``, none when it
  is <= 0: chunked prefill off, SGLang's ``rem_chunk_tokens`` None,
  ``max_prefill_tokens``) is spent, or when an admission leaves no room.
- The radix-cache prefix a request reuses is ``floor_p(min(cached_len, prompt - 1))``.

Releases before 0.5.22 (``server.admission: v0.5.4``, checked in the 0.5.4 and 0.5.10 wheels)
weight every running request by the ratio (``ignore_eos`` gets no full reservation) and
reserve no page per request.
"""

from __future__ import annotations

import math

from sim.model.batch import Batch, Req
from sim.model.costs import EXTEND

from sim.engines.sglang.policy.reserve import CLIP_MAX_NEW_TOKENS


class AdmissionMixin:
    """``get_new_batch_prefill`` over the state of :class:`sim.engines.sglang.policy.scheduler.Scheduler`."""

    def _new_prefill_batch(self) -> Batch | None:
        if self.n_running == 0:
            self.batch_is_full = False  # an empty running batch has nobody left to leave
        if (self.batch_is_full or not self.waiting) and self.chunked_req is None:
            return None
        srv, kv = self.server, self.kv
        page = kv.page_size
        running = self.n_running + len(self.unmerged_finishers)
        if running >= srv.max_running_requests and self.chunked_req is None:
            self.batch_is_full = True
            return None
        chunk = srv.chunked_prefill_size if srv.chunked_prefill_size > 0 else math.inf  # <= 0: chunked prefill off
        p = _Pass(self, kv.free_pages * page, self._running_offset(), chunk, srv.max_prefill_tokens)
        if self.chunked_req is not None:
            req = self.chunked_req
            room = int(p.kv_free - p.reserve)
            take = min(req.prefill_target - req.prefix_len, p.budget, room if room > 0 else p.budget)
            take = min(take, p.kv_free + kv.pages(req.kv_held) * page - req.kv_held)  # where SGLang would run out of memory
            if take <= 0:
                return None
            p.add(req, take)
        p.admit_waiting(running)
        return p.batch()

    def _running_offset(self) -> float:
        """The running batch's reserve, plus under overlap the requests whose prefill finishes
        them but whose result is not processed yet (SGLang merged them into the running batch)."""
        out = self.reserve.total(self.new_token_ratio, self.last_processed_decode, self.next_decode_seq)
        for r in self.unmerged_finishers:
            w = 1.0 if r.ignore_eos and self.reserve.full_ratio_for_ignore_eos else self.new_token_ratio
            out += w * min(r.max_new_tokens, CLIP_MAX_NEW_TOKENS)
        return out


class _Pass:
    """One admission pass: its budgets and the chunks admitted so far."""

    def __init__(self, sched, kv_free: int, reserve: float, budget: int, rem_input: int):
        self.s = sched
        self.kv_free, self.reserve, self.budget, self.rem_input = kv_free, reserve, budget, rem_input
        self.per_req = sched.kv.page_size if sched.admission_rules == "v0.5.22" else 0
        self.chunks: list = []
        self.pages = self.num_tokens = self.sum_ctx = self.warm = self.attn_pairs = 0

    def add(self, req: Req, take: int) -> None:
        """Admit ``take`` tokens of ``req``'s prompt: a page, and for the chunk that ends the
        prompt ``min(max_new_tokens, 4096)`` of output (not less the output so far: SGLang's
        ``_select_prefill_admission`` reserves the full budget even for a retracted request)."""
        s, kv = self.s, self.s.kv
        grow = kv.grow(req.kv_held, take)
        req.prefix_len += take
        req.kv_held += take
        last = req.prefix_len == req.prefill_target
        finishes = last and req.output_done + 1 >= req.output_len
        self.chunks.append((req, take, last, finishes, req.retractions))
        whole_pages = kv.ceil(take)
        self.budget -= whole_pages
        self.rem_input -= whole_pages
        self.kv_free -= grow * kv.page_size
        self.pages += grow
        self.num_tokens += take
        self.sum_ctx += req.prefix_len
        self.attn_pairs += take * req.prefix_len  # each new token attends the prefix and the chunk
        self.warm += req.warmup
        self.reserve += self.per_req + (min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS) if last else 0)
        if req.retractions:
            s.reprefill_tokens += take
        if last:
            s.chunked_req = None
            if finishes:
                s.unmerged_finishers.append(req)
            else:
                s.pending_merge.append(req)
        else:
            s.chunked_req = req
            s._chunk_in_last_prefill = True

    def admit_waiting(self, running: int) -> None:
        """The FCFS pass over the waiting queue (``get_new_batch_prefill``'s loop over
        ``waiting_queue`` with ``PrefillAdder.add_one_req``): each request admitted in order while
        it fits, chunked where its prompt exceeds the chunk budget, until one does not fit or a
        budget is spent. Whole prompts go through :meth:`_admit_whole_prompts`, a chunk through
        :meth:`add`. ``running``: the running batch's requests, unmerged finishers included."""
        while True:
            chunk = self._admit_whole_prompts(running)
            if chunk is None:
                return
            self.s.waiting.popleft()
            self.add(*chunk)
            if self.kv_free - self.reserve <= 0:  # this admission used up the room: the next one cannot fit
                self.s.batch_is_full = True
                return

    def _admit_whole_prompts(self, running: int) -> tuple[Req, int] | None:
        """Admit waiting requests whose whole (rest of the) prompt fits the chunk budget, in order,
        as :meth:`add` admits each (its rule for a last chunk, with the pass's budgets in locals,
        written back once); the radix-cache prefix of a new request is matched first
        (``init_next_round_input``: the prompt, plus the output so far after a retraction, and
        whole pages of at most prompt - 1 from the cache). Returns the first request to chunk
        and its chunk (ending on a page boundary), still at the queue's head, or None when the pass
        ends (a request that does not fit, the running batch full, a budget spent)."""
        s = self.s
        kv, waiting, chunks = s.kv, s.waiting, self.chunks
        page, clip, per_req = kv.page_size, CLIP_MAX_NEW_TOKENS, self.per_req
        kv_free, reserve, budget, rem_input = self.kv_free, self.reserve, self.budget, self.rem_input
        pages = num_tokens = sum_ctx = attn_pairs = warm = 0
        pending_merge, unmerged = s.pending_merge, s.unmerged_finishers
        slots = s.server.max_running_requests - running  # admissions before the running batch is full
        chunk_open = s.chunked_req is not None
        chunk = None
        while waiting and budget > 0 and rem_input > 0 and not s.batch_is_full:
            if len(chunks) >= slots:
                s.batch_is_full = True
                break
            req = waiting[0]
            target, done = req.prefill_target, req.output_done
            if target == 0:  # init_next_round_input
                req.prefill_target = target = req.input_len + done
                cached = req.cached_len if req.cached_len < target - 1 else target - 1
                req.prefix_len = req.shared_len = prefix = cached // page * page
                req.kv_held = held = 0
            else:
                held, prefix = req.kv_held, req.prefix_len
            extend = target - prefix
            max_new = req.max_new_tokens
            future = max_new - done
            future = clip if future > clip else (0 if future < 0 else future)
            if extend + future + per_req >= kv_free - reserve:
                s.batch_is_full = bool(chunks) or s.n_running > 0
                break
            whole = -(-extend // page) * page
            if whole > budget:  # chunked: the chunk ends on a page boundary
                take = kv.floor(prefix + kv.floor(budget)) - prefix
                chunk = (req, take) if take > 0 else None
                break
            waiting.popleft()
            grow = whole // page if held == 0 else -(-(held + extend) // page) - -(-held // page)
            prefix += extend
            req.prefix_len = prefix
            req.kv_held = held + extend
            finishes = done + 1 >= req.output_len
            chunks.append((req, extend, True, finishes, req.retractions))
            budget -= whole
            rem_input -= whole
            kv_free -= grow * page
            pages += grow
            num_tokens += extend
            sum_ctx += prefix
            attn_pairs += extend * prefix
            warm += req.warmup
            reserve += per_req + (max_new if max_new < clip else clip)
            if req.retractions:
                s.reprefill_tokens += extend
            if chunk_open:  # the request chunked before is done with (add's rule for a last chunk)
                s.chunked_req = None
                chunk_open = False
            (unmerged if finishes else pending_merge).append(req)
            if kv_free - reserve <= 0:  # this admission used up the room: the next one cannot fit
                s.batch_is_full = True
                break
        self.kv_free, self.reserve, self.budget, self.rem_input = kv_free, reserve, budget, rem_input
        self.pages += pages
        self.num_tokens += num_tokens
        self.sum_ctx += sum_ctx
        self.attn_pairs += attn_pairs
        self.warm += warm
        return chunk

    def batch(self) -> Batch | None:
        if not self.chunks:
            return None
        s = self.s
        s.kv.alloc(self.pages)
        batch = Batch(s._take_seq(), EXTEND, len(self.chunks), self.num_tokens, self.sum_ctx, num_warmup=self.warm,
                      chunks=self.chunks, attn_pairs=self.attn_pairs)
        if s.grammar is not None:  # the mask's rows: every constrained request of the prefill
            batch.num_grammar = sum(c[0].grammar for c in self.chunks)
        batch.kv_used_after_alloc = s.kv.used_tokens
        return batch
