"""Your own server as the source, end to end (run by hand): a real SGLang server profiled the way
docs/real-engines.md tells a user to, the profile built from its traces and log, and that
profile's predictions against the same server unprofiled.

    python benchmarks/own_server.py [--work results/own-server] [--out benchmarks/results/own-server-sglang-cpu.json]

1. :mod:`realengines.sglang.own_server` (in the SGLang environment) starts the server, takes
   the docs' recipe's profile windows (``overlap-sim calibrate --profile-server``'s designed
   load, :mod:`calibrate.real.from_trace.record`), then serves the truth loads unprofiled, in
   rounds;
2. ``overlap-sim calibrate --from-trace <the windows' traces> --server-log recipe.server.log
   --out own-server.json``: what ``--profile-server`` runs after its recording, with the log as it
   stood when the recording ended;
3. each truth load as a scenario on that profile (``overlap-sim run --json``: closed loop, the
   load's clients, lengths and warm-up, the server's resolved limits), against the measured
   client records (bench_serving's definitions: output throughput over the measured requests'
   span, TPOT = (latency - TTFT) / (output tokens - 1), medians).

The truth loads are closed loops the traces did not see as such (the windows hold stages of
requests sent at once); the 256/64 one has contexts between the traces' short and long stages
at a batch no stage had, the 1792/64 one contexts beyond every trace's. Needs
``realengines/sglang/setup.sh``. Everything is kept in ``--work``: a finished recording is reused
(delete the folder to record again). About 8 minutes here (11 with ``--repeats 3``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TRUTH = [
    {"name": "c12-128-128", "concurrency": 12, "requests": 48, "input_len": 128, "output_len": 128,
     "warmup_requests": 4, "seed": 2},
    {"name": "c6-256-64", "concurrency": 6, "requests": 24, "input_len": 256, "output_len": 64,
     "warmup_requests": 2, "seed": 3},
    {"name": "c16-512-128", "concurrency": 16, "requests": 48, "input_len": 512, "output_len": 128,
     "warmup_requests": 4, "seed": 4},
    {"name": "c8-1792-64", "concurrency": 8, "requests": 24, "input_len": 1792, "output_len": 64,
     "warmup_requests": 2, "seed": 5},  # contexts beyond every trace's (x1.8)
]
SERVER_ARGS = ["--context-length", "2048", "--max-running-requests", "16", "--mem-fraction-static", "0.05"]


def measured(path: Path) -> dict:
    """bench_serving's output throughput (tok/s), median TPOT and TTFT (ms) of a client record's
    measured requests."""
    reqs = [r for r in json.loads(path.read_text())["requests"] if not r["warmup"] and not r.get("error")]
    span = max(r["end_s"] for r in reqs) - min(r["send_s"] for r in reqs)
    tpot = [(r["end_s"] - r["first_s"]) / (r["output_len"] - 1) * 1e3 for r in reqs if r["output_len"] > 1]
    return {"output_throughput": sum(r["output_len"] for r in reqs) / span,
            "median_tpot_ms": statistics.median(tpot),
            "median_ttft_ms": statistics.median((r["first_s"] - r["send_s"]) * 1e3 for r in reqs),
            "requests": len(reqs)}


def scenario(load: dict, profile: Path, limits: dict, setting: str) -> dict:
    return {"name": load["name"], "seed": 0,
            "workload": {"arrival": "closed_loop", "concurrency": load["concurrency"],
                         # the simulator's num_requests counts the warm-ups; the client sent them besides
                         "num_requests": load["requests"] + load["warmup_requests"], "input_len": load["input_len"],
                         "output_len": load["output_len"], "warmup_requests": load["warmup_requests"],
                         "warmup_before_benchmark": True},
            "server": {"device": "cpu", "settings": [setting], "version": "0.5.23",
                       "max_running_requests": int(limits.get("max_running_requests") or 16),
                       "chunked_prefill_size": int(limits.get("chunked_prefill_size") or 4096),
                       "kv_pool_tokens": int(limits.get("max_total_num_tokens") or 400_000)},
            "costs": {"profile": str(profile.resolve())}}


def write_fixture(folder: Path, traces: list[str], log: Path, work: Path, cases: list[dict], setting: str,
                  command: str) -> None:
    """The recorded server for ``tests/test_own_server.py``: each trace trimmed to what the importer
    reads (:func:`realengines.sglang.record_profile.trim`), the log, and ``truth.json`` (each load's
    scenario and its measured medians)."""
    from realengines.sglang.record_profile import trim

    folder.mkdir(parents=True, exist_ok=True)
    for t in traces:
        trim(Path(t), folder / Path(t).name)
    (folder / "recipe.server.log").write_text(log.read_text(errors="replace"))
    truth = {"command": command, "setting": setting,
             "cases": [{"name": c["load"]["name"], "measured": c["measured"],
                        "scenario": {k: v for k, v in json.loads((work / f"{c['load']['name']}.json").read_text()).items()
                                     if k != "costs"}} for c in cases]}
    (folder / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("results/own-server"))
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/own-server-sglang-cpu.json"))
    ap.add_argument("--setting", choices=("normal", "overlap"), default="normal")
    ap.add_argument("--num-steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--fixture", type=Path, default=None, metavar="DIR",
                    help="also write the test fixture: the traces trimmed, the log, the truth (tests/test_own_server.py)")
    args = ap.parse_args(argv)
    if args.num_steps < 4 or args.repeats < 1:
        print("own_server.py: --num-steps, --repeats: at least 4, 1", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from calibrate.real.environment import REPO, find_engine, test_model
    from calibrate.real.validate import server_limits

    test_model(find_engine("sglang"), REPO / ".venvs" / "models" / "tiny-llama")

    work = args.work.resolve()
    rec = work / "record"
    plan = {"setting": args.setting, "server_args": SERVER_ARGS, "num_steps": args.num_steps, "truth": TRUTH,
            "repeats": args.repeats}
    work.mkdir(parents=True, exist_ok=True)
    (work / "plan.json").write_text(json.dumps(plan, indent=1))
    subprocess.run([sys.executable, "-m", "realengines.sglang.own_server", str(work / "plan.json"), str(rec)],
                   check=True, cwd=ROOT)
    record = json.loads((rec / "record.json").read_text())
    traces = [w["trace"] for w in record["windows"]]
    profile = work / "own-server.json"
    cal = ["overlap-sim", "calibrate", "--from-trace", *traces, "--server-log", str(rec / "recipe.server.log"),
           "--out", str(profile)]
    done = subprocess.run(cal, capture_output=True, text=True, cwd=ROOT)
    print(done.stderr, file=sys.stderr)
    if done.returncode:
        return done.returncode
    limits = server_limits(rec)
    cases = []
    for load in TRUTH:
        sc_path = work / f"{load['name']}.json"
        sc_path.write_text(json.dumps(scenario(load, profile, limits, args.setting)))
        run = subprocess.run(["overlap-sim", "run", str(sc_path), "--out", str(work / "runs" / load["name"]), "--json",
                              "--no-plots"], capture_output=True, text=True, cwd=ROOT, check=True)
        out = json.loads(run.stdout)
        pred = out["settings"][args.setting]
        runs = [measured(p) for p in sorted((rec / "truth").glob(f"{load['name']}-*.json"))]
        meas = {k: statistics.median(r[k] for r in runs) for k in ("output_throughput", "median_tpot_ms",
                                                                     "median_ttft_ms")}
        err = {k: pred[k] / meas[k] - 1 for k in meas}
        cases.append({"load": load, "measured": meas, "measured_runs": runs,
                      "predicted": {k: pred[k] for k in meas}, "error": err,
                      "extrapolated_steps": pred.get("extrapolated_steps"), "far_steps": pred.get("far_steps"),
                      "max_extrapolation": pred.get("max_extrapolation"), "verdict": (out.get("verdict") or {}).get("line")})
        print(f"{load['name']:14s} throughput {meas['output_throughput']:8.1f} measured, {pred['output_throughput']:8.1f} "
              f"predicted ({err['output_throughput']:+.1%}); TPOT {meas['median_tpot_ms']:.2f} / "
              f"{pred['median_tpot_ms']:.2f} ms ({err['median_tpot_ms']:+.1%}); TTFT {err['median_ttft_ms']:+.1%}; "
              f"{pred.get('extrapolated_steps')} steps beyond the data (up to x{pred.get('max_extrapolation', 1):.1f})")
    meta = json.loads(profile.read_text())["metadata"]
    med = {k: statistics.median(abs(c["error"][k]) for c in cases) for k in cases[0]["error"]}
    result = {"command": shlex.join(["python", "benchmarks/own_server.py", *(argv if argv is not None else sys.argv[1:])]),
              "calibrate_command": shlex.join(cal), "plan": plan, "versions": record["versions"],
              "windows": record["windows"], "coverage": meta["coverage"], "slowdown": meta["trace"]["slowdown"],
              "server_log_check": {k: v for k, v in meta.get("server_log_check", {}).items() if k != "traces"},
              "cases": cases, "median_abs_error": med}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.fixture is not None:
        write_fixture(args.fixture, traces, rec / "recipe.server.log", work, cases, args.setting, result["command"])
    print("median |error|: " + ", ".join(f"{k} {v:.1%}" for k, v in med.items()))
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
