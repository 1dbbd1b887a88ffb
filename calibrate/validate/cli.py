"""``overlap-sim validate``: run the ground-truth harness over a grid of configurations, simulate
each from its isolated timings, and print predicted against measured.

    overlap-sim validate --backend torch --device cpu --grid quick
    overlap-sim validate --backend mlx --device cpu --grid full --out results/validate-mlx-cpu/
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from calibrate.errors import CalibrationInputError
from sim.commands import command, output_path

HELP = "score the simulator against a real serving loop (the ground-truth harness) on this device"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=["sglang", "vllm"], default=None,
                   help="score against a real engine's server instead of the harness (SGLang 0.5.23 on the CPU, in "
                        "its own environment: realengines/sglang/setup.sh); needs --profile (calibrate --engine)")
    p.add_argument("--engine-python", type=Path, default=None, metavar="PATH",
                   help="with --engine: the engine environment's python (default .venvs/<engine>/bin/python)")
    p.add_argument("--backend", choices=["torch", "mlx"], default=None, help="framework of the harness (without --engine)")
    p.add_argument("--device", choices=["cpu", "cuda", "gpu"], default=None,
                   help="torch: cpu or cuda; mlx: cpu or gpu (Metal) (without --engine)")
    p.add_argument("--grid", choices=["quick", "full", "smoke", "heldout", "structured"], default="quick",
                   help="quick: minutes on 2 cores; full: more sizes and lengths; smoke: two tiny configurations "
                        "(under a minute, no waiting for a quiet machine); with --engine, heldout: loads the "
                        "calibration never ran, closed and open loops, sent by the engine's own benchmark client; "
                        "structured: every request constrained to a JSON schema (the profile needs the grammar "
                        "curves: calibrate --engine E --structured-output) (any other value: the engine's "
                        "default grid)")
    p.add_argument("--profile", type=Path, default=None,
                   help="use this calibration profile for every configuration and setting instead of calibrating")
    p.add_argument("--out", type=output_path, default=None,
                   help="results folder (default results/validate-<backend>-<device>/): cases/<name>.json (one per "
                        "finished configuration, reused on a rerun), profiles/, validation.csv, validation.json, "
                        "validation.png; with --engine: results/validate-<engine>/ (sessions/, validation.json)")
    p.add_argument("--repeats", type=int, default=None,
                   help="runs per setting, interleaved (median of each metric); default 1, with --engine 5")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="run only configurations whose name contains NAME (repeatable)")
    p.add_argument("--client-nice", type=int, default=None, metavar="N",
                   help="with --engine: the load generator's niceness (default: the grid's, -10 for heldout, 0 "
                        "otherwise; below 0 needs root)")
    p.add_argument("--fresh", action="store_true", help="run again the configurations already saved in --out")
    p.add_argument("--json", action="store_true", help="print one JSON object (rows and error summary) on stdout")
    p.add_argument("--no-plot", action="store_true", help="skip the predicted-vs-measured plot")
    p.add_argument("--max-wait", type=float, default=None, metavar="SECONDS",
                   help="wait at most this long for a quiet machine before each calibration and harness run, and "
                        "take a disturbed run again (default 60; 0 with --grid smoke)")
    p.add_argument("--no-wait", action="store_true",
                   help="never wait for a quiet machine nor retake a disturbed run (= --max-wait 0): the results "
                        "then show how busy the machine was")


MAX_WAIT_S = 3600.0
SMOKE_CALIBRATION_REPEATS = 5


def _check_device(backend: str, device: str) -> None:
    from calibrate.harness.config import BACKENDS

    if device not in BACKENDS[backend]:
        raise CalibrationInputError("--device", "", f"one of {', '.join(BACKENDS[backend])} for --backend {backend}")
    if backend == "torch" and device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise CalibrationInputError("--device", "", "cuda, but torch.cuda.is_available() is False here")
    if backend == "mlx":
        try:
            import mlx.core  # noqa: F401
        except ImportError:
            raise CalibrationInputError("--backend", "", "mlx needs: pip install 'mlx[cpu]' (Linux) or mlx (macOS)") from None
        if device == "gpu":
            from calibrate.forward.mlx_backend import metal_available

            if not metal_available():
                raise CalibrationInputError("--device", "", "gpu, but MLX has no Metal device here")


def run(args: argparse.Namespace) -> int:
    """Validate every configuration of the grid (resuming), then report."""
    import dataclasses

    from rich.console import Console

    from calibrate.validate import report
    from calibrate.validate.grid import grid
    from calibrate.validate.runner import CALIBRATION_REPEATS, QUIET_TIMEOUT_S, Quiet, load_cases, machine, validate_case
    from sim.atomic import check_output_dir
    from sim.model.profile import load_profile

    if args.engine:
        from calibrate.real.cli import run_validate

        for flag in ("backend", "device"):  # the harness's flags: a real engine's validation has none
            if getattr(args, flag) is not None:
                raise CalibrationInputError(f"--{flag}", "", f"the harness's (without --engine); the real {args.engine} "
                                            "server's validation takes its setting from --profile")

        args.repeats = 5 if args.repeats is None else args.repeats
        return run_validate(args)
    if args.client_nice is not None:
        raise CalibrationInputError("--client-nice", "", "the niceness of a real engine's load generator: add --engine")
    if args.grid in ("heldout", "structured"):
        raise CalibrationInputError("--grid", "", f"{args.grid} is a real engine's grid: add --engine vllm or --engine "
                                    "sglang")
    for flag in ("backend", "device"):
        if getattr(args, flag) is None:
            raise CalibrationInputError(f"--{flag}", "", "required (or --engine sglang to score against the real server)")
    args.repeats = 1 if args.repeats is None else args.repeats
    if args.max_wait is not None and not (0 <= args.max_wait <= MAX_WAIT_S):  # NaN fails too
        raise CalibrationInputError("--max-wait", "", f"expected seconds from 0 to {MAX_WAIT_S:g} (got {args.max_wait})")
    if args.no_wait and args.max_wait:
        raise CalibrationInputError("--no-wait", "", "contradicts --max-wait (give one of them)")
    if not 1 <= args.repeats <= 1000:
        raise CalibrationInputError("--repeats", "", f"an integer from 1 to 1000 (got {args.repeats})")
    if args.profile is not None:
        if not args.profile.is_file():
            raise CalibrationInputError("--profile", "", f"no such calibration profile: {args.profile}")
        load_profile(args.profile)  # a corrupt profile fails now, not after the harness runs
    out = check_output_dir(args.out or Path("results") / f"validate-{args.backend}-{args.device}", "--out")
    _check_device(args.backend, args.device)
    smoke = args.grid == "smoke"
    max_wait = 0.0 if args.no_wait else args.max_wait if args.max_wait is not None else 0.0 if smoke else QUIET_TIMEOUT_S
    quiet = Quiet(max_wait)
    err = Console(stderr=True, width=120)
    cases = [(regime, dataclasses.replace(cfg, device=args.device)) for regime, cfg in grid(args.backend, args.grid)]
    if args.only:
        cases = [(r, c) for r, c in cases if any(s in c.name for s in args.only)]
        if not cases:
            names = ", ".join(c.name for _, c in grid(args.backend, args.grid))
            raise CalibrationInputError("--only", "", f"a part of a configuration name of the {args.backend} "
                                        f"{args.grid} grid ({names}); got {', '.join(args.only)}")
    done = {} if args.fresh else load_cases(out)
    todo = [(r, c) for r, c in cases if c.name not in done]
    if len(todo) < len(cases):
        err.print(f"resuming: {len(cases) - len(todo)} of {len(cases)} configurations already in {out}/cases/")
    for i, (regime, cfg) in enumerate(todo):
        err.print(f"[{i + 1}/{len(todo)}] {cfg.name} ({regime})", highlight=False)
        done[cfg.name] = validate_case(regime, cfg, out, args.profile, args.repeats,
                                       report=lambda msg: err.print(f"    {msg}", highlight=False), quiet=quiet,
                                       calibration_repeats=SMOKE_CALIBRATION_REPEATS if smoke else CALIBRATION_REPEATS)
    rows = [row for _, cfg in cases for row in report.case_rows(done[cfg.name])]
    report.write_csv(rows, out / "validation.csv")
    m = machine()
    title = (f"overlap-sim validate: {args.backend} on {args.device}, grid {args.grid} "
             f"({m['host_cpu']}, {m['cores']} cores)")
    if not args.no_plot:
        report.plot(rows, out / "validation.png", title)
    obj = report.json_object(rows)
    from sim.atomic import atomic_path
    from sim.output.report import jsonable

    with atomic_path(out / "validation.json") as tmp:
        tmp.write_text(json.dumps(jsonable({**obj, "machine": m}), indent=1) + "\n")
    if args.json:
        print(json.dumps(jsonable(obj)))
    else:
        report.print_table(rows, title, Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 220))
        print(f"table: {out / 'validation.csv'}, {out / 'validation.json'}"
              + ("" if args.no_plot else f"; plot: {out / 'validation.png'}")
              + f"; per configuration: {out / 'cases'}/")
    return 0


command("validate", HELP, add_arguments)(run)
