"""The drafting calibration's worker phases with its load generator at niceness 0 and -10, A/B,
in one window (run by hand; root, vLLM's environment).

    python benchmarks/spec_phases_nice_ab.py --repeats 2 --work results/ab-spec-nice \
        [--out benchmarks/results/vllm-spec-phases-nice-ab.json]

The speculative check of 4 December 2026 (docs/vllm.md) found every worker phase 10-30% slower
under the validation's loads (vLLM's benchmark client at niceness -10) than in the calibration's
drafting sessions (the own client at 0). This runs the synchronous drafting session
(:func:`calibrate.real.vllm.sessions.run_speculative_session`, the test model drafting for itself,
k = 2) with the client at 0 and at -10, alternated per repeat (0, -10, -10, 0, ...), and prints
the medians of the worker's phases per batch size for each niceness, with the -10/0 ratio: if the
niceness is the reason, the ratios show it here, where the load and the client are the same.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

NICENESS = (0, -10)
PHASES = ("prepare", "verify_forward", "sample_less_drafter", "drafter", "post_step")


def phases(folder: Path) -> dict[int, dict[str, list[float]]]:
    """Per batch size, each phase's times (s) over the drafting session's decode steps."""
    from calibrate.real.vllm import trace

    steps = trace.steps_of_session(folder)
    by_k = {s.k: s for s in steps}
    out: dict[int, dict[str, list[float]]] = {}
    for s in steps:
        nxt = by_k.get(s.k + 1)
        if s.draft is None or s.update is None or nxt is None or nxt.reqs != s.reqs or not all(t == 3 for t in s.tok):
            continue
        row = out.setdefault(s.num_reqs, {p: [] for p in PHASES})
        row["prepare"].append(s.execute["dur"] - s.forward)
        row["verify_forward"].append(s.forward)
        row["sample_less_drafter"].append(s.sample["dur"] - s.draft["dur"])
        row["drafter"].append(s.draft["dur"])
        row["post_step"].append(nxt.schedule["t0"] - (s.update["t0"] + s.update["dur"]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("results/ab-spec-nice"))
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/vllm-spec-phases-nice-ab.json"))
    args = ap.parse_args(argv)
    if args.repeats < 1:
        print("spec_phases_nice_ab.py: --repeats: an integer >= 1", file=sys.stderr)
        return 2
    from calibrate.real.environment import REPO, find_engine, test_model
    from calibrate.real.vllm.sessions import VllmGrid, run_speculative_session

    engine = find_engine("vllm")
    model = test_model(engine, REPO / ".venvs" / "models" / "tiny-llama")
    spec = {"method": "draft_model", "model": str(model), "num_speculative_tokens": 2, "draft_cost_ratio": 1.0}
    pooled: dict[int, dict[int, dict[str, list[float]]]] = {n: {} for n in NICENESS}
    order = []
    for r in range(args.repeats):
        for nice in (NICENESS if r % 2 == 0 else tuple(reversed(NICENESS))):
            name = f"n{nice}-{r}"
            order.append(name)
            out = run_speculative_session(engine, model, VllmGrid(), "sync", args.work, print, name, spec,
                                          client_nice=nice)
            for m, row in phases(out).items():
                into = pooled[nice].setdefault(m, {p: [] for p in PHASES})
                for p in PHASES:
                    into[p] += row[p]
    table = {}
    for m in sorted(set(pooled[0]) & set(pooled[-10])):
        table[m] = {p: {"nice0_ms": statistics.median(pooled[0][m][p]) * 1e3,
                        "nice-10_ms": statistics.median(pooled[-10][m][p]) * 1e3} for p in PHASES}
        for p in PHASES:
            t = table[m][p]
            t["ratio"] = t["nice-10_ms"] / t["nice0_ms"] if t["nice0_ms"] else float("nan")
        print(f"{m:3d} requests: " + "; ".join(f"{p} {table[m][p]['nice0_ms']:.2f} -> {table[m][p]['nice-10_ms']:.2f} ms "
                                              f"(x{table[m][p]['ratio']:.2f})" for p in PHASES))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": " ".join(["python", "benchmarks/spec_phases_nice_ab.py", *(argv or sys.argv[1:])]),
                                    "order": order, "by_batch": {str(m): v for m, v in table.items()}}, indent=1) + "\n")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
