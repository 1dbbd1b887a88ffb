"""Validation against a real server with the calibration interleaved (run by hand).

``overlap-sim calibrate --engine E`` then ``overlap-sim validate --engine E`` run one after the
other (vLLM: 35 minutes of calibration sessions, then 27 of validation sessions). On a shared VM
the host's speed drifts between the two halves (its Python probe read x0.69-1.16 of the
calibration's speed across the vLLM validation of 1 December 2026, 19:30 UTC), and every
prediction carries that drift whatever the model gets right. This script runs the same sessions
in one window, interleaved: two calibration rounds first (each round one run per setting, the
order alternating: sync-0, async-0, async-1, sync-1), then one validation repeat (both
settings), one calibration round, and so on, so that the profile and the sessions it is judged
against are measured over the same stretch of time. Then it builds the profile from every
calibration run (``calibrate_vllm`` / ``calibrate_sglang`` with ``sessions``, which reuse them)
and scores the validation with it (:func:`calibrate.real.validate.validate`, which reuses the
sessions): the profile is still fed by the designed calibration loads only, never by the
validation's. vLLM's calibration runs are server sessions; SGLang's are in-process runs of its
scheduler (``calibrate --engine sglang``), as without this script.

    python benchmarks/validate_interleaved.py --engine vllm          # 6 calibration rounds, 5 repeats
    python benchmarks/validate_interleaved.py --engine sglang --rounds 5
    python benchmarks/validate_interleaved.py --engine vllm --rounds 3 --repeats 2 --work results/il-small

Needs the engine's environment (``realengines/<engine>/setup.sh``). Keeps everything in ``--work``
(default ``results/interleaved-<engine>``: ``calibrate/``, ``profile.json``, ``validate/``): an
interrupted run resumes, finished runs and sessions are reused. Writes ``--result`` (default
``benchmarks/results/validate-<engine>-cpu-interleaved.json``): the validation's comparison and
the order the runs went in. About 65 minutes for vLLM here, 45 for SGLang.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path


def interleaved_order(rounds: int, repeats: int) -> list[tuple[str, int]]:
    """``("calibrate", round)`` and ``("validate", repeat)`` steps in run order: two calibration
    rounds, then a validation repeat and a calibration round in turn; whatever is left of either
    at the end. Raises ValueError when ``rounds`` < 2 or ``repeats`` < 1."""
    if rounds < 2 or repeats < 1:
        raise ValueError("rounds must be >= 2 and repeats >= 1")
    order: list[tuple[str, int]] = [("calibrate", 0), ("calibrate", 1)]
    c, v = 2, 0
    while c < rounds or v < repeats:
        if v < repeats:
            order.append(("validate", v))
            v += 1
        if c < rounds:
            order.append(("calibrate", c))
            c += 1
    return order


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("vllm", "sglang"), default="vllm")
    ap.add_argument("--rounds", type=int, default=6, help="calibration runs per setting (>= 2)")
    ap.add_argument("--repeats", type=int, default=5, help="validation repeats (both settings each)")
    ap.add_argument("--work", type=Path, default=None, help="runs kept here (default results/interleaved-<engine>)")
    ap.add_argument("--result", type=Path, default=None,
                    help="default benchmarks/results/validate-<engine>-cpu-interleaved.json")
    args = ap.parse_args(argv)
    try:
        order = interleaved_order(args.rounds, args.repeats)
    except ValueError as e:
        print(f"validate_interleaved.py: --rounds/--repeats: {e}", file=sys.stderr)
        return 2
    work = args.work or Path("results") / f"interleaved-{args.engine}"
    result_path = args.result or Path("benchmarks/results") / f"validate-{args.engine}-cpu-interleaved.json"

    from calibrate.profile import save_profile
    from calibrate.real.environment import REPO, find_engine, session_order, test_model
    from calibrate.real.validate import Plan, noise_floor_line, pooled_line, run_sessions, validate

    def report(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    engine = find_engine(args.engine)
    model = test_model(engine, REPO / ".venvs" / "models" / "tiny-llama")
    cal_dir, val_dir, profile_path = work / "calibrate", work / "validate", work / "profile.json"
    if args.engine == "vllm":
        from calibrate.real.vllm_profile import VllmGrid, calibrate_vllm, run_session

        grid = VllmGrid()
        settings = ("sync", "async")  # the calibration's order (its base setting first)

        def calibration_run(setting: str, name: str) -> None:
            run_session(engine, model, grid, setting, cal_dir, report, name)

        def build(command: str) -> dict:
            return calibrate_vllm(engine, model, grid, cal_dir, command=command, report=report, sessions=args.rounds)
    else:
        from calibrate.real.sglang_profile import SglangGrid, calibrate_sglang, design, run_job

        grid = SglangGrid()
        settings = ("normal", "overlap")
        d = design(grid)

        def calibration_run(setting: str, name: str) -> None:
            run_job(engine, d.job(str(model), setting == "overlap", grid), cal_dir, f"calibrate-{name}", report)

        def build(command: str) -> dict:
            return calibrate_sglang(engine, model, grid, cal_dir, command=command, report=report,
                                    sessions=args.rounds)
    cal_runs = session_order(settings, args.rounds)
    for step, i in order:
        if step == "calibrate":
            for setting, name in cal_runs[2 * i:2 * i + 2]:
                calibration_run(setting, name)
        else:
            run_sessions(engine, model, Plan.for_engine(args.engine, repeats=i + 1), val_dir, report)
    command = shlex.join(["python", "benchmarks/validate_interleaved.py", *(argv if argv is not None else sys.argv[1:])])
    save_profile(profile_path, build(command))
    result = validate(engine, model, profile_path, val_dir, Plan.for_engine(args.engine, repeats=args.repeats),
                      report=report, command=command)
    result["interleaved_order"] = [f"{step}-{i}" for step, i in order]
    result_path.parent.mkdir(parents=True, exist_ok=True)
    result_path.write_text(json.dumps(result, indent=1) + "\n")
    errs = result["median_abs_error"]
    print("median |error|: " + ", ".join(f"{k} {v * 100:.1f}%" for k, v in errs.items())
          + f"; speedup max |error| {result['speedup_max_abs_error_pp']:.1f} pp")
    inside = [c["speedup"]["inside_ci"] for c in result["cases"] if "speedup" in c]
    print(f"speedup inside the measured 95% interval: {sum(map(bool, inside))} of {len(inside)}")
    if pooled := result.get("speedup_pooled"):
        print(pooled_line(pooled))
    if floors := result.get("noise_floor"):
        print(noise_floor_line(floors))
    if fixed := result.get("drift_corrected"):
        print("drift-corrected: " + ", ".join(f"{k} {v * 100:.1f}%" for k, v in fixed["median_abs_error"].items()))
    print(f"results: {result_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
