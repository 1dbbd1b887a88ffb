"""Does a grammar slow SGLang's forward in the server? An A/B on the structured grid's loads (run by hand).

The structured validation (``validate_interleaved.py --engine sglang --grid structured``) found the
server's ``ModelRunner.forward`` 5-10% slower at 8-16 requests than the in-process calibration
priced it, where the held-out grid's plain sessions matched within a few percent. This script
separates the grammar from everything else: the same loads (own client, the grid's niceness),
with every request constrained (``-json``) and plain (``-plain``, the same prompts and lengths,
greedy), alternated session by session (json, plain, plain, json, ...), under one loop; then, from
the scheduler's trace, the mean ``ModelRunner.forward`` (the forward record alone, sampling
excluded) of the decode steps per batch size and context bucket, both ways, and the clients'
median TPOT.

    python benchmarks/grammar_forward_ab.py --repeats 3 --work results/grammar-ab

Needs SGLang's environment. Resumes: finished sessions in ``--work`` are reused. Writes
``--result`` (default ``benchmarks/results/sglang-grammar-forward-ab.json``).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

BUCKETS = ((64, 128), (128, 192), (192, 256), (256, 4096))  # context per request, tokens


def forward_by_shape(folder: Path) -> dict:
    """Mean ``ModelRunner.forward`` (ms) of the decode steps of the sessions under ``folder``,
    keyed ``"B@lo-hi"`` (batch size, context bucket), with the count."""
    from calibrate.real import sglang_trace

    acc = collections.defaultdict(list)
    for f in sorted(glob.glob(str(folder / "sessions" / "*" / "trace.*.jsonl"))):
        _, recs, _ = sglang_trace.read_records(Path(f))
        fwd = {}
        for r in recs:  # the forward record of each batch, by its forward_iter
            if r["ph"] == "forward" and r.get("mode") == "DECODE":
                fwd.setdefault(r.get("bs"), []).append(r["cpu"])
        its = sglang_trace.iterations(recs)
        order = collections.defaultdict(int)
        for s in sglang_trace.steps(its):
            if s.kind != "decode":
                continue
            b = s.num_reqs
            i = order[b]
            order[b] += 1
            if b not in fwd or i >= len(fwd[b]):
                continue
            c = s.ctx / b
            for lo, hi in BUCKETS:
                if lo <= c < hi:
                    acc[f"{b}@{lo}-{hi}"].append(fwd[b][i])
    return {k: {"mean_ms": round(statistics.mean(v) * 1e3, 4), "n": len(v)} for k, v in sorted(acc.items())}


def client_tpot(folder: Path) -> dict:
    """Median TPOT (ms) per load over the sessions under ``folder``."""
    out = collections.defaultdict(list)
    for f in sorted(glob.glob(str(folder / "sessions" / "*" / "*.json"))):
        if f.endswith("session.json") or "host_speed" in f:
            continue
        d = json.loads(Path(f).read_text())
        tp = [(r["end_s"] - r["first_s"]) / (r["output_len"] - 1) * 1e3 for r in d.get("requests", [])
              if r.get("output_len", 0) > 1 and not r.get("warmup") and not r.get("error")]
        if tp:
            out[d["name"]].append(statistics.median(tp))
    return {k: [round(x, 3) for x in v] for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    from calibrate.real.environment import REPO, find_engine, test_model
    from calibrate.real.validate import Plan, run_sessions

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--setting", choices=("normal", "overlap"), default="normal")
    ap.add_argument("--work", type=Path, default=Path("results/grammar-ab"))
    ap.add_argument("--result", type=Path, default=Path("benchmarks/results/sglang-grammar-forward-ab.json"))
    args = ap.parse_args(argv)
    engine = find_engine("sglang")
    model = test_model(engine, REPO / ".venvs" / "models" / "tiny-llama")
    json_plan = replace(Plan.for_engine("sglang", "structured", repeats=1), settings=(args.setting,))
    plain_plan = replace(json_plan, configs=tuple(replace(c, name=c.name.replace("-json", "-plain"), grammar="")
                                                  for c in json_plan.configs))
    arms = {"json": json_plan, "plain": plain_plan}
    for r in range(args.repeats):
        for arm in (("json", "plain") if r % 2 == 0 else ("plain", "json")):
            run_sessions(engine, model, replace(arms[arm], repeats=r + 1), args.work / arm,
                         lambda m: print(f"{arm}: {m}", file=sys.stderr, flush=True))
    out = {"command": "python benchmarks/grammar_forward_ab.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "setting": args.setting, "repeats": args.repeats, "client_nice": json_plan.client_nice,
           "loads": [c.name for c in json_plan.configs]}
    for arm in arms:
        out[arm] = {"forward": forward_by_shape(args.work / arm), "client_tpot_ms": client_tpot(args.work / arm)}
    out["forward_ratio_json_over_plain"] = {
        k: round(v["mean_ms"] / out["plain"]["forward"][k]["mean_ms"], 4)
        for k, v in out["json"]["forward"].items()
        if k in out["plain"]["forward"] and min(v["n"], out["plain"]["forward"][k]["n"]) >= 20}
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(out, indent=1) + "\n")
    for k, ratio in out["forward_ratio_json_over_plain"].items():
        print(f"forward {k:14s} json {out['json']['forward'][k]['mean_ms']:8.3f} ms  plain "
              f"{out['plain']['forward'][k]['mean_ms']:8.3f} ms  ratio {ratio:.3f}")
    print(f"results: {args.result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
