"""Subcommands for what-if analysis: ``sweep``, ``trace``, ``gaps``, ``log`` and ``plots`` (and, from
:mod:`sim.whatif.transfer_cli`, ``transfer``)."""

from __future__ import annotations

import argparse
import re
import json
import math
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sim.commands import add_no_leap_argument, apply_no_leap, command, output_path, stdout_console
from sim.errors import UserInputError
from sim.output.report import jsonable, ratio_pair
from sim.whatif.sweep_verdict import sweep_verdict_line
from sim.whatif.verdict import add_run_cv_argument, check_run_cv, verdict_platform_note
from sim.whatif import transfer_cli  # noqa: F401  registers `overlap-sim transfer`

_err = Console(stderr=True)


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

    for line in load_warnings(scenario):  # what the base scenario asks for approximately, as run says
        print(line)
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
                      scheduler=args.scheduler, on_progress=on_progress)
        failed = False
    finally:
        if "first" not in state:  # started
            _stop_progress(progress, failed)
    _print_sweep(table, scenario.name, stdout_console())
    line = sweep_verdict_line(table, scenario.costs.noise, args.run_cv, scenario.server.device, _grounds(plan))
    if line:
        print(line)
        if note := verdict_platform_note(scenario.server):
            print(note)
    drawn = save_sweep_plots(out, table, scenario.name) if not args.no_plots else []
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
    """Each grid point's grounds for its verdict (:func:`sim.whatif.sweep_verdict.sweep_verdict_line`):
    (its server section, its profile's metadata or None, whether its costs are placeholders, what
    its profile's stated uncertainties are, whether its load is an open loop), each profile's
    metadata read once."""
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
                           point.workload.arrival != "closed_loop")
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


def _trace_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", type=Path, help="a results folder written by 'overlap-sim run'")
    p.add_argument("--setting", action="append", default=None, help="only this setting (repeatable; default all)")
    p.add_argument("--window", default=None, metavar="START:END", help="seconds of simulated time, e.g. 0.2:0.5")
    p.add_argument("--out", type=output_path, default=None, help="trace file (default RESULTS/trace.json; .gz compresses)")
    p.add_argument("--preview", type=Path, default=None, metavar="PNG", help="also draw the first 40 ms as a PNG")


@command("trace", "write a run's timeline as a Chrome trace JSON (open in Perfetto or chrome://tracing)", _trace_args)
def cmd_trace(args: argparse.Namespace) -> int:
    from sim.output.chrome_trace import chrome_trace, parse_window, write_chrome_trace
    from sim.output.plots import _save
    from sim.output.run_tables import load_run_tables
    from sim.whatif.plots import trace_preview

    from sim.atomic import check_output_file

    window = parse_window(args.window)
    inputs = _run_inputs(args.results)  # the run's own files: the trace may not overwrite what it reads
    out = check_output_file(args.out or args.results / "trace.json", "--out", (".json", ".json.gz", ".gz"), inputs)
    if args.preview:
        check_output_file(args.preview, "--preview", image_suffixes(), inputs)
        _refuse_the_runs_plots(args.preview, args.results)
    run = load_run_tables(args.results, args.setting)
    trace = chrome_trace(run, window)
    out = write_chrome_trace(trace, out)
    if args.preview:
        _save(trace_preview(trace, f"{run.scenario_name}: Chrome trace preview"), args.preview)
    counts = {}
    for e in trace["traceEvents"]:
        counts[e["ph"]] = counts.get(e["ph"], 0) + 1
    print(f"{out}: {counts.get('X', 0)} slices, {counts.get('s', 0)} flow arrows, {counts.get('C', 0)} counter samples "
          f"for {', '.join(run.steps)}; open it in https://ui.perfetto.dev or chrome://tracing")
    return 0


def _refuse_the_runs_plots(path: Path, results: Path) -> None:
    """A --preview that would replace one of the run's own plots (gaps, metrics, timeline) is
    refused, naming it."""
    if not results.is_dir() or not path.exists():
        return
    for name in ("gaps.png", "metrics.png", "timeline.png"):
        plot = results / name
        if plot.exists() and path.samefile(plot):
            raise UserInputError("--preview", "", f"{path} is the run's own plot {plot}; write the preview elsewhere")


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


