"""Applying a batch's results: ``process_batch_result_{prefill,decode}`` (token delivery,
finishes, KV free) and the failure paths (server died, could not connect), mixed into
:class:`sim.engines.sglang.policy.scheduler.Scheduler`. O(1) per decode step in the batch size except for finishes."""

from __future__ import annotations

from sim.model.batch import FAILED, FINISHED, RUNNING, Batch, Req
from sim.model.costs import DECODE


class ResultsMixin:
    """Result processing over the scheduler state of :class:`sim.engines.sglang.policy.scheduler.Scheduler`."""

    def process_batch_result(self, batch: Batch, deliver_s: float) -> int:
        """Apply a batch's results as ``process_batch_result_{prefill,decode}`` does; tokens reach
        the client at ``deliver_s``. Returns the number of requests that finished."""
        if batch.kind == DECODE:
            return self._process_decode(batch, deliver_s)
        return self._process_prefill(batch, deliver_s)

    def _process_prefill(self, batch: Batch, t: float) -> int:
        done = 0
        rec = self.recorder
        joined = []  # overlap: requests merged into the running batch before this result
        for req, _take, last, finishes, retractions in batch.chunks:
            if not last or req.retractions != retractions or req.status == FAILED:
                continue  # a chunk, or a request retracted/aborted while the prefill was in flight
            if req.first_token_s != req.first_token_s:  # NaN: first token of the request
                req.first_token_s = t
            elif not req.warmup:
                rec.itl(t - req.last_token_s, 1)
            req.last_token_s = t
            if req.status == RUNNING:  # overlap: merged into the running batch before this result
                joined.append(req)
            req.delivered += 1
            if finishes:
                req.output_done += 1
                self.kv.free(self.kv.pages(req.kv_held))
                self.unmerged_finishers.remove(req)
                self.batch_is_full = False  # it left the running batch SGLang merged it into
                self._complete(req, t)
                done += 1
        if joined:
            self.reserve.delivered_all(joined)
        return done

    def _process_decode(self, batch: Batch, t: float) -> int:
        g = batch.decode_seq
        finished = self.deliver_decode(g, batch.num_reqs, batch.num_warmup, batch.fresh, batch.overshoot,
                                       batch.dropped, t)
        if batch.overshoot_pages:  # the extra slot of each overshoot member, if not yet freed
            self.kv.free(batch.overshoot_pages)
        nxt = self.inflight_decode
        if nxt is not None and nxt.decode_seq == g + 1 and nxt.overshoot_pages:
            # SGLang releases the slot the finished requests took in the next (in-flight) batch now
            self.kv.free(nxt.overshoot_pages)
            nxt.overshoot_pages = 0
        batch.finished = finished
        return finished

    def deliver_decode(self, g: int, num_reqs: int, num_warmup: int, fresh: list[Req], overshoot: list[Req],
                       dropped: list[Req], t: float) -> int:
        """The tokens of decode batch ``g`` (``num_reqs`` members, ``num_warmup`` of them warm-up;
        ``fresh``: members fresh from a prefill, ``overshoot``: members that finished in the batch
        before, their token discarded, ``dropped``: members retracted or aborted in flight) reach
        the clients at ``t``: its finished requests leave, one ITL sample per fresh member and one
        for the members that go on. Returns how many finished. (Its KV slots are
        :meth:`_process_decode`'s.)"""
        finished = self.finishing_at.pop(g, None)
        if not (finished or fresh or overshoot or dropped):  # (most decodes: every member goes on)
            if num_reqs > num_warmup:
                self.recorder.itl(t - self.last_decode_delivery_s, num_reqs - num_warmup)
            self.last_processed_decode = g
            self.last_decode_delivery_s = t
            return 0
        rec = self.recorder
        if finished:
            self.leave_decoded(finished, g, t)
        warm_fresh = 0
        if fresh:
            samples = []  # one per measured fresh member, in batch order
            for req in fresh:
                if req.warmup:
                    warm_fresh += 1
                elif not (dropped and req in dropped):
                    samples.append(t - req.last_token_s)
            if samples:
                rec.itl_once_each(samples)
        warm_over = sum(r.warmup for r in overshoot) if overshoot else 0
        continuing = num_reqs - len(overshoot) - len(fresh)
        measured = continuing - (num_warmup - warm_over - warm_fresh)
        if dropped:
            measured -= sum(1 for r in dropped if not r.warmup and r not in fresh)
        if measured > 0:
            rec.itl(t - self.last_decode_delivery_s, measured)
        self.last_processed_decode = g
        self.last_decode_delivery_s = t
        return len(finished) if finished else 0

    def leave_decoded(self, finished: list[Req], g: int, t: float) -> None:
        """Requests whose last token came in decode batch ``g`` leave the running batch at ``t``:
        their KV freed, their clients told (``process_batch_result_decode``'s finish path). The
        running batch's aggregates drop by the group's sums (one update each, not one per
        request); then each request is settled in batch order."""
        self.batch_is_full = False  # requests left the running batch
        self.reserve.remove_all(finished)
        self.demand.remove_all(finished)
        page = self.kv.page_size
        warm = grammar = ctx = finish = freed = 0
        for req in finished:
            warm += req.warmup
            grammar += req.grammar
            ctx += req.input_len + req.output_done - req.join_seq  # (Req.ctx_at_join)
            finish += req.finish_seq
            freed -= (req.kv_base + (g - req.join_seq + 1)) // -page  # KVPool.pages
            req.output_done = req.output_len
        self.n_running -= len(finished)
        self.n_running_warmup -= warm
        self.n_running_grammar -= grammar
        self.ctx_offset -= ctx
        self.finish_sum -= finish
        self.kv.free(freed)
        self._settle_all(finished, t)

    def _complete(self, req: Req, t: float) -> None:
        self._settle(req, t, FINISHED)

    def _fail(self, req: Req, t: float, failure: str) -> None:
        req.failure = failure
        self._settle(req, t, FAILED)

    def _settle(self, req: Req, t: float, status) -> None:
        """The request leaves the server at ``t`` with ``status``: recorded, its client told."""
        req.status = status
        req.finish_s = t
        self.num_done += 1
        self.recorder.request(req)
        self.on_finish(req.rid, t)

    def _settle_all(self, reqs: list[Req], t: float) -> None:
        """:meth:`_settle` of each of ``reqs`` (finished, in order) at ``t``: all recorded, then
        each client told in turn."""
        rids = []
        for req in reqs:
            req.status = FINISHED
            req.finish_s = t
            rids.append(req.rid)
        self.recorder.requests_finished(reqs)
        self.num_done += len(reqs)
        if self.on_finish_all is not None:
            self.on_finish_all(rids, t)
        else:
            on_finish = self.on_finish
            for rid in rids:
                on_finish(rid, t)

    def fail_all(self, t: float) -> int:
        """The server died at ``t``: every request it holds (queued, prefilling, running) fails.
        Requests that arrive later are failed by :meth:`reject_arrivals`. Returns how many failed."""
        live: dict[int, Req] = {}
        # (unmerged_finishers: requests that finish at their prefill, the prefill's result not yet processed)
        for req in list(self.waiting) + self.pending_merge + self.unmerged_finishers + [self.chunked_req]:
            if req is not None:
                live[req.rid] = req
        for reqs in self.finishing_at.values():
            for req in reqs:
                live[req.rid] = req
        self.waiting.clear()
        self.pending_merge.clear()
        self.unmerged_finishers.clear()
        self.finishing_at.clear()
        self.chunked_req = None
        self.n_running = self.n_running_warmup = self.n_running_grammar = self.ctx_offset = self.finish_sum = 0
        failed = [r for r in live.values() if r.status not in (FINISHED, FAILED)]
        for req in failed:
            self._fail(req, t, "cut_off")
        return len(failed)

    def reject_arrivals(self, now: float) -> int:
        """After the server died: requests arriving by ``now`` cannot connect and fail."""
        n = 0
        while self.inbox and self.inbox[0][0] <= now:
            arrival, rid = self.inbox.popleft()
            self._fail(self.new_req(rid, arrival), arrival, "could_not_connect")
            n += 1
        return n
