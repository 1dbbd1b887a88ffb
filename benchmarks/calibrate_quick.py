"""Wall time of `overlap-sim calibrate --quick` for torch and MLX on this machine's CPU (the
issue's target: well under a minute on 2 cores). Run by hand:

    python benchmarks/calibrate_quick.py            # one line per backend, exit 1 if over --limit
    python benchmarks/calibrate_quick.py --limit 30

Each backend runs in a fresh process (`python -m sim.cli calibrate ...`), so the time includes
importing torch or MLX, as a user sees it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=float, default=60.0, help="seconds each run must stay under")
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("torch", "mlx"):
            out = Path(tmp) / f"{backend}.json"
            cmd = [sys.executable, "-m", "sim.cli", "calibrate", "--backend", backend, "--device", "cpu",
                   "--model", "tiny", "--quick", "--quiet", "--out", str(out)]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            status = "ok" if proc.returncode == 0 and out.exists() and wall < args.limit else "FAIL"
            ok &= status == "ok"
            print(f"{backend:6s} --quick on cpu: {wall:6.1f} s  (limit {args.limit:.0f} s)  {status}")
            if proc.returncode:
                print(proc.stderr[-2000:], file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
