"""The ``overlap-sim`` command line. Subcommands register themselves in :data:`sim.commands.COMMANDS`.

User mistakes (bad scenario, missing file, bad override, bad flag) print one line to stderr and
exit 2, before anything is written. ``run`` exits 3 when a setting's server died or none of its
measured requests completed (see :data:`sim.errors.EXIT_RUN_FAILED`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

from sim.commands import (COMMANDS, OneLineParser, UsageError, add_no_leap_argument, add_plots_arguments, apply_no_leap,
                          command, output_path)
from sim.errors import (EXIT_BAD_INPUT, EXIT_EXTERNAL_FAILED, EXIT_INTERRUPTED, EXIT_MODELLING_BUG, EXIT_RUN_FAILED,
                        ExternalRunError, SimulationStalled, UserInputError)

# modules whose import registers more subcommands with @command (sim.commands); named, not
# imported, here: calibration's commands load only when the parser is built, and importing sim
# never imports calibrate
COMMAND_MODULES: tuple[str, ...] = (
    "sim.whatif.cli",
    "sim.whatif.ask",
    "sim.engines.sglang.ask",  # registers each engine's server defaults for `ask` (sim.commands.ASKERS)
    "sim.engines.vllm.ask",
    "sim.engines.vllm.rules.advise",  # registers `advise --engine vllm` (sim.commands.ADVISORS)
    "sim.engines.sglang.rules.advise",
    "calibrate.command",
    "calibrate.validate.cli",
    "calibrate.real.cli",
)
# subcommands registered by this module: a command line that names one builds only its parser
# (the same parse) and imports none of COMMAND_MODULES
OWN_COMMANDS = ("run",)


RUN_EPILOG = ("Writes into the results folder: summary.json, steps_/requests_/itl_<setting>.<format> (the tables "
              "--tables keeps) and, with --plots, gaps.png, metrics.png, timeline.png (with --tables steps; `overlap-sim "
              "plots FOLDER` draws them later from the tables); the tables, plots "
              "and Chrome trace of an earlier run in that folder are removed first. Exit status: 0 done; 2 bad "
              "input (one line on "
              "stderr, nothing written); 3 a setting's server died or none of its measured requests completed "
              "(results written; the table and one line on stderr say which).")


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.epilog = RUN_EPILOG
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario field, e.g. workload.concurrency=16 (repeatable; a relative "
                        "costs.profile or workload.trace path is taken from the working directory)")
    p.add_argument("--out", type=output_path, default=None,
                   help="results folder (default results/<scenario name>/, or results/<scenario name>-<the --set "
                        "overrides>/ with --set, so variants do not overwrite each other; overrides longer than 80 "
                        "characters or with other characters than letters, digits and _.,=+- give "
                        "results/<scenario name>-set-<a hash of them>/; the run's last line names it)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
    p.add_argument("--format", choices=["parquet", "csv"], default="parquet",
                   help="file format of the tables: parquet (default; typed columns, written in about a sixth "
                        "of CSV's time, half its size; pandas.read_parquet) or csv")
    p.add_argument("--tables", choices=["steps", "summary", "none"], default="steps",
                   help="tables kept: steps (all, exact metrics), summary (per-request only; streamed metrics), "
                        "none (no tables; memory: the requests in flight and the workload drawn up front, about 100 "
                        "bytes a request)")
    add_plots_arguments(p)
    add_no_leap_argument(p)
    p.add_argument("--no-range", action="store_true",
                   help="do not simulate the profile's stated uncertainties (each costs two streamed runs per "
                        "corner); the verdict line then says it was not computed")
    from sim.whatif.verdict import add_run_cv_argument

    add_run_cv_argument(p)


def default_run_folder(name: str, overrides: list[str]) -> Path:
    """``results/<name>/``; with overrides ``results/<name>-<overrides>/`` (their text when short
    and plain, else a hash of it), so a variant never overwrites the plain run's results."""
    if not overrides:
        return Path("results") / name
    text = ",".join(o.strip() for o in overrides)
    if len(text) <= 80 and re.fullmatch(r"[A-Za-z0-9_.,=+-]+", text):
        return Path("results") / f"{name}-{text}"
    import hashlib  # only here: it loads OpenSSL

    return Path("results") / f"{name}-set-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def standing(found, scenario, meta: dict | None, summaries: dict[str, dict], simulate_range: bool = True,
             tables: str = "steps"):
    """The verdict with what it stands on: the range over the profile's stated uncertainties
    (:mod:`sim.whatif.stated_range`), the share of steps priced beyond the profile's data and how
    far (:meth:`Verdict.with_reach`), the scenario's placeholder costs, or a launch command serving
    another model than the profile measured ("cannot tell": the server section's
    ``rests_on_another_model``), and the run again without the harness's prefill launch
    (:mod:`sim.whatif.harness`, kept with the run's ``tables``, so that its medians are as exact as
    the run's)."""
    from sim.whatif.harness import attention_caveat, launch_floor_clause, launch_floor_json, prefill_launch_floor
    from sim.whatif.stated_range import stated_range, stated_uncertainties
    from sim.whatif.verdict import grounded

    found = grounded(found, scenario.server, meta, not scenario.costs.profile, [summaries[s] for s in found.pair[:2]],
                     open_loop=scenario.workload.arrival != "closed_loop")
    if caveat := attention_caveat(scenario, meta, {s: summaries[s] for s in found.pair[:2]}):
        found = replace(found, caveats=found.caveats + (caveat,))
    if found.failed:  # a server that died: what it stands on is said, no range is run over it
        return found
    if (floor := prefill_launch_floor(scenario, meta, found.pair, simulate_range, tables)) is not None:
        found = replace(found, launch_floor=launch_floor_json(floor, found.pair))  # (said where it moves something)
        if clause := launch_floor_clause(floor, found, summaries):
            found = replace(found, caveats=found.caveats + (clause,))
    if stated := stated_uncertainties(meta):
        if not simulate_range:
            return replace(found, range_skipped=tuple(s.what for s in stated))
        found = found.with_range(*stated_range(scenario, found.pair, stated), [s.what for s in stated])
    return found


