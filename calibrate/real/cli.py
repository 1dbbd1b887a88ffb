"""The real engines on the command line: ``calibrate --engine``, ``validate --engine`` and
``conform``.

    overlap-sim calibrate --engine sglang --out scenarios/profiles/cpu-sglang-tiny.json
    overlap-sim conform --engine sglang
    overlap-sim validate --engine sglang --profile scenarios/profiles/cpu-sglang-tiny.json

Each runs code in the engine's own environment (:mod:`calibrate.real.environment`; build it with
``realengines/<engine>/setup.sh``) and keeps what it ran in a work folder, so an interrupted
command resumes.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from calibrate.errors import CalibrationInputError
from calibrate.real.vllm.speculative import check_config
from sim.atomic import check_output_dir
from sim.commands import command, output_path

CONFORM_HELP = "run the same requests through a real engine's scheduler and the simulator's policy; compare the batches"


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return values


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by the real-engine commands."""
    p.add_argument("--engine-python", type=Path, default=None, metavar="PATH",
                   help="the engine environment's python (default: $OVERLAP_SIM_<ENGINE>_PYTHON, else .venvs/<engine>/bin/python)")
    p.add_argument("--work", type=output_path, default=None, metavar="DIR",
                   help="where runs of the real engine are kept (resume); default results/<command>-<engine>/")


def grid_changes(args: argparse.Namespace) -> dict:
    """The SGLang calibration grid's fields that ``--batch-sizes``, ``--contexts``,
    ``--extend-tokens`` and ``--prefixes`` replace."""
    return {k: tuple(v) for k, v in (("decode_batch_sizes", args.batch_sizes), ("decode_contexts", args.contexts),
                                     ("extend_tokens", args.extend_tokens), ("extend_prefixes", args.prefixes)) if v}


def _engine(args: argparse.Namespace):
    from calibrate.real.environment import REPO, find_engine, test_model

    engine = find_engine(args.engine, args.engine_python)
    model = test_model(engine, REPO / ".venvs" / "models" / "tiny-llama")
    return engine, model


