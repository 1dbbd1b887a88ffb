"""Instructions a simulated request costs, this tree against another (run by hand; see docs/speed.md).

CPU time on the shared development VM moves by 10-40% from one run to the next, more than a
change to the hot path gains; the number of instructions a process executes does not (valgrind's
callgrind counts them: the same count from run to run, to a few in a million). For each workload
and setting, each tree runs the leap benchmark's case (``sim_speed.py --leap-case``: the
simulation with ``--tables none`` and its summary, in one process) under callgrind at two sizes;
the difference over the difference in requests is the marginal cost of a request, with start-up,
imports and the scenario's set-up cancelled out.

    python benchmarks/instructions.py closed-64 --settings overlap normal --against /tmp/base
    python benchmarks/instructions.py open --settings overlap --sizes 1000 4000 --against /tmp/base

Workloads as ``sim_speed.py --leap`` names them (``open``, ``closed-C``, ``vllm-open``,
``vllm-closed-C``); ``--against DIR`` is another checkout (``git archive <commit> | tar -x -C
DIR``). Under callgrind a run takes about 60 times its CPU time (``closed-64`` at 20,000
requests: about 25 s; ``open`` at 4,000: about 20 s). Instructions are not seconds: a change that
trades instructions for cache misses or a slower numpy call can move them apart, so a speed
claim still reports CPU time, measured interleaved; the count says which way a change goes
when the CPU time is within its noise. It can also say so wrongly: a change that trades cheap
instructions for others (locals for attribute loads, fewer calls, more list appends) can cut
the count and leave the time where it was. On 5 December 2026 the leap's "quiet stretches" cut
10-11% of the instructions a request of the open loop and none of its CPU time (the minimum of
four runs in one process, three processes a tree, interleaved), and were reverted: confirm a
count's gain with CPU time before keeping a change.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIM_SPEED = ROOT / "benchmarks" / "sim_speed.py"


def count(workload: str, requests: int, setting: str, tree: Path | None) -> tuple[int, float]:
    """Instructions the case executes under callgrind, and the throughput it reports.

    Raises:
        RuntimeError: the case failed (its stderr's end in the message).
    """
    case = json.dumps([workload, requests, setting, "tree" if tree else "leap"])
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, str(SIM_SPEED),
           "--leap-case", case, *(["--tree", str(tree)] if tree else [])]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}  # numpy's idle BLAS threads would count too
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode or not found:
        raise RuntimeError(f"{' '.join(cmd[4:])} failed: {out.stderr[-800:]}")
    return int(found.group(1)), json.loads(out.stdout.splitlines()[-1])["throughput"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workloads", nargs="+", help="open, closed-C, vllm-open, vllm-closed-C")
    ap.add_argument("--settings", nargs="+", default=["overlap", "normal"])
    ap.add_argument("--sizes", type=int, nargs=2, default=[2000, 20000], metavar=("SMALL", "BIG"))
    ap.add_argument("--against", type=Path, default=None, metavar="DIR", help="another checkout to compare with")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        print("instructions.py: valgrind is not installed (it counts the instructions)", file=sys.stderr)
        sys.exit(2)
    if args.against is not None and not (args.against / "sim").is_dir():
        print(f"instructions.py: --against {args.against}: no sim/ package there", file=sys.stderr)
        sys.exit(2)
    small, big = args.sizes
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from sim_speed import workload_settings  # the settings a workload runs (vLLM's for vllm- workloads)

    trees = [("this tree", None)] + ([("against", args.against)] if args.against else [])
    for workload in args.workloads:
        for setting in workload_settings(workload, args.settings):
            per_request, outputs = {}, set()
            for name, tree in trees:
                (lo, _), (hi, throughput) = count(workload, small, setting, tree), count(workload, big, setting, tree)
                per_request[name] = (hi - lo) / (big - small)
                outputs.add(throughput)
            line = f"{workload:<14} {setting:<8} " + "  ".join(f"{k}: {v:,.0f}" for k, v in per_request.items())
            if args.against:
                line += f"  this/against {per_request['this tree'] / per_request['against']:.3f}"
                line += "" if len(outputs) == 1 else "  (! the trees' throughputs differ)"
            print(line + f"  instructions per request ({small:,} to {big:,} requests)", flush=True)


if __name__ == "__main__":
    main()
