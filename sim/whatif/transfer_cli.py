"""``overlap-sim transfer``: move a measured profile to another card by public specs
(:mod:`sim.model.transfer`); ``--list`` prints the card table (:mod:`sim.model.cards`)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from sim.commands import command, output_path, stdout_console
from sim.errors import UserInputError
from sim.jsonio import is_number


def _args(p: argparse.ArgumentParser) -> None:
    from sim.model.transfer import EFFICIENCY

    p.add_argument("profile", nargs="?", type=Path, help="a measured SGLang or vLLM calibration profile (JSON)")
    p.add_argument("--to", default=None, metavar="CARD", help="the target card (see --list), e.g. l4")
    p.add_argument("--out", type=output_path, default=None, help="the new profile to write (JSON)")
    p.add_argument("--from", dest="from_card", default=None, metavar="CARD",
                   help="the card the profile was measured on (default: its metadata.device_name)")
    p.add_argument("--host-speed", type=float, default=None, metavar="X",
                   help="target host's single-thread CPU speed / the measuring host's (default 1: the same; "
                        "2 halves every scheduler phase)")
    p.add_argument("--host-probe", type=Path, default=None, metavar="READING",
                   help="instead of --host-speed: the target host's reading of the host speed probe "
                        "(python -m calibrate.hostspeed READING.json), divided into the profile's own "
                        "(metadata.host_speed, written by calibrate --engine)")
    p.add_argument("--method", choices=["roofline", "ratio"], default="roofline",
                   help="roofline (default): only the roofline share of a forward moves with the card; ratio: "
                        "all of a decode by the bandwidth ratio, all of a prefill by the compute ratio")
    p.add_argument("--efficiency", type=float, default=EFFICIENCY, metavar="ETA",
                   help=f"share of peak bandwidth and compute a tuned kernel reaches (default {EFFICIENCY})")
    p.add_argument("--list", action="store_true", help="print the table of cards and their sources, then exit")


def _print_cards() -> None:
    from rich.table import Table

    from sim.model.cards import CARDS
    from sim.output.report import console_width

    # the numbers in a table that fits 80 columns; each card's host and sources below it, as
    # paragraphs that wrap (long URLs in a table column wrapped a letter at a time)
    t = Table(title="cards: public peak specs (vendor pages)")
    for col in ("card", "name", "memory (GB)", "bandwidth (GB/s)", "dense BF16 (TFLOPS)"):
        t.add_column(col, justify="right" if "(" in col else "left", no_wrap=col in ("card", "name"))
    for c in CARDS.values():
        t.add_row(c.key, c.name, f"{c.memory_gb:g}", f"{c.bandwidth_gb_s:g}",
                  "-" if c.bf16_tflops is None else f"{c.bf16_tflops:g}")
    console = stdout_console(console_width())
    console.print(t)
    for c in CARDS.values():
        console.print(f"{c.key}: host {c.host}; source {c.source}", highlight=False, soft_wrap=False)


MAX_PROBE_S = 3600.0  # a probe reading's seconds per repetition: beyond an hour it is a corrupt value


def host_speed_from_probe(profile: dict, profile_path: Path, reading_path: Path) -> float:
    """The target host's speed over the measuring host's, from two readings of the host speed
    probe's Python workload (``python_s``, seconds per repetition; :mod:`calibrate.hostspeed`):
    the profile's ``metadata.host_speed`` over the target's reading (2: the target runs the
    bookkeeping twice as fast).

    Raises:
        UserInputError: the profile has no reading, or the reading file is unreadable, gives a
            key twice or has no ``python_s`` above 0 and up to :data:`MAX_PROBE_S` (ratios outside
            0.01..100 too).
    """
    if not Path(reading_path).is_file():  # (said first: the flag the user gave, before what the profile lacks)
        what = "a folder" if Path(reading_path).is_dir() else "no such file"
        raise UserInputError("--host-probe", "", f"a host speed probe's reading, a JSON file ({reading_path}: {what})")
    ref = (profile.get("metadata") or {}).get("host_speed") or {}
    ref_s = ref.get("python_s") if isinstance(ref, dict) else None
    if not is_number(ref_s, 0, MAX_PROBE_S, above=True):
        raise UserInputError(str(profile_path), "metadata.host_speed.python_s",
                             "missing: the profile predates host speed probes (use --host-speed X)")
    from sim.jsonio import DuplicateKeyError, unique_keys

    try:
        reading = json.loads(Path(reading_path).read_text(), object_pairs_hook=unique_keys)
    except DuplicateKeyError as err:
        raise UserInputError(str(reading_path), err.key, "given twice in one JSON object") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        why = getattr(err, "strerror", None) or err.__class__.__name__
        raise UserInputError("--host-probe", "", f"a readable JSON reading ({reading_path}: {why})") from None
    now_s = reading.get("python_s") if isinstance(reading, dict) else None
    if not is_number(now_s, 0, MAX_PROBE_S, above=True):
        raise UserInputError(str(reading_path), "python_s", f"a positive number of seconds up to {MAX_PROBE_S:g} "
                             "(from calibrate.hostspeed)")
    speed = float(ref_s) / float(now_s)
    if not 0.01 <= speed <= 100:
        raise UserInputError(str(reading_path), "python_s", f"a reading within 100x of the profile's (ratio {speed:.3g})")
    return speed


def _refuse_card(engine: str, to: str) -> None:
    """One line (``--to``) when the profile's engine has no platform on the target card (the
    engine's :data:`sim.commands.CARD_REFUSALS`, as ``overlap-sim ask`` reads it)."""
    import sim.engines  # noqa: F401  (the engines register their refusals)
    from sim.commands import CARD_REFUSALS
    from sim.model.cards import find_card

    card, check = find_card(to), CARD_REFUSALS.get(engine)
    if card is not None and check is not None and (why := check(card)) is not None:
        raise UserInputError("--to", "", why)


