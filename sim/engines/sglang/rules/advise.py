"""``overlap-sim advise``: which event loop an SGLang launch command selects, whether overlap is
on, which rule turned it off, and the known hazards of that path for that release.

    overlap-sim advise --device mlx --version 0.5.22 -- --model-path X --disable-overlap-schedule

The answer comes from the rules table (:mod:`sim.engines.sglang.rules.loop_rules`); arguments the table does not
read are passed over with a note.
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.markup import escape

from sim.commands import ADVISORS, command, stdout_console
from sim.model.known_flags import render_flags
from sim.engines.sglang.rules.launch_args import PLATFORMS
from sim.engines.sglang.rules.loop_rules import Advice, advise

_SEVERITY_STYLE = {"fault": "bold red", "risk": "yellow", "info": "dim"}


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=["sglang", *sorted(ADVISORS)], default="sglang",
                   help="the serving engine whose launch command follows (default sglang)")
    p.add_argument("--device", choices=PLATFORMS, default="cuda",
                   help="platform: cuda, mlx (Apple MPS with SGLANG_USE_MLX=1), mps (torch MPS), cpu")
    p.add_argument("--version", default=None, help="SGLang release (default: the rules table's, 0.5.22); with "
                                                   "--engine vllm, the vLLM release (default 0.32.0)")
    p.add_argument("--json", action="store_true", help="print the answer as one JSON object")
    p.add_argument("launch_args", nargs=argparse.REMAINDER,
                   help="after --: the engine's launch command, SGLang's or with --engine vllm vLLM's (NAME=VALUE "
                        "environment tokens allowed)")


def render(adv: Advice, console: Console) -> None:
    """Print an :class:`Advice` for people."""
    cfg = adv.config
    sim_setting = adv.setting or "not modelled by the simulator"
    console.print(f"SGLang {cfg.version} on {cfg.platform}: [bold]{escape(adv.selected_by.text)}[/]")
    console.print(f"  simulator setting: {sim_setting}")
    if adv.overlap:
        console.print("  overlap schedule: [green]on[/]")
    else:
        console.print("  overlap schedule: [bold]off[/], turned off by:")
        for hit in adv.disabled_by:
            console.print(f"    - {hit.id}: {escape(hit.text)}  [dim]({escape(hit.source)})[/]")
    console.print(f"  loop chosen by rule {adv.selected_by.id}  [dim]({escape(adv.selected_by.source)})[/]")
    if adv.hazards:
        console.print("  hazards of this path:")
        for hit in adv.hazards:
            style = _SEVERITY_STYLE.get(hit.severity, "")
            console.print(f"    - [{style}]{hit.severity}[/] {hit.id}: {escape(hit.text)}")
            console.print(f"      [dim]source: {escape(hit.source)}[/]")
    render_flags(cfg.flags, console)
    for note in adv.notes:
        console.print(f"  note: {escape(note)}")


@command("advise", "say which event loop a launch command selects (SGLang; vLLM with --engine vllm), and its known hazards", _add_arguments)
def cmd_advise(args: argparse.Namespace) -> int:
    if args.engine != "sglang":  # another engine's rules (registered in sim.commands.ADVISORS)
        return ADVISORS[args.engine](args)
    launch = list(args.launch_args)
    if launch and launch[0] == "--":
        launch = launch[1:]
    adv = advise(launch, args.device, args.version)
    if args.json:
        print(json.dumps(adv.to_dict()))
    else:
        render(adv, stdout_console())
    return 0
