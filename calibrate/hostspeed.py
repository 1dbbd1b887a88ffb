"""Host speed probe: how fast this host runs the two kinds of work a CPU-served engine does,
right now, as two fixed workloads timed in a fresh process.

A shared VM's speed drifts: on this project's 2-vCPU VM the same calibration ran x1.17-1.39
slower 35 minutes later (docs/real-engines.md). A profile measured at one time then prices a
server run at another time wrongly by that factor, whatever the model gets right. The probe is
the yardstick: taken beside a calibration (stored in the profile's ``metadata.host_speed``) and
beside each validation session, the ratio of the two readings is the drift, and the validation
reports its comparison with the profile's CPU curves (``costs.cpu.scale``) and forward curves
(``costs.gpu.scale``) multiplied by it, beside the uncorrected one. A calibration stores the mean of
its runs' readings; it does not restate one run's samples by another's reading: tried on
2026-12-01, the readings of vLLM's sync and async calibration sessions (minutes apart) differed
by x1.36 on the torch probe while the forward they timed did not move that way, and restating
the samples made the predicted async/sync speedup 1.23-1.48 against 0.99-1.29 measured. On this
VM one reading varies by up to x2 from one minute to the next (150 repetitions of 1.6-3.3 ms):
the probe sees the host's noise as much as its drift.

The workloads are the project's own and fixed, unrelated to any load being measured:

- ``python_s``: Python bookkeeping like a scheduler's (request objects, a dict keyed by request
  id, a sort by priority, list appends): 2,000 requests per repetition;
- ``torch_s``: a float32 forward of a 4-layer MLP of the tiny test model's widths (16 rows,
  256 -> 512 -> 256) on one torch thread, the kind of work the CPU engines' forward is.

Each is run ``reps`` times after ``warmup`` runs; the reading is the median (seconds per
repetition, wall clock: ``time.perf_counter``; the thread's CPU time, ``time.thread_time``, is
recorded beside it as ``*_cpu_s``). Run in the engine's own environment (same interpreter and
torch as the server)::

    python -m calibrate.hostspeed OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

PY_REQUESTS = 2000
TORCH_ROWS, TORCH_HIDDEN, TORCH_INTERMEDIATE, TORCH_LAYERS = 16, 256, 512, 4
MAX_DRIFT = 10.0  # a drift ratio beyond this (or below its inverse) is a corrupt reading
TORCH_CALLS = 8  # forwards per repetition (one forward is ~0.1 ms: too short to time alone)


class _Req:
    __slots__ = ("rid", "priority", "output_ids")

    def __init__(self, rid: str, priority: int):
        self.rid, self.priority, self.output_ids = rid, priority, []


def python_work(n: int = PY_REQUESTS) -> int:
    """One repetition of the bookkeeping workload; returns a checksum (so nothing is skipped)."""
    reqs = [_Req(f"r{i}", (i * 7919) % 977) for i in range(n)]
    table = {r.rid: r for r in reqs}
    reqs.sort(key=lambda r: r.priority)
    total = 0
    for r in reqs:
        r.output_ids.append(r.priority)
        total += len(r.output_ids) + table[r.rid].priority
    return total


def _torch_work():
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(TORCH_ROWS, TORCH_HIDDEN, generator=g)
    ws = [(torch.randn(TORCH_HIDDEN, TORCH_INTERMEDIATE, generator=g) * 0.05,
           torch.randn(TORCH_INTERMEDIATE, TORCH_HIDDEN, generator=g) * 0.05) for _ in range(TORCH_LAYERS)]

    def work() -> float:
        with torch.no_grad():
            for _ in range(TORCH_CALLS):
                h = x
                for up, down in ws:
                    h = h + torch.nn.functional.silu(h @ up) @ down
        return float(h[0, 0])
    return work


def _time(fn, reps: int, warmup: int) -> tuple[float, float]:
    """(median wall s, median thread-CPU s) of ``fn`` over ``reps`` calls after ``warmup``."""
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(reps):
        w0, c0 = time.perf_counter(), time.thread_time()
        fn()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    return statistics.median(wall), statistics.median(cpu)


def probe(reps: int = 150, warmup: int = 10, with_torch: bool = True) -> dict:
    """The probe's reading: ``{"python_s", "python_cpu_s", "torch_s"?, "torch_cpu_s"?, "utc"}``
    (seconds per repetition). ``with_torch=False`` (or torch missing) leaves the torch keys out.

    Raises:
        ValueError: ``reps`` < 1 or ``warmup`` < 0.
    """
    if reps < 1 or warmup < 0:
        raise ValueError("reps must be >= 1 and warmup >= 0")
    out: dict = {}
    out["python_s"], out["python_cpu_s"] = _time(python_work, reps, warmup)
    if with_torch:
        try:
            work = _torch_work()
        except ImportError:
            work = None
        if work is not None:
            out["torch_s"], out["torch_cpu_s"] = _time(work, reps, warmup)
    out["utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return out


def mean_reading(readings: list[dict]) -> dict:
    """The mean of several readings, key by key (keys every reading has; ``utc`` of each kept as
    ``utc_list``). Raises ValueError for an empty list."""
    if not readings:
        raise ValueError("no probe readings")
    keys = [k for k in readings[0] if k != "utc" and all(isinstance(r.get(k), (int, float)) for r in readings)]
    out = {k: statistics.fmean(float(r[k]) for r in readings) for k in keys}
    out["utc_list"] = [r.get("utc") for r in readings]
    return out


def drift(now: dict, reference: dict) -> dict[str, float]:
    """Scale factors from ``reference`` (the calibration's reading) to ``now``: ``{"cpu": python
    ratio, "gpu": torch ratio}`` (a ratio > 1: the host is slower now). A factor whose readings
    are missing or not positive finite numbers, or whose ratio lies outside [1/10, 10] (no host
    drifts that far: a corrupt reading), is 1.0."""
    def ratio(key: str) -> float:
        a, b = now.get(key), reference.get(key)
        ok = all(isinstance(v, (int, float)) and v == v and 0 < v < float("inf") for v in (a, b))
        r = float(a) / float(b) if ok else 1.0
        return r if 1.0 / MAX_DRIFT <= r <= MAX_DRIFT else 1.0
    return {"cpu": ratio("python_s"), "gpu": ratio("torch_s")}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m calibrate.hostspeed OUT.json", file=sys.stderr)
        return 2
    reading = probe()
    Path(argv[0]).write_text(json.dumps(reading) + "\n")
    print(json.dumps(reading))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
