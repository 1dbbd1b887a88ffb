"""vLLM V1's scheduling policy step by step, from hand-computable cases (no SimPy): the token budget
and its split, chunked prefill, long_prefill_token_threshold, max_num_seqs, KV blocks and prefix
hits, preemption by recompute, stops at max_tokens and on a stop token, async placeholders."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engines.vllm.policy.kv_blocks import BlockPool
from sim.engines.vllm.policy.request import FINISHED, PREEMPTED, RUNNING, Request
from sim.engines.vllm.policy.scheduler import Scheduler
from sim.engines.vllm.server import VllmServer
from sim.model.costs import DECODE, EXTEND
from sim.trace.recorder import TraceRecorder


def make(async_scheduling: bool = False, **server):
    """A scheduler over a CPU-platform server with 16-token blocks (fields overridable)."""
    fields = {"device": "cpu", "block_size": 16, "num_gpu_blocks": 1025, "max_model_len": 1024, "max_num_seqs": 8,
              "max_num_batched_tokens": 256, **server}
    done: list[int] = []
    sched = Scheduler(VllmServer(engine="vllm", **fields), async_scheduling, TraceRecorder(),
                      lambda rid, t: done.append(rid))
    return sched, done


def req(rid: int, prompt: int, output: int, max_tokens: int | None = None, cached: int = 0) -> Request:
    return Request(rid, 0.0, prompt, cached, output, max_tokens or output, False)


def add(sched, *reqs):
    for r in reqs:
        sched.add_request(r)
    return reqs


def tokens(step) -> dict[int, int]:
    """request id -> tokens scheduled in the step."""
    return {e[0].rid: e[1] for e in step.chunks}


def test_budget_is_split_in_arrival_order_and_a_chunk_continues_first_next_step():
    sched, _ = make(max_num_batched_tokens=256)
    a, b, c = add(sched, req(0, 100, 5), req(1, 100, 5), req(2, 100, 5))
    s1 = sched.schedule()
    assert tokens(s1) == {0: 100, 1: 100, 2: 56} and s1.num_tokens == 256 and s1.kind == EXTEND
    assert [e[3] for e in s1.chunks] == [True, True, False]  # the chunk of c samples no token
    assert c.is_prefill_chunk and c.num_computed_tokens == 56
    sched.update_from_output(s1, 1.0)
    assert (a.num_output_tokens, b.num_output_tokens, c.num_output_tokens) == (1, 1, 0)
    s2 = sched.schedule()  # running first, in order: two decodes and the rest of c's prompt
    assert tokens(s2) == {0: 1, 1: 1, 2: 44} and s2.sum_ctx == 101 + 101 + 100
    sched.update_from_output(s2, 2.0)
    s3 = sched.schedule()
    assert tokens(s3) == {0: 1, 1: 1, 2: 1} and s3.kind == DECODE


def test_long_prefill_threshold_caps_each_prompt_but_not_a_lone_request():
    sched, _ = make(long_prefill_token_threshold=64)
    add(sched, req(0, 100, 5), req(1, 100, 5))
    assert tokens(sched.schedule()) == {0: 64, 1: 64}
    lone, _ = make(long_prefill_token_threshold=64)
    add(lone, req(0, 100, 5))
    assert tokens(lone.schedule()) == {0: 100}  # nobody to starve: the whole budget


def test_max_num_seqs_caps_the_running_requests():
    sched, _ = make(max_num_seqs=2)
    add(sched, req(0, 10, 5), req(1, 10, 5), req(2, 10, 5))
    assert tokens(sched.schedule()) == {0: 10, 1: 10}
    assert [r.rid for r in sched.waiting] == [2] and len(sched.running) == 2


def test_without_chunked_prefill_a_prompt_over_the_budget_stops_admission():
    sched, _ = make(enable_chunked_prefill=False, max_model_len=256, max_num_batched_tokens=256)
    add(sched, req(0, 200, 5), req(1, 100, 5), req(2, 10, 5))
    assert tokens(sched.schedule()) == {0: 200}  # 100 > 56 left: FCFS stops, the 10 waits too
    assert [r.rid for r in sched.waiting] == [1, 2]


def test_kv_blocks_follow_computed_tokens_and_free_on_finish():
    sched, done = make()
    (r,) = add(sched, req(0, 33, 3))  # 33 tokens: 3 blocks of 16
    s1 = sched.schedule()
    assert r.num_blocks == 3 and sched.kv.num_used_blocks == 3
    for t in (1.0, 2.0):
        sched.update_from_output(s1, t)
        s1 = sched.schedule()  # decode tokens 34, 35: still 3 blocks
    assert r.num_blocks == 3 and tokens(s1) == {0: 1}
    sched.update_from_output(s1, 3.0)  # the third token: max_tokens
    assert r.status == FINISHED and done == [0] and sched.kv.num_used_blocks == 0
    assert sched.has_requests()  # its id is still to be sent to the worker: one empty step
    empty = sched.schedule()
    assert empty.num_reqs == 0 and not sched.has_requests()


def test_stop_token_before_max_tokens():
    sched, done = make()
    (r,) = add(sched, req(0, 10, 2, max_tokens=50))
    for t in (1.0, 2.0):
        sched.update_from_output(sched.schedule(), t)
    assert r.status == FINISHED and r.num_output_tokens == 2 and done == [0]


def test_prefix_cache_hits_are_whole_blocks_of_the_cached_prefix():
    sched, _ = make()
    a, b = add(sched, req(0, 64, 5, cached=40), req(1, 64, 5, cached=64))
    step = sched.schedule()
    # a: 40 cached -> 32 (two blocks) hit; b: all cached, but the last token is computed -> 48 hit
    assert tokens(step) == {0: 32, 1: 16}
    assert (a.num_computed_tokens, b.num_computed_tokens) == (64, 64)
    assert (a.num_hit_blocks, b.num_hit_blocks) == (2, 3)
    assert sched.kv.num_used_blocks == (4 - 2) + (4 - 3)  # hit blocks are resident, not taken
    off, _ = make(enable_prefix_caching=False)
    add(off, req(0, 64, 5, cached=40))
    assert tokens(off.schedule()) == {0: 64}


def test_a_new_request_is_admitted_only_if_its_whole_prompt_fits():
    # 8 usable blocks; A holds 2; B's first chunk (44 tokens, 3 blocks) would fit, its prompt (8) does not
    sched, _ = make(num_gpu_blocks=9, max_model_len=128, max_num_batched_tokens=64, max_num_seqs=4)
    add(sched, req(0, 20, 5), req(1, 120, 5))
    assert tokens(sched.schedule()) == {0: 20}
    assert [r.rid for r in sched.waiting] == [1]


def test_preemption_by_recompute_takes_the_last_running_request():
    sched, _ = make(num_gpu_blocks=9, max_model_len=128, max_num_seqs=4)
    a, b = add(sched, req(0, 48, 64), req(1, 48, 64))
    step = sched.schedule()
    assert tokens(step) == {0: 48, 1: 48} and sched.kv.num_free_blocks == 2
    for k in range(17):  # the prefill's token, then 16 decodes: A and B hold 4 blocks each at 64 tokens
        sched.update_from_output(step, float(k))
        step = sched.schedule()
        if k < 16:
            assert tokens(step) == {0: 1, 1: 1} and sched.preempted_reqs == 0
    # A's 65th token needs a fifth block: B (running[-1]) is preempted, its KV freed, back in front
    assert tokens(step) == {0: 1}
    assert b.status == PREEMPTED and b.num_computed_tokens == 0 and b.num_blocks == 0 and b.num_preemptions == 1
    assert list(sched.waiting) == [b] and sched.running == [a] and sched.kv.num_free_blocks == 3
    assert (sched.preemption_steps, sched.preempted_reqs) == (1, 1)
    while a.status == RUNNING:  # B cannot return while its 65 tokens (5 blocks) do not fit
        sched.update_from_output(step, 100.0)
        step = sched.schedule()
        if a.status == RUNNING:
            assert b.status == PREEMPTED
    assert tokens(step) == {1: 65} and b.status == RUNNING  # prompt and 17 outputs recomputed
    assert sched.recompute_tokens == 65


def test_async_placeholders_schedule_ahead_and_stop_exactly_at_max_tokens():
    sched, done = make(async_scheduling=True)
    (r,) = add(sched, req(0, 10, 3))
    s1 = sched.schedule()
    assert tokens(s1) == {0: 10} and r.num_output_placeholders == 1
    s2 = sched.schedule()  # on the placeholder for s1's token, before s1's output
    assert tokens(s2) == {0: 1} and r.num_output_placeholders == 2 and r.num_computed_tokens == 11
    sched.update_from_output(s1, 1.0)
    assert r.num_output_tokens == 1 and r.num_output_placeholders == 1
    s3 = sched.schedule()
    assert tokens(s3) == {0: 1}
    sched.update_from_output(s2, 2.0)
    s4 = sched.schedule()  # s3 in flight already produces the third (last) token: nothing to schedule
    assert s4.num_reqs == 0
    sched.update_from_output(s3, 3.0)
    sched.update_from_output(s4, 4.0)
    assert r.status == FINISHED and r.num_output_tokens == 3 and done == [0]
    assert sum(len(s.overshoot) for s in (s1, s2, s3, s4)) == 0


def test_async_a_stop_token_costs_one_dropped_step():
    sched, _ = make(async_scheduling=True)
    (r,) = add(sched, req(0, 10, 2, max_tokens=50))
    s1, s2 = sched.schedule(), sched.schedule()
    sched.update_from_output(s1, 1.0)
    s3 = sched.schedule()
    sched.update_from_output(s2, 2.0)  # the stop token: finished while s3 is in flight
    assert r.status == FINISHED and sched.kv.num_used_blocks == 0
    sched.update_from_output(s3, 3.0)
    assert s3.overshoot == [r] and r.num_output_tokens == 2


def test_block_pool_rejects_what_vllm_rejects():
    with pytest.raises(ValueError):
        BlockPool(1, 16)
    pool = BlockPool(3, 16)
    with pytest.raises(ValueError):
        pool.allocate_slots(req(0, 8, 1), 0)
    r = req(0, 40, 1)
    assert not pool.allocate_slots(r, 40) and r.num_blocks == 0  # 3 blocks > 2 usable: nothing taken
    assert pool.allocate_slots(r, 32) and pool.num_free_blocks == 0


# --- invariants of the policy alone, over random loads and both schedulers ---------------------

@settings(max_examples=60, deadline=None)
@given(async_scheduling=st.booleans(), blocks=st.integers(9, 40), budget=st.integers(8, 200),
       seqs=st.integers(1, 8), threshold=st.sampled_from([0, 16]), chunked=st.booleans(),
       lens=st.lists(st.tuples(st.integers(1, 100), st.integers(1, 30), st.integers(0, 1), st.integers(0, 100)),
                     min_size=1, max_size=8))
def test_policy_invariants(async_scheduling, blocks, budget, seqs, threshold, chunked, lens):
    max_model_len = 128
    budget = max(budget, seqs) if chunked else max(budget, max_model_len)
    sched, done = make(async_scheduling, num_gpu_blocks=blocks, max_model_len=max_model_len,
                       max_num_batched_tokens=budget, max_num_seqs=seqs, long_prefill_token_threshold=threshold,
                       enable_chunked_prefill=chunked)
    reqs = []
    for i, (prompt, out, eos, cached) in enumerate(lens):
        max_tokens = max_model_len - prompt if eos else min(out, max_model_len - prompt)
        if max_tokens < 1:
            continue
        reqs.append(req(i, prompt, min(out, max_tokens), max_tokens, cached=min(cached, prompt)))
    add(sched, *reqs)
    inflight = []
    for k in range(5000):
        if not (sched.has_requests() or inflight):
            break
        step = sched.schedule()
        assert step.num_tokens <= budget and len(sched.running) <= seqs
        assert all(n >= 1 for n in tokens(step).values())
        inflight.append(step)
        if len(inflight) > (1 if async_scheduling else 0) or not sched.has_requests():
            sched.update_from_output(inflight.pop(0), float(k))
        held = sum(r.num_blocks - r.num_hit_blocks for r in reqs)
        assert sched.kv.num_free_blocks >= 0 and held == sched.kv.num_used_blocks
        for r in reqs:
            assert r.num_output_placeholders >= 0 and r.num_in_flight_tokens >= 0
            assert r.num_blocks == 0 or r.status == RUNNING
            assert r.num_computed_tokens <= r.num_tokens + r.num_output_placeholders
    assert sorted(done) == [r.rid for r in reqs]
    assert all(r.status == FINISHED and r.num_output_tokens == r.output_len for r in reqs)
    assert sched.kv.num_used_blocks == 0
