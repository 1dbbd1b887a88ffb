"""Scheduling policy: the scheduler's state and what goes into the next batch (no SimPy here).

Modelled on SGLang's ``Scheduler`` (python/sglang/srt/managers/scheduler.py, 0.5.x):
``get_next_batch_to_run`` merges the last prefill into the running batch, then tries a new
prefill batch first (``get_new_batch_prefill`` with ``PrefillAdder``: FCFS, chunked prefill,
``max_running_requests``, KV admission with ``new_token_ratio`` reserve), else runs a decode
of the whole running batch (``update_running_batch``). ``process_batch_result_*`` delivers
tokens, detects finishes and frees KV.

Every step costs O(1) in the batch size: decode progress follows from decode sequence
numbers (see :class:`sim.batch.Req`); finishes are bucketed by the decode batch they happen in.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from sim.batch import FAILED, FINISHED, RUNNING, Batch, Req
from sim.costs import DECODE, EXTEND
from sim.scenario import Server
from sim.workload import RequestSpecs


# Arrivals within this of ``now`` count as arrived: phase times are sums of floats computed in
# different orders, and a request sent at the instant a token was delivered must not depend on
# rounding to be seen by the next recv.
TIME_EPS_S = 1e-9


class ServerDied(Exception):
    """The modelled server process died (e.g. a KV allocation failure). ``reason`` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Scheduler:
    """Scheduler state: inbox, waiting queue, running batch aggregates, KV pool (tokens).

    Args:
        specs: the requests' lengths.
        server: the server section of the scenario.
        warmup_requests: ids below this are warm-up (excluded from metrics).
        finish_by_length: True for ``finish: length`` (the scheduler knows when a request will
            stop), False for ``eos`` (it learns only when it reads the sampled token).
        recorder: receives finished requests and ITL samples (see :class:`sim.trace.TraceRecorder`).
        on_finish: called as ``on_finish(rid, time_s)`` when a request completes or fails.
    """

    def __init__(self, specs: RequestSpecs, server: Server, warmup_requests: int,
                 finish_by_length: bool, recorder, on_finish: Callable[[int, float], None]):
        self.specs = specs
        self.server = server
        self.warmup_requests = warmup_requests
        self.finish_by_length = finish_by_length
        self.recorder = recorder
        self.on_finish = on_finish
        self.exclude_length_finishes = server.retraction == "v0.5.22"
        self.inbox: deque = deque()  # (arrival_s, rid), non-decreasing arrival_s
        self.waiting: deque[Req] = deque()
        self.chunked_req: Req | None = None
        self.pending_merge: list[Req] = []  # last prefill chunk launched, not yet in the running batch
        # running batch, as aggregates
        self.n_running = 0
        self.n_running_warmup = 0
        self.ctx_offset = 0  # sum over running of ctx_at_join - join_seq
        self.finish_sum = 0  # sum over running of finish_seq
        self.finishing_at: dict[int, list[Req]] = {}
        self.fresh: list[Req] = []
        self.next_decode_seq = 0
        self.last_processed_decode = -1
        self.last_decode_delivery_s = 0.0
        self.kv_used = 0
        self.kv_peak = 0
        self.next_step_seq = 0
        self.num_done = 0
        self.num_requests = len(specs)

    # --- input ---------------------------------------------------------------------------
    def submit(self, rid: int, arrival_s: float) -> None:
        """A request reaches the server's socket at ``arrival_s`` (seconds)."""
        self.inbox.append((arrival_s, rid))

    def next_arrival_s(self) -> float | None:
        """Arrival time of the earliest request not yet received, if one is known."""
        return self.inbox[0][0] if self.inbox else None

    def recv(self, now: float) -> int:
        """``recv_requests`` + ``process_input_requests``: move arrived requests to the waiting
        queue. Returns how many arrived. A request that can never fit the KV pool is aborted."""
        n = 0
        s = self.specs
        horizon = now + TIME_EPS_S
        while self.inbox and self.inbox[0][0] <= horizon:
            arrival, rid = self.inbox.popleft()
            req = Req(rid, arrival, int(s.input_len[rid]), int(s.cached_len[rid]), int(s.output_len[rid]),
                      self.finish_by_length, rid < self.warmup_requests)
            if req.input_len + req.output_len > self.server.kv_pool_tokens:
                self._fail(req, now)
            else:
                self.waiting.append(req)
            n += 1
        return n

    @property
    def all_done(self) -> bool:
        return self.num_done >= self.num_requests

    @property
    def has_queued_work(self) -> bool:
        """Requests are waiting for a prefill (new, chunked or retracted)."""
        return bool(self.waiting) or self.chunked_req is not None

    # --- get_next_batch_to_run --------------------------------------------------------------
    def get_next_batch(self) -> Batch | None:
        """The next batch to run, prefill first (SGLang ``get_next_batch_to_run``), or None."""
        self._merge_prefilled()
        batch = self._new_prefill_batch()
        if batch is None:
            batch = self._decode_batch()
        return batch

    def _merge_prefilled(self) -> None:
        g = self.next_decode_seq
        for r in self.pending_merge:
            r.output_done += 1  # the prefill sampled one token
            r.status = RUNNING
            r.join_seq = g
            r.finish_seq = g + (r.output_len - r.output_done) - 1
            r.kv_base = r.prefill_target - r.cached_len
            self.n_running += 1
            self.n_running_warmup += r.warmup
            self.ctx_offset += r.ctx_at_join() - g
            self.finish_sum += r.finish_seq
            self.finishing_at.setdefault(r.finish_seq, []).append(r)
            self.fresh.append(r)
        self.pending_merge.clear()

    @property
    def _running_remaining_tokens(self) -> int:
        # tokens the running batch will still allocate from the next decode batch on
        return self.finish_sum - self.n_running * (self.next_decode_seq - 1)

    def _new_prefill_batch(self) -> Batch | None:
        srv = self.server
        if not self.has_queued_work:
            return None
        budget = srv.chunked_prefill_size
        kv_free = srv.kv_pool_tokens - self.kv_used
        reserve = srv.init_new_token_ratio * self._running_remaining_tokens
        chunks: list = []
        num_tokens = sum_ctx = warm = 0

        def add(req: Req, take: int) -> None:
            nonlocal budget, kv_free, num_tokens, sum_ctx, warm
            req.prefix_len += take
            last = req.prefix_len == req.prefill_target
            finishes = last and req.output_done + 1 >= req.output_len
            chunks.append((req, take, last, finishes))
            budget -= take
            kv_free -= take
            num_tokens += take
            sum_ctx += req.prefix_len
            warm += req.warmup
            if last:
                self.chunked_req = None
                if not finishes:
                    self.pending_merge.append(req)
            else:
                self.chunked_req = req

        if self.chunked_req is not None:
            req = self.chunked_req
            take = min(req.prefill_target - req.prefix_len, budget, kv_free)
            if take <= 0:
                return None
            add(req, take)
        while self.waiting and budget > 0 and self.n_running + len(chunks) < srv.max_running_requests \
                and self.chunked_req is None:
            req = self.waiting[0]
            if req.prefill_target == 0:  # radix prefix match on first admission
                req.prefill_target = req.input_len + req.output_done
                req.prefix_len = min(req.cached_len, req.prefill_target - 1)
            need = req.prefill_target - req.prefix_len
            future = srv.init_new_token_ratio * (req.output_len - req.output_done - 1)
            if need + future > kv_free - reserve:
                break
            reserve += future
            self.waiting.popleft()
            add(req, min(need, budget))
        if not chunks:
            return None
        self.kv_used += num_tokens
        self.kv_peak = max(self.kv_peak, self.kv_used)
        batch = Batch(self._take_seq(), EXTEND, len(chunks), num_tokens, sum_ctx, num_warmup=warm, chunks=chunks)
        batch.kv_used_after_alloc = self.kv_used
        return batch

    def _decode_batch(self) -> Batch | None:
        if self.n_running == 0:
            return None
        g = self.next_decode_seq
        n, warm = self.n_running, self.n_running_warmup
        sum_ctx = self.ctx_offset + n * g
        overshoot: list[Req] = []
        if self.last_processed_decode < g - 1:
            # overlap: batch g-1 is still in flight, its finishes are not yet known to the CPU
            for r in self.finishing_at.get(g - 1, ()):
                if r.finish_by_length and self.exclude_length_finishes:
                    n -= 1  # v0.5.22: a request that finishes by length leaves before this batch
                    warm -= r.warmup
                    sum_ctx -= r.ctx_at_join() + g - r.join_seq
                else:
                    overshoot.append(r)
        if n == 0:
            return None
        self._check_decode_mem(n)
        self.kv_used += n
        self.kv_peak = max(self.kv_peak, self.kv_used)
        self.next_decode_seq = g + 1
        batch = Batch(self._take_seq(), DECODE, n, n, sum_ctx, decode_seq=g, num_warmup=warm,
                      fresh=self.fresh, overshoot=overshoot)
        batch.kv_used_after_alloc = self.kv_used
        self.fresh = []
        return batch

    def _check_decode_mem(self, num_slots: int) -> None:
        """SGLang ``check_decode_mem``: the decode needs one free KV slot per request.

        Raises:
            ServerDied: the pool cannot hold the batch's new tokens (allocation failure).
        """
        if self.server.kv_pool_tokens - self.kv_used < num_slots:
            raise ServerDied(
                f"KV allocation failed: decode needs {num_slots} slots, "
                f"{self.server.kv_pool_tokens - self.kv_used} free "
                f"(token usage {self.kv_used / self.server.kv_pool_tokens:.2f})")

    def _take_seq(self) -> int:
        self.next_step_seq += 1
        return self.next_step_seq - 1

    # --- process_batch_result -------------------------------------------------------------
    def process_batch_result(self, batch: Batch, deliver_s: float) -> int:
        """Apply a batch's results as ``process_batch_result_{prefill,decode}`` does; tokens reach
        the client at ``deliver_s``. Returns the number of requests that finished."""
        if batch.kind == DECODE:
            return self._process_decode(batch, deliver_s)
        return self._process_prefill(batch, deliver_s)

    def _process_prefill(self, batch: Batch, t: float) -> int:
        done = 0
        rec = self.recorder
        for req, _take, last, finishes in batch.chunks:
            if not last:
                continue
            if req.first_token_s != req.first_token_s:  # NaN: first token of the request
                req.first_token_s = t
            elif not req.warmup:
                rec.itl(t - req.last_token_s, 1)
            req.last_token_s = t
            if finishes:
                req.output_done += 1
                self.kv_used -= req.prefill_target - req.cached_len
                self._complete(req, t)
                done += 1
        return done

    def _process_decode(self, batch: Batch, t: float) -> int:
        g = batch.decode_seq
        rec = self.recorder
        finished = self.finishing_at.pop(g, [])
        for req in finished:
            self.n_running -= 1
            self.n_running_warmup -= req.warmup
            self.ctx_offset -= req.ctx_at_join() - req.join_seq
            self.finish_sum -= req.finish_seq
            self.kv_used -= req.kv_base + (g - req.join_seq + 1)
            req.output_done = req.output_len
            self._complete(req, t)
        self.kv_used -= len(batch.overshoot)  # the extra slot of each overshoot member
        warm_fresh = 0
        for req in batch.fresh:
            warm_fresh += req.warmup
            if not req.warmup:
                rec.itl(t - req.last_token_s, 1)
        warm_over = sum(r.warmup for r in batch.overshoot)
        continuing = batch.num_reqs - len(batch.overshoot) - len(batch.fresh)
        measured = continuing - (batch.num_warmup - warm_over - warm_fresh)
        if measured > 0:
            rec.itl(t - self.last_decode_delivery_s, measured)
        self.last_processed_decode = g
        self.last_decode_delivery_s = t
        batch.finished = len(finished)
        return len(finished)

    def _complete(self, req: Req, t: float) -> None:
        req.status = FINISHED
        req.finish_s = t
        self.num_done += 1
        self.recorder.request(req)
        self.on_finish(req.rid, t)

    def _fail(self, req: Req, t: float) -> None:
        req.status = FAILED
        req.finish_s = t
        self.num_done += 1
        self.recorder.request(req)
        self.on_finish(req.rid, t)

    def fail_all(self, t: float) -> int:
        """The server died at ``t``: every request it holds (queued, prefilling, running) fails.
        Requests that arrive later are failed by :meth:`reject_arrivals`. Returns how many failed."""
        live: dict[int, Req] = {}
        for req in list(self.waiting) + self.pending_merge + [self.chunked_req]:
            if req is not None:
                live[req.rid] = req
        for reqs in self.finishing_at.values():
            for req in reqs:
                live[req.rid] = req
        self.waiting.clear()
        self.pending_merge.clear()
        self.finishing_at.clear()
        self.chunked_req = None
        self.n_running = self.n_running_warmup = self.ctx_offset = self.finish_sum = 0
        failed = [r for r in live.values() if r.status not in (FINISHED, FAILED)]
        for req in failed:
            self._fail(req, t)
        return len(failed)

    def reject_arrivals(self, now: float) -> int:
        """After the server died: requests arriving by ``now`` cannot connect and fail."""
        n = 0
        s = self.specs
        while self.inbox and self.inbox[0][0] <= now:
            arrival, rid = self.inbox.popleft()
            self._fail(Req(rid, arrival, int(s.input_len[rid]), int(s.cached_len[rid]), int(s.output_len[rid]),
                           self.finish_by_length, rid < self.warmup_requests), arrival)
            n += 1
        return n
