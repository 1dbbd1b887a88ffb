"""``overlap-sim ask``: the user's question in one command.

    overlap-sim ask --engine sglang --card l4 --model llama-3.1-8b --concurrency 16 --input-len 1000 --output-len 300

1. **The profile**: the shipped measured profile of that engine and model (:data:`SHIPPED`: the
   H200 profiles built from parts); none for another model: the command refuses and prints the
   calibration that would answer it.
2. **The card**: on another card than the profile's, the profile is moved by public specs
   (:func:`sim.model.transfer.transfer_profile`, ±30% stated); ``--host-speed`` says how fast the
   card's host runs the scheduler against the profile's host (default 1: as fast, stated);
   ``--memory-gb`` the card's memory where it is not the public figure (an Apple SoC's
   configurations: the largest by default, stated).
3. **The server**: the engine's own defaults for that model on that card (the engine's ``ask``
   module, :data:`sim.commands.ASKERS`: its KV pool and batch limits from the card's memory), no
   cap from a shipped scenario.
4. **The load**: a closed loop of ``--concurrency`` clients (or Poisson arrivals at ``--rate``),
   ``--num-requests`` requests (default: 8 per client, at least 64; the first ``concurrency`` of a
   closed loop are warm-up), prompts of ``--input-len`` tokens of which ``--cached-len`` hit the
   prefix cache, ``--output-len`` tokens by length.
5. **The answer**: ``overlap-sim run`` of the written scenario: every setting the engine's switch
   selects, the table and the verdict with its range over what the profile does not know
   (:mod:`sim.whatif.stated_range`). The scenario YAML and the moved profile stay in the results
   folder, to edit and run again.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

from sim.commands import ASKERS, CALIBRATE_SHAPES, CARD_REFUSALS, COMMANDS, add_plots_arguments, command, output_path
from sim.errors import UserInputError

PROFILES = Path(__file__).resolve().parents[2] / "scenarios" / "profiles"
# (engine, model) -> the shipped profile that measured it
SHIPPED = {("sglang", "llama-3.2-1b"): "h200-llama-3.2-1b.json", ("sglang", "llama-3.1-8b"): "h200-llama-3.1-8b.json",
           ("vllm", "llama-3.2-1b"): "h200-vllm-llama-3.2-1b.json"}
# the shipped models' context (tokens): max_position_embeddings of their config.json on the Hugging
# Face hub (meta-llama/Llama-3.2-1B and meta-llama/Llama-3.1-8B: 131,072), what both engines take as
# the server's context length by default; a load beyond it is one the server refuses
MODEL_CONTEXT = {"llama-3.2-1b": 131_072, "llama-3.1-8b": 131_072}
MAX_COUNT = 1_000_000
MAX_TOKENS = 1_000_000

HELP = "answer 'should overlap / async scheduling be on?' for an engine, card, model and load in one command"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=["sglang", "vllm"], default="sglang", help="the serving engine (default sglang)")
    p.add_argument("--card", required=True, help="the card (overlap-sim transfer --list), e.g. l4, h100, m3-max")
    p.add_argument("--model", required=True, help="the model: " + ", ".join(sorted({m for _, m in SHIPPED})))
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency", type=int, default=None, metavar="N", help="clients in a closed loop")
    load.add_argument("--rate", type=float, default=None, metavar="REQ_S", help="Poisson arrivals (requests/s)")
    p.add_argument("--input-len", type=int, required=True, metavar="TOKENS", help="prompt tokens per request")
    p.add_argument("--output-len", type=int, required=True, metavar="TOKENS", help="output tokens per request")
    p.add_argument("--cached-len", type=int, default=0, metavar="TOKENS",
                   help="prompt tokens that hit the prefix cache (default 0)")
    p.add_argument("--num-requests", type=int, default=None, metavar="N",
                   help="requests measured (default 8 per client or 8 s of arrivals, at least 64)")
    p.add_argument("--host-speed", type=float, default=1.0, metavar="X",
                   help="the card's host's single-thread speed over the profile's host's (default 1)")
    p.add_argument("--memory-gb", type=float, default=None, metavar="GB",
                   help="the card's memory in GB (10^9 bytes) where yours is not its public figure (an Apple SoC "
                        "is sold with several: default the largest configuration's)")
    p.add_argument("--out", type=output_path, default=None, help="results folder (default results/ask-<engine>-<card>-<model>-<load>/)")
    add_plots_arguments(p)
    from sim.whatif.verdict import add_run_cv_argument

    add_run_cv_argument(p)


def model_key(text: str) -> str:
    """A model name as the shipped profiles name it: case folded, a hub organisation and an
    instruction-tuned suffix dropped (``meta-llama/Llama-3.1-8B-Instruct`` -> ``llama-3.1-8b``)."""
    name = text.strip().lower().split("/")[-1]
    return re.sub(r"-(instruct|chat|it|base)$", "", name)


def _check(args: argparse.Namespace) -> None:
    """Every number in range, before anything is read or written (one line per fault)."""
    from sim.whatif.verdict import check_run_cv

    check_run_cv(args.run_cv)
    for flag, value, low in (("--concurrency", args.concurrency, 1), ("--input-len", args.input_len, 1),
                             ("--output-len", args.output_len, 1), ("--num-requests", args.num_requests, 1)):
        if value is not None and not low <= value <= (MAX_COUNT if "len" not in flag else MAX_TOKENS):
            raise UserInputError(flag, "", f"an integer from {low} to {MAX_TOKENS if 'len' in flag else MAX_COUNT} "
                                 f"(got {value})")
    if not 0 <= args.cached_len < args.input_len:
        raise UserInputError("--cached-len", "", f"from 0 to --input-len - 1 = {args.input_len - 1} (got "
                             f"{args.cached_len}): the last prompt token is always computed")
    if args.rate is not None and not (math.isfinite(args.rate) and 0 < args.rate <= 1e6):
        raise UserInputError("--rate", "", f"requests per second above 0 and at most 1e6 (got {args.rate:g})")
    if args.memory_gb is not None and not (math.isfinite(args.memory_gb) and 1 <= args.memory_gb <= 100_000):
        raise UserInputError("--memory-gb", "", f"GB from 1 to 100,000 (got {args.memory_gb:g})")
    if not (math.isfinite(args.host_speed) and 0 < args.host_speed <= 1000):
        raise UserInputError("--host-speed", "", f"a number above 0 and at most 1000 (got {args.host_speed:g})")
    if args.num_requests is not None and args.concurrency is not None and args.num_requests < args.concurrency:
        raise UserInputError("--num-requests", "", f"at least --concurrency {args.concurrency} (got "
                             f"{args.num_requests}): a closed loop keeps that many in flight")


def _profile(args: argparse.Namespace, card) -> tuple[dict, Path, list[str]]:
    """(the profile for the card, the shipped file it came from, what was done to it)."""
    import json

    from sim.model.cards import find_card
    from sim.model.transfer import transfer_profile

    name = SHIPPED.get((args.engine, model_key(args.model)))
    refusal = CARD_REFUSALS.get(args.engine)
    if refusal is not None and (why := refusal(card)) is not None:  # (before a recipe for a card it refuses)
        raise UserInputError("--card", "", why)
    if name is None:
        have = ", ".join(m for e, m in sorted(SHIPPED) if e == args.engine)
        m = model_key(args.model)
        device = ("--backend mlx --device gpu" if card.key.startswith("m") else "--backend torch --device cuda")
        if CALIBRATE_SHAPES and m not in CALIBRATE_SHAPES:  # a shape calibrate does not know by name: its dimensions
            m = (f"{CALIBRATE_SHAPES[-1]} --layers L --hidden H --heads A --kv-heads K --head-dim D --vocab V "
                 f"--intermediate I "
                 f"(a shape it knows, each dimension set to {args.model}'s, from its config.json; it knows "
                 f"{', '.join(CALIBRATE_SHAPES)})")
        recipe = (f"overlap-sim calibrate {device} --model {m} --out dev.json; overlap-sim calibrate --engine sglang "
                  "--host-only --out host.json; overlap-sim compose dev.json host.json --out mine.json"
                  if args.engine == "sglang" else
                  f"overlap-sim calibrate {device} --model {m} --out dev.json; overlap-sim compose dev.json "
                  "scenarios/profiles/parts/vllm-0.32.0-host-intel-xeon.json --out mine.json")
        raise UserInputError("--model", "", f"one with a measured {args.engine} profile ({have}); for "
                             f"{args.model!r} measure it on {card.name} ({recipe}), then run a scenario of this load "
                             "on it (overlap-sim ask with a shipped model writes one: run it with --set "
                             "costs.profile=mine.json)")
    path = PROFILES / name
    profile = json.loads(path.read_text())
    meta = profile["metadata"]
    steps = [f"profile {path.name} ({meta.get('device_name')}, {meta['model']['name']})"]
    if find_card(meta.get("device_name", "")) == card and args.host_speed == 1.0:
        return profile, path, steps
    if args.engine == "vllm":
        from sim.engines.vllm.profile import VLLM_CURVES as table
    else:
        from sim.model.profile import SGLANG_CURVES as table
    moved = transfer_profile(profile, card.key, source=str(path), host_speed=args.host_speed, curves=table)
    t = moved["metadata"]["transfer"]
    if t["from_card"] != t["to_card"]:
        silent = card.name if card.bf16_tflops is None else "the profile's card"  # (the one without a figure)
        compute = (f"compute x{t['compute_ratio']:.2f}" if t.get("compute_published", True) else
                   f"compute x{t['compute_ratio']:.2f} assumed: {silent} publishes no compute figure, so the other "
                   "card's compute-to-bandwidth balance is taken, which prices the prefill and TTFT beyond the stated "
                   "range")
        steps.append(f"moved to {card.name} by public specs (bandwidth x{t['bandwidth_ratio']:.2f}, {compute}; "
                     f"±{t['uncertainty_rel']:.0%} stated)")
    else:  # the profile's own card: only the host phases move (transfer_profile leaves the forward)
        steps.append(f"its forward as measured on {card.name}")
    steps.append(f"the card's host ({card.host}) assumed as fast as the profile's host ({meta.get('host_cpu')}): pass "
                 "--host-speed to say otherwise" if args.host_speed == 1.0 else
                 f"the card's host x{args.host_speed:g} the profile's host's speed (--host-speed)")
    return moved, path, steps


ASK_HEADER = "# overlap-sim ask"  # the first line of the scenario.yaml ask writes


def _check_own_files(out: Path) -> None:
    """``ask`` replaces ``scenario.yaml`` and ``profile.json`` in ``out`` only where an earlier
    ``ask`` wrote them (its scenario's first line); a user's own files there are not overwritten.

    Raises:
        UserInputError: naming ``--out`` and the file.
    """
    scenario = out / "scenario.yaml"
    try:
        ours = scenario.is_file() and scenario.read_text(errors="replace").startswith(ASK_HEADER)
    except OSError:
        ours = False
    for name in ("scenario.yaml", "profile.json"):
        if (out / name).exists() and not ours:
            raise UserInputError("--out", "", f"{out / name} was not written by ask, which would replace it; "
                                 "choose another folder")


def _check_load(scenario: dict) -> None:
    """Validate the scenario ``ask`` built (its workload and server; the profile is checked when
    it runs), naming the flags its values came from.

    Raises:
        UserInputError: naming the flags (a KV pool too small for the requests: --input-len,
            --output-len, --concurrency).
    """
    from sim.errors import ScenarioError
    from sim.scenario import load_scenario

    try:
        load_scenario({**scenario, "costs": {}})
    except ScenarioError as err:
        flag = {"workload.input_len": "--input-len", "workload.output_len": "--output-len",
                "workload.cached_len": "--cached-len", "workload.concurrency": "--concurrency",
                "workload.rate_per_s": "--rate", "workload.num_requests": "--num-requests"}.get(err.field)
        raise UserInputError(flag or "--input-len, --output-len, --concurrency", err.field, err.expected) from None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


def _arguments(p: argparse.ArgumentParser) -> None:
    add_arguments(p)
    p.epilog = ("Exit status: 0 done; 2 bad input or an unanswerable question (one line on stderr, nothing "
                "written); 3 a setting's server died or none of its measured requests completed (results written; "
                "e.g. SGLang 0.5.22's normal loop on MLX).")


@command("ask", HELP, _arguments)
def run(args: argparse.Namespace) -> int:
    import yaml

    import json

    from sim.atomic import atomic_path, check_output_dir
    from sim.model.cards import CARDS, find_card
    from sim.model.transfer import model_terms

    _check(args)
    card = find_card(args.card)
    if card is None:
        raise UserInputError("--card", "", f"one of {', '.join(CARDS)} (got {args.card!r}); another card: calibrate "
                             "on it (README: your own card, in three steps) and run the scenario on that profile")
    if args.engine not in ASKERS:
        raise UserInputError("--engine", "", f"one of {', '.join(sorted(ASKERS))}")
    profile, shipped, steps = _profile(args, card)
    context = MODEL_CONTEXT.get(model_key(args.model))
    if context is not None and args.input_len + args.output_len > context:  # (before anything is written)
        raise UserInputError("--input-len, --output-len", "", f"{args.input_len:,} prompt and {args.output_len:,} output "
                             f"tokens exceed {model_key(args.model)}'s context of {context:,} tokens (its config.json's "
                             "max_position_embeddings, the server's default context length): the server refuses or "
                             "cuts such requests")
    if args.memory_gb is not None:  # the user's own configuration: the sizing below reads it
        from dataclasses import replace

        card = replace(card, memory_gb=args.memory_gb, memory_largest=False)
        steps.append(f"the card's memory {args.memory_gb:g} GB (--memory-gb)")
    elif card.memory_largest:
        steps.append(f"the card's memory {card.memory_gb:g} GB, the largest configuration's: pass --memory-gb for yours")
    load = {"input_len": args.input_len, "output_len": args.output_len}
    try:
        server, notes = ASKERS[args.engine](card, model_terms(profile["metadata"], str(shipped)), load)
    except ValueError as err:  # (the weights do not fit: the card's memory, or the one --memory-gb gave)
        raise UserInputError("--memory-gb" if args.memory_gb is not None else "--card", "", str(err)) from None
    closed = args.concurrency is not None
    n = args.num_requests or max(64, 8 * args.concurrency if closed else int(8 * args.rate))
    workload = {"arrival": "closed_loop" if closed else "poisson", "num_requests": n + (args.concurrency if closed else 0),
                "warmup_requests": args.concurrency if closed else 0, "input_len": args.input_len,
                "cached_len": args.cached_len, "output_len": args.output_len, "finish": "length"}
    workload.update({"concurrency": args.concurrency} if closed else {"rate_per_s": args.rate})
    shape = f"c{args.concurrency}" if closed else f"r{args.rate:g}"
    name = _slug(f"ask-{args.engine}-{card.key}-{args.model.lower()}-{shape}-{args.input_len}-{args.output_len}")
    out = check_output_dir(args.out or Path("results") / name, "--out")
    scenario = {"name": name, "seed": 0, "workload": workload, "server": server,
                "costs": {"profile": "profile.json"}}
    _check_load(scenario)  # before anything is written
    _check_own_files(out)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "profile.json") as tmp:
        tmp.write_text(json.dumps(profile, indent=1, allow_nan=False) + "\n")
    head = (f"{ASK_HEADER} --engine {args.engine} --card {args.card} --model {args.model} ...: the scenario it ran\n"
            + "".join(f"#   {line}\n" for line in steps + notes))
    with atomic_path(out / "scenario.yaml") as tmp:
        tmp.write_text(head + yaml.safe_dump(scenario, sort_keys=False))
    from sim.output.text import say

    say("asked: " + "; ".join(steps + notes))
    run_args = argparse.Namespace(scenario=str(out / "scenario.yaml"), overrides=[], out=out, json=False,
                                  format="parquet", tables="steps", no_plots=args.no_plots, run_cv=args.run_cv)
    code = COMMANDS["run"][2](run_args)
    print(f"scenario written to {out / 'scenario.yaml'} (its profile beside it): edit it and run "
          f"overlap-sim run {out / 'scenario.yaml'}")
    return code
