"""Does the scheduler's bookkeeping run slower right after the CPU waited? (run by hand)

Times ``process_decode`` of one decode step (``calibrate.bookkeeping.bookkeeper.Bookkeeper``, a running
batch of ``--batch`` requests with ``--stop-strings`` stop strings each) in three ways, pinned
to one core, rounds interleaved:

- ``back-to-back``: decode steps one after another (what calibration times, and what the CPU
  does in a CPU-bound ``overlap`` loop, which never waits for the device);
- ``after-sleep``: after the thread slept ``--wait-ms`` (a blocking wait for the device);
- ``after-spin``: after it spun ``--wait-ms`` on the clock (a spinning synchronize).

The ground-truth harness measured ``process.decode`` slower in the ``normal`` loop (which
waits for every forward) than in the ``overlap`` loop; the simulator prices a phase the same in
every loop. This script isolates that effect.

    python benchmarks/bookkeeping_after_wait.py                                 # 64 requests, 512 stop strings
    python benchmarks/bookkeeping_after_wait.py --batch 8 --stop-strings 2      # a small batch
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    from calibrate.bookkeeping.bench import BookkeepingBench
    from calibrate.config import BenchWorkload
    from calibrate.harness.workload import stop_strings

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64, help="running requests in the decode batch")
    ap.add_argument("--stop-strings", type=int, default=512, help="stop strings per request")
    ap.add_argument("--wait-ms", type=float, default=1.0, help="how long the thread sleeps or spins before a step")
    ap.add_argument("--steps", type=int, default=32, help="timed decode steps per mode and round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (the three modes interleaved)")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    w = BenchWorkload(system_prompts=1, system_len=24, user_len=16, output_lo=16, output_hi=16,
                      stop_strs=tuple(stop_strings(args.stop_strings)), vocab=1024)
    bench = BookkeepingBench(args.batch, workload=w)
    wait = args.wait_ms / 1e3

    def spin() -> None:
        end = time.perf_counter() + wait
        while time.perf_counter() < end:
            pass

    modes = {"back-to-back": None, "after-sleep": lambda: time.sleep(wait), "after-spin": spin}
    medians: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for mode, before in modes.items():
            bk = bench.fresh()
            times = []
            for _ in range(args.steps + 2):
                bench._fill_running(bk, args.batch)  # finished requests replaced, untimed
                if before is not None:
                    before()
                batch = bk.schedule_decode()
                ids = bench.text.take(args.batch)
                t0 = time.perf_counter()
                bk.process_decode(batch, ids)
                times.append(time.perf_counter() - t0)
            medians[mode].append(statistics.median(times[2:]))
    base = statistics.median(medians["back-to-back"])
    print(f"process_decode, batch {args.batch}, {args.stop_strings} stop strings, wait {args.wait_ms} ms, "
          f"{args.rounds} rounds x {args.steps} steps (median of round medians):")
    for mode, vals in medians.items():
        m = statistics.median(vals)
        print(f"  {mode:13s} {m * 1e3:7.3f} ms  x{m / base:.2f}   rounds: " + ", ".join(f"{v * 1e3:.3f}" for v in vals))


if __name__ == "__main__":
    main()