def _report(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_calibrate(args: argparse.Namespace) -> int:
    """``calibrate --engine sglang``: the profile from SGLang's own scheduler (in-process)."""
    from dataclasses import replace

    from calibrate.profile import save_profile
    from calibrate.real.sglang_profile import SglangGrid, calibrate_sglang, phase_table

    if args.out.is_dir():
        raise CalibrationInputError("--out", "", f"a file path, not the folder {args.out}")
    if args.engine == "vllm":
        return _calibrate_vllm(args)
    grid = SglangGrid()
    grid = replace(grid, **grid_changes(args))
    grid.check()
    engine, model = _engine(args)
    work = check_output_dir(args.work or Path("results") / f"calibrate-{args.engine}", "--work")
    sessions = args.sessions or 1
    argv = ["overlap-sim", "calibrate", "--engine", args.engine, "--out", str(args.out)]
    argv += ["--sessions", str(sessions)] if sessions > 1 else []
    structured = bool(getattr(args, "structured_output", False))
    argv += ["--structured-output"] if structured else []
    tp = getattr(args, "tensor_parallel_size", None) or 1
    argv += ["--tensor-parallel-size", str(tp)] if tp > 1 else []
    profile = calibrate_sglang(engine, model, grid, work, command=shlex.join(argv), report=_report,
                               sessions=sessions, structured=structured, tp_size=tp)
    save_profile(args.out, profile)
    for curve, point, med, mean in phase_table(profile):
        _report(f"  {curve:16s} {point:>8s}  median {med:7.3f} ms  mean {mean:7.3f} ms")
    print(f"profile written to {args.out}")
    return 0


def parse_speculative(text: str, where: str = "--speculative") -> dict:
    """``--speculative``'s JSON object, checked (:func:`calibrate.real.vllm.speculative.check_config`).

    Raises:
        CalibrationInputError: not JSON, or a field missing or out of range (named)."""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError:
        raise CalibrationInputError(where, "", f"not a JSON object: {text!r}") from None
    return check_config(spec, where)


def _calibrate_vllm(args: argparse.Namespace) -> int:
    """``calibrate --engine vllm``: the profile from the real vLLM server's own functions."""
    from dataclasses import replace

    from calibrate.profile import save_profile
    from calibrate.real.vllm.profile import calibrate_vllm, phase_table
    from calibrate.real.vllm.sessions import VllmGrid

    speculative = parse_speculative(args.speculative) if args.speculative is not None else None
    engine, model = _engine(args)
    work = check_output_dir(args.work or Path("results") / "calibrate-vllm", "--work")
    sessions = args.sessions or 1
    argv = ["overlap-sim", "calibrate", "--engine", "vllm", "--out", str(args.out)]
    argv += ["--sessions", str(sessions)] if sessions > 1 else []
    argv += ["--speculative", args.speculative] if speculative else []
    structured = bool(getattr(args, "structured_output", False))
    argv += ["--structured-output"] if structured else []
    if speculative and speculative.get("model") == "MODEL":  # the target drafting for itself
        speculative["model"] = str(model)
    grid = VllmGrid()
    if getattr(args, "feature_client", None) is not None:
        grid = replace(grid, feature_client=args.feature_client)
        argv += ["--feature-client", args.feature_client]
    if getattr(args, "tensor_parallel_size", None) is not None:
        grid = replace(grid, tensor_parallel_size=args.tensor_parallel_size)
        argv += ["--tensor-parallel-size", str(args.tensor_parallel_size)]
    if getattr(args, "feature_client_nice", None) is not None:
        grid = replace(grid, feature_client_nice=args.feature_client_nice)
        argv += ["--feature-client-nice", str(args.feature_client_nice)]
    profile = calibrate_vllm(engine, model, grid, work, command=shlex.join(argv), report=_report,
                             sessions=sessions, speculative=speculative, structured=structured)
    save_profile(args.out, profile)
    for curve, point, med in phase_table(profile):
        _report(f"  {curve:24s} {point:>8s}  median {med:8.3f} ms")
    print(f"profile written to {args.out}")
    return 0


def add_conform_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=["sglang"], default="sglang", help="the real engine (default sglang)")
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="run only these workloads (repeatable)")
    p.add_argument("--out", type=output_path, default=None, help="report file (default <work>/conformance.json)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    add_engine_arguments(p)


@command("conform", CONFORM_HELP, add_conform_arguments)
def run_conform(args: argparse.Namespace) -> int:
    from calibrate.real import conformance

    names = [w.name for w in conformance.WORKLOADS]
    bad = [n for n in args.only if n not in names]
    if bad:
        raise CalibrationInputError("--only", "", f"one of {', '.join(names)} (got {', '.join(bad)})")
    workloads = [w for w in conformance.WORKLOADS if not args.only or w.name in args.only]
    engine, model = _engine(args)
    work = check_output_dir(args.work or Path("results") / f"conform-{args.engine}", "--work")
    comps = conformance.conformance(engine, model, work, workloads, report=_report)
    out = args.out or work / "conformance.json"
    summary = conformance.write_report(comps, out, {"engine": {"name": engine.name, "version": engine.version},
                                                    "command": shlex.join(["overlap-sim", *sys.argv[1:]])})
    if args.json:
        print(json.dumps(summary))
    else:
        for r in summary["runs"]:
            print(f"{r['workload']:15s} {r['setting']:8s} {r['identical']:5d}/{r['steps']:<5d} identical "
                  f"({r['share'] * 100:5.1f}%)")
            if r["first_difference"]:
                d = r["first_difference"]
                print(f"    first difference at iteration {d['iteration']}: real {d['real'][:100]}")
                print(f"    {' ' * (27 + len(str(d['iteration'])))}sim  {d['sim'][:100]}")
        print(f"all: {summary['identical']}/{summary['steps']} steps identical ({summary['share'] * 100:.1f}%); "
              f"report {out}")
    return 0


def _check_grammar_profile(path: Path, engine: str) -> None:
    """Refuse, before any session runs, a profile without the grammar curves the structured grid's
    predictions need (``metadata.structured_output``, written by ``calibrate --structured-output``).

    Raises:
        CalibrationInputError: naming ``--profile``.
    """
    try:
        meta = json.loads(Path(path).read_text()).get("metadata", {})
    except (OSError, ValueError, AttributeError, RecursionError):
        return  # unreadable: the validation's own profile check names it
    if not isinstance(meta, dict) or not isinstance(meta.get("structured_output"), dict):
        raise CalibrationInputError("--profile", "metadata.structured_output",
                                    f"the structured grid needs the grammar curves: calibrate --engine {engine} "
                                    "--structured-output")


def run_validate(args: argparse.Namespace) -> int:
    """``validate --engine sglang``: the simulator against the real server."""
    from dataclasses import replace

    from calibrate.real.validate import Plan, noise_floor_line, pooled_line, validate

    if args.profile is None:
        raise CalibrationInputError("--profile", "", "a calibration profile of this engine (calibrate --engine "
                                    f"{args.engine} makes one)")
    # the harness's grid names mean the default here
    grid = args.grid if args.grid in ("heldout", "structured") else "default"
    if grid == "structured":
        _check_grammar_profile(args.profile, args.engine)
    nice = {} if args.client_nice is None else {"client_nice": args.client_nice}
    plan = Plan.for_engine(args.engine, grid=grid, repeats=args.repeats, **nice)  # refuses --repeats < 1
    if args.only:
        configs = tuple(c for c in plan.configs if any(s in c.name for s in args.only))
        if not configs:
            raise CalibrationInputError("--only", "", "a part of a configuration name "
                                        f"({', '.join(c.name for c in plan.configs)})")
        plan = replace(plan, configs=configs)
    engine, model = _engine(args)
    out = args.out or Path("results") / f"validate-{args.engine}"
    result = validate(engine, model, args.profile, out, plan, report=_report,
                      command=shlex.join(["overlap-sim", *sys.argv[1:]]))
    if args.json:
        keys = ("median_abs_error", "speedup_max_abs_error_pp")
        print(json.dumps({**{k: result[k] for k in keys},
                          "drift_corrected": {k: result["drift_corrected"][k] for k in keys}
                          if "drift_corrected" in result else None}))
        return 0
    for case in result["cases"]:
        for setting, v in case["settings"].items():
            cells = "  ".join(f"{m} {v['measured'][m]:.4g} -> {v['predicted'][m]:.4g} ({v['error'][m] * 100:+.1f}%)"
                              for m in v["measured"])
            share = v.get("hidden_cpu_share", {})
            if share:
                cells += f"  hidden CPU share {share['measured']:.2f} -> {share['predicted']:.2f}"
            print(f"{case['name']:10s} {setting:8s} {cells}")
        if "speedup" in case:
            s = case["speedup"]
            print(f"{case['name']:10s} speedup {s['of']}: measured {s['measured_mean']:.3f} "
                  f"[{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}], predicted {s['predicted']:.3f}")
    if pooled := result.get("speedup_pooled"):  # the headline: what a user acts on
        print(pooled_line(pooled, result.get("speedup_signs")))
    errs = result["median_abs_error"]
    print("median |error|: " + ", ".join(f"{k} {v * 100:.1f}%" for k, v in errs.items()))
    if floors := result.get("noise_floor"):
        print(noise_floor_line(floors))
    if fixed := result.get("drift_corrected"):
        errs = fixed["median_abs_error"]
        print("median |error| with the host's drift since calibration corrected (host speed probes): "
              + ", ".join(f"{k} {v * 100:.1f}%" for k, v in errs.items())
              + f"; speedup max |error| {fixed['speedup_max_abs_error_pp']:.1f} pp")
    else:
        print("no drift correction: the profile or a session has no host speed probe (calibrate.hostspeed)")
    print(f"results: {out / 'validation.json'}")
    return 0
