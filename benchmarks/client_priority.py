"""What the load generator's priority does to a real server's measured numbers (run by hand).

    python benchmarks/client_priority.py NICE0_DIR NICE10_DIR [--out benchmarks/results/vllm-client-priority.json]

Each DIR is a validation folder (``overlap-sim validate --engine vllm --grid heldout`` or
``benchmarks/validate_interleaved.py --grid heldout``: ``sessions/<setting>-<repeat>/``) whose
sessions ran the same loads with the client at one niceness (``client_nice`` in the session spec:
0, and -10). Per load and setting (the first repeat of each) it reports, from the client's own
records and the engine's trace: output throughput, median TTFT and TPOT, how late the client
sent its open-loop requests against its own schedule (``vllm bench serve``'s ``queue_times``:
median, p90, max), and how long after the engine core's ``update_from_output`` the API server
had processed each step's output (the tracer's ``output`` records: median and p99 lag). A client
starved of CPU shows as late sends and late reads while the API server keeps pace with the
engine; the server's own slowness shows in the second column as well.
"""

from __future__ import annotations

import argparse
import bisect
import glob
import json
import statistics
import sys
from pathlib import Path


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def _trace(folder: Path) -> list[dict]:
    out: list[dict] = []
    for path in glob.glob(str(folder / "trace.*.jsonl")):
        with open(path) as f:
            out += [json.loads(line) for line in f]
    return out


def load_row(folder: Path, name: str, trace: list[dict]) -> dict | None:
    """The numbers of one load in one session (None when the session has no such load)."""
    path = folder / f"{name}.json"
    if not path.exists():
        return None
    load = json.loads(path.read_text())
    reqs = [r for r in load["requests"] if not r["warmup"] and r["end_s"] is not None]
    start = min(r["send_s"] for r in reqs)
    end = max(r["end_s"] for r in reqs)
    tokens = sum(r["output_len"] for r in reqs)
    if all("send_lag_s" in r for r in reqs):
        lags = [r["send_lag_s"] for r in reqs]
    else:  # records written before the lag was kept: the benchmark's own result holds it
        bench = json.loads((folder / f"{name}.bench.json").read_text())
        lags = [lag for lag, err in zip(bench["queue_times"], bench["errors"]) if not err]
    updates = sorted(r["t0"] + r["dur"] for r in trace if r["ph"] == "update" and start <= r["t0"] <= end)
    outputs = sorted(r["t0"] + r["dur"] for r in trace if r["ph"] == "output" and start <= r["t0"] <= end)
    out_lag = [o - updates[i - 1] for o in outputs if (i := bisect.bisect_right(updates, o)) > 0]
    return {"output_throughput": tokens / (end - start),
            "median_ttft_ms": statistics.median(r["first_s"] - r["send_s"] for r in reqs) * 1e3,
            "median_tpot_ms": statistics.median((r["end_s"] - r["first_s"]) / (r["output_len"] - 1)
                                                for r in reqs if r["output_len"] > 1) * 1e3,
            "send_lag_ms": {"median": statistics.median(lags) * 1e3, "p90": _quantile(lags, 0.9) * 1e3,
                            "max": max(lags) * 1e3},
            "api_output_lag_ms": {"median": statistics.median(out_lag) * 1e3 if out_lag else float("nan"),
                                  "p99": _quantile(out_lag, 0.99) * 1e3}}


def compare(dirs: dict[str, Path]) -> dict:
    result: dict = {"sessions": {k: str(v) for k, v in dirs.items()}, "loads": {}}
    for label, base in dirs.items():
        for folder in sorted((base / "sessions").glob("*-0")):
            if not folder.is_dir():
                continue
            setting, trace = folder.name.rsplit("-", 1)[0], _trace(folder)
            for path in sorted(folder.glob("*.bench.json")):
                name = path.name[: -len(".bench.json")]
                if (row := load_row(folder, name, trace)) is not None:
                    result["loads"].setdefault(name, {}).setdefault(setting, {})[label] = row
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("nice0", type=Path, help="validation folder, client at niceness 0")
    ap.add_argument("nice10", type=Path, help="validation folder, client at niceness -10")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/vllm-client-priority.json"))
    args = ap.parse_args(argv)
    for d in (args.nice0, args.nice10):
        if not (d / "sessions").is_dir():
            print(f"client_priority.py: {d}: no sessions/ folder (a validation folder)", file=sys.stderr)
            return 2
    result = compare({"nice 0": args.nice0, "nice -10": args.nice10})
    result["command"] = " ".join(["python", "benchmarks/client_priority.py", *(argv or sys.argv[1:])])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'load':12s} {'setting':6s} {'client':9s} {'tok/s':>7s} {'TTFT ms':>8s} {'TPOT ms':>8s} "
          f"{'send lag p90/max ms':>20s} {'API out lag med/p99 ms':>23s}")
    for name, by_setting in result["loads"].items():
        for setting, rows in sorted(by_setting.items()):
            for label, r in rows.items():
                print(f"{name:12s} {setting:6s} {label:9s} {r['output_throughput']:7.0f} {r['median_ttft_ms']:8.1f} "
                      f"{r['median_tpot_ms']:8.2f} {r['send_lag_ms']['p90']:9.1f} / {r['send_lag_ms']['max']:7.1f} "
                      f"{r['api_output_lag_ms']['median']:10.2f} / {r['api_output_lag_ms']['p99']:7.2f}")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
