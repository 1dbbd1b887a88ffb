"""The decode batch: ``update_running_batch`` (SGLang 0.5.23, ``managers/scheduler.py``) over the
running batch's aggregates: members (less, under overlap from 0.5.22 on, the requests that finish
by length in the in-flight batch), ``check_decode_mem`` against the free pages, the 0.5.22 skip,
retraction, the new-token-ratio decay, and the decode's KV allocation at scheduling time.

Retraction (:mod:`sim.engines.sglang.policy.retraction`) takes candidates in running-batch
order (SGLang breaks ties of its keep order by that order), renumbers the kept requests in keep
order (``filter_batch(keep_indices=...)`` reorders the batch) and appends the retracted ones to
the tail of the waiting queue in retraction order (``_add_request_to_queue``).
"""

from __future__ import annotations

from sim.engines.sglang.policy.retraction import AllocationFailed, retract_decode
from sim.model.batch import Batch, Req
from sim.model.costs import DECODE

DECODE_LOG_INTERVAL = 40  # ServerArgs.decode_log_interval: SGLang logs token usage every 40 decode batches


class ServerDied(Exception):
    """The modelled server process died (e.g. a KV allocation failure). ``reason`` says why;
    ``time_s`` is when (None: the time of the loop iteration that raised it)."""

    def __init__(self, reason: str, time_s: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.time_s = time_s


class DecodeMixin:
    """``update_running_batch`` over the state of :class:`sim.engines.sglang.policy.scheduler.Scheduler`."""

    def _compose_decode(self, g: int):
        """Members of decode batch ``g`` as aggregates: (n, warm-ups, sum_ctx, overshoot, excluded);
        with n 0 (every member excluded: no batch runs) the warm-ups and sum_ctx are not computed."""
        n, warm = self.n_running, self.n_running_warmup
        sum_ctx = self.ctx_offset + n * g
        overshoot: list[Req] = []
        excluded: list[Req] = []
        if self.last_processed_decode < g - 1:
            # overlap: batch g-1 is still in flight, its finishes are not yet known to the CPU
            leaving = self.finishing_at.get(g - 1, ())
            if self.exclude_length_finishes:  # v0.5.22: a request that finishes by length leaves before this batch
                excluded = [r for r in leaving if r.finish_by_length]
                overshoot = [r for r in leaving if not r.finish_by_length] if len(excluded) < len(leaving) else []
            else:
                overshoot = list(leaving)
            n -= len(excluded)
            if n:
                for r in excluded:
                    warm -= r.warmup
                    sum_ctx -= r.ctx_at_join() + g - r.join_seq
        return n, warm, sum_ctx, overshoot, excluded

    def _decode_batch(self) -> Batch | None:
        if self.n_running == 0:
            return None
        g = self.next_decode_seq
        n, warm, sum_ctx, overshoot, excluded = self._compose_decode(g)
        if excluded:
            self.batch_is_full = False  # the running batch shrank
        if n == 0:
            return None
        kv = self.kv
        need = self._page_demand(g, excluded) if excluded else self.demand.need(g)
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
        if self.n_running_grammar:  # the mask's rows: constrained members whose grammar goes on
            batch.num_grammar = (self.n_running_grammar - sum(r.grammar for r in excluded)
                                 - sum(r.grammar for r in overshoot))
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
        members = sorted((r for bucket in self.finishing_at.values() for r in bucket if id(r) not in skip),
                         key=lambda r: r.order)  # running-batch order
        flight = self.inflight_decode
        if self.lock_inflight and flight is not None and flight.decode_seq > self.last_processed_decode:
            # naive under overlap: members of the in-flight batch cannot be taken back
            locked = [r for r in members if r.join_seq <= flight.decode_seq]
            members = [r for r in members if r.join_seq > flight.decode_seq]
        else:
            locked = []
        try:
            retracted, aborted, ratio, kept = retract_decode(self, g, members, locked, self.kv.free_pages,
                                                             self.abort_last)
        except AllocationFailed as err:
            self.usage_at_failure = usage
            raise ServerDied(f"KV allocation failed: {err} (token usage {usage:.2f} at the check of decode "
                             f"batch {g}, pool {self.kv.size_tokens} tokens)") from None
        for req in kept:  # filter_batch(keep_indices=...): the batch is now in keep order
            req.order = self._next_order()
        self.waiting.extend(retracted)  # _add_request_to_queue: the tail, in retraction order
        self.batch_is_full = False
        self.retraction_events += 1
        self.retracted_reqs += len(retracted)
        self.new_token_ratio = ratio