def _run_inputs(results: Path) -> list[Path]:
    """The files of the run folder ``results`` that ``trace`` reads: its summary and tables (none
    if it is not a folder)."""
    from sim.output.run_files import RUN_FILES

    if not results.is_dir():
        return []
    return [p for p in results.iterdir() if p.name == "summary.json" or (
        RUN_FILES.match(p.name) and p.suffix in (".csv", ".parquet"))]


def _gaps_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", type=Path, help="a Chrome trace JSON (torch.profiler export_chrome_trace; .gz ok)")
    p.add_argument("--step-name", default=None, metavar="NAME",
                   help="record_function annotation around each forward (default: device kernels per step)")
    p.add_argument("--split-gap-us", type=float, default=50.0,
                   help="without annotations: a device idle gap longer than this starts a new step (default 50)")
    p.add_argument("--pid", default=None, help="the trace pid (device) to measure; default: the one with most steps")
    p.add_argument("--against", type=Path, default=None, metavar="RESULTS",
                   help="a results folder of 'overlap-sim run': print (and --plot) the predicted values beside the "
                        "measured")
    p.add_argument("--plot", type=Path, default=None, metavar="PNG",
                   help="write a histogram of the measured gaps (and of the predicted ones, with --against)")
    p.add_argument("--json", action="store_true", help="print the summary keys as one JSON object")


def _gap_table(title: str, columns: dict[str, dict]) -> Table:
    rows = [("forward steps", "num_steps", "{:d}"), ("GPU idle fraction", "gpu_idle_fraction", "{:.3f}"),
            ("gap mean / median / p99 (ms)", "gap", "{:.3f}")]
    t = Table(title=title)
    t.add_column("metric")
    for name in columns:
        t.add_column(name, justify="right")

    def fmt(f, v):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f.format(int(v) if "d" in f else v)
    for label, key, f in rows:
        if key == "gap":
            t.add_row(label, *(" / ".join(fmt(f, c.get(f"{s}_gap_ms")) for s in ("mean", "median", "p99"))
                               for c in columns.values()))
        else:
            t.add_row(label, *(fmt(f, c.get(key)) for c in columns.values()))
    return t


@command("gaps", "measure GPU gaps and idle fraction in a real torch.profiler / Chrome trace", _gaps_args)
def cmd_gaps(args: argparse.Namespace) -> int:
    from sim.output.real_trace import GAP_KEYS, measure_gaps
    from sim.output.run_tables import load_run_tables
    from sim.trace.metrics import SUMMARY_KEYS

    from sim.atomic import check_output_file

    if not (math.isfinite(args.split_gap_us) and args.split_gap_us >= 0):
        raise UserInputError("--split-gap-us", "", f"expected a finite number of microseconds >= 0 (got {args.split_gap_us})")
    if args.plot:
        check_output_file(args.plot, "--plot", image_suffixes())
    run = load_run_tables(args.against) if args.against else None
    predicted = run.summaries if run else {}
    res = measure_gaps(args.trace, args.step_name, args.split_gap_us, args.pid)
    if args.plot:
        from sim.output.plots import _save, measured_gaps
        from sim.whatif.plots import measured_gap_histogram

        sim_gaps = {s: measured_gaps(run.steps[s], run.requests.get(s))["gaps_ms"] for s in run.steps} if run else None
        _save(measured_gap_histogram(res["gaps_ms"], f"{args.trace.name}: {res['mode']}", sim_gaps), args.plot)
    if args.json:
        out = {k: res[k] for k in GAP_KEYS + ["mode", "source"]}
        if predicted:
            out["predicted"] = {s: {k: v.get(k) for k in SUMMARY_KEYS if k in GAP_KEYS} for s, v in predicted.items()}
        print(json.dumps(jsonable(out)))
        return 0
    columns = {"measured": res, **{f"predicted: {s}": v for s, v in predicted.items()}}
    stdout_console().print(_gap_table(f"{args.trace.name}: {res['mode']}", columns))
    return 0


def _log_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("log", type=Path, help="an SGLang server log (scheduler 'Prefill batch' / 'Decode batch' lines)")
    p.add_argument("--json", action="store_true", help='print {"records": [...], "skipped_lines": N}')
    p.add_argument("--out", type=output_path, default=None, help="folder for log.csv and log.png (default results/<log>-log/)")


