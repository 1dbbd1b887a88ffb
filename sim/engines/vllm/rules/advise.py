"""``overlap-sim advise --engine vllm``: whether a vLLM launch command runs with async scheduling,
which rule decided it (or why vLLM refuses to start), and the simulator setting that models it.

    overlap-sim advise --engine vllm --device cpu -- --model DIR --async-scheduling

The answer comes from :mod:`sim.engines.vllm.rules.async_rules`; arguments the rules do not read
are passed over with a note. Registered in :data:`sim.commands.ADVISORS`; SGLang's ``advise``
command (:mod:`sim.engines.sglang.rules.advise`) owns the flags and dispatches here.
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.markup import escape

from sim.commands import advisor, stdout_console
from sim.model.known_flags import render_flags
from sim.engines.vllm.rules.async_rules import VllmAdvice, advise


def render(adv: VllmAdvice, console: Console) -> None:
    """Print a :class:`VllmAdvice` for people."""
    cfg = adv.config
    console.print(f"vLLM {cfg.version} on {cfg.platform}:")
    if adv.refused:
        console.print("  [bold red]vLLM refuses to start[/] (ValueError at start-up):")
    elif adv.async_scheduling:
        console.print("  async scheduling: [green]on[/] (EngineCore.step_with_batch_queue, batch queue of 2)")
    else:
        console.print("  async scheduling: [bold]off[/] (EngineCore.step)" + (", turned off by:" if adv.decided_by else
                                                                            ": not asked for (--no-async-scheduling)"))
    for r in adv.decided_by:
        console.print(f"    - {r.id}: {escape(r.text)}  [dim]({escape(r.source)})[/]")
    console.print(f"  simulator setting: {adv.setting or 'not modelled by the simulator'}")
    if cfg.server:
        fields = ", ".join(f"{k}={v}" for k, v in cfg.server.items())
        console.print(f"  scenario server fields: {escape(fields)}")
    render_flags(cfg.flags, console)
    for note in adv.notes:
        console.print(f"  note: {escape(note)}")


@advisor("vllm")
def cmd_advise_vllm(args: argparse.Namespace) -> int:
    """``advise --engine vllm`` (flags of :func:`sim.engines.sglang.rules.advise._add_arguments`)."""
    launch = list(args.launch_args)
    if launch and launch[0] == "--":
        launch = launch[1:]
    adv = advise(launch, args.device, args.version)
    if args.json:
        print(json.dumps(adv.to_dict()))
    else:
        render(adv, stdout_console())
    return 0