def run_failures(summaries: dict[str, dict]) -> list[str]:
    """What went wrong in each failed setting: its server died, or none of its measured
    requests completed (empty when every setting served)."""
    out = []
    for name, s in summaries.items():
        if s.get("outcome", "ok") != "ok":
            t = s.get("outcome_time_s")
            at = f" at t={t:.3f}s" if isinstance(t, float) and t == t else ""
            out.append(f"{name}: the server died{at} ({s.get('outcome_reason', '')})")
        elif not s.get("completed"):
            kinds = ", ".join(f"{k} {s[k]}" for k in ("cut_off", "could_not_connect", "aborted", "too_long") if s.get(k))
            out.append(f"{name}: all {s.get('failed', 0)} measured requests failed" + (f" ({kinds})" if kinds else ""))
    return out


@command("run", "simulate a scenario under each scheduling setting and compare them", _add_run_args)
def cmd_run(args: argparse.Namespace) -> int:
    from sim.atomic import check_output_dir, staged_folder
    from sim.output.report import (composed_note, device_mismatch, print_table, reimplementation_warning, run_title,
                                   run_warnings)
    from sim.output.text import say
    from sim.output.run_files import atomic_write_text, stale_run_files, write_tables
    from sim.scenario import load_scenario
    from sim.simulate import simulate
    from sim.whatif.verdict import check_run_cv

    check_run_cv(args.run_cv)
    if not args.no_plots and args.tables != "steps":  # (before anything runs or is written)
        raise UserInputError("--plots", "", f"needs --tables steps: the plots are drawn from the steps tables, "
                             f"which --tables {args.tables} does not keep")
    apply_no_leap(args)
    scenario = load_scenario(args.scenario, args.overrides)
    out_dir = check_output_dir(args.out or default_run_folder(scenario.name, args.overrides), "--out")
    plots = not args.no_plots  # (with --tables steps: refused above otherwise)
    with staged_folder(out_dir, stale_run_files, "summary.json") as stage:  # the old run or the new, never a mix
        summaries, kept = {}, []
        for setting in scenario.server.settings:  # each setting's tables written, then let go (memory)
            result = simulate(scenario, setting, tables=args.tables)
            summaries[result.setting] = result.summary()
            write_tables(stage, result, args.format, args.tables)
            if plots:
                kept.append(result)
            del result
        found, meta, note, load = _run_answer(args, scenario, summaries)
        # what the results warn of (steps beyond the profile's data, a queue that grew): under the
        # table (by setting), and in --json's and summary.json's warnings
        by_setting = run_warnings(summaries, scenario.workload.arrival != "closed_loop")
        warned = [line for lines in by_setting.values() for line in lines]
        # what the table's reader is warned of, in --json's and summary.json's "warnings" alike (the
        # results' own, printed under the table by print_table, come first there)
        before = [line for line in (device_mismatch(scenario.server.device, meta), reimplementation_warning(meta))
                  if line] + list(load)
        after = [line for line in (note, composed_note(meta)) if line]
        payload = _run_summary_json(scenario, summaries, found, note, warned + before + after)
        atomic_write_text(stage / "summary.json", json.dumps(payload, indent=2) + "\n")
        if plots:
            from sim.output.plots import save_run_plots  # matplotlib only when plots are drawn

            save_run_plots(stage, scenario.name, {r.setting: r.steps for r in kept}, summaries,
                           {r.setting: r.requests for r in kept}, device=scenario.server.device)
    if args.json:
        print(json.dumps({k: payload[k] for k in ("scenario", "seed", "settings", "ratios", "verdict", "warnings")}))
    else:
        print_table(run_title(scenario.name, scenario.seed, scenario.server.device, meta), summaries,
                    streamed=args.tables != "steps", device=scenario.server.device, warned=by_setting)
        for line in before:  # (notes and warnings wrapped as the verdict is, their lines after the first indented)
            say(line)
        if found is not None:
            print(found.text().block())
        for line in after:
            say(line)
        print(f"results written to {out_dir}/")
        if args.tables == "steps" and args.no_plots:
            say(f"plots: overlap-sim plots {out_dir}/ draws gaps.png, metrics.png and timeline.png from these tables "
                "(or run with --plots)")
        elif plots:
            print(f"plots: gaps.png, metrics.png and timeline.png drawn in {out_dir}/")
    failures = run_failures(summaries)
    if failures:
        print(f"overlap-sim: run failed: {'; '.join(failures)} (exit status {EXIT_RUN_FAILED})", file=sys.stderr)
        return EXIT_RUN_FAILED
    return 0


