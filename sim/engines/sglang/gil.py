"""CPython's global interpreter lock between simulated threads (SimPy).

The model follows CPython's "new GIL" (3.2+, Python/ceval_gil.c): a thread runs Python only
while it holds the GIL. A thread that blocks (a queue get, an event wait, a GIL-releasing C
call such as a torch op's compute) releases it, and a waiting thread takes it at once. A
thread that has waited ``switch_interval`` seconds (``sys.getswitchinterval()``, 5 ms) without
any switch happening sets a drop request; the holder drops the GIL at its next bytecode
boundary (here: at once), the waiter takes it, and the dropped thread queues to take it back
(after the new holder releases it, or after its own switch interval). A waiter sleeps on a
condition variable: with ``wake_latency_s`` it runs that long after the GIL was handed to it
(the GIL stays reserved for it meanwhile). Two CPU-bound threads
therefore alternate every 5 ms, and a thread that needs the GIL briefly, beside one that runs
Python, waits up to 5 ms for it every time.
"""

from __future__ import annotations

from collections import deque

import simpy

_EPS = 1e-12


def _relay(target: simpy.Event):
    """A callback that triggers ``target`` when the first of the events it is attached to is
    processed (an any-of condition: later ones find it triggered and do nothing)."""

    def fire(_event) -> None:
        if not target.triggered:
            target.succeed()

    return fire


class GIL:
    """The GIL shared by simulated threads (any hashable thread names).

    Attributes:
        holder: the thread holding it, or None.
        wait_s: seconds each thread spent waiting for it.
        forced_switches: drops forced by a waiter's switch interval.
    """

    def __init__(self, env: simpy.Environment, switch_interval_s: float, wake_latency_s: float = 0.0):
        self.env = env
        self.interval = switch_interval_s
        self.wake_latency = wake_latency_s
        self.holder = None
        self.waiters: deque = deque()  # (thread, event)
        self.switches = 0
        self.drop_requested = False
        self._drop: simpy.Event | None = None
        self.wait_s: dict = {}
        self.forced_switches = 0

    def run(self, me, work_s: float):
        """SimPy sub-generator: run ``work_s`` seconds of Python in thread ``me``. Takes the GIL
        if ``me`` does not hold it and keeps it afterwards (call :meth:`release` when ``me``
        blocks); a waiter's drop request preempts it, and the rest runs once it has the GIL back."""
        while work_s > _EPS:
            if self.holder is not me:
                yield from self._acquire(me)
            if self.drop_requested:
                self._force_drop(me)
                continue
            # wait for the work's end or a drop request, whichever comes first: ``ran | drop`` as two
            # relays to one event (the same events scheduled in the same order as SimPy's Condition,
            # without its bookkeeping)
            wake = self.env.event()
            relay = _relay(wake)
            self._drop = drop = self.env.event()
            drop.callbacks.append(relay)
            start = self.env.now
            ran = self.env.timeout(work_s)
            ran.callbacks.append(relay)
            yield wake
            if ran.processed and self.env.now == start:
                self._drop = None
                break  # what is left is below the clock's resolution at this time: done (else no progress)
            work_s -= self.env.now - start
            self._drop = None
            if self.drop_requested and work_s > _EPS:
                self._force_drop(me)

    def release(self, me) -> None:
        """``me`` blocks: the GIL goes to the first waiter (or becomes free). No-op if not held."""
        if self.holder is not me:
            return
        self.holder = None
        self.drop_requested = False
        if self.waiters:
            thread, event = self.waiters.popleft()
            self.holder = thread
            self.switches += 1
            if self.wake_latency > 0:  # the waiter sleeps on a condition variable: it runs once woken
                self.env.timeout(self.wake_latency).callbacks.append(lambda _: event.succeed())
            else:
                event.succeed()

    def _acquire(self, me):
        if self.holder is None and not self.waiters:
            self.holder = me
            return
        event = self.env.event()
        self.waiters.append((me, event))
        since = self.env.now
        self._arm(event)
        yield event
        self.wait_s[me] = self.wait_s.get(me, 0.0) + (self.env.now - since)

    def _arm(self, event: simpy.Event) -> None:
        switches = self.switches

        def expired(_):
            if event.triggered:
                return
            if self.switches == switches:  # waited a whole interval without a switch: drop request
                self.drop_requested = True
                if self._drop is not None and not self._drop.triggered:
                    self._drop.succeed()
            else:
                self._arm(event)

        self.env.timeout(self.interval).callbacks.append(expired)

    def _force_drop(self, me) -> None:
        self.forced_switches += 1
        self.release(me)
