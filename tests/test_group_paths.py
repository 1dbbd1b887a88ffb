"""Paths that take a group at once, held to their members one at a time: a closed loop's clients
whose requests finished together, the recorders' grouped arrivals and ITL samples, the numpy
run's KV line, and the random generators made at their first draw. Hand cases first, then
hypothesis."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engines.sglang.leap_runs import _Line
from sim.model.costs import SeededGenerator
from sim.model.workload import ClosedLoopClients
from sim.trace.recorder import TraceRecorder
from sim.trace.streaming import StreamingRecorder

ROOT = Path(__file__).resolve().parents[1]


def _clients(num, concurrency, warmup, grouped):
    sent = []
    clients = ClosedLoopClients(num, concurrency, lambda rid, t: sent.append((rid, t)), warmup,
                                submit_range=(lambda first, count, t: sent.extend((r, t) for r in range(first, first + count)))
                                if grouped else None)
    return clients, sent


def test_a_finished_group_sends_its_clients_next_requests_together():
    # 3 clients, 7 requests: the first 3 go at 0; 3 finish at 1.0 and 3 more go; 3 finish at 2.0,
    # and only the last request is left to send
    clients, sent = _clients(7, 3, 0, grouped=True)
    clients.start()
    clients.on_finish_all([0, 1, 2], 1.0)
    clients.on_finish_all([3, 4, 5], 2.0)
    assert sent == [(0, 0.0), (1, 0.0), (2, 0.0), (3, 1.0), (4, 1.0), (5, 1.0), (6, 2.0)]


@settings(max_examples=200, deadline=None)
@given(num=st.integers(1, 40), concurrency=st.integers(1, 12), warmup=st.integers(0, 10),
       groups=st.lists(st.integers(1, 12), min_size=1, max_size=30), grouped=st.booleans())
def test_a_group_finish_sends_what_its_members_finishing_one_at_a_time_send(num, concurrency, warmup, groups, grouped):
    """``on_finish_all`` (with or without the clients' ``submit_range``) sends the requests, in
    order and at the same time, that ``on_finish`` of each member sends, warm-up phase included."""
    one, sent_one = _clients(num, concurrency, warmup, grouped=False)
    many, sent_many = _clients(num, concurrency, warmup, grouped=grouped)
    one.start()
    many.start()
    finished = 0
    for t, size in enumerate(groups, start=1):
        group = [rid for rid, _ in sent_one[finished:finished + size]]
        finished += len(group)
        for rid in group:
            one.on_finish(rid, float(t))
        many.on_finish_all(group, float(t))
        assert sent_many == sent_one


@pytest.mark.parametrize("recorder", [StreamingRecorder, TraceRecorder])
def test_grouped_itl_samples_and_arrivals_are_the_ones_given_one_at_a_time(recorder):
    kwargs = {"warmup_requests": 2, "keep_requests": False} if recorder is StreamingRecorder else {}
    one, many = recorder(**kwargs), recorder(**kwargs)
    values = [0.5, 1e-9, 0.0, 3.25, 2e-3]
    for v in values:
        one.itl(v, 1)
    many.itl_once_each(values)
    for rid in range(5):
        one.arrival(rid, 7.0)
    many.arrivals(0, 5, 7.0)
    if recorder is StreamingRecorder:
        assert one.window_start == many.window_start == 7.0
        one.itl_stat.fold()
        many.itl_stat.fold()
        assert (one.itl_stat.count, one.itl_stat.total, one.itl_stat.bins) == \
            (many.itl_stat.count, many.itl_stat.total, many.itl_stat.bins)
    else:
        a, b = one.itl_columns(), many.itl_columns()
        assert a["itl_s"].tolist() == b["itl_s"].tolist() and a["weight"].tolist() == b["weight"].tolist()


@settings(max_examples=200, deadline=None)
@given(used=st.integers(0, 10_000), need=st.integers(0, 300), k=st.integers(1, 400))
def test_the_kv_line_is_the_pages_used_after_each_decode(used, need, k):
    """``_Line`` (a page-1 pool, every decode taking ``need`` pages) gives what ``used +
    np.cumsum(need)`` gives, elementwise and as a slice."""
    want = used + np.cumsum(np.full(k, need, dtype=np.int64))
    line = _Line(used, need)
    assert [line[i] for i in range(k)] == want.tolist()
    assert line[:k].tolist() == want.tolist()


def test_a_seeded_generator_draws_numpys_stream_once_asked():
    lazy, eager = SeededGenerator([3, 1]), np.random.default_rng([3, 1])
    assert lazy.integers(0, 100, size=5).tolist() == eager.integers(0, 100, size=5).tolist()
    assert lazy.lognormal(0.0, 0.5, 3).tolist() == eager.lognormal(0.0, 0.5, 3).tolist()


def test_a_run_that_draws_nothing_does_not_import_numpy_random():
    """The quickstart's shape (fixed lengths, a closed loop, no noise) draws nothing: its run
    leaves ``numpy.random`` unimported (8 ms of a process's start); a Poisson run imports it."""
    code = ("import sys, sim; sc = sim.load_scenario({0!r}, ['workload.num_requests=16']); "
            "sim.simulate(sc, 'overlap', tables='none'); print('numpy.random' in sys.modules)")
    for arrival, imported in (("closed_loop", "False"), ("poisson", "True")):
        raw = {"name": "t", "workload": {"arrival": arrival, "concurrency": 4, "rate_per_s": 50.0, "num_requests": 16,
                                         "warmup_requests": 0, "input_len": 64, "output_len": 8, "finish": "length"},
               "server": {"settings": ["overlap"]}}
        out = subprocess.run([sys.executable, "-c", code.format(raw)], capture_output=True, text=True, cwd=ROOT,
                             check=True).stdout.split()
        assert out[-1] == imported, arrival