def curve_table(path: Path):
    """The curves of the profile at ``path`` by its ``metadata.engine`` (absent: SGLang's; vLLM's).

    Raises:
        ProfileError: an engine other than SGLang and vLLM."""
    from sim.errors import ProfileError
    from sim.model.profile import SGLANG_CURVES

    try:
        engine = json.loads(Path(path).read_text()).get("metadata").get("engine", "sglang")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError, RecursionError):
        return SGLANG_CURVES  # unreadable or not a profile: load_profile says why
    if engine == "vllm":
        from sim.engines.vllm.profile import VLLM_CURVES

        return VLLM_CURVES
    if engine == "sglang":
        return SGLANG_CURVES
    raise ProfileError(str(path), "metadata.engine", f"an SGLang or vLLM profile ('sglang' or 'vllm'); got {engine!r}")


@command("transfer", "move a measured calibration profile to another card by public specs (bandwidth, compute, "
                     "host speed)", _args)
def cmd_transfer(args: argparse.Namespace) -> int:
    if args.list:
        _print_cards()
        return 0
    for flag, value in (("PROFILE", args.profile), ("--to", args.to), ("--out", args.out)):
        if value is None:
            raise UserInputError(flag, "", "required (or --list to see the cards)")
    if args.host_speed is not None and not (math.isfinite(args.host_speed) and 0.01 <= args.host_speed <= 100):
        raise UserInputError("--host-speed", "", f"a speed ratio from 0.01 to 100 (got {args.host_speed!r})")
    if not (math.isfinite(args.efficiency) and 0.05 <= args.efficiency <= 1):
        raise UserInputError("--efficiency", "", f"a share of peak from 0.05 to 1 (got {args.efficiency!r})")
    from sim.atomic import check_output_file
    from sim.model.profile import load_profile
    from sim.model.transfer import transfer_profile, vllm_decode_max
    from sim.output.run_files import atomic_write_text

    curves = curve_table(args.profile)
    profile = load_profile(args.profile, curves)
    _refuse_card(curves.engine, args.to)
    if args.host_probe is not None:
        if args.host_speed is not None:
            raise UserInputError("--host-speed", "", "either it or --host-probe, not both (the probe's reading sets the "
                                 "host speed)")
        args.host_speed = host_speed_from_probe(profile, args.profile, args.host_probe)
    elif args.host_speed is None:
        args.host_speed = 1.0
    out = check_output_file(args.out, "--out", inputs=[args.profile])
    new = transfer_profile(profile, args.to, source=str(args.profile), from_card=args.from_card,
                           host_speed=args.host_speed, method=args.method, efficiency=args.efficiency, curves=curves)
    atomic_write_text(out, json.dumps(new, indent=1, allow_nan=False) + "\n")
    rec = new["metadata"]["transfer"]
    print(f"{args.profile}: {rec['from_device_name']} -> {new['metadata']['device_name']} ({rec['method']}, "
          f"eta {rec['efficiency']:g}): bandwidth x{rec['bandwidth_ratio']:.3g}, compute x{rec['compute_ratio']:.3g}"
          f"{'' if rec['compute_published'] else ' (no published compute figure: same balance assumed)'}, "
          f"host phases / {rec['host_speed']:g}")
    vllm = new["metadata"].get("engine") == "vllm"
    for name in ("vllm.forward",) if vllm else ("forward.decode", "forward.extend"):
        old, moved = profile["curves"][name], new["curves"][name]
        g = old["grid"]
        corners = [(0, 0), (len(g[0]) - 1, len(g[1]) - 1)]
        if vllm:  # the largest decode node too (the rows beyond it are prefills)
            top = max((i for i, n in enumerate(g[0]) if n <= vllm_decode_max(profile["metadata"], "")), default=0)
            corners.insert(1, (top, len(g[1]) - 1))
        cells = "; ".join(f"{g[0][i]:g} x {g[1][j]:g}: {old['values_s'][i][j] * 1e3:.3f} -> "
                          f"{moved['values_s'][i][j] * 1e3:.3f} ms" for i, j in dict.fromkeys(corners))
        print(f"  {name} ({' x '.join(old['axes'])}) {cells}")
    other = ("the ratio method (which scales a whole step, its launches and synchronisation too) would differ"
             if rec["method"] == "roofline" else "the roofline method (the default) would differ")
    print(f"stated uncertainty ±{rec['uncertainty_rel']:.0%} on forward times, stated not measured (docs/transfer.md); "
          f"{other} by up to {rec['method_spread_rel']:.0%} on this grid, most where a measured step is far slower than its roofline; written to {out}")
    if vllm:
        print("a vLLM scenario on it: server.device: cuda (the forward runs on the card while the worker's CPU goes "
              "on; cpu would charge it to the worker's CPU)")
    return 0
