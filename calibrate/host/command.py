"""``calibrate --engine <engine> --host-only``: what both engines' host calibrations do around
their runs (the output checked first, the engine found, the file written, a line per curve)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Callable

from sim.atomic import check_output_dir


def run_host_command(args, engine_name: str, grid, calibrate: Callable[..., dict], flags: list[str] = ()) -> int:
    """Run ``calibrate(engine, model, grid, work, command=, report=, sessions=)`` for ``args``
    (``--out``, ``--work``, ``--sessions``, ``--engine-python``) and write its host-costs file;
    ``flags``: further flags of the command line it records.

    Raises:
        CalibrationInputError / UserInputError: a bad ``--out`` or engine environment (one line).
    """
    from calibrate.profile import save_profile
    from calibrate.real.cli import _engine, _report
    from sim.atomic import check_output_file

    check_output_file(args.out, "--out")
    engine, model = _engine(args)
    work = check_output_dir(args.work or Path("results") / f"calibrate-{engine_name}-host", "--work")
    sessions = args.sessions or 1
    argv = ["overlap-sim", "calibrate", "--engine", engine_name, "--host-only", "--out", str(args.out)]
    argv += ["--sessions", str(sessions)] if sessions > 1 else []
    argv += list(flags)
    host = calibrate(engine, model, grid, work, command=shlex.join(argv), report=_report, sessions=sessions)
    save_profile(args.out, host)
    for name, c in host["curves"].items():
        _report(f"  {name:18s} {c['axes'][0]} {c['grid'][0][0]:g}-{c['grid'][0][-1]:g}: "
                f"{min(c['values_s']) * 1e3:.3f}-{max(c['values_s']) * 1e3:.3f} ms")
    print(f"host costs written to {args.out} ({host['metadata']['wall_s']:.0f} s in this call, finished runs "
          f"reused); join them to a device's forward with overlap-sim compose")
    return 0
