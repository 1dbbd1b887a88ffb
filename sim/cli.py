"""The ``overlap-sim`` command line. Subcommands register themselves in :data:`sim.commands.COMMANDS`.

User mistakes (bad scenario, missing file, bad override) print one line to stderr and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from sim.commands import COMMANDS, command
from sim.errors import UserInputError

# modules whose import registers more subcommands with @command (sim.commands); named, not
# imported, here: calibration's commands load only when the parser is built, and importing sim
# never imports calibrate
COMMAND_MODULES: tuple[str, ...] = (
    "sim.whatif.cli",
    "sim.engines.sglang.rules.advise",
    "calibrate.command",
    "calibrate.validate.cli",
    "calibrate.real.cli",
)


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario field, e.g. workload.concurrency=16 (repeatable)")
    p.add_argument("--out", type=Path, default=None, help="results folder (default results/<scenario-name>/)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
    p.add_argument("--format", choices=["csv", "parquet"], default="csv", help="file format of the tables")
    p.add_argument("--tables", choices=["steps", "summary", "none"], default="steps",
                   help="tables kept: steps (all, exact metrics), summary (per-request only; streamed metrics), "
                        "none (no tables; memory bounded by requests in flight)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


@command("run", "simulate a scenario under each scheduling setting and compare them", _add_run_args)
def cmd_run(args: argparse.Namespace) -> int:
    from sim.output.plots import save_run_plots
    from sim.output.report import print_table, run_payload, write_results
    from sim.scenario import load_scenario
    from sim.simulate import simulate

    scenario = load_scenario(args.scenario, args.overrides)
    results = [simulate(scenario, s, tables=args.tables) for s in scenario.server.settings]
    summaries = {r.setting: r.summary() for r in results}
    payload = run_payload(scenario.name, scenario.seed, summaries)
    payload["scenario_config"] = scenario.model_dump(mode="json")
    out_dir = args.out or Path("results") / scenario.name
    write_results(out_dir, payload, results, args.format, args.tables)
    if not args.no_plots and args.tables == "steps":
        save_run_plots(out_dir, scenario.name, {r.setting: r.steps for r in results}, summaries,
                       {r.setting: r.requests for r in results})
    if args.json:
        print(json.dumps({k: payload[k] for k in ("scenario", "seed", "settings", "ratios")}))
    else:
        print_table(f"{scenario.name} (seed {scenario.seed}, {scenario.server.device})", summaries,
                    streamed=args.tables != "steps")
        if args.tables != "steps" and not args.no_plots:
            print("no plots: they are drawn from the steps tables (--tables steps)")
        print(f"results written to {out_dir}/")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="overlap-sim",
        description="Predict what SGLang's overlap scheduler does on your device, against the synchronous loop.")
    for module in COMMAND_MODULES:
        importlib.import_module(module)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, arguments, _run) in COMMANDS.items():
        arguments(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point. Returns the exit status (0 ok, 2 bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command][2](args)
    except UserInputError as err:
        print(f"overlap-sim: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    # run the imported sim.cli, where command modules register (this file runs as __main__)
    from sim.cli import main as _main
    sys.exit(_main())
