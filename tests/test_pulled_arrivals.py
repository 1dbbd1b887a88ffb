"""The open loop's arrivals pulled by the event loop (sim.model.workload.PulledArrivals) against
their SimPy process (open_loop_arrivals) next to a loop process that yields as SGLang's loops do:
the same requests submitted by each resume, the same clocks, float for float."""

from __future__ import annotations

import math

import numpy as np
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.model.workload import PulledArrivals, open_loop_arrivals


def simpy_reference(arrival_s: list[float], plan: list[tuple]) -> list[tuple[float, int]]:
    """(env.now, requests submitted) after each of ``plan``'s yields by a loop process started after
    the arrival process: ('to', x) yields a timeout to ``x`` (``x - env.now``); ('wait',) waits for
    the next arrival as ``Phases.idle`` does (a timeout to the first one submitted and not yet
    received, else an event the next submission triggers). Each step then receives (drains) what
    was submitted."""
    env = simpy.Environment()
    submitted: list[float] = []
    received = [0]
    wakeup: list[simpy.Event] = []

    def submit(i: int, t: float) -> None:
        assert i == len(submitted)
        submitted.append(t)
        if wakeup and not wakeup[-1].triggered:
            wakeup[-1].succeed()

    log = []

    def loop():
        for step in plan:
            if step[0] == "to":
                yield env.timeout(max(step[1], env.now) - env.now)
            elif received[0] < len(submitted):
                yield env.timeout(max(0.0, submitted[received[0]] - env.now))
            else:
                if len(submitted) == len(arrival_s):
                    break  # nothing left to arrive: a real run would stall here
                wakeup.append(env.event())
                yield wakeup[-1]
            log.append((env.now, len(submitted)))
            received[0] = len(submitted)

    env.process(open_loop_arrivals(env, np.array(arrival_s, dtype=float), submit))
    env.process(loop())
    env.run()
    return log


def pulled(arrival_s: list[float], plan: list[tuple]) -> list[tuple[float, int]]:
    """The same plan with the arrivals pulled."""
    submitted: list[float] = []
    arrivals = PulledArrivals([float(t) for t in arrival_s], lambda i, t: submitted.append(t))
    log, received = [], 0
    for step in plan:
        if step[0] == "to":
            arrivals.advance(max(step[1], arrivals.clock) - arrivals.clock)
        elif received < len(submitted):
            arrivals.advance(max(0.0, submitted[received] - arrivals.clock))
        elif arrivals.wait() is None:
            break
        log.append((arrivals.clock, len(submitted)))
        received = len(submitted)
    return log


def test_hand_computed_order():
    """Arrivals at 0 (submitted before the loop runs), a burst at 0.5 and one at 2.0; the loop
    yields to exactly 0.5 (the burst's timeout is older: it comes first), then to 1.0, then waits
    (wakes at 2.0)."""
    arrival_s = [0.0, 0.5, 0.5, 2.0]
    plan = [("to", 0.5), ("to", 1.0), ("wait",)]
    assert simpy_reference(arrival_s, plan) == pulled(arrival_s, plan) == [(0.5, 3), (1.0, 3), (2.0, 4)]


def test_a_timeout_created_while_the_loop_waits_fires_after_it_at_a_tie():
    """The loop yields to 0.3 while the process holds for 0.2: it fires first, submits and holds
    for 0.3, a timeout created after the loop's, so at the tie the loop resumes first."""
    arrival_s = [0.2, 0.3]
    plan = [("to", 0.3), ("to", 0.3)]
    assert simpy_reference(arrival_s, plan) == pulled(arrival_s, plan) == [(0.3, 1), (0.3, 2)]


times = st.one_of(st.floats(0.0, 3.0), st.sampled_from([0.0, 0.1, 0.2, 0.3, 0.7, 1e-9, 1.0, 2.0 / 3.0]))


@st.composite
def cases(draw):
    arrival_s = sorted(draw(st.lists(times, min_size=1, max_size=12)))
    plan, clock = [], 0.0
    for _ in range(draw(st.integers(1, 16))):
        kind = draw(st.sampled_from(["to", "to", "at", "wait"]))
        if kind == "wait":
            plan.append(("wait",))
        elif kind == "at":  # exactly an arrival's time (ties with the process's timeouts)
            plan.append(("to", draw(st.sampled_from(arrival_s))))
        else:
            plan.append(("to", draw(st.one_of(times, st.just(math.nextafter(arrival_s[0], math.inf))))))
    return arrival_s, plan


@settings(max_examples=400, deadline=None)
@given(cases())
def test_pulled_arrivals_follow_simpy(case):
    arrival_s, plan = case
    assert pulled(arrival_s, plan) == simpy_reference(arrival_s, plan)