def _run_answer(args: argparse.Namespace, scenario, summaries: dict[str, dict]) -> tuple:
    """The verdict of a run's ``summaries`` and how sure it is, the profile's metadata, the
    platform note and the load's warnings: (found, meta, note, warnings)."""
    from sim.output.report import load_warnings, profile_metadata
    from sim.whatif.verdict import resolve_run_cv, verdict, verdict_platform_note

    found = verdict(summaries, *resolve_run_cv(args.run_cv, scenario.costs.noise, scenario.server.device))
    meta = profile_metadata(scenario.resolve_path(scenario.costs.profile)) if scenario.costs.profile else None
    if found is not None:
        found = standing(found, scenario, meta, summaries, simulate_range=not getattr(args, "no_range", False),
                         tables="steps" if getattr(args, "tables", "steps") == "steps" else "none")
    note = verdict_platform_note(scenario.server) if found is not None else None
    return found, meta, note, load_warnings(scenario)


def _run_summary_json(scenario, summaries: dict[str, dict], found, note: str | None, warnings: list[str]) -> dict:
    """summary.json of a run: the summaries and their ratios, the verdict, the scenario as run
    and every warning the run prints (``warnings``, a list, empty when none: what ``--json``
    prints under the same key)."""
    from sim.output.report import run_payload

    payload = run_payload(scenario.name, scenario.seed, summaries)
    payload["verdict"] = found.as_json() if found is not None else None
    if note:
        payload["verdict"]["platform_note"] = note
    payload["scenario_config"] = scenario.model_dump(mode="json")
    payload["warnings"] = warnings
    return payload


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or with ``command`` one of :data:`OWN_COMMANDS`, of that
    one only (the other command modules are then not imported: start-up)."""
    parser = OneLineParser(
        prog="overlap-sim",
        description="Predict what SGLang's overlap scheduler (and vLLM's async scheduling) does on your device, "
                    "against the synchronous loop.",
        epilog="Exit status: 0 done; 1 a modelling bug (the simulation stalled: one line asking for the scenario); "
               "2 bad input (one line on stderr naming the file or flag and the field, "
               "nothing written); 3 'run' finished but a setting's server died or all its requests failed; 4 a "
               "real engine the command started (calibrate, validate, conform) failed or timed out (one line "
               "naming its log); 130 interrupted (a run folder keeps the earlier run's files; sweeps and "
               "calibrations resume).")
    only = command if command in OWN_COMMANDS else None
    if only is None:
        for module in COMMAND_MODULES:
            importlib.import_module(module)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, arguments, _run) in COMMANDS.items():
        if only in (None, name):
            arguments(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point. Returns the exit status (0 ok, 2 bad input, 3 a run whose server died or
    whose requests all failed, 130 interrupted). Run as the command (``argv`` None), a Ctrl-C
    after the command has finished and said so is ignored: the process exits with the status its
    work earned (Python would otherwise end it by the signal, without a word)."""
    status = _command(sys.argv[1:] if argv is None else argv)
    if argv is None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return status


