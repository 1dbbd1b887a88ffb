"""The GIL parameters of the simulator's thread-era loop (``costs.gil``), measured on this
machine for one configuration's model, never fitted to the harness's result.

- ``switch_interval``: ``sys.getswitchinterval()`` (CPython's default 5 ms).
- ``ops_per_forward``: how many times a forward must take the GIL back. Measured the way
  DESIGN.md section 6 did it by hand: a decode forward of the configuration's batch runs in a
  thread, alone and then beside a thread that spins in Python; beside the spinner every GIL
  re-acquisition waits one switch interval, so (spinning - alone) / switch_interval
  acquisitions. (The torch calls the forward makes are counted too, for the record:
  ``torch_calls``.)
- ``sample_launch``: the forward thread's Python after the forward (sampling, reading the
  tokens, the token buffer, the output queue), timed alone.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time

import numpy as np

from calibrate.harness.config import HarnessConfig

REPEATS = 3


def _in_thread(fn) -> float:
    out = []
    th = threading.Thread(target=lambda: out.append(fn()))
    th.start()
    th.join()
    return out[0]


def measure_gil_params(cfg: HarnessConfig) -> dict:
    """``costs.gil`` for ``cfg`` plus ``torch_calls`` and the raw times (seconds)."""
    import torch
    from torch.overrides import TorchFunctionMode

    from calibrate.harness.torch_device import DeviceSpec, ForwardRunner

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

    def forward() -> float:
        t0 = time.perf_counter()
        m.decode_logits(ids, slots, pos, loc, ctx)
        return time.perf_counter() - t0

    def sample() -> float:
        logits = m.decode_logits(ids, slots, pos, loc, ctx)
        t0 = time.perf_counter()
        toks = torch.argmax(logits, dim=-1).tolist()
        toks = runner.script.apply(list(range(bs)), toks)
        runner.tokens[list(range(bs))] = toks
        return time.perf_counter() - t0

    alone = statistics.median(_in_thread(forward) for _ in range(5))
    stop = threading.Event()

    def spin():
        x = 0
        while not stop.is_set():
            x += 1

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        beside = statistics.median(_in_thread(forward) for _ in range(REPEATS))
    finally:
        stop.set()
        spinner.join()
    interval = sys.getswitchinterval()
    calls = [0]

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            calls[0] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        m.decode_logits(ids, slots, pos, loc, ctx)
    sample_s = statistics.median(_in_thread(sample) for _ in range(5))
    return {"switch_interval": interval, "ops_per_forward": max(1, round((beside - alone) / interval)),
            "sample_launch": sample_s, "wait_launch_done": True,
            "measured": {"forward_alone_s": alone, "forward_beside_spinner_s": beside, "torch_calls": calls[0],
                         "batch": bs, "ctx": ctx}}