@command("log", "parse an SGLang server log into a table over time and plot it", _log_args)
def cmd_log(args: argparse.Namespace) -> int:
    from sim.engines.sglang.server_log import parse_log
    from sim.output.plots import _save
    from sim.output.run_files import atomic_write_frame
    from sim.whatif.plots import log_timeline

    from sim.atomic import check_output_dir

    out = check_output_dir(args.out or Path("results") / f"{args.log.stem}-log", "--out")
    parsed = parse_log(args.log)
    df = parsed.frame()
    atomic_write_frame(df, out / "log.csv")
    _save(log_timeline(df, f"{args.log.name}: SGLang scheduler log ({len(df)} batch lines)"), out / "log.png")
    if parsed.skipped_lines:
        print(f"{args.log}: skipped {parsed.skipped_lines} line(s) that are not scheduler batch lines", file=sys.stderr)
    if df.attrs.get("t_is_line_order"):
        print(f"warning: {args.log}: no batch line has a timestamp SGLang writes ([YYYY-MM-DD HH:MM:SS ...]): the "
              "table's t_s and the plot's axis are line numbers, not seconds", file=sys.stderr)
    if parsed.cut_lines:
        print(f"warning: {args.log}: {parsed.cut_lines} 'Prefill/Decode batch' line(s) cut short or garbled (a label "
              "without its value, a number that is not one) left out of the table and the plot", file=sys.stderr)
    if args.json:
        records = [{k: (v.isoformat(sep=" ") if hasattr(v, "isoformat") else v) for k, v in r.items()}
                   for r in parsed.records]
        print(json.dumps(jsonable({"records": records, "skipped_lines": parsed.skipped_lines})))
        return 0
    t = Table(title=f"{args.log.name}: {len(df)} batch lines, {parsed.skipped_lines} other lines skipped")
    t.add_column("")
    t.add_column("prefill", justify="right")
    t.add_column("decode", justify="right")
    for label, col, agg, f in (("lines", "kind", "size", "{:d}"), ("max running requests", "running_req", "max", "{:.0f}"),
                               ("max waiting queue", "queue_req", "max", "{:.0f}"),
                               ("max KV token usage", "token_usage", "max", "{:.2f}"),
                               ("mean gen throughput (tok/s)", "gen_throughput_tok_s", "mean", "{:.1f}"),
                               ("cuda graph share", "cuda_graph", "mean", "{:.2f}")):
        cells = []
        for kind in ("prefill", "decode"):
            sub = df[df["kind"] == kind]
            v = len(sub) if agg == "size" else (getattr(sub[col].dropna().astype(float), agg)()
                                                if col in sub and sub[col].notna().any() else None)
            cells.append("-" if v is None or (isinstance(v, float) and math.isnan(v)) else f.format(v))
        t.add_row(label, *cells)
    stdout_console().print(t)
    if df["t_s"].max() > 0 and not df.attrs.get("t_is_line_order"):
        print(f"time span {df['t_s'].max():.1f} s; table and plot written to {out}/")
    else:
        print(f"table and plot written to {out}/")
    return 0


def image_suffixes() -> tuple[str, ...]:
    """File endings matplotlib can save a figure as (``.png``, ``.pdf``, ``.svg``, ...)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return tuple(f".{ext}" for ext in FigureCanvasBase.get_supported_filetypes())


def _plots_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", type=Path, help="a folder written by 'overlap-sim run' or 'overlap-sim sweep'")


@command("plots", "redraw every plot of a run or sweep from its saved tables (no simulation)", _plots_args)
def cmd_plots(args: argparse.Namespace) -> int:
    from sim.output.plots import save_run_plots
    from sim.output.run_tables import is_run_folder, load_run_tables
    from sim.whatif.plots import save_sweep_plots
    from sim.whatif.sweeps import MANIFEST, load_sweep

    from sim.atomic import check_output_dir

    if not args.results.is_dir():
        raise UserInputError(str(args.results), "", "no such folder (expected a folder written by 'overlap-sim run' "
                                                    "or 'overlap-sim sweep')")
    check_output_dir(args.results, "results")
    if (args.results / MANIFEST).is_file():
        table, manifest = load_sweep(args.results)
        paths = save_sweep_plots(args.results, table, manifest.get("scenario", args.results.name))
    elif is_run_folder(args.results) or (args.results / "summary.json").is_file():
        run = load_run_tables(args.results)  # a run that kept no steps table is named as such
        paths = save_run_plots(args.results, run.scenario_name, run.steps, run.summaries, run.requests)
    else:
        raise UserInputError(str(args.results), "", "not a run or sweep folder (expected summary.json + steps_<setting>.csv "
                                                    "or .parquet, or sweep.json + sweep.parquet)")
    for p in paths:
        print(p)
    return 0
