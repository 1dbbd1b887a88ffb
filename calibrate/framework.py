"""``overlap-sim calibrate --backend B --device D``: the framework calibration run: the model's
forward and the scheduler's bookkeeping timed on this machine (:mod:`calibrate.measure`), the
grid cut to the memory available (:mod:`calibrate.sizing`), the plan, the progress and a summary
of the fitted curves. :mod:`calibrate.cli` parses the command and sends it here.
"""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path

from calibrate.errors import CalibrationInputError

GRID_FLAGS = {"decode_batch_sizes": "--batch-sizes", "decode_contexts": "--contexts", "extend_tokens": "--extend-tokens",
              "extend_prefixes": "--prefixes", "bookkeeping_batch_sizes": "--bookkeeping-batch-sizes"}
MAX_GRID_VALUE = 10**7
MAX_SEED = 2**32 - 1  # torch's and numpy's seeds


def config_from_args(args: argparse.Namespace):
    """The :class:`calibrate.config.CalibrationConfig` the arguments describe."""
    from dataclasses import replace

    from calibrate.config import CalibrationConfig, default_grid
    from calibrate.shapes import resolve_shape

    _check_flags(args)
    try:
        shape = resolve_shape(args.model, layers=args.layers, hidden=args.hidden, heads=args.heads,
                              kv_heads=args.kv_heads, vocab=args.vocab, intermediate=args.intermediate,
                              head_dim=args.head_dim)
    except CalibrationInputError as err:
        if err.source != "model shape":
            raise
        if err.field == "kv_heads" and args.kv_heads is None and args.heads is not None:
            # the user changed --heads; the shape's own kv_heads no longer divides it
            kv = err.expected.split("got ")[-1].rstrip(")")
            raise CalibrationInputError("--heads", "", f"a multiple of the model's {kv} KV heads, or pass --kv-heads "
                                        f"too (got --heads {args.heads})") from None
        raise CalibrationInputError("--" + err.field.replace("_", "-"), "", err.expected) from None
    grid = default_grid(args.device, args.quick)
    changes = {k: tuple(getattr(args, a)) for k, a in (("decode_batch_sizes", "batch_sizes"), ("decode_contexts", "contexts"),
                                                       ("extend_tokens", "extend_tokens"), ("extend_prefixes", "prefixes"),
                                                       ("bookkeeping_batch_sizes", "bookkeeping_batch_sizes"))
               if getattr(args, a)}
    if args.repeats is not None:
        changes["repeats"] = args.repeats
    if args.warmup is not None:
        changes["warmup"] = args.warmup
    try:
        grid = replace(grid, **changes) if changes else grid
    except CalibrationInputError as err:
        raise CalibrationInputError(GRID_FLAGS.get(err.field, "--" + err.field), "", err.expected) from None
    return CalibrationConfig(args.backend, args.device, shape, grid, dtype=args.dtype, seed=args.seed,
                             threads=args.threads, cuda_graph=not args.no_cuda_graph, quick=args.quick, note=args.note)


def _check_flags(args: argparse.Namespace) -> None:
    """Counts and sizes in range, before anything is imported or measured."""
    gib = getattr(args, "device_memory_gib", None)
    if gib is not None and not (gib == gib and 0.01 <= gib <= 1e6):
        raise CalibrationInputError("--device-memory-gib", "", f"expected GiB from 0.01 to 1e6 (got {gib!r})")
    checks = [("--repeats", args.repeats, 1, 100_000), ("--warmup", args.warmup, 0, 100_000),
              ("--threads", args.threads, 1, 4096), ("--seed", args.seed, 0, MAX_SEED)]
    checks += [(f"--{name.replace('_', '-')}", getattr(args, name), 1, MAX_GRID_VALUE)
               for name in ("layers", "hidden", "heads", "kv_heads", "vocab", "intermediate", "head_dim")]
    for flag, value, low, high in checks:
        if value is not None and not low <= value <= high:
            raise CalibrationInputError(flag, "", f"expected an integer from {low} to {high} (got {value})")
    for name, flag in GRID_FLAGS.items():
        values = getattr(args, {"decode_batch_sizes": "batch_sizes", "decode_contexts": "contexts",
                                "extend_prefixes": "prefixes"}.get(name, name)) or []
        low = 0 if name == "extend_prefixes" else 1
        bad = [v for v in values if not low <= v <= MAX_GRID_VALUE]
        if bad:
            raise CalibrationInputError(flag, "", f"expected integers from {low} to {MAX_GRID_VALUE} (got {bad[0]})")


