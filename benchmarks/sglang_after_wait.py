"""Does a phase of SGLang's real scheduler cost more right after a blocking wait? (run by hand)

On a GPU host, ``event_loop_normal`` blocks on every step's result (the copy of the sampled
tokens) before ``process_batch_result``; ``event_loop_overlap`` blocks only when the device is
behind. If the CPU work after a wait is slower (caches and branch predictors gone cold, a core
clocked down), the simulator, which prices a phase the same in every loop, would be wrong by
that much. This script measures it on SGLang 0.5.23's own ``Scheduler`` (in-process,
:mod:`realengines.sglang.drive`): the same decode waves (the calibration's design, a smaller
grid) under ``event_loop_normal``, once as they run here (the forward runs on the scheduler's
thread, no wait) and once with a blocking ``time.sleep(--wait-ms)`` after every sampling, before
the result is processed (the driver's ``wait_before_process_s``). Runs interleaved, the order
swapped every repeat; per phase and batch size, the median thread CPU time of each and their
ratio (after wait / no wait) with the spread over repeats.

    python benchmarks/sglang_after_wait.py                      # 3 repeats, 5 ms wait
    python benchmarks/sglang_after_wait.py --repeats 5 --wait-ms 2

Needs the SGLang environment (``realengines/sglang/setup.sh``); writes
``benchmarks/results/sglang-after-wait.json`` (``--out``) and keeps the runs in ``--work``
(an interrupted run resumes).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

PHASES = ("recv", "schedule.decode", "launch.decode", "process.decode")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per condition (interleaved)")
    ap.add_argument("--wait-ms", type=float, default=5.0, help="blocking sleep after each sampling")
    ap.add_argument("--work", type=Path, default=Path("results/sglang-after-wait"), help="runs kept here")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/sglang-after-wait.json"))
    args = ap.parse_args()
    if args.repeats < 1 or not args.wait_ms > 0:
        print("sglang_after_wait.py: --repeats must be >= 1 and --wait-ms > 0", file=sys.stderr)
        return 2

    from calibrate.real import sglang_trace
    from calibrate.real.environment import REPO, find_engine, test_model
    from calibrate.real.sglang_profile import SglangGrid, design, run_job, samples

    engine = find_engine("sglang")
    model = test_model(engine, REPO / ".venvs" / "models" / "tiny-llama")
    grid = SglangGrid(decode_batch_sizes=(1, 4, 16), decode_contexts=(256,), decode_steps=32, decode_waves=2,
                      extend_tokens=(16,), extend_prefixes=(0,), extend_repeats=1)
    d = design(grid)
    conditions = {"no-wait": 0.0, "after-wait": args.wait_ms / 1e3}
    medians: dict[str, dict[str, list[float]]] = {c: {} for c in conditions}
    for r in range(args.repeats):
        order = list(conditions) if r % 2 == 0 else list(reversed(conditions))
        for cond in order:
            job = d.job(str(model), False, grid)
            if conditions[cond]:
                job["wait_before_process_s"] = conditions[cond]
            trace = run_job(engine, job, args.work, f"{cond}-{r}", lambda m: print(m, file=sys.stderr))
            _, records, _ = sglang_trace.read_records(trace)
            for smp in samples(sglang_trace.iterations(records), d):
                if smp["curve"] in PHASES:
                    key = f"{smp['curve']}@{','.join(str(v) for v in smp['point'].values())}"
                    medians[cond].setdefault(key, []).append(statistics.median(smp["times_s"]))
    rows = []
    for key in sorted(medians["no-wait"]):
        base, after = medians["no-wait"][key], medians["after-wait"].get(key, [])
        if len(base) != len(after):
            continue
        ratios = [a / b for a, b in zip(after, base)]
        rows.append({"phase": key, "no_wait_ms": statistics.median(base) * 1e3,
                     "after_wait_ms": statistics.median(after) * 1e3, "ratio_median": statistics.median(ratios),
                     "ratio_min": min(ratios), "ratio_max": max(ratios)})
        print(f"{key:22s} no wait {rows[-1]['no_wait_ms']:7.3f} ms  after wait {rows[-1]['after_wait_ms']:7.3f} ms  "
              f"ratio {rows[-1]['ratio_median']:.3f} [{min(ratios):.3f}, {max(ratios):.3f}]")
    result = {"command": shlex.join(["python", "benchmarks/sglang_after_wait.py", *sys.argv[1:]]),
              "engine": {"name": engine.name, "version": engine.version}, "wait_ms": args.wait_ms,
              "repeats": args.repeats, "loop": "event_loop_normal", "clock": "thread CPU time",
              "grid": {"decode_batch_sizes": list(grid.decode_batch_sizes), "decode_contexts": list(grid.decode_contexts),
                       "decode_steps": grid.decode_steps, "decode_waves": grid.decode_waves},
              "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
