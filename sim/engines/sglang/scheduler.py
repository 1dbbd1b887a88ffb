"""Scheduling policy: the scheduler's state and what goes into the next batch (no SimPy here).

Modelled on SGLang's ``Scheduler`` (python/sglang/srt/managers/scheduler.py, 0.5.x):
``get_next_batch_to_run`` merges the last prefill into the running batch, then tries a new
prefill batch first (``get_new_batch_prefill`` with ``PrefillAdder``: FCFS, chunked prefill,
``max_running_requests``, KV admission with ``new_token_ratio`` reserve), else runs a decode
of the whole running batch (``update_running_batch``). ``process_batch_result_*`` delivers
tokens, detects finishes and frees KV.

Every step costs O(1) in the batch size: decode progress follows from decode sequence
numbers (see :class:`sim.model.batch.Req`); finishes are bucketed by the decode batch they happen in;
decode's page demand is counted by residue class (:mod:`sim.engines.sglang.kvpool`). Only the rare retraction
path (:mod:`sim.engines.sglang.retraction`) walks the running batch.

KV pressure (``check_decode_mem``): a decode batch needs one new page for each member whose
private KV fills its last page. Under overlap the check for batch k runs before the KV of
requests finishing in k-1 is freed. ``server.retraction`` picks what happens then:
``naive`` (SGLang before 0.5.10, the incident of issue #14972): those requests stay in the
batch (an overshoot slot each); retraction as ``retract_decode``, except that under overlap it
cannot take back the members of the in-flight batch k-1 (a modelling assumption for the
pre-fix overlap + retraction path, see the README), and when what is left cannot fit the
allocation fails and the server dies. ``v0.5.10``: the same, but the last
request is aborted instead (PR #19881). ``v0.5.22``: requests finishing by length in k-1 are
left out of batch k (``_reqs_finishing_inflight``), and a step whose check fails while such
requests are in flight is skipped rather than retracting (``update_running_batch``).
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from sim.engines.sglang.kvpool import DecodePageDemand, KVPool
from sim.engines.sglang.results import ResultsMixin
from sim.engines.sglang.retraction import AllocationFailed, RetractionMixin, retract_decode
from sim.engines.sglang.server import Server
from sim.model.batch import RUNNING, Batch, Req
from sim.model.costs import DECODE, EXTEND
from sim.model.workload import RequestSpecs

# NewTokenRatioTracker (0.5.22): min = init x SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, reached after
# SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS decode steps without retraction; reset when idle.
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
DECODE_LOG_INTERVAL = 40  # ServerArgs.decode_log_interval: SGLang logs token usage every 40 decode batches
NEW_TOKEN_RATIO_DECAY_STEPS = 600


# Arrivals within this of ``now`` count as arrived: phase times are sums of floats computed in
# different orders, and a request sent at the instant a token was delivered must not depend on
# rounding to be seen by the next recv.
TIME_EPS_S = 1e-9


class ServerDied(Exception):
    """The modelled server process died (e.g. a KV allocation failure). ``reason`` says why;
    ``time_s`` is when (None: the time of the loop iteration that raised it)."""

    def __init__(self, reason: str, time_s: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.time_s = time_s


class Scheduler(ResultsMixin, RetractionMixin):
    """Scheduler state: inbox, waiting queue, running batch aggregates, KV pool (tokens).

    Args:
        specs: the requests' lengths.
        server: the server section of the scenario.
        warmup_requests: ids below this are warm-up (excluded from metrics).
        finish_by_length: True for ``finish: length`` (the scheduler knows when a request will
            stop), False for ``eos`` (it learns only when it reads the sampled token).
        recorder: receives finished requests and ITL samples (see :class:`sim.trace.recorder.TraceRecorder`).
        on_finish: called as ``on_finish(rid, time_s)`` when a request completes or fails.
        lookahead_policy: apply v0.5.22's handling of requests finishing in the in-flight batch
            (exclusion, skip). SGLang has it in ``event_loop_overlap`` only, not in
            ``event_loop_overlap_mlx``.
    """

    def __init__(self, specs: RequestSpecs, server: Server, warmup_requests: int,
                 finish_by_length: bool, recorder, on_finish: Callable[[int, float], None],
                 lookahead_policy: bool = True):
        self.specs = specs
        self.server = server
        self.warmup_requests = warmup_requests
        self.finish_by_length = finish_by_length
        self.recorder = recorder
        self.on_finish = on_finish
        self.exclude_length_finishes = lookahead_policy and server.retraction == "v0.5.22"
        self.skip_when_finishing = lookahead_policy and server.retraction == "v0.5.22"
        self.abort_last = server.retraction in ("v0.5.10", "v0.5.22")
        self.lock_inflight = server.retraction == "naive"
        self.last_logged_usage = float("nan")  # token usage of the last logged decode batch
        self.kv = KVPool(server.kv_pool_tokens, server.page_size)
        self.demand = DecodePageDemand(server.page_size)
        self.init_ratio = server.init_new_token_ratio
        self.new_token_ratio = self.init_ratio
        self.min_ratio = self.init_ratio * MIN_NEW_TOKEN_RATIO_FACTOR
        self.ratio_decay = (self.init_ratio - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.retraction_events = 0  # steps that retracted
        self.retracted_reqs = 0  # requests retracted, summed over events
        self.reprefill_tokens = 0  # prefill tokens computed again for retracted requests
        self.skipped_decodes = 0  # v0.5.22 steps skipped instead of retracting
        self.aborted = 0
        self.usage_at_failure = float("nan")
        self.now = 0.0  # the scheduler's clock, as of the last recv
        self.inflight_decode: Batch | None = None
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
        self.next_step_seq = 0
        self.num_done = 0
        self.num_requests = len(specs)

    @property
    def kv_used(self) -> int:
        """Allocated KV tokens (page-rounded)."""
        return self.kv.used_tokens

    @property
    def kv_peak(self) -> int:
        return self.kv.peak_tokens

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
        self.now = now
        horizon = now + TIME_EPS_S
        while self.inbox and self.inbox[0][0] <= horizon:
            arrival, rid = self.inbox.popleft()
            req = Req(rid, arrival, int(s.input_len[rid]), int(s.cached_len[rid]), int(s.output_len[rid]),
                      self.finish_by_length, rid < self.warmup_requests)
            if self.kv.pages(req.input_len + req.output_len) > self.kv.total_pages:
                self._fail(req, now, "too_long")
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
        if batch is None and self.n_running == 0 and not self.has_queued_work:
            self.new_token_ratio = self.init_ratio  # idle: NewTokenRatioTracker.reset
        return batch

    def _merge_prefilled(self) -> None:
        g = self.next_decode_seq
        for r in self.pending_merge:
            r.output_done += 1  # the prefill sampled one token
            r.status = RUNNING
            r.join_seq = g
            r.finish_seq = g + (r.output_len - r.output_done) - 1
            r.kv_base = r.prefill_target - r.shared_len
            self.demand.add(r.kv_base, g)
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
        kv, page = self.kv, self.kv.page_size
        budget = srv.chunked_prefill_size
        kv_free = kv.free_pages * page
        reserve = self.new_token_ratio * self._running_remaining_tokens
        chunks: list = []
        num_tokens = sum_ctx = warm = pages = 0

        def add(req: Req, take: int) -> None:
            nonlocal budget, kv_free, num_tokens, sum_ctx, warm, pages
            grow = kv.grow(req.prefix_len - req.shared_len, take)
            req.prefix_len += take
            last = req.prefix_len == req.prefill_target
            finishes = last and req.output_done + 1 >= req.output_len
            chunks.append((req, take, last, finishes, req.retractions))
            budget -= take
            kv_free -= grow * page
            pages += grow
            num_tokens += take
            sum_ctx += req.prefix_len
            warm += req.warmup
            if req.retractions:
                self.reprefill_tokens += take
            if last:
                self.chunked_req = None
                if not finishes:
                    self.pending_merge.append(req)
            else:
                self.chunked_req = req

        if self.chunked_req is not None:
            req = self.chunked_req
            held = req.prefix_len - req.shared_len
            room = kv_free + kv.pages(held) * page - held  # free pages plus the slack of its last page
            take = min(req.prefill_target - req.prefix_len, budget, room)
            if take <= 0:
                return None
            add(req, take)
        while self.waiting and budget > 0 and self.n_running + len(chunks) < srv.max_running_requests \
                and self.chunked_req is None:
            req = self.waiting[0]
            if req.prefill_target == 0:  # radix prefix match on (re)admission, whole pages only
                req.prefill_target = req.input_len + req.output_done
                req.shared_len = min(req.cached_len - req.cached_len % page, req.prefill_target - 1)
                req.prefix_len = req.shared_len
            need = kv.pages(req.prefill_target - req.prefix_len) * page
            future = self.new_token_ratio * (req.output_len - req.output_done - 1)
            alone = self.n_running == 0 and not chunks and not self.pending_merge
            if need + future > kv_free - reserve and not (alone and need <= kv_free):
                break  # (with nothing running, a prompt that fits is admitted: no reserve to keep)
            reserve += future
            self.waiting.popleft()
            add(req, min(req.prefill_target - req.prefix_len, budget))
        if not chunks:
            return None
        kv.alloc(pages)
        batch = Batch(self._take_seq(), EXTEND, len(chunks), num_tokens, sum_ctx, num_warmup=warm, chunks=chunks)
        batch.kv_used_after_alloc = kv.used_tokens
        return batch

    def _compose_decode(self, g: int):
        """Members of decode batch ``g`` as aggregates: (n, warm-ups, sum_ctx, overshoot, excluded)."""
        n, warm = self.n_running, self.n_running_warmup
        sum_ctx = self.ctx_offset + n * g
        overshoot: list[Req] = []
        excluded: list[Req] = []
        if self.last_processed_decode < g - 1:
            # overlap: batch g-1 is still in flight, its finishes are not yet known to the CPU
            for r in self.finishing_at.get(g - 1, ()):
                if r.finish_by_length and self.exclude_length_finishes:
                    excluded.append(r)  # v0.5.22: a request that finishes by length leaves before this batch
                    n -= 1
                    warm -= r.warmup
                    sum_ctx -= r.ctx_at_join() + g - r.join_seq
                else:
                    overshoot.append(r)
        return n, warm, sum_ctx, overshoot, excluded

    def _decode_batch(self) -> Batch | None:
        if self.n_running == 0:
            return None
        g = self.next_decode_seq
        n, warm, sum_ctx, overshoot, excluded = self._compose_decode(g)
        if n == 0:
            return None
        kv = self.kv
        need = self._page_demand(g, excluded)
        if need > kv.total_pages - kv.used_pages:  # check_decode_mem failed
            if excluded and self.skip_when_finishing:
                self.skipped_decodes += 1  # v0.5.22: the in-flight result frees their KV first
                return None
            self._retract(g, excluded)
            n, warm, sum_ctx, overshoot, excluded = self._compose_decode(g)
            if n == 0:
                return None
            need = self._page_demand(g, excluded)
        elif self.new_token_ratio > self.min_ratio:
            self.new_token_ratio = max(self.new_token_ratio - self.ratio_decay, self.min_ratio)
        kv.alloc(need)
        if g % DECODE_LOG_INTERVAL == 0:
            self.last_logged_usage = kv.usage()
        self.next_decode_seq = g + 1
        batch = Batch(self._take_seq(), DECODE, n, n, sum_ctx, decode_seq=g, num_warmup=warm,
                      fresh=self.fresh, overshoot=overshoot)
        if overshoot:
            batch.overshoot_pages = sum(self.needs_page(r, g) for r in overshoot)
        batch.kv_used_after_alloc = kv.used_pages * kv.page_size
        self.fresh = []
        self.inflight_decode = batch
        return batch

    def _page_demand(self, g: int, excluded: list[Req]) -> int:
        need = self.demand.need(g)
        if excluded:
            need -= sum(self.needs_page(r, g) for r in excluded)
        return need

    def _retract(self, g: int, excluded: list[Req]) -> None:
        """``retract_decode`` for batch ``g`` (rare path, O(n log n)).

        Raises:
            ServerDied: the last request cannot fit and the policy does not abort it.
        """
        usage = self.kv.usage()
        skip = {id(r) for r in excluded}
        members = [r for bucket in self.finishing_at.values() for r in bucket if id(r) not in skip]
        flight = self.inflight_decode
        if self.lock_inflight and flight is not None and flight.decode_seq > self.last_processed_decode:
            # naive under overlap: members of the in-flight batch cannot be taken back
            locked = [r for r in members if r.join_seq <= flight.decode_seq]
            members = [r for r in members if r.join_seq > flight.decode_seq]
        else:
            locked = []
        try:
            retracted, aborted, ratio = retract_decode(self, g, members, locked, self.kv.free_pages,
                                                       self.abort_last)
        except AllocationFailed as err:
            self.usage_at_failure = usage
            raise ServerDied(f"KV allocation failed: {err} (token usage {usage:.2f} at the check of decode "
                             f"batch {g}, pool {self.kv.size_tokens} tokens)") from None
        for req in sorted(retracted, key=lambda r: r.arrival_s, reverse=True):
            self.waiting.appendleft(req)  # back to the waiting queue, ahead of later arrivals
        self.retraction_events += 1
        self.retracted_reqs += len(retracted)
        self.new_token_ratio = ratio

    def _take_seq(self) -> int:
        self.next_step_seq += 1
        return self.next_step_seq - 1