def run_framework(args: argparse.Namespace) -> int:
    """``calibrate --backend B --device D``: time the model's forward and the bookkeeping on this
    machine and write the profile (``--dry-run``: print the plan only). Returns 0.

    Raises:
        CalibrationInputError: a missing ``--backend``/``--device``, a flag out of range, an
            unwritable ``--out`` (naming the flag)."""
    from rich.console import Console

    from calibrate.measure import calibrate
    from sim.atomic import check_output_file

    for flag in ("backend", "device"):
        if getattr(args, flag) is None:
            raise CalibrationInputError(f"--{flag}", "", "required (or --engine sglang to time SGLang's own scheduler)")

    cfg = config_from_args(args)
    if args.out.is_dir():
        raise CalibrationInputError("--out", "", f"a file path, not the folder {args.out}")
    check_output_file(args.out, "--out")
    console = Console(stderr=True)
    if not console.is_terminal:
        console = Console(stderr=True, width=120)
    cfg, backend = sized_config(cfg, args, console)
    if args.dry_run:
        return 0
    with _Reporter(console, args.quiet) as report:
        profile = calibrate(cfg, args.out, fresh=args.fresh, report=report, command=canonical_command(args),
                            backend=backend)
    print_summary(profile, args.out, console)
    return 0


def sized_config(cfg, args: argparse.Namespace, console):
    """``cfg`` with its grid cut to the memory available (:mod:`calibrate.sizing`) and the backend
    that reported it (None with ``--device-memory-gib`` or on a CPU); prints the plan (unless
    ``--quiet`` without ``--dry-run``): memory, what was cut, points and steps, the duration estimate.

    Raises:
        CalibrationInputError: an unknown ``--card``, a missing framework or device (without
            ``--device-memory-gib``), a model too large for the memory."""
    from dataclasses import replace

    from calibrate.measure import make_backend, plan
    from calibrate.sizing import GIB, available_memory, dtype_bytes, estimate_duration_s, format_duration, size_grid
    from sim.model.cards import CARDS, find_card

    card = None
    if args.card:
        card = find_card(args.card)
        if card is None:
            raise CalibrationInputError("--card", "", f"one of {', '.join(CARDS)} (got {args.card!r})")
    backend = None
    if args.device_memory_gib is None and cfg.device != "cpu":
        backend = make_backend(cfg)  # the device's free memory; a missing device fails here
        if card is None and cfg.backend == "torch":
            card = find_card(backend.describe()["device_name"])
    available, share, source = available_memory(cfg, args.device_memory_gib, backend)
    sized = size_grid(cfg.shape, dtype_bytes(cfg), cfg.grid, available, share, source,
                      flag="--device-memory-gib" if args.device_memory_gib is not None else "--model")
    cfg = replace(cfg, grid=sized.grid)
    if not args.dry_run and getattr(args, "out", None) is not None:  # (a resumed run's bad sidecar: one line, first)
        from calibrate.sidecar import Sidecar

        Sidecar.check(Path(args.out), cfg.identity(), bool(getattr(args, "fresh", False)))
    if args.quiet and not args.dry_run:
        return cfg, backend
    g = cfg.grid
    budget = f"{sized.budget_bytes / GIB:.1f} GiB ({share:.0%} of {available / GIB:.1f} GiB, {source})"
    console.print(f"memory: {cfg.shape.name} {cfg.resolved_dtype} needs {sized.need_bytes / GIB:.1f} GiB of {budget}"
                  + (f"; cut to fit, left out: {'; '.join(sized.dropped)}" if sized.dropped else ""),
                  highlight=False, soft_wrap=True)
    points = len(plan(cfg))
    if card is not None or cfg.device == "cpu":
        on = card.name if card is not None else "this host (stated CPU peaks)"
        estimate = f"estimated {format_duration(estimate_duration_s(cfg, card))} on {on}"
    else:
        estimate = "no duration estimate: an unknown card (pass --card, see overlap-sim transfer --list)"
    console.print(f"grid: decode {len(g.decode_batch_sizes)} batch sizes ({g.decode_batch_sizes[-1]} max) x "
                  f"{len(g.decode_contexts)} contexts ({g.decode_contexts[-1]} max), prefill {len(g.extend_tokens)} x "
                  f"{len(g.extend_prefixes)}, {points} points x {g.warmup + g.repeats} steps; {estimate}",
                  highlight=False, soft_wrap=True)
    return cfg, backend


