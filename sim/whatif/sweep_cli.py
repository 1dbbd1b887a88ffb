"""``overlap-sim sweep``: a scenario over a grid of field values, every setting, with repeats
(resumable): the plan checked up front, the progress bar, the table, the verdict
(:mod:`sim.whatif.sweep_verdict`), the plots and the spread across repeats."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sim.commands import add_no_leap_argument, apply_no_leap, command, output_path, stdout_console
from sim.errors import UserInputError
from sim.output.report import ratio_pair
from sim.whatif.sweep_verdict import sweep_verdict_text
from sim.whatif.verdict import add_run_cv_argument, check_run_cv, resolve_run_cv, verdict_platform_note

_err = Console(stderr=True)  # the progress bar's stream

def _sweep_args(p: argparse.ArgumentParser) -> None:
    p.epilog = ("Exit status: 0 done, also where a setting's server died at some points (a result of the sweep, "
                "as the kv-pressure scenario's overlap server dies when its KV pool runs out: the table's cells "
                "say which setting failed, the note under it counts the runs, spread.csv and ratio_ci.csv have a "
                "failed_runs and failed_settings columns); 1 a modelling bug (a point's simulation stalled, as for run); 2 bad input (one "
                "line on stderr, nothing written); 130 interrupted (a rerun reuses the finished points).")
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=v1,v2,...",
                   help="a scenario field and the values to sweep, e.g. workload.concurrency=1,8,64 (repeatable)")
    p.add_argument("--repeats", type=int, default=1, help="runs per grid point; repeat r uses seed + r (default 1)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario field for every point (repeatable)")
    p.add_argument("--out", type=output_path, default=None,
                   help="sweep folder (default results/<scenario>-sweep-<grid>/): points/<id>.json (one per finished run, "
                        "reused on a rerun), sweep.json, sweep.parquet, sweep.csv, the plots, and with --repeats > 1 "
                        "spread.csv and ratio_ci.csv")
    p.add_argument("--executor", choices=["local", "dask"], default="local",
                   help="local processes (default) or a Dask distributed cluster")
    p.add_argument("--scheduler", default=None, metavar="tcp://HOST:8786",
                   help="Dask scheduler address (--executor dask; default: a local Dask cluster)")
    p.add_argument("--workers", type=int, default=None, help="processes (local) or local Dask workers; default: cores")
    p.add_argument("--no-plots", action="store_true", help="skip the sweep plots")
    add_no_leap_argument(p)
    add_run_cv_argument(p)


def _print_sweep(table, scenario: str, console: Console) -> None:
    from sim.whatif.variance import failed_settings, grid_keys, ratio_ci

    keys = grid_keys(table)
    settings = list(dict.fromkeys(table["setting"]))
    grouped = table.groupby(["point", "setting"], sort=False)["output_throughput"]
    means = grouped.mean().unstack("setting")
    cvs = (grouped.std() / grouped.mean()).unstack("setting")
    first = table.drop_duplicates("point").set_index("point")
    pair = ratio_pair(settings)  # overlap/normal (SGLang) or async/sync (vLLM)
    ci = ratio_ci(table, num=pair[0], den=pair[1]).set_index("point") if pair else None
    failed = failed_settings(table, settings)  # no value, nor ratio, where a server died or served nothing
    n = int(table["repeat"].max()) + 1
    t = Table(title=f"{scenario}: output throughput (tok/s), mean of {n} repeat{'s' if n > 1 else ''}"
                    + (" ± CV across repeats" if n > 1 else ""))
    for k in keys:
        t.add_column(k, justify="right")
    for s in settings:
        t.add_column(s, justify="right")
    if ci is not None:
        t.add_column(f"{pair[0]}/{pair[1]}" + (" [95% CI]" if n > 1 else ""), justify="right")
    shown = list(means.index)[:40]
    for point in shown:
        cells = [str(first.loc[point, k]) for k in keys]
        for s in settings:
            cv = cvs.loc[point, s]
            cells.append("failed" if s in failed.get(point, ()) else
                         f"{means.loc[point, s]:.1f}" + (f" ±{cv:.1%}" if n > 1 and math.isfinite(cv) else ""))
        if ci is not None:
            r = ci.loc[point]
            dead = [s for s in pair if s in failed.get(point, ())]
            cells.append(f"{' and '.join(dead)} failed" if dead else
                         f"{r['ratio']:.3f}" + (f" [{r['ci_low']:.3f}, {r['ci_high']:.3f}]" if n > 1 else ""))
        t.add_row(*cells)
    console.print(t)
    if n > 1 and (cvs.fillna(0.0).abs().to_numpy() < 1e-12).all():  # (the interval plot says the same)
        console.print("the repeats are identical: the scenario has no run-to-run noise (set costs.noise)")
    if len(means) > len(shown):
        console.print(f"... {len(means) - len(shown)} more points in the table")


def default_sweep_folder(name: str, grid: list[str], overrides: list[str]) -> Path:
    """``results/<name>-sweep-<the grid and overrides>/`` (their text when short and plain, else a
    hash of it): a sweep of another grid never lands in a folder of this one."""
    text = ",".join(x.strip() for x in [*grid, *overrides])
    if len(text) <= 80 and re.fullmatch(r"[A-Za-z0-9_.,=+-]*", text):
        return Path("results") / (f"{name}-sweep-{text}" if text else f"{name}-sweep")
    import hashlib

    return Path("results") / f"{name}-sweep-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


@command("sweep", "run a scenario over a grid of field values, every setting, with repeats (resumable)", _sweep_args)
def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from sim.scenario import load_scenario
    from sim.whatif.plots import save_sweep_plots
    from sim.whatif.sweeps import parse_grid, plan_sweep, sweep

    from sim.atomic import check_output_dir

    check_run_cv(args.run_cv)
    apply_no_leap(args)  # local worker processes inherit it (a Dask cluster's workers do not)
    scenario = load_scenario(args.scenario, args.overrides)
    grid = parse_grid(args.grid)
    fixed = {item.partition("=")[0].strip() for item in args.overrides}
    for key in grid:
        if key in fixed:
            raise UserInputError(f"--grid {key}", "", "also given with --set: the grid would set it at every point")
    if args.scheduler and args.executor != "dask":
        raise UserInputError("--scheduler", "", "needs --executor dask")
    max_workers = 4 * (os.cpu_count() or 1)
    if args.workers is not None and not 1 <= args.workers <= max_workers:
        raise UserInputError("--workers", "", f"expected 1 to {max_workers} (4 x this machine's cores; got {args.workers})")
    plan = plan_sweep(scenario, grid, args.repeats)  # bad keys and values fail here, before the progress bar
    from sim.output.report import load_warnings
    from sim.output.text import say

    said = load_warnings(scenario)
    for line in said:  # what the base scenario asks for approximately, as run says
        print(line)
    warned_at = []  # the points whose load is answered approximately beyond the base's (the verdict says so too)
    for task in plan:  # and what a point asks for beyond it (a concurrency above num_requests...), once each
        if task.repeat == 0:
            at = ", ".join(f"{k}={v}" for k, v in task.values.items())
            for line in load_warnings(task.scenario):
                if line not in said:
                    said.append(line)
                    print(f"at {at}: {line}")
                    warned_at += [at] if at not in warned_at else []
    out = check_output_dir(args.out or default_sweep_folder(scenario.name, args.grid, args.overrides), "--out")
    from sim.whatif.sweeps import other_sweep_note

    if note := other_sweep_note(out, scenario, grid, args.repeats):
        print(note)
    points = len(plan) // args.repeats
    counted = "points" if args.repeats == 1 else f"runs ({points} points x {args.repeats} repeats)"
    columns = (TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(), TextColumn(counted),
               TimeElapsedColumn(), TimeRemainingColumn())
    # the bar starts with the first progress report, once the executor is up (a Dask scheduler
    # that cannot be reached is then one line, with no bar before it)
    progress = Progress(*columns, console=_err)
    bar = progress.add_task("sweep", total=None)
    state = {"first": True}

    def on_progress(done: int, total: int) -> None:
        if state.pop("first", False):
            sys.stdout.flush()  # (what was printed before the bar, ahead of it where both streams go to one file)
            progress.start()
            if done:
                progress.console.print(f"resuming: {done} of {total} point runs already in {out}/points/")
        progress.update(bar, completed=done, total=total)

    failed = True
    try:
        table = sweep(scenario, grid, args.repeats, out=out, executor=args.executor, workers=args.workers,
                      scheduler=args.scheduler, on_progress=on_progress, run_cv=args.run_cv)
        failed = False
    finally:
        if "first" not in state:  # started
            _stop_progress(progress, failed)
    _print_sweep(table, scenario.name, stdout_console())
    answer = sweep_verdict_text(table, scenario.costs.noise, args.run_cv, scenario.server.device, _grounds(plan))
    if answer:
        if warned_at:
            answer = answer.with_clause(f"at {'; '.join(warned_at)} the load is answered approximately (the warning "
                                        "above)")
        print(answer.block())
        if note := verdict_platform_note(scenario.server):
            say(note)
    run_cv = resolve_run_cv(args.run_cv, scenario.costs.noise, scenario.server.device)[0]  # (the verdict's)
    drawn = save_sweep_plots(out, table, scenario.name, run_cv) if not args.no_plots else []
    print(f"{len(table)} rows written to {out}/sweep.parquet and sweep.csv")
    if drawn:
        print(f"plots: {', '.join(Path(p).name for p in drawn)} drawn in {out}/")
    if args.repeats > 1:
        _write_variance(out, table)
        print(f"spread of every metric across repeats: {out}/spread.csv; ratio intervals: {out}/ratio_ci.csv")
    else:
        for stale in ("spread.csv", "ratio_ci.csv"):  # of an earlier sweep with repeats, not of this table
            (out / stale).unlink(missing_ok=True)
    failed = _failed_runs(table)
    if failed:
        print(f"note: {failed}", file=sys.stderr)
    return 0


def _grounds(plan) -> dict[int, tuple]:
    """Each grid point's grounds for its verdict (:func:`sim.whatif.sweep_verdict.sweep_verdict_text`):
    (its server section, its profile's metadata or None, whether its costs are placeholders, what
    its profile's stated uncertainties are, whether its load is an open loop, its scenario), each
    profile's metadata read once."""
    from sim.output.report import profile_metadata
    from sim.whatif.stated_range import stated_uncertainties

    metas: dict = {}
    out = {}
    for task in plan:
        if task.index in out:
            continue
        point = task.scenario
        meta = None
        if point.costs.profile:
            path = point.resolve_path(point.costs.profile)
            if path not in metas:
                metas[path] = profile_metadata(path)
            meta = metas[path]
        out[task.index] = (point.server, meta, not point.costs.profile, [s.what for s in stated_uncertainties(meta)],
                           point.workload.arrival != "closed_loop", point)
    return out


def _failed_runs(table) -> str:
    """A line about the runs of a sweep whose server died or whose requests all failed (they are
    rows of the table like the others: a sweep may look for where a server breaks)."""
    died = table["outcome"].astype(str) != "ok" if "outcome" in table else None
    none = table["completed"] == 0 if "completed" in table else None
    parts = []
    if died is not None and died.any():
        parts.append(f"{int(died.sum())} of {len(table)} runs: the server died")
    if none is not None and (none & ~died if died is not None else none).any():
        parts.append(f"{int((none & ~died if died is not None else none).sum())} of {len(table)} runs: every measured "
                     "request failed")
    return "; ".join(parts) + (" (column outcome and completed in the table)" if parts else "")


VARIANCE_RATIO_METRICS = ("output_throughput", "request_throughput", "median_ttft_ms", "median_tpot_ms",
                          "median_itl_ms", "mean_gap_ms", "gpu_idle_fraction")


def _write_variance(out: Path, table) -> None:
    """spread.csv: mean/std/cv/min/max of every numeric summary key per point and setting;
    ratio_ci.csv: overlap/normal (vLLM: async/sync) 95% t-interval of the main metrics per point."""
    import pandas as pd

    from sim.output.run_files import atomic_write_frame
    from sim.trace.metrics import SUMMARY_KEYS
    from sim.whatif.variance import ratio_ci, spread

    metrics = [k for k in SUMMARY_KEYS + ["peak_token_usage"] if k in table and pd.api.types.is_numeric_dtype(table[k])]
    atomic_write_frame(spread(table, metrics), out / "spread.csv")
    pair = ratio_pair(set(table["setting"]))
    if pair:
        parts = [ratio_ci(table, m, *pair).assign(metric=m) for m in VARIANCE_RATIO_METRICS if m in table]
        atomic_write_frame(pd.concat(parts, ignore_index=True), out / "ratio_ci.csv")


def _stop_progress(progress, failed: bool) -> None:
    """Stop the sweep's bar; a failed or interrupted sweep's goes without a last line (one line
    says why): erased on a terminal, not printed elsewhere."""
    if not failed:
        progress.stop()
        return
    progress.live.transient = True
    quiet, _err.quiet = _err.quiet, not _err.is_terminal
    try:
        progress.stop()
    finally:
        _err.quiet = quiet
