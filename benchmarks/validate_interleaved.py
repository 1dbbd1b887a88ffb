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


def stub_control(engine, model, grid, folder: Path, profile_path: Path, val_dir: Path, plan, rounds: int,
                 command: str, report) -> dict:
    """The stub check in the validation's window: the host-costs file of the stubbed rounds
    (:func:`calibrate.host.vllm.calibrate_vllm_host`, reusing them), its agreement per curve with
    the full calibration (``benchmarks/stub_check.py`` :func:`agreement`), and the validation
    scored with the full profile's forward curves and these host curves (:func:`swap_vllm_host`)."""
    from calibrate.host.vllm import calibrate_vllm_host
    from calibrate.profile import save_profile
    from calibrate.real.validate import compare
    from sim.engines.vllm.profile import VLLM_CURVES, VLLM_HOST_CURVES
    from sim.model.profile import load_profile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from stub_check import agreement, swap_vllm_host

    host_path, stub_profile = folder / "host.json", folder / "cpu-forward-stub-host.json"
    save_profile(host_path, calibrate_vllm_host(engine, model, grid, folder, command=command, report=report,
                                                sessions=rounds))
    full, host = load_profile(profile_path, VLLM_CURVES), load_profile(host_path, VLLM_HOST_CURVES)
    save_profile(stub_profile, swap_vllm_host(full, host))
    r = compare(val_dir, plan, stub_profile)
    return {"host_file": str(host_path), "profile": str(stub_profile), "agreement": agreement(full, host, "sync"),
            "median_abs_error": r["median_abs_error"], "speedup_pooled": r.get("speedup_pooled"),
            "noise_floor": r.get("noise_floor"),
            "per_case": [{"name": c["name"], **{s: v["error"] for s, v in c["settings"].items()}} for c in r["cases"]]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("vllm", "sglang"), default="vllm")
    ap.add_argument("--rounds", type=int, default=6, help="calibration runs per setting (>= 2)")
    ap.add_argument("--repeats", type=int, default=5, help="validation repeats (both settings each)")
    ap.add_argument("--work", type=Path, default=None, help="runs kept here (default results/interleaved-<engine>)")
    ap.add_argument("--result", type=Path, default=None,
                    help="default benchmarks/results/validate-<engine>-cpu-interleaved.json")
    ap.add_argument("--grid", choices=("default", "heldout", "speculative", "structured", "tp"), default="default",
                    help="the validation's loads (calibrate.real.validation_loads.GRIDS): heldout = loads the calibration "
                         "never ran, closed and open loops, sent by the engine's own benchmark client (SGLang: its "
                         "gamma load by the own client); speculative: with --speculative; structured: every request "
                         "constrained to a JSON schema, the calibration with its constrained sessions (vLLM) or runs (SGLang, "
                         "whose loads go by the own client); tp: the "
                         "speculative grid's loads plain (with --tensor-parallel-size)")
    ap.add_argument("--speculative", default=None, metavar="JSON",
                    help="vLLM: serve with --speculative-config of these keys (method, model, num_speculative_tokens; "
                         "MODEL in model: the test model) and predict with its draft_cost_ratio and the acceptance "
                         "each load's sessions measured (use with --grid speculative)")
    ap.add_argument("--client-nice", type=int, default=None, metavar="N",
                    help="the load generator's niceness (default: the grid's, calibrate.real.validation_loads.CLIENT_NICE)")
    ap.add_argument("--feature-client", choices=("own", "engine"), default="own",
                    help="vLLM: the calibration's drafting and constrained sessions' load generator: own (token ids) "
                         "or engine (vllm bench serve, as the validation's loads)")
    ap.add_argument("--feature-client-nice", type=int, default=0, metavar="N",
                    help="vLLM: that load generator's niceness (the validation's grids run theirs at -10)")
    ap.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                    help="every server (calibration and validation) at N tensor-parallel ranks bound to their own "
                         "cores (vLLM: --tensor-parallel-size; SGLang: --tp-size, its calibration runs through the "
                         "server)")
    ap.add_argument("--stub-control", action="store_true",
                    help="vLLM: each calibration round also runs the stubbed server on the calibration's own grid "
                         "(forward stubbed, busy-waiting); the validation is scored again with the full forward "
                         "curves and these host curves (the stub check, in one window)")
    args = ap.parse_args(argv)
    if args.engine != "vllm" and (args.feature_client != "own" or args.feature_client_nice):
        print("validate_interleaved.py: --feature-client/--feature-client-nice: vLLM's only", file=sys.stderr)
        return 2
    if args.engine == "sglang" and args.tensor_parallel_size > 1 and args.grid == "structured":
        print("validate_interleaved.py: --tensor-parallel-size with --grid structured: not for SGLang (its "
              "constrained calibration runs are in-process, rank 0 alone)", file=sys.stderr)
        return 2
    if args.stub_control and args.engine != "vllm":
        print("validate_interleaved.py: --stub-control: vLLM's only (SGLang's stub check is "
              "benchmarks/stub_check.py)", file=sys.stderr)
        return 2
    try:
        order = interleaved_order(args.rounds, args.repeats)
    except ValueError as e:
        print(f"validate_interleaved.py: --rounds/--repeats: {e}", file=sys.stderr)
        return 2
    speculative = None
    if args.speculative is not None:
        from calibrate.errors import CalibrationInputError
        from calibrate.real.cli import parse_speculative

        try:
            if args.engine != "vllm":
                raise CalibrationInputError("--speculative", "", "only with --engine vllm")
            speculative = parse_speculative(args.speculative)
        except CalibrationInputError as e:
            print(f"validate_interleaved.py: {e}", file=sys.stderr)
            return 2
    suffix = "" if args.grid == "default" else f"-{args.grid}"
    work = args.work or Path("results") / f"interleaved-{args.engine}{suffix}"
    result_path = args.result or Path("benchmarks/results") / f"validate-{args.engine}-cpu-interleaved{suffix}.json"

    from calibrate.profile import save_profile
    from calibrate.real.environment import REPO, find_engine, session_order, test_model
    from calibrate.errors import CalibrationInputError
    from calibrate.real.validate import Plan, check_client_nice, noise_floor_line, pooled_line, run_sessions, validate

    def plan(repeats: int) -> Plan:
        nice = {} if args.client_nice is None else {"client_nice": args.client_nice}
        return Plan.for_engine(args.engine, args.grid, repeats=repeats, speculative=speculative,
                               tensor_parallel_size=args.tensor_parallel_size, **nice)

    try:  # before the first calibration run: a held-out client that cannot be favoured fails now
        check_client_nice(plan(args.repeats))
    except CalibrationInputError as e:
        print(f"validate_interleaved.py: {e}", file=sys.stderr)
        return 2

    def report(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    engine = find_engine(args.engine)
    model = test_model(engine, REPO / ".venvs" / "models" / "tiny-llama")
    if speculative and speculative.get("model") == "MODEL":  # the target drafting for itself
        speculative["model"] = str(model)
    cal_dir, val_dir, profile_path = work / "calibrate", work / "validate", work / "profile.json"
    if args.engine == "vllm":
        from dataclasses import replace

        from calibrate.real.vllm.profile import calibrate_vllm
        from calibrate.real.vllm.sessions import (VllmGrid, check_feature_client_nice, run_session,
                                                  run_speculative_session, run_structured_session, tp_bind)

        try:
            check_feature_client_nice(args.feature_client_nice)
            tp_bind(args.tensor_parallel_size)
        except CalibrationInputError as e:
            print(f"validate_interleaved.py: {e}", file=sys.stderr)
            return 2
        grid = replace(VllmGrid(), feature_client=args.feature_client, feature_client_nice=args.feature_client_nice,
                       tensor_parallel_size=args.tensor_parallel_size)
        settings = ("sync", "async")  # the calibration's order (its base setting first)

        structured = args.grid == "structured"

        def calibration_run(setting: str, name: str) -> None:
            run_session(engine, model, grid, setting, cal_dir, report, name)
            if speculative:  # the drafting session beside it (the speculative host curves)
                run_speculative_session(engine, model, grid, setting, cal_dir, report, name, speculative)
            if structured:  # the constrained session beside it (the grammar curves)
                run_structured_session(engine, model, grid, setting, cal_dir, report, name)

        def build(command: str) -> dict:
            return calibrate_vllm(engine, model, grid, cal_dir, command=command, report=report, sessions=args.rounds,
                                  speculative=speculative, structured=structured)

        if args.stub_control:
            from dataclasses import asdict

            from calibrate.host.vllm import control_grid, stub_session

            stub_grid, stub_dir = control_grid(asdict(grid)), work / "stub"
            plain_run = calibration_run

            def calibration_run(setting: str, name: str) -> None:  # noqa: F811 (the round gains a stubbed run)
                plain_run(setting, name)
                stub_session(engine, model, stub_grid, setting, stub_dir, report, name)
    else:
        from calibrate.real.sglang_profile import (SglangGrid, calibrate_sglang, design, run_job, run_tp_session,
                                                   tp_launch)
        from calibrate.real import sglang_structured

        grid = SglangGrid()
        settings = ("normal", "overlap")
        d = design(grid)
        structured = args.grid == "structured"

        tp = args.tensor_parallel_size
        try:
            tp_launch(tp)  # refuses more ranks than cores
        except CalibrationInputError as e:
            print(f"validate_interleaved.py: {e}", file=sys.stderr)
            return 2

        def calibration_run(setting: str, name: str) -> None:
            if tp > 1:  # the waves through the TP server (the in-process driver builds rank 0 alone)
                run_tp_session(engine, model, grid, d, setting, tp, cal_dir, f"calibrate-{name}", report)
                return
            run_job(engine, d.job(str(model), setting == "overlap", grid), cal_dir, f"calibrate-{name}", report)
            if structured:  # the constrained run beside it (the grammar curves)
                run_job(engine, sglang_structured.job(str(model), setting == "overlap", grid), cal_dir,
                        f"calibrate-{name}-json", report)

        def build(command: str) -> dict:
            return calibrate_sglang(engine, model, grid, cal_dir, command=command, report=report,
                                    sessions=args.rounds, structured=structured, tp_size=tp)
    cal_runs = session_order(settings, args.rounds)
    for step, i in order:
        if step == "calibrate":
            for setting, name in cal_runs[2 * i:2 * i + 2]:
                calibration_run(setting, name)
        else:
            run_sessions(engine, model, plan(i + 1), val_dir, report)
    command = shlex.join(["python", "benchmarks/validate_interleaved.py", *(argv if argv is not None else sys.argv[1:])])
    save_profile(profile_path, build(command))
    result = validate(engine, model, profile_path, val_dir, plan(args.repeats),
                      report=report, command=command)
    result["interleaved_order"] = [f"{step}-{i}" for step, i in order]
    if args.stub_control:
        result["stub_control"] = stub_control(engine, model, stub_grid, stub_dir, profile_path, val_dir,
                                              plan(args.repeats), args.rounds,
                                              command, report)
    result_path.parent.mkdir(parents=True, exist_ok=True)
    result_path.write_text(json.dumps(result, indent=1) + "\n")
    if pooled := result.get("speedup_pooled"):  # the headline: what a user acts on
        print(pooled_line(pooled, result.get("speedup_signs")))
    inside = [c["speedup"]["inside_ci"] for c in result["cases"] if "speedup" in c]
    print(f"speedup inside the measured 95% interval: {sum(map(bool, inside))} of {len(inside)}")
    for c in result["cases"]:
        if sp := c.get("speedup"):
            print(f"  {c['name']:14s} measured {sp['measured_mean']:.3f} [{sp['ci95'][0]:.3f}, {sp['ci95'][1]:.3f}]"
                  f" predicted {sp['predicted']:.3f} ({sp['error_pp']:+.1f} pp)")
    errs = result["median_abs_error"]
    print("median |error|: " + ", ".join(f"{k} {v * 100:.1f}%" for k, v in errs.items())
          + f"; speedup max |error| {result['speedup_max_abs_error_pp']:.1f} pp")
    if floors := result.get("noise_floor"):
        print(noise_floor_line(floors))
    if fixed := result.get("drift_corrected"):
        print("drift-corrected: " + ", ".join(f"{k} {v * 100:.1f}%" for k, v in fixed["median_abs_error"].items()))
    if ctl := result.get("stub_control"):
        errs = ", ".join(f"{k} {v * 100:.1f}%" for k, v in ctl["median_abs_error"].items())
        print(f"with the stubbed host curves: {errs}")
        if pooled := ctl.get("speedup_pooled"):
            print("  " + pooled_line(pooled))
        for row in ctl["agreement"]:
            print(f"  {row['setting']:6s} {row['curve']:18s} stub/full median {row['median_ratio']:.2f}")
    print(f"results: {result_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
