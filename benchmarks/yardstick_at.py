"""Time the host yardstick (:mod:`calibrate.host.yardstick`) of an earlier revision of this repository on
this host: the re-implementation's bookkeeping exactly as that revision's calibration ran it.

    python benchmarks/yardstick_at.py REV OUT.json [--repeats 15] [--warmup 3]

A device profile written before the yardstick had a version (no ``metadata.yardstick_version``;
the shipped H200 device profiles were until 5 December 2026, revision ``f505e66``) is moved to
another host by readings of the same code on that host: this script extracts ``calibrate/`` of
REV (``git archive``) into a temporary folder, runs that revision's ``BookkeepingBench`` in a
fresh interpreter with it first on the path, at the batch sizes, warm-up and repeats of the full
GPU grid (1-256, 3 + 15), and writes ``{"version": REV, "python", "host_cpu", "date", "readings":
[...]}`` for ``overlap-sim compose --host-yardstick``. Run it on the host the host-costs file was
measured on, in the same window (about 70 s here at 3 rounds). The shipped profiles no longer
need it (their device parts record the version, docs/real-engines.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, statistics, sys
try:
    from calibrate.bench_bookkeeping import BookkeepingBench      # revision f505e66
except ImportError:
    from calibrate.bookkeeping.bench import BookkeepingBench      # later revisions
sizes, warmup, repeats, rounds = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
assert sys.modules[BookkeepingBench.__module__].__file__.startswith(sys.argv[4]), "not the revision's code"
bench = BookkeepingBench(max(sizes), seed=0)
acc = {}
for _ in range(rounds):  # rounds over the whole grid: a transient slowdown of the host hits one round's points
    for n in [0] + sizes:
        for curve, times in bench.measure(n, warmup, repeats).items():
            acc.setdefault((curve, n), []).append(statistics.median(times))
print(json.dumps([{"curve": c, "point": {"num_reqs": n}, "median_s": statistics.median(v), "n": rounds * repeats}
                  for (c, n), v in acc.items()]))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rev", help="a git revision of this repository (e.g. f505e66)")
    p.add_argument("out", type=Path)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3, help="passes over the grid; a point's reading is the median")
    p.add_argument("--batch-sizes", default="1,2,4,8,16,32,64,128,256")
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    sys.path.insert(0, str(ROOT))
    from calibrate.measure import host_cpu

    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.rev, "calibrate"], capture_output=True)
        if archive.returncode != 0:
            print(f"yardstick_at: git archive {args.rev}: {archive.stderr.decode().strip()}", file=sys.stderr)
            return 2
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        got = subprocess.run([sys.executable, "-c", CHILD, json.dumps(sizes), str(args.warmup), str(args.repeats), tmp,
                              str(args.rounds)],
                             capture_output=True, text=True, cwd=tmp, env={"PYTHONPATH": tmp, "PATH": "/usr/bin:/bin"})
        if got.returncode != 0:
            print(f"yardstick_at: revision {args.rev}'s bench failed: {got.stderr.strip().splitlines()[-1:]}",
                  file=sys.stderr)
            return 1
    reading = {"version": args.rev, "python": platform.python_version(), "host_cpu": host_cpu(),
               "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "command": " ".join(["python", "benchmarks/yardstick_at.py", *(argv or sys.argv[1:])]),
               "readings": json.loads(got.stdout)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = args.out.with_suffix(".tmp")
    tmp_out.write_text(json.dumps(reading, indent=1) + "\n")
    tmp_out.replace(args.out)
    print(f"{len(reading['readings'])} readings of revision {args.rev}'s yardstick written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
