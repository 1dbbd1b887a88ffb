"""The running requests' sums the vLLM leap keeps across its iterations
(:class:`sim.engines.vllm.leap.steady.SteadyRunning`) equal a walk over the requests.

A case summed by hand first (both loops), then a hypothesis-generated sequence of what the leap
does to the running list (runs of lockstep tokens, carried finishes, admissions, an iteration
through the processes) with every summary compared to a fresh walk."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from sim.engines.vllm.leap.steady import SteadyRunning, _walk
from sim.engines.vllm.policy.request import Request

BS, MAX_LEN = 4, 1000


def decoding(rid: int, prompt: int, out: int, max_tokens: int, output_len: int, async_scheduling: bool,
             last: float = 0.5, warmup: bool = False, hits: int = 0) -> Request:
    """A request that decodes steadily: ``out`` tokens delivered (the last at ``last``), one
    placeholder in flight under async scheduling, its blocks covering its computed tokens."""
    r = Request(rid, 0.0, prompt, 0, output_len, max_tokens, warmup)
    placeholders = 1 if async_scheduling else 0
    r.num_output_tokens = out
    r.num_computed_tokens = prompt + out + placeholders - 1
    r.num_output_placeholders = r.num_in_flight_tokens = placeholders
    r.num_blocks = -(-r.num_computed_tokens // BS)
    r.num_hit_blocks = hits
    r.first_token_s, r.last_token_s = 0.1, last
    return r


def lockstep(running: list, k: int, last: float) -> None:
    """``k`` tokens each, as the leap's runs advance them."""
    for r in running:
        r.num_computed_tokens += k
        r.num_output_tokens += k
        r.num_blocks = -(-r.num_computed_tokens // BS)
        r.last_token_s = last


def test_three_requests_summed_by_hand():
    """Synchronous loop, blocks of 4: contexts 10, 13, 16 (block residues 2, 3, 0), stops after
    16 (max_tokens 20, 3 out), 2 (a stop token at 7, 4 out) and 1 (max_tokens 7, 5 out)
    iterations; one warm-up member, one with 2 prefix-cache hit blocks. Then a token each."""
    running = [decoding(0, 8, 3, 20, 20, False, hits=2), decoding(1, 10, 4, 50, 7, False, warmup=True),
               decoding(2, 12, 5, 7, 7, False)]
    steady = SteadyRunning(BS, MAX_LEN, False)
    last, k_max, finishing, hist, ctx, warm, hits = steady.summary(running, 3, 100)
    assert (last, k_max, finishing, hist, ctx, warm, hits) == (0.5, 1, [running[2]], [1, 0, 1, 1], 42, 1, [2])
    lockstep(running, 1, 0.6)
    steady.seq = 101  # (the leap moved the step number with them)
    assert steady.summary(running, 3, 101) == (0.6, 0, [running[2]], [0, 1, 1, 1], 45, 1, [2])
    steady.finish(running, 0, 101)
    running.pop()
    assert steady.summary(running, 2, 101) == (0.6, 1, [running[1]], [0, 1, 1, 0], 27, 1, [2])  # (a stop token)


def test_async_scheduling_carries_only_finishes_its_next_step_leaves_out():
    """Async scheduling: a request whose in-flight step reaches ``max_tokens`` is left out of the
    next step and its finish carried; a stop token's finish is not (the next step holds it)."""
    by_length = decoding(0, 12, 5, 7, 7, True)  # computed 17: the in-flight token is its 6th, the next its 7th
    by_stop = decoding(1, 10, 4, 50, 6, True)
    steady = SteadyRunning(BS, MAX_LEN, True)
    assert steady.summary([by_length], 1, 7)[1:3] == (1, [by_length])
    assert SteadyRunning(BS, MAX_LEN, True).summary([by_stop], 1, 7)[1:3] == (1, None)


def test_a_request_that_does_not_decode_steadily_is_refused_and_the_kept_ones_stay():
    """A request admitted behind the kept ones with no token yet (its first in flight) makes the
    summary None; the kept sums are not touched, and answer again without it."""
    running = [decoding(0, 8, 3, 20, 20, False), decoding(1, 9, 2, 20, 20, False)]
    steady = SteadyRunning(BS, MAX_LEN, False)
    kept = steady.summary(running, 2, 5)
    fresh = Request(2, 0.0, 30, 0, 10, 10, False)
    running.append(fresh)
    assert steady.summary(running, 3, 5) is None
    assert steady.summary(running, 2, 5) == kept and steady.count == 2


@settings(max_examples=150, deadline=None)
@given(async_scheduling=st.booleans(), data=st.data())
def test_kept_sums_equal_a_walk(async_scheduling, data):
    """Whatever the leap does to the running list (runs of lockstep tokens up to the next stop,
    the stopping requests finished, requests admitted behind, an iteration through the
    processes, out of lockstep, that moves the step number without the sums), the summary
    equals a walk."""
    lengths = st.tuples(st.integers(1, 60), st.integers(1, 30), st.integers(2, 80), st.integers(2, 80))
    rid = [0]

    def admit(last: float) -> list[Request]:
        out = []
        for prompt, done, max_tokens, output_len in data.draw(st.lists(lengths, min_size=1, max_size=5)):
            max_tokens = max(max_tokens, done + 2)
            output_len = min(max(output_len, done + 2), max_tokens)
            out.append(decoding(rid[0], prompt, done, max_tokens, output_len, async_scheduling, last,
                                data.draw(st.booleans()), data.draw(st.sampled_from([0, 0, 1, 3]))))
            rid[0] += 1
        return out

    seq, last = data.draw(st.integers(0, 10_000)), 1.0
    running = admit(last)
    steady = SteadyRunning(BS, MAX_LEN, async_scheduling)
    for _ in range(data.draw(st.integers(1, 12))):
        got = steady.summary(running, len(running), seq)
        assert got == _walk(running, BS, MAX_LEN, async_scheduling)
        if got is None:
            break
        k_max, finishing = got[1], got[2]
        op = data.draw(st.sampled_from(["run", "finish", "admit", "processes"]))
        if op == "finish" and k_max == 0 and finishing is not None and len(finishing) < len(running):
            steady.finish(running, 0, seq)
            running = [r for r in running if r not in finishing]
        elif op == "admit":
            running += admit(last)
        elif op == "processes":  # iterations the leap did not take (not in lockstep: some requests
            last += 0.01  # got a token more): the sums are dropped
            lockstep(running, 1, last)
            lockstep([r for r in running if data.draw(st.booleans())], 1, last)
            seq += 1
        elif k_max > 0:
            k = data.draw(st.integers(1, k_max))
            last += 0.01 * k
            lockstep(running, k, last)
            seq += k
            steady.seq = seq
