"""SGLang 0.5.23's prefill admission in the policy: hand-computable cases first, then the running
offset's O(1) aggregates against a brute-force sum, under hypothesis."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.engines.sglang.policy.reserve import CLIP_MAX_NEW_TOKENS
from sim.engines.sglang.policy.scheduler import Scheduler
from sim.engines.sglang.server import Server
from sim.model.costs import DECODE
from sim.model.workload import RequestSpecs
from sim.trace.recorder import TraceRecorder


def _scheduler(lengths, pool=1000, page=1, ignore_eos=True, max_new=None, ratio=0.7, admission="v0.5.22",
               max_running=64, chunk=8192, deferred=False):
    """A scheduler over requests [(input_len, output_len), ...] (no cached prefix)."""
    n = len(lengths)
    inp = np.array([a for a, _ in lengths], dtype=np.int64)
    out = np.array([b for _, b in lengths], dtype=np.int64)
    specs = RequestSpecs(inp, np.zeros(n, dtype=np.int64), out, None,
                         out if max_new is None else np.array(max_new, dtype=np.int64), np.full(n, ignore_eos))
    server = Server(kv_pool_tokens=pool, page_size=page, init_new_token_ratio=ratio, admission=admission,
                    max_running_requests=max_running, chunked_prefill_size=chunk)
    return Scheduler(specs, server, 0, True, TraceRecorder(), lambda rid, t: None, deferred_results=deferred)


def _admitted(batch):
    return [(c[0].rid, c[1]) for c in batch.chunks] if batch is not None else []


def test_new_request_reserves_its_whole_output_and_a_page():
    # pool 100: A = 40 + 20 + 1 page = 61 < 100 -> admitted; A then holds 40 and reserves 1 + 20
    # B = 30 + 20 + 1 = 51 < 100 - 40 - 21 = 39? no: B waits (and the latch shuts admission)
    s = _scheduler([(40, 20), (30, 20)], pool=100)
    for rid in (0, 1):
        s.submit(rid, 0.0)
    s.recv(0.0)
    assert _admitted(s.get_next_batch()) == [(0, 40)]
    assert s.batch_is_full and [r.rid for r in s.waiting] == [1]


def test_the_check_is_strict_and_the_page_counts():
    # pool 100: A = 10 + 5 + 1 = 16 admitted; left: 100 - 10 (A's prompt) - (1 + 5) = 84.
    # B = 40 + 43 + 1 = 84 is not < 84: it waits; with 42 output tokens it fits.
    for out, admitted in ((43, False), (42, True)):
        s = _scheduler([(10, 5), (40, out)], pool=100)
        for rid in (0, 1):
            s.submit(rid, 0.0)
        s.recv(0.0)
        assert _admitted(s.get_next_batch()) == [(0, 10)] + ([(1, 40)] if admitted else [])
    # the 0.5.4-era rules reserve no page: 40 + 43 = 83 < 100 - 10 - 5 = 85 admits B
    s = _scheduler([(10, 5), (40, 43)], pool=100, admission="v0.5.4")
    for rid in (0, 1):
        s.submit(rid, 0.0)
    s.recv(0.0)
    assert _admitted(s.get_next_batch()) == [(0, 10), (1, 40)]


def test_running_ignore_eos_requests_are_reserved_in_full_others_by_the_ratio():
    # A (40 in, 20 out) has run one decode: it holds 41 tokens and has committed 2, so 18 remain.
    # B (30 in, 20 out) needs 30 + 20 + 1 page = 51 < 110 - 41 - offset. ignore_eos: offset 18,
    # 51 < 51 fails; otherwise the offset is 18 x ratio (0.7 less one decay step): B is admitted.
    for ignore_eos in (True, False):
        s = _scheduler([(40, 20), (30, 20)], pool=110, ignore_eos=ignore_eos)
        s.submit(0, 0.0)
        s.recv(0.0)
        s.process_batch_result(s.get_next_batch(), 0.1)  # normal loop: the prefill's token is delivered
        s.process_batch_result(s.get_next_batch(), 0.2)  # decode 0
        offset = s.reserve.total(s.new_token_ratio, s.last_processed_decode, s.next_decode_seq)
        assert offset == pytest.approx(18.0 if ignore_eos else 18.0 * s.new_token_ratio)
        assert s.new_token_ratio == pytest.approx(0.7 - (0.7 - 0.098) / 600)
        s.submit(1, 0.3)
        s.recv(0.3)
        batch = s.get_next_batch()
        assert _admitted(batch) == ([] if ignore_eos else [(1, 30)])


def test_a_long_output_is_clipped_in_the_offset():
    s = _scheduler([(10, 6000)], pool=100_000, ignore_eos=True)
    s.submit(0, 0.0)
    s.recv(0.0)
    s.process_batch_result(s.get_next_batch(), 0.1)
    s.get_next_batch()  # merges it into the running batch (and schedules decode 0)
    assert s.reserve.total(1.0, s.last_processed_decode, s.next_decode_seq) == CLIP_MAX_NEW_TOKENS


def test_a_prompt_longer_than_the_chunk_budget_is_chunked_on_page_boundaries():
    # page 16, budget 100: the first chunk ends at 96 (floor to a page), the next continues from there
    s = _scheduler([(250, 4)], pool=4096, page=16, chunk=100)
    s.submit(0, 0.0)
    s.recv(0.0)
    b1 = s.get_next_batch()
    assert _admitted(b1) == [(0, 96)] and s.chunked_req is not None
    s.process_batch_result(b1, 0.1)
    b2 = s.get_next_batch()  # a continuing chunk is not page-aligned: min(rest, budget)
    assert _admitted(b2) == [(0, 100)]


def test_arrival_clips_max_new_tokens_to_the_pool():
    # pool 64, page 1: max_new <= 64 - 40 - 1 - 1 = 22, so a 50-token answer stops at 22, by length
    s = _scheduler([(40, 50)], pool=64)
    s.submit(0, 0.0)
    s.recv(0.0)
    req = s.waiting[0]
    assert (req.max_new_tokens, req.output_len, req.finish_by_length) == (22, 22, True)
    # a prompt the pool cannot hold fails as too_long
    s = _scheduler([(60, 5)], pool=64)
    s.submit(0, 0.0)
    s.recv(0.0)
    assert not s.waiting and s.num_done == 1


def _brute_offset(s: Scheduler) -> float:
    total = 0.0
    for bucket in s.finishing_at.values():
        for r in bucket:
            w = 1.0 if r.ignore_eos and s.reserve.full_ratio_for_ignore_eos else s.new_token_ratio
            total += w * min(r.max_new_tokens - s.committed_output(r), CLIP_MAX_NEW_TOKENS)
    return total


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 80)), min_size=1, max_size=10),
       ignore=st.lists(st.booleans(), min_size=10, max_size=10), overlap=st.booleans(),
       pool=st.integers(200, 2000), admission=st.sampled_from(["v0.5.4", "v0.5.22"]))
def test_the_running_offset_equals_the_sum_over_the_running_batch(lengths, ignore, overlap, pool, admission):
    n = len(lengths)
    s = _scheduler(lengths, pool=pool, admission=admission, deferred=overlap, ignore_eos=np.array(ignore[:n]))
    for rid in range(n):
        s.submit(rid, float(rid))
    last = None
    for k in range(20_000):  # admission may serialize the requests: up to ~sum of outputs steps
        s.recv(float(k))
        batch = s.get_next_batch()
        assert s.reserve.total(s.new_token_ratio, s.last_processed_decode, s.next_decode_seq) == \
            pytest.approx(_brute_offset(s), abs=1e-6)
        if overlap:
            if last is not None:
                s.process_batch_result(last, k + 0.5)
            last = batch
        elif batch is not None:
            s.process_batch_result(batch, k + 0.5)
        if s.all_done and last is None:
            break
    assert s.all_done


def test_arrival_without_given_caps_takes_the_finish_modes_budget_and_eos_flag():
    # specs without max_new_tokens / ignore_eos (what a scenario's workload gives): a length finish
    # is ignore_eos with max_new_tokens = output_len; an EOS finish is not ignore_eos, and its
    # max_new_tokens is SGLang's estimate max(output_len, 4096), clipped to the pool (10,000 - 1 -
    # 1 - 40 = 9,958 at page 1)
    for by_length, ignore_eos, max_new in ((True, True, 50), (False, False, 4096)):
        specs = RequestSpecs(np.array([40]), np.array([0]), np.array([50]), None)
        server = Server(kv_pool_tokens=10_000, page_size=1)
        s = Scheduler(specs, server, 0, by_length, TraceRecorder(), lambda rid, t: None)
        s.submit(0, 0.0)
        s.recv(0.0)
        req = s.waiting[0]
        assert (req.ignore_eos, req.max_new_tokens, req.output_len) == (ignore_eos, max_new, 50)
        # and the admission's running offset weighs it so: 1.0 (ignore_eos) or the ratio
        s.process_batch_result(s.get_next_batch(), 0.1)
        s.get_next_batch()
        offset = s.reserve.total(0.5, s.last_processed_decode, s.next_decode_seq)
        assert offset == pytest.approx(49.0 if ignore_eos else 0.5 * 4095)


def _reference_pass(s: Scheduler, running: int, p) -> None:
    """The FCFS loop over the waiting queue one request at a time through ``_Pass.add``, the
    radix-cache prefix matched as ``init_next_round_input`` does (the loop ``admit_waiting``
    performs with its budgets in locals), kept here as the reference."""
    kv, srv = s.kv, s.server
    while s.waiting and p.budget > 0 and p.rem_input > 0:
        if running + len(p.chunks) >= srv.max_running_requests:
            s.batch_is_full = True
        if s.batch_is_full:
            break
        req = s.waiting[0]
        if req.prefill_target == 0:  # init_next_round_input
            req.prefill_target = req.input_len + req.output_done
            req.shared_len = kv.floor(min(req.cached_len, req.prefill_target - 1))
            req.prefix_len = req.shared_len
            req.kv_held = 0
        extend = req.prefill_target - req.prefix_len
        future = min(max(req.max_new_tokens - req.output_done, 0), CLIP_MAX_NEW_TOKENS)
        if extend + future + p.per_req >= p.kv_free - p.reserve:
            s.batch_is_full = bool(p.chunks) or s.n_running > 0
            break
        take = extend
        if kv.ceil(extend) > p.budget:
            take = kv.floor(req.prefix_len + kv.floor(p.budget)) - req.prefix_len
            if take <= 0:
                break
        s.waiting.popleft()
        p.add(req, take)
        if p.kv_free - p.reserve <= 0:
            s.batch_is_full = True
            break


def _state(s: Scheduler, batch) -> tuple:
    chunks = [] if batch is None else [(c[0].rid, c[1], c[2], c[3], c[4]) for c in batch.chunks]
    reqs = sorted((r.rid, r.prefix_len, r.kv_held, r.prefill_target, r.shared_len)
                  for r in list(s.waiting) + s.pending_merge + s.unmerged_finishers)
    totals = None if batch is None else (batch.num_reqs, batch.num_tokens, batch.sum_ctx, batch.num_warmup,
                                         batch.attn_pairs, batch.kv_used_after_alloc)
    return (chunks, reqs, totals, s.batch_is_full, s.kv.used_pages, s.reprefill_tokens,
            None if s.chunked_req is None else s.chunked_req.rid, [r.rid for r in s.pending_merge],
            [r.rid for r in s.unmerged_finishers], [r.rid for r in s.waiting])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.tuples(st.integers(1, 300), st.integers(0, 299), st.integers(1, 5000)),
                        min_size=1, max_size=12),
       pool=st.integers(50, 6000), page=st.sampled_from([1, 4, 16]), chunk=st.sampled_from([-1, 8, 64, 256, 8192]),
       max_running=st.integers(1, 16), admission=st.sampled_from(["v0.5.4", "v0.5.22"]),
       retracted=st.sets(st.integers(0, 11), max_size=4), warm=st.integers(0, 12))
def test_the_admission_pass_equals_admitting_one_request_at_a_time(lengths, pool, page, chunk, max_running,
                                                                   admission, retracted, warm):
    """``_Pass.admit_waiting`` (the budgets in locals, a whole prompt admitted inline) leaves the
    scheduler, the requests and the batch as the one-at-a-time loop through ``_Pass.add`` does:
    cached prefixes, chunking, page rounding, retracted requests' re-prefills and output so far,
    both admission rules, every latch."""
    from sim.engines.sglang.policy import admission as adm

    def build():
        n = len(lengths)
        specs = RequestSpecs(np.array([a for a, _, _ in lengths]), np.array([min(c, a) for a, c, _ in lengths]),
                             np.array([o for _, _, o in lengths]), None)
        server = Server(kv_pool_tokens=pool // page * page, page_size=page, admission=admission,
                        max_running_requests=max_running, chunked_prefill_size=chunk if chunk < 0 else max(chunk, page))
        s = Scheduler(specs, server, warm, True, TraceRecorder(), lambda rid, t: None)
        for rid in range(n):
            s.submit(rid, 0.0)
        s.recv(0.0)
        for r in s.waiting:  # a retracted request comes back with output so far and its count
            if r.rid in retracted and r.output_len > 2:
                r.output_done, r.retractions = r.output_len // 2, 1
        return s

    original = adm._Pass.admit_waiting
    budgets = []  # each pass's budgets when its loop ends

    def run(admit):
        def loop(p, running):
            admit(p, running)
            budgets.append((p.kv_free, p.reserve, p.budget, p.rem_input, p.pages, p.num_tokens, p.sum_ctx, p.warm))
        s = build()
        adm._Pass.admit_waiting = loop
        try:
            return _state(s, s._new_prefill_batch())
        finally:
            adm._Pass.admit_waiting = original

    got = run(original)
    want = run(lambda p, running: _reference_pass(p.s, running, p))
    assert got == want
    assert len(budgets) in (0, 2) and budgets[:1] == budgets[1:]
