"""The load generator's niceness, A/B, in one window (run by hand).

    python benchmarks/client_nice_ab.py --engine sglang --profile PROFILE --repeats 3 \
        --only c4-len --only c16-len --only c8-mixed --work results/ab-nice \
        [--out benchmarks/results/sglang-client-nice-ab.json]

On a 2-vCPU VM the load generator shares the cores with the server (SGLang's scheduler,
tokenizer and detokenizer; vLLM's engine core, worker and API server), so how much CPU it gets
may move what it measures. This runs ``overlap-sim validate --engine E`` on the default grid's
loads (``--only``) with the client at niceness 0 and at -10, alternated per repeat (repeat 1: 0
then -10; repeat 2: -10 then 0; ...), each niceness in its own folder (``WORK0``, ``WORK-10``:
sessions reused on a rerun), then writes both validations (errors, per-load and pooled speedup)
side by side. Needs root (niceness -10) and the engine's environment.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

NICENESS = (0, -10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=("sglang", "vllm"), default="sglang")
    ap.add_argument("--profile", type=Path, required=True, help="the engine's calibration profile")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", action="append", default=[], metavar="NAME", help="default-grid loads (repeatable)")
    ap.add_argument("--work", type=Path, default=Path("results/ab-nice"))
    ap.add_argument("--out", type=Path, default=None, help="default benchmarks/results/<engine>-client-nice-ab.json")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        print("client_nice_ab.py: --repeats: an integer >= 1", file=sys.stderr)
        return 2
    from sim.cli import main as overlap_sim

    base = ["validate", "--engine", args.engine, "--profile", str(args.profile), "--no-plot",
            *[x for name in args.only for x in ("--only", name)]]
    for r in range(1, args.repeats + 1):
        for nice in (NICENESS if r % 2 else NICENESS[::-1]):
            code = overlap_sim([*base, "--repeats", str(r), "--client-nice", str(nice),
                                "--out", f"{args.work}{nice}"])
            if code:
                return code
    out = args.out or Path("benchmarks/results") / f"{args.engine}-client-nice-ab.json"
    command = shlex.join(["python", "benchmarks/client_nice_ab.py", *(argv if argv is not None else sys.argv[1:])])
    result = {"command": command,
              "by_niceness": {str(n): json.loads(Path(f"{args.work}{n}/validation.json").read_text()) for n in NICENESS}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for n in NICENESS:
        v = result["by_niceness"][str(n)]
        p = v["speedup_pooled"]
        print(f"niceness {n:3d}: pooled {p['of']} measured {p['measured_mean']:.3f}, predicted {p['predicted_mean']:.3f} "
              f"({p['error_pp']:+.1f} pp [{p['ci95_pp'][0]:+.1f}, {p['ci95_pp'][1]:+.1f}]); median |error| "
              + ", ".join(f"{k} {x * 100:.1f}%" for k, x in v["median_abs_error"].items()))
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
