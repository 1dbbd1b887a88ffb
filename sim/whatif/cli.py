"""Subcommands for what-if analysis: ``trace``, ``gaps``, ``log`` and ``plots`` (and, from
:mod:`sim.whatif.transfer_cli`, ``transfer``; from :mod:`sim.whatif.sweep_cli`, ``sweep``)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from rich.table import Table

from sim.commands import command, output_path, stdout_console
from sim.errors import UserInputError
from sim.output.report import jsonable
from sim.whatif import transfer_cli  # noqa: F401  registers `overlap-sim transfer`
from sim.whatif import sweep_cli  # noqa: F401  registers `overlap-sim sweep` (after transfer: the help's order)


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
    from sim.output.run_tables import check_run_folder, load_run_tables
    from sim.whatif.plots import trace_preview

    from sim.atomic import check_output_file

    window = parse_window(args.window)
    check_run_folder(args.results)  # (before --out's check, which would blame --out for a results path that is a file)
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
    from sim.whatif.sweeps import MANIFEST, load_sweep, manifest_run_cv

    from sim.atomic import check_output_dir

    if not args.results.is_dir():
        raise UserInputError(str(args.results), "", "no such folder (expected a folder written by 'overlap-sim run' "
                                                    "or 'overlap-sim sweep')")
    check_output_dir(args.results, "results")
    if (args.results / MANIFEST).is_file():
        table, manifest = load_sweep(args.results)
        paths = save_sweep_plots(args.results, table, manifest.get("scenario", args.results.name),
                                 manifest_run_cv(manifest))
    elif is_run_folder(args.results) or (args.results / "summary.json").is_file():
        run = load_run_tables(args.results)  # a run that kept no steps table is named as such
        paths = save_run_plots(args.results, run.scenario_name, run.steps, run.summaries, run.requests,
                               device=run.device)
    else:
        raise UserInputError(str(args.results), "", "not a run or sweep folder (expected summary.json + steps_<setting>.csv "
                                                    "or .parquet, or sweep.json + sweep.parquet)")
    for p in paths:
        print(p)
    return 0