class _Reporter:
    """A rich progress bar on a terminal; elsewhere (logs, CI) one line per grid point."""

    def __init__(self, console, quiet: bool):
        self.console, self.quiet = console, quiet
        self.progress = self.job = None
        self.t0 = time.perf_counter()

    def __enter__(self):
        if not self.quiet and self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), console=self.console)
            self.progress.start()
        return self

    def __call__(self, done: int, total: int, label: str) -> None:
        if self.quiet:
            return
        if self.progress is None:
            if label:
                self.console.print(f"[{done}/{total}] {time.perf_counter() - self.t0:7.1f}s  {label}", highlight=False)
            return
        if self.job is None:
            self.job = self.progress.add_task("calibrating", total=total)
        self.progress.update(self.job, completed=done, description=label or "done")

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.stop()
        return False


def canonical_command(args: argparse.Namespace) -> str:
    """The command line that reproduces this calibration (recorded in the profile)."""
    parts = ["overlap-sim", "calibrate"]
    for key, value in vars(args).items():
        if key.startswith("_") or key in ("command", "fresh", "quiet", "dry_run") or value in (None, False, "", []):
            continue
        if key == "seed" and value == 0:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif isinstance(value, list):
            parts += [flag, ",".join(map(str, value))]
        else:
            parts += [flag, str(value)]
    return shlex.join(parts)


NOISY_FORWARD_R2 = 0.95  # below this a forward curve is more noise than signal


def print_summary(profile: dict, out: Path, console) -> None:
    """A short table of the fitted curves."""
    from rich.table import Table

    m = profile["metadata"]
    table = Table(title=f"{m['backend']} on {m['device_name']} ({m['host_cpu']}), {m['model']['name']}, {m['dtype']}")
    for col in ("curve", "grid", "min (ms)", "max (ms)", "R²", "max rel. residual"):
        table.add_column(col, justify="left" if col in ("curve", "grid") else "right")
    for name, c in profile["curves"].items():
        vals = c["values_s"] if len(c["axes"]) == 1 else [v for row in c["values_s"] for v in row]
        grid = " x ".join(f"{a} {g[0]:g}-{g[-1]:g}" for a, g in zip(c["axes"], c["grid"]))
        table.add_row(name, grid, f"{min(vals) * 1e3:.4f}", f"{max(vals) * 1e3:.4f}", f"{c['r2']:.3f}",
                      f"{c['max_rel_residual']:.2f}")
    console.print(table)
    noisy = [name for name, c in profile["curves"].items() if name.startswith("forward") and c["r2"] < NOISY_FORWARD_R2]
    if noisy:
        console.print(f"[bold yellow]warning:[/] {', '.join(noisy)} fit poorly (R² < {NOISY_FORWARD_R2}): forward times "
                      "should grow smoothly, so the machine was probably busy. Re-measure on a quiet machine "
                      "(torch on CPU: try --threads 1) with --fresh.")
    console.print(f"profile written to {out}")
