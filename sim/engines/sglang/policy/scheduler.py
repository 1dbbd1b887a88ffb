"""Scheduling policy: the scheduler's state and what goes into the next batch (no SimPy here).

Modelled on SGLang 0.5.23's ``Scheduler`` (``python/sglang/srt/managers/scheduler.py``):
``get_next_batch_to_run`` merges the last prefill into the running batch, then tries a new
prefill batch first (:mod:`~sim.engines.sglang.policy.admission`: FCFS, chunked prefill,
``max_running_requests``, the KV budget and its running offset), else runs a decode of the
whole running batch (:mod:`~sim.engines.sglang.policy.decode`: ``update_running_batch``).
``process_batch_result_*`` (:mod:`~sim.engines.sglang.policy.results`) delivers tokens,
detects finishes and frees KV. Each request carries the ``max_new_tokens`` the scheduler knows
and whether it is ``ignore_eos``; it finishes by length (foreseeably) when its output reaches
``max_new_tokens``, else on a sampled stop token (EOS) the scheduler learns of from the result.

Every step costs O(1) in the batch size: decode progress follows from decode sequence
numbers (see :class:`sim.model.batch.Req`); finishes are bucketed by the decode batch they
happen in; decode's page demand is counted by residue class (:mod:`~sim.engines.sglang.policy.kvpool`)
and the admission's running offset by join group (:mod:`~sim.engines.sglang.policy.reserve`).
Only the rare retraction path (:mod:`~sim.engines.sglang.policy.retraction`) walks the running batch.

KV pressure (``check_decode_mem``): a decode batch needs one new page for each member whose
private KV fills its last page. Under overlap the check for batch k runs before the KV of
requests finishing in k-1 is freed. ``server.retraction`` picks what happens then:
``naive`` (SGLang before 0.5.10, the incident of issue #14972): those requests stay in the
batch (an overshoot slot each); retraction as ``retract_decode``, except that under overlap it
cannot take back the members of the in-flight batch k-1 (a modelling assumption for the
pre-fix overlap + retraction path, see docs/model.md), and when what is left cannot fit the
allocation fails and the server dies. ``v0.5.10``: the same, but the last
request is aborted instead (PR #19881). ``v0.5.22``: requests finishing by length in k-1 are
left out of batch k (``_reqs_finishing_inflight``), and a step whose check fails while such
requests are in flight is skipped rather than retracting (``update_running_batch``).

Simplifications, stated: the radix cache is a per-request ``cached_len`` that is resident and
free (a matched prefix does not occupy the KV pool, and a finished request's KV is freed, not
kept as evictable cache: the same for admission, which counts evictable KV as free); a
retracted request's prompt is prefilled again in full; a request whose first (prefill) token is
a stop token is not given the overshoot decode slot SGLang's overlap loop gives it; the context
length does not cap ``max_new_tokens`` (only the KV pool does).
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import numpy as np

from sim.engines.sglang.policy.admission import AdmissionMixin
from sim.engines.sglang.policy.decode import ServerDied, DecodeMixin
from sim.engines.sglang.policy.kvpool import DecodePageDemand, KVPool
from sim.engines.sglang.policy.reserve import CLIP_MAX_NEW_TOKENS, RunningReserve
from sim.engines.sglang.policy.results import ResultsMixin
from sim.engines.sglang.policy.retraction import RetractionMixin
from sim.engines.sglang.server import Server
from sim.model.batch import RUNNING, Batch, Req
from sim.model.costs import EXTEND
from sim.model.workload import RequestSpecs

# NewTokenRatioTracker (0.5.22): min = init x SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, reached after
# SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS decode steps without retraction; reset when idle.
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600


# Arrivals within this of ``now`` count as arrived: phase times are sums of floats computed in
# different orders, and a request sent at the instant a token was delivered must not depend on
# rounding to be seen by the next recv.
TIME_EPS_S = 1e-9
LONE_ARRIVAL = True  # Scheduler.admit_lone_arrival takes its case (tests turn it off to compare)


class Scheduler(AdmissionMixin, DecodeMixin, ResultsMixin, RetractionMixin):
    """Scheduler state: inbox, waiting queue, running batch aggregates, KV pool (tokens).

    Args:
        specs: the requests' lengths.
        server: the server section of the scenario.
        warmup_requests: ids below this are warm-up (excluded from metrics).
        finish_by_length: True for ``finish: length`` (requests stop at ``max_new_tokens``:
            the scheduler knows when), False for ``eos`` (they stop on a sampled token before it);
            requests whose ``specs.max_new_tokens`` is given follow their own.
        recorder: receives finished requests and ITL samples (see :class:`sim.trace.recorder.TraceRecorder`).
        on_finish: called as ``on_finish(rid, time_s)`` when a request completes or fails.
        on_finish_all: called as ``on_finish_all(rids, time_s)`` for requests that finished
            together, in order: what ``on_finish`` of each does (None: ``on_finish`` of each).
        lookahead_policy: apply v0.5.22's handling of requests finishing in the in-flight batch
            (exclusion, skip). SGLang has it in ``event_loop_overlap`` only, not in
            ``event_loop_overlap_mlx``.
        deferred_results: the loop processes each result after scheduling the next batch
            (``event_loop_overlap``): the new-token ratio is reset only at the second idle
            iteration (``on_idle`` runs once the last result is processed).
        grammar: which requests carry a grammar (bool per request id; None: none); a decode
            batch then counts its constrained members in ``num_grammar``
            (:mod:`sim.engines.sglang.structured`).
    """

    def __init__(self, specs: RequestSpecs, server: Server, warmup_requests: int,
                 finish_by_length: bool, recorder, on_finish: Callable[[int, float], None],
                 lookahead_policy: bool = True, deferred_results: bool = False, grammar=None,
                 on_finish_all: Callable[[list[int], float], None] | None = None):
        self.specs = specs
        self.server = server
        self.warmup_requests = warmup_requests
        self.finish_by_length = finish_by_length
        self.recorder = recorder
        self.on_finish = on_finish
        self.on_finish_all = on_finish_all
        self.exclude_length_finishes = lookahead_policy and server.retraction == "v0.5.22"
        self.skip_when_finishing = lookahead_policy and server.retraction == "v0.5.22"
        self.abort_last = server.retraction in ("v0.5.10", "v0.5.22")
        self.lock_inflight = server.retraction == "naive"
        self.admission_rules = server.admission
        self.deferred_results = deferred_results
        self.reserve = RunningReserve(ignore_eos_at_full_ratio=server.admission == "v0.5.22")
        self.batch_is_full = False  # SGLang running_batch.batch_is_full: admission latched shut
        self.unmerged_finishers: list[Req] = []  # finish at their prefill, result not processed yet
        self._order = 0  # running-batch order (joins, and keep order after a retraction)
        self._chunk_in_last_prefill = False
        self._idle_calls = 0
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
        self.grammar = grammar
        self.n_running_grammar = 0  # running requests with a grammar
        # the lengths as memoryviews: an element read gives a Python int without numpy's scalar
        self._lengths = tuple(_view(a, np.int64) for a in (specs.input_len, specs.cached_len, specs.output_len))
        # the client's caps and ignore_eos flags the same way (None where the specs have none)
        self._caps = (_view(specs.max_new_tokens, np.int64), _view(specs.ignore_eos, np.bool_))

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

    def submit_range(self, first_rid: int, count: int, arrival_s: float) -> None:
        """:meth:`submit` of requests ``first_rid .. first_rid + count - 1``, in order, all at ``arrival_s``."""
        self.inbox.extend([(arrival_s, rid) for rid in range(first_rid, first_rid + count)])

    def next_arrival_s(self) -> float | None:
        """Arrival time of the earliest request not yet received, if one is known."""
        return self.inbox[0][0] if self.inbox else None

    def recv(self, now: float) -> int:
        """``recv_requests`` + ``process_input_requests``: move arrived requests to the waiting
        queue. Returns how many arrived.

        As ``init_req_max_new_tokens`` (0.5.23): ``max_new_tokens`` is clipped so that the prompt
        and the output fit the KV pool (``pool - ceil_p(input) - page - 1``); a request whose
        output would go beyond it stops there, by length. A prompt the pool cannot hold
        (``input >= pool - 6``, SGLang's ``max_req_input_len``) fails as ``too_long``. With a
        ``context_length`` (:meth:`_fit_context`), the tokenizer manager's and the scheduler's
        checks against it come first."""
        self.now = now
        horizon = now + TIME_EPS_S
        inbox = self.inbox
        if not inbox or inbox[0][0] > horizon:
            return 0  # nothing arrived (most iterations)
        n = 0
        s = self.specs
        kv = self.kv
        cap, page = kv.size_tokens, kv.page_size
        room = cap - page - 1  # the pool less a page and one token (SGLang's clip, with the prompt's pages)
        context = self.server.context_length
        by_length, grammar, waiting = self.finish_by_length, self.grammar, self.waiting
        input_len, cached_len, output_len = self._lengths
        warm = self.warmup_requests
        given_max, given_eos = self._caps
        plain = given_max is None and given_eos is None and grammar is None and context is None
        while inbox and inbox[0][0] <= horizon:
            arrival, rid = inbox.popleft()
            out = output_len[rid]
            req = Req(rid, arrival, input_len[rid], cached_len[rid], out, by_length, rid < warm)  # (new_req's, inline)
            if given_max is not None:
                max_new = given_max[rid]
            elif by_length:
                max_new = out
            else:  # a client without a cap on an EOS finish: SGLang's estimate
                max_new = out if out > CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS
            if plain:
                if not by_length:
                    req.ignore_eos = False  # (Req's default: True)
            else:
                req.ignore_eos = by_length if given_eos is None else given_eos[rid]
                if grammar is not None:
                    req.grammar = bool(grammar[rid])
                if context is not None:  # the max_new_tokens the client sends (none: the server's estimate)
                    sent = bool(s.max_new_sent[rid]) if s.max_new_sent is not None else (
                        given_max is not None or by_length)
                    max_new = self._fit_context(req, context, max_new, max_new if sent else None, cap)
            inp = req.input_len  # (as _fit_context left it)
            fit = room + (inp // -page) * page  # room - ceil_p(input)
            req.max_new_tokens = max_new = max_new if max_new < fit else fit
            if out > max_new:
                req.output_len = out = max_new
            req.finish_by_length = out >= max_new
            if inp >= cap - 6 or max_new < 1:
                self._fail(req, now, "too_long")
            else:
                waiting.append(req)
            n += 1
        return n

    def new_req(self, rid: int, arrival_s: float) -> Req:
        """Request ``rid`` as it reaches the server at ``arrival_s``: its lengths from the specs."""
        input_len, cached_len, output_len = self._lengths
        return Req(rid, arrival_s, input_len[rid], cached_len[rid], output_len[rid], self.finish_by_length,
                   rid < self.warmup_requests)

    def _fit_context(self, req: Req, context: int, max_new: int, asked: int | None, cap: int) -> int:
        """``server.context_length`` applied to an arriving request, as SGLang 0.5.23 applies
        ``--context-length``; returns its ``max_new_tokens`` (0: it fails as ``too_long``).

        ``TokenizerManager._validate_one_request`` (``managers/tokenizer_manager.py``): a prompt of
        ``context`` tokens or more, or one whose prompt and the ``max_new_tokens`` the client sent
        (``asked``) exceed ``context``, is answered with an error; with ``allow_auto_truncate`` the
        prompt is cut to ``context`` tokens and ``max_new_tokens`` to what is left. Then the
        scheduler (``TpModelWorker.get_worker_info``: ``max_req_len = min(context - 1, pool - 1)``,
        ``max_req_input_len = max_req_len - 5``; ``validate_input_length``): a prompt of
        ``max_req_input_len`` or more is refused (cut to it with auto-truncate), and
        ``max_new_tokens`` is clipped to ``max_req_len - input - 1``. A cut prompt keeps its cached
        prefix up to its last token; a request cut to no new token is priced as one (a prefill-only
        request is not modelled, as for ``output_len`` 0)."""
        truncate = self.server.allow_auto_truncate
        if req.input_len >= context or (asked is not None and req.input_len + asked > context):
            if not truncate:
                return 0
            req.input_len = min(req.input_len, context)
            max_new = min(max_new, max(0, context - req.input_len))
        max_req_len = min(context - 1, cap - 1)
        if req.input_len >= max_req_len - 5:
            if not truncate or max_req_len - 5 < 1:
                return 0
            req.input_len = max_req_len - 5
        req.cached_len = min(req.cached_len, req.input_len - 1)
        max_new = min(max_new, max_req_len - req.input_len - 1)
        return max(1, max_new) if truncate else max(0, max_new)

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
        if self.pending_merge or self._chunk_in_last_prefill:  # else merging changes nothing
            self._merge_prefilled()
        batch = self._new_prefill_batch()
        if batch is None:
            batch = self._decode_batch()
        if batch is None and self.n_running == 0 and not self.has_queued_work:
            self._idle_calls += 1
            if self._idle_calls > self.deferred_results:  # on_idle: NewTokenRatioTracker.reset
                self.new_token_ratio = self.init_ratio
        else:
            self._idle_calls = 0
        return batch

    def admit_lone_arrival(self, now: float) -> Batch | None:
        """``recv_requests`` and ``get_next_batch_to_run`` at ``now`` where they reduce to one
        plain request arriving at an empty waiting queue and admitted whole into a prefill batch of
        its own (an open loop below capacity, most arrivals): the same state and batch as
        :meth:`Scheduler.recv` then :meth:`Scheduler.get_next_batch` give, without the general
        pass. Returns that batch, or None where anything else could happen: another request due,
        requests waiting, a chunk pending, admission latched shut or the running batch full, a
        grammar or a context length, a prompt the pool cannot hold, a prompt the chunk budget
        cuts, or a KV pool where the running batch's reserve could refuse it. Nothing has changed
        then but, possibly, the last prefill's merge into the running batch, which
        ``get_next_batch_to_run`` makes first whatever it schedules and which neither reads nor
        changes what ``recv_requests`` does. The reserve is not summed: each running request
        reserves at most ``CLIP_MAX_NEW_TOKENS`` times the larger of 1 and the new-token ratio
        (:meth:`sim.engines.sglang.policy.reserve.RunningReserve.total`), so a pool with room for the request beyond that bound
        admits it, and is not latched full after it, whatever the reserve is."""
        if not LONE_ARRIVAL:
            return None
        inbox, srv, kv = self.inbox, self.server, self.kv
        horizon = now + TIME_EPS_S
        if (not inbox or inbox[0][0] > horizon or (len(inbox) > 1 and inbox[1][0] <= horizon) or self.waiting
                or self.chunked_req is not None or self.grammar is not None or srv.context_length is not None):
            return None
        arrival, rid = inbox[0]
        input_len, cached_len, output_len = self._lengths
        inp, out, by_length = input_len[rid], output_len[rid], self.finish_by_length
        cap, page, clip = kv.size_tokens, kv.page_size, CLIP_MAX_NEW_TOKENS
        given_max, given_eos = self._caps
        if given_max is not None:  # (Scheduler.recv's max_new_tokens)
            max_new = given_max[rid]
        else:
            max_new = out if by_length or out > clip else clip
        fit = cap - page - 1 + (inp // -page) * page
        max_new = max_new if max_new < fit else fit
        if inp >= cap - 6 or max_new < 1 or srv.max_prefill_tokens <= 0:
            return None  # (it fails: recv's path)
        cached = cached_len[rid]
        prefix = (cached if cached < inp - 1 else inp - 1) // page * page  # init_next_round_input
        extend = inp - prefix
        whole = -(-extend // page) * page
        chunk = srv.chunked_prefill_size
        if chunk > 0 and whole > chunk:
            return None  # chunked: the general pass
        if self.pending_merge or self._chunk_in_last_prefill:  # get_next_batch_to_run merges the last prefill
            self._merge_prefilled()  # first, whatever it then schedules (recv neither reads nor changes it)
        running = self.n_running + len(self.unmerged_finishers)
        if (self.batch_is_full and self.n_running) or running >= srv.max_running_requests:
            return None
        future = max_new if max_new < clip else clip
        per_req = page if self.admission_rules == "v0.5.22" else 0
        bound = running * clip * (self.new_token_ratio if self.new_token_ratio > 1.0 else 1.0)
        kv_free = kv.free_pages * page
        if not (extend + future + per_req + 1 < kv_free - bound
                and kv_free - whole - (bound + per_req + future) > 1):
            return None
        # --- recv: the request reaches the waiting queue (Scheduler.recv's plain case) ----------
        inbox.popleft()
        self.now = now
        req = Req(rid, arrival, inp, cached, out, by_length, rid < self.warmup_requests)
        if given_max is None and given_eos is None:
            if not by_length:
                req.ignore_eos = False
        else:
            req.ignore_eos = by_length if given_eos is None else given_eos[rid]
        req.max_new_tokens = max_new
        if out > max_new:
            req.output_len = out = max_new
        req.finish_by_length = out >= max_new
        # --- get_next_batch_to_run: the pass admits it whole (_admit_whole_prompts' case) -------
        if self.n_running == 0:
            self.batch_is_full = False
        req.prefill_target = inp
        req.shared_len = prefix
        req.prefix_len = inp
        req.kv_held = extend
        finishes = 1 >= out
        (self.unmerged_finishers if finishes else self.pending_merge).append(req)
        kv.alloc(whole // page)
        batch = Batch(self._take_seq(), EXTEND, 1, extend, inp, num_warmup=0 + req.warmup,
                      chunks=[(req, extend, True, finishes, 0)], attn_pairs=extend * inp)
        batch.kv_used_after_alloc = kv.used_pages * page
        self._idle_calls = 0
        return batch

    def _merge_prefilled(self) -> None:
        """The last prefill batch joins the running batch (``get_next_batch_to_run``). SGLang's
        latch is cleared when the prefill batch replaces an empty running batch (a new batch
        object) or when it shrank on merging (a chunk that is not the last)."""
        if (self.pending_merge and self.n_running == 0) or self._chunk_in_last_prefill:
            self.batch_is_full = False
        self._chunk_in_last_prefill = False
        g = self.next_decode_seq
        joining = self.pending_merge
        finishing_at = self.finishing_at
        warm = grammar = ctx = finish = 0
        order = self._order
        at = bucket = None  # the last finish step's bucket (a group joining together mostly shares one)
        for r in joining:
            r.output_done = done = r.output_done + 1  # the prefill sampled one token
            r.status = RUNNING
            r.join_seq = g
            r.finish_seq = f = g + (r.output_len - done) - 1
            r.kv_base = r.prefill_target - r.shared_len
            warm += r.warmup
            grammar += r.grammar
            ctx += r.input_len + done - g  # (Req.ctx_at_join)
            finish += f
            if f != at:
                at, bucket = f, finishing_at.setdefault(f, [])
            bucket.append(r)
            order += 1  # (_next_order)
            r.order = order
        self._order = order
        self.n_running += len(joining)
        self.n_running_warmup += warm
        self.n_running_grammar += grammar
        self.ctx_offset += ctx
        self.finish_sum += finish
        self.demand.add_all(joining)
        self.reserve.add_all(joining)
        self.fresh.extend(joining)
        joining.clear()

    def _next_order(self) -> int:
        self._order += 1
        return self._order

    def _take_seq(self) -> int:
        seq = self.next_step_seq
        self.next_step_seq = seq + 1
        return seq


def _view(values, dtype):
    """``values`` (a per-request array, or None) as a memoryview of ``dtype``: an element read gives
    a Python int or bool without numpy's scalar."""
    return None if values is None else memoryview(np.ascontiguousarray(values, dtype=dtype))