def _set_hint(message: str, argv: list[str]) -> str:
    """For an unrecognized flag that names a scenario field (``run ... --concurrency 4``) in a
    command that takes ``--set``: the ``--set`` that sets it; else ''."""
    if "unrecognized arguments" not in message or not argv or argv[0] not in ("run", "sweep"):
        return ""
    from sim.scenario import field_for_flag

    for i, arg in enumerate(argv[1:], 1):
        if not arg.startswith("--"):
            continue
        flag, eq, value = arg.partition("=")
        key = field_for_flag(flag)
        if key is None:
            continue
        if not eq:
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            value = nxt if nxt and not nxt.startswith("-") else "VALUE"
        return f"; a scenario field is set with --set: --set {key}={value}"
    return ""


def _command(argv: list[str]) -> int:
    """:func:`main` for the arguments ``argv``."""
    for name in ("stdout", "stderr"):  # a closed stream (`>&-`): what would be printed goes nowhere
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))
    try:
        parser = build_parser(argv[0] if argv else None)  # imports the commands' modules
    except KeyboardInterrupt:  # Ctrl-C while the commands load: one line, as later
        print("overlap-sim: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    try:
        args = parser.parse_args(argv)
    except UsageError as err:
        print(f"{err}{_set_hint(str(err), argv)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return COMMANDS[args.command][2](args)
    except UserInputError as err:
        print(f"overlap-sim: error: {' '.join(str(err).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except SimulationStalled as err:  # a modelling bug: one line, with what to report
        print(f"overlap-sim: error: {' '.join(str(err).split())}", file=sys.stderr)
        return EXIT_MODELLING_BUG
    except ExternalRunError as err:  # a real engine the command started failed: its log says why
        print(f"overlap-sim: error: {' '.join(str(err).split())}", file=sys.stderr)
        return EXIT_EXTERNAL_FAILED
    except KeyboardInterrupt:  # Ctrl-C: finished work is kept (run folders, sweep points, calibration samples)
        print("overlap-sim: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (`| head`): what was written stays, no traceback
        _quiet_stdout()
        return 0
    except UnicodeEncodeError as err:  # printing to a terminal or file whose encoding lacks a character
        _quiet_stdout()
        print(f"overlap-sim: error: standard output cannot encode {err.object[err.start:err.end]!r} in "
              f"{err.encoding} (set PYTHONIOENCODING=utf-8); {_FILES_KEPT}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as err:  # a file the system refused past the up-front checks (writes go through atomic_path)
        if getattr(err, "filename", None) is None:  # writing to standard output failed (a full disk: > /dev/full)
            _quiet_stdout()
            print(f"overlap-sim: error: writing to standard output: {err.strerror or type(err).__name__}; "
                  f"{_FILES_KEPT}", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(f"overlap-sim: error: {err.filename}: {err.strerror or type(err).__name__}", file=sys.stderr)
        return EXIT_BAD_INPUT


# standard output failed after the files may have been written (a run's folder is published before its
# table is printed): what the command wrote is kept, whole (sim.atomic), and says so
_FILES_KEPT = "the results files it finished writing are kept, whole"


def _quiet_stdout() -> None:
    """Standard output failed: send what is left in it (and its flush at exit) to the null device."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        sys.stdout = open(os.devnull, "w")


if __name__ == "__main__":  # pragma: no cover
    # run the imported sim.cli, where command modules register (this file runs as __main__)
    from sim.cli import main as _main
    sys.exit(_main())
