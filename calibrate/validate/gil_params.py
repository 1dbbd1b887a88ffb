"""The GIL parameters of the simulator's thread-era loop (``costs.gil``), measured on this
machine for one configuration's model, never fitted to the harness's result.

- ``switch_interval``: ``sys.getswitchinterval()`` (CPython's default 5 ms).
- ``ops_per_forward``: how many times a forward must take the GIL back. Measured the way
  DESIGN.md section 6 did it by hand: a decode forward of the configuration's batch runs in a
  thread, alone and then beside a thread that spins in Python; beside the spinner every GIL
  re-acquisition waits one switch interval, so (spinning - alone) / switch_interval
  acquisitions. (The torch calls the forward makes are counted too, for the record:
  ``torch_calls``.)
- ``sample_compute``: the sampling op (argmax) after ``launch_done``, timed alone (torch
  releases the GIL inside it, so a woken scheduler thread can take the GIL meanwhile).
- ``sample_launch``: the forward thread's Python after it (the tokens to the host, the EOS
  script, the token buffer), timed alone.
- ``wake_latency``: how long a thread blocked on an event takes to run once it is set (the
  median of 200 wake-ups; the futex wake-up a queue, an event or a contended GIL costs).
"""

from __future__ import annotations

import statistics
import sys
import threading
import time

import numpy as np

from calibrate.harness.config import HarnessConfig

REPEATS = 3
ATTEMPTS = 3


def _pin(core) -> None:
    import os

    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})


class _Spinner:
    """A thread that runs Python without pause (holds the GIL whenever it can), counting loops;
    on the scheduler's core, as the harness pins the scheduler thread."""

    def __init__(self, core=None):
        self.count = 0
        self.stop = False
        self.core = core
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        _pin(self.core)
        while not self.stop:
            self.count += 1

    def __enter__(self):
        self.thread.start()
        while self.count == 0:
            time.sleep(0.001)
        return self

    def __exit__(self, *exc):
        self.stop = True
        self.thread.join()
        return False


def _median_in_thread(fn, n: int, core=None) -> float:
    """Median of ``n`` calls of ``fn()`` (each returns seconds) in one fresh thread (pinned to
    ``core``), after one untimed call (a thread's first torch call initialises per-thread state)."""
    out: list[float] = []

    def run():
        _pin(core)
        fn()
        out.extend(fn() for _ in range(n))

    th = threading.Thread(target=run)
    th.start()
    th.join()
    return statistics.median(out)


def _wake_latency_s(cores: tuple, n: int = 200) -> float:
    """Median time from ``Event.set()`` to the waiting thread running (a futex wake-up), the
    setter and the waiter pinned to the harness's scheduler and device cores (waking a thread
    on the other, idle core took ~27 us here, on the same core ~15 us)."""
    import os

    ev, done = threading.Event(), threading.Event()
    stamp, res = [0.0], []
    pin = cores[0] is not None and hasattr(os, "sched_setaffinity")
    old = os.sched_getaffinity(0) if pin else None

    def waiter():
        if pin:
            os.sched_setaffinity(0, {cores[1]})
        for _ in range(n):
            ev.wait()
            res.append(time.perf_counter() - stamp[0])
            ev.clear()
            done.set()

    if pin:
        os.sched_setaffinity(0, {cores[0]})
    th = threading.Thread(target=waiter)
    th.start()
    try:
        for _ in range(n):
            time.sleep(0.0003)  # the waiter is asleep when the event fires
            stamp[0] = time.perf_counter()
            ev.set()
            done.wait()
            done.clear()
        th.join()
    finally:
        if pin:
            os.sched_setaffinity(0, old)
    return statistics.median(res[10:])


def measure_gil_params(cfg: HarnessConfig) -> dict:
    """``costs.gil`` for ``cfg`` plus the raw measurements (``measured``: seconds, counts)."""
    import torch
    from torch.overrides import TorchFunctionMode

    from calibrate.harness.run import _cores
    from calibrate.harness.torch_device import DeviceSpec, ForwardRunner

    torch.set_num_threads(cfg.torch_threads)
    bs = min(cfg.concurrency, cfg.max_running_requests)
    in_len = cfg.input_len if isinstance(cfg.input_len, int) else int(cfg.input_len.get("high", cfg.input_len.get("max", 128)))
    ctx = in_len + 16
    spec = DeviceSpec(cfg.shape, cfg.seed, cfg.torch_threads, max_slots=bs, max_ctx=ctx + 1, pool_tokens=bs * (ctx + 1),
                      eos_at=np.zeros(0, dtype=np.int64), eos_id=0, system_prompt=[], system_slots=np.zeros(0, np.int64),
                      warmup_decode=((bs, ctx),), warmup_extend=(), core=None)
    runner = ForwardRunner(spec)
    runner.prepare()
    m = runner.model
    slots = torch.arange(bs)
    pos = torch.full((bs,), ctx - 1)
    loc = 1 + torch.arange(bs) * (ctx + 1) + ctx - 1
    ids = torch.zeros(bs, dtype=torch.int64)
    logits = m.decode_logits(ids, slots, pos, loc, ctx)
    every = list(range(bs))

    def forward() -> float:
        t0 = time.perf_counter()
        m.decode_logits(ids, slots, pos, loc, ctx)
        return time.perf_counter() - t0

    def sample_op() -> float:  # the sampling op right after launch_done (torch releases the GIL inside)
        t0 = time.perf_counter()
        torch.argmax(logits, dim=-1)
        return time.perf_counter() - t0

    def sample_python() -> float:  # the rest: tokens to the host, the EOS script, the token buffer
        out = torch.argmax(logits, dim=-1)
        t0 = time.perf_counter()
        toks = runner.script.apply(every, out.tolist())
        runner.tokens[every] = toks
        return time.perf_counter() - t0

    interval = sys.getswitchinterval()
    cores = _cores()
    alone = _median_in_thread(forward, 9, cores[1])
    attempts = []
    for _ in range(ATTEMPTS):  # a spinner that did not get the CPU measures nothing: take it again
        with _Spinner(cores[0]) as spinner:
            c0 = spinner.count
            beside = _median_in_thread(forward, REPEATS, cores[1])
            loops = spinner.count - c0
        attempts.append({"beside_s": beside, "spinner_loops": loops})
        if beside - alone > interval:
            break
    calls = [0]

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            calls[0] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        m.decode_logits(ids, slots, pos, loc, ctx)
    beside = attempts[-1]["beside_s"]
    return {"switch_interval": interval, "ops_per_forward": max(1, round((beside - alone) / interval)),
            "sample_launch": _median_in_thread(sample_python, 9, cores[1]),
            "sample_compute": _median_in_thread(sample_op, 9, cores[1]),
            "wake_latency": _wake_latency_s(cores), "wait_launch_done": True,
            "measured": {"forward_alone_s": alone, "forward_beside_spinner_s": beside, "attempts": attempts,
                         "torch_calls": calls[0], "batch": bs, "ctx": ctx}}
