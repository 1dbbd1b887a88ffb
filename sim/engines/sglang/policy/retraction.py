"""Decode retraction under KV pressure: SGLang's ``retract_decode`` and the new_token_ratio
update after it (the rare path; O(n log n) in the running batch, nothing per step).

Sources (PyPI wheels): ``ScheduleBatch.retract_decode`` and ``_get_decode_retraction_order``
(0.5.4, 0.5.22): requests are kept in order of output length (longest first; for equal
output, shortest input first) and retracted from the other end, one at a time, until the
decode fits; at least one request is always kept. Retracted requests release their KV (not
inserted into the radix cache) and go back to the waiting queue, to be prefilled again with
their input and the output so far. Afterwards ``new_token_ratio`` becomes
min(1, (decoded tokens + SGLANG_RETRACT_DECODE_STEPS x kept) / (sum of max_new_tokens + 1))
over the kept requests (``estimate_new_token_ratio_after_retract``). When even the last
request cannot fit: before PR #19881 the allocation fails and the scheduler dies (0.5.4
asserts); from it on (seen in 0.5.10) the last request is aborted instead.
"""

from __future__ import annotations

from sim.model.batch import WAITING, Req

RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS


class AllocationFailed(Exception):
    """Retraction could not make room for the last request and the policy does not abort it."""


def keep_order(running: list[Req], known: dict[int, int]) -> list[Req]:
    """Running requests from most to least preferred to keep (SGLang
    ``_get_decode_retraction_order``): longest output first, then shortest input; ties keep the
    order of ``running`` (Python's sort is stable with ``reverse=True``, as SGLang's is).
    ``known`` maps ``id(req)`` to its committed output tokens."""
    return sorted(running, key=lambda r: (known[id(r)], -r.input_len), reverse=True)


def ratio_after_retract(kept: list[Req], known: dict[int, int]) -> float:
    """``new_token_ratio`` after a retraction, from the requests kept in the batch
    (``estimate_new_token_ratio_after_retract``: over their ``max_new_tokens``)."""
    decoded = sum(known[id(r)] for r in kept)
    max_new = sum(r.max_new_tokens for r in kept)
    return min(1.0, (decoded + RETRACT_DECODE_STEPS * len(kept)) / (max_new + 1))


def retract_decode(sched, g: int, candidates: list[Req], locked: list[Req], free_pages: int, abort_last: bool):
    """Retract requests from decode batch ``g`` until its page demand fits ``free_pages``.

    Args:
        sched: the :class:`sim.engines.sglang.policy.scheduler.Scheduler` (provides ``committed_output``,
            ``needs_page``, ``release`` and ``abort``).
        g: the decode batch being built.
        candidates: the requests of batch ``g`` that may be retracted.
        locked: members of batch ``g`` that cannot be retracted (they count towards the demand
            and towards the request that is always kept).
        free_pages: free pages in the KV pool before retraction.
        abort_last: abort the last request when it alone does not fit (PR #19881) instead
            of failing the allocation.

    Returns:
        (retracted requests in retraction order, the aborted request or None, new_token_ratio,
        the kept candidates in keep order).

    Raises:
        AllocationFailed: the last request does not fit and ``abort_last`` is False.
    """
    known = {id(r): sched.committed_output(r) for r in candidates}
    kept = keep_order(candidates, known)
    need = sum(1 for r in kept if sched.needs_page(r, g)) + sum(1 for r in locked if sched.needs_page(r, g))
    retracted: list[Req] = []
    min_kept = 0 if locked else 1  # SGLang always keeps one request of the batch
    while need > free_pages and len(kept) > min_kept:
        req = kept.pop()
        need -= sched.needs_page(req, g)
        free_pages += sched.release(req, g, known[id(req)])
        retracted.append(req)
    aborted = None
    if need > free_pages:
        if not abort_last or not kept:
            left = len(kept) + len(locked)
            raise AllocationFailed(f"decode batch needs {need} page(s) for the {left} request(s) it cannot "
                                   f"retract, {free_pages} free")
        aborted = kept.pop()
        sched.release(aborted, g, known[id(aborted)])
        sched.abort(aborted)
    known.update((id(r), sched.committed_output(r)) for r in locked)
    return retracted, aborted, ratio_after_retract(kept + locked, known), kept


class RetractionMixin:
    """The scheduler's side of :func:`retract_decode` (mixed into :class:`sim.engines.sglang.policy.scheduler.Scheduler`)."""

    def needs_page(self, req: Req, g: int) -> bool:
        """Whether running ``req`` takes a new KV page in decode batch ``g``."""
        return self.demand.member_needs(req.kv_base, req.join_seq, g)

    def committed_output(self, req: Req) -> int:
        """Output tokens of a running request whose results were processed (``len(output_ids)``)."""
        return req.delivered + max(0, self.last_processed_decode - req.join_seq + 1)

    def release(self, req: Req, g: int, committed: int) -> int:
        """Take ``req`` out of the running batch before decode batch ``g`` and free its KV (not
        cached); it returns to WAITING with ``committed`` output tokens. Returns pages freed."""
        self.reserve.remove(req)
        self.n_running -= 1
        self.n_running_warmup -= req.warmup
        self.n_running_grammar -= req.grammar
        self.ctx_offset -= req.ctx_at_join() - req.join_seq
        self.finish_sum -= req.finish_seq
        self.finishing_at[req.finish_seq].remove(req)
        self.demand.remove(req.kv_base, req.join_seq)
        if req in self.fresh:
            self.fresh.remove(req)
        flight = self.inflight_decode
        pages = self.kv.pages(req.kv_base + (g - req.join_seq))
        if flight is not None and flight.decode_seq > self.last_processed_decode and req.join_seq <= flight.decode_seq:
            flight.dropped.append(req)  # its token from the in-flight batch is discarded
        self.kv.free(pages)
        req.status = WAITING
        req.output_done = req.delivered = committed
        req.prefill_target = req.prefix_len = req.kv_held = 0
        req.join_seq = req.finish_seq = -1
        req.retractions += 1
        return pages

    def abort(self, req: Req) -> None:
        """Abort a released request (PR #19881: out of memory even alone)."""
        self.aborted += 1
        self._fail(req, self.now, "aborted")
