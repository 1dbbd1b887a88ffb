"""``overlap-sim calibrate``: measure this device and write a calibration profile.

Also runnable on its own as ``python -m calibrate.cli ...`` on a machine that has torch or MLX
but not the simulator's dependencies (pydantic, SimPy, PyYAML).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from calibrate.errors import CalibrationInputError
from sim.commands import output_path

HELP = "time a real model and the scheduler's bookkeeping on this device; write a calibration profile"


def _int_list(text: str) -> list[int]:
    """``1,4,16`` as integers; an empty item (``1,,4``, a trailing comma) is an error, as in
    ``sweep --grid``, not skipped."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    return values


# calibration fields and the flags that set them (errors name the flag)
GRID_FLAGS = {"decode_batch_sizes": "--batch-sizes", "decode_contexts": "--contexts", "extend_tokens": "--extend-tokens",
              "extend_prefixes": "--prefixes", "bookkeeping_batch_sizes": "--bookkeeping-batch-sizes"}
MAX_GRID_VALUE = 10**7
MAX_SEED = 2**32 - 1  # torch's and numpy's seeds
MAX_SESSIONS = 100  # --sessions: server sessions per setting


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=["sglang", "vllm"], default=None,
                   help="time a real engine's own functions instead (SGLang 0.5.23's CPU engine in-process, or the "
                        "vLLM 0.32 CPU server, each in its own environment: realengines/<engine>/setup.sh); "
                        "the framework calibration's flags (--backend, --device, --dry-run, --quick, ...) are then "
                        "refused")
    p.add_argument("--engine-python", type=Path, default=None, metavar="PATH",
                   help="with --engine: the engine environment's python (default .venvs/<engine>/bin/python)")
    p.add_argument("--host-only", action="store_true",
                   help="with --engine: time the real engine's host phases with the model's forward stubbed "
                        "(SGLang's scheduler in-process, or the vLLM server under both settings; decode batches "
                        "1-256, contexts to 8k, prefills to 8k tokens; minutes on any host) and write a host-costs "
                        "file for overlap-sim compose")
    p.add_argument("--work", type=output_path, default=None, metavar="DIR",
                   help="with --engine: where the engine's runs are kept (resume); default results/calibrate-<engine>/")
    p.add_argument("--sessions", type=int, default=None, metavar="N",
                   help="with --engine: N runs per setting (vLLM: server sessions; SGLang: in-process runs), in an "
                        "alternating order (sync-0, async-0, async-1, sync-1, ...), every curve from all of "
                        "them; a larger N adds runs to the finished ones (default 1)")
    p.add_argument("--speculative", default=None, metavar="JSON",
                   help="with --engine vllm: after each session, one more with the server drafting "
                        "(--speculative-config of the object's method, model, num_speculative_tokens; its "
                        "draft_cost_ratio is the draft pass against the target's of the same shape, 1.0 when "
                        "model is \"MODEL\": the target drafting for itself), which times the speculative host "
                        "curves (the drafter's host work, the rejection sampler; docs/vllm.md)")
    p.add_argument("--structured-output", action="store_true",
                   help="after each session (vllm) or run (sglang), one more whose requests all carry a JSON "
                        "schema, which times the grammar curves (vllm: the engine core's bitmask, the worker's "
                        "mask, the grammar's accept, docs/vllm.md; sglang: the mask and the processing with "
                        "the accept, docs/model.md)")
    p.add_argument("--feature-client", choices=("own", "engine"), default=None,
                   help="with --speculative or --structured-output: the load generator of those sessions: own (this "
                        "project's client, token-id prompts; default) or engine (vLLM's own benchmark client, "
                        "text prompts): calibrate under the client the server will run with")
    p.add_argument("--feature-client-nice", type=int, default=None, metavar="N",
                   help="with --speculative or --structured-output: that load generator's niceness (-20..19; "
                        "below 0 needs root; default 0)")
    p.add_argument("--tensor-parallel-size", type=int, default=None, metavar="N",
                   help="serve with N tensor-parallel ranks, each bound to its own share of the cores (vllm: "
                        "--tensor-parallel-size N, a scenario's server.tensor_parallel_size; sglang: --tp-size N, the "
                        "calibration's waves through the server, rank 0's trace, a scenario's server.tp_size)")
    p.add_argument("--from-trace", type=Path, nargs="+", default=None, metavar="TRACE",
                   help="read the profile from an SGLang server's torch.profiler traces (/start_profile, .json or "
                        ".json.gz; several profile windows of one server merge) instead of timing anything "
                        "(docs/real-engines.md)")
    p.add_argument("--profile-server", default=None, metavar="URL",
                   help="profile your running SGLang server: send it a short designed load (batch sizes 1 to its "
                        "max_running_requests, short and long prompts) with a /start_profile window per stage, then "
                        "build the profile from those traces (as --from-trace; add --server-log). Run on the "
                        "server's machine")
    p.add_argument("--trace-dir", type=Path, default=None, metavar="DIR",
                   help="with --profile-server: the folder the server writes its traces to (default: next to --out)")
    p.add_argument("--num-steps", type=int, default=None, metavar="N",
                   help="with --profile-server: forwards per profile window (default 40)")
    p.add_argument("--max-batch", type=int, default=None, metavar="N",
                   help="with --profile-server: the largest stage (default: the server's max_running_requests)")
    p.add_argument("--server-log", type=Path, default=None, metavar="LOG",
                   help="with --from-trace: the server's log (--decode-log-interval 1): its 'Decode batch' lines "
                        "check the traces' step period, and those outside the profiled windows measure the "
                        "profiler's slowdown, which is divided out")
    p.add_argument("--trace-context", type=float, default=None, metavar="TOKENS",
                   help="with --from-trace, for a trace without token counts (no \"detailed_annotations\"): the "
                        "mean KV length per request of its decode steps")
    p.add_argument("--trace-prefix", type=float, default=None, metavar="TOKENS",
                   help="with --from-trace, for a trace without token counts: the mean cached prefix per request "
                        "of its prefills")
    p.add_argument("--backend", choices=["torch", "mlx"], default=None, help="framework to time (required without --engine)")
    p.add_argument("--device", choices=["cpu", "cuda", "gpu"], default=None,
                   help="torch: cpu or cuda; mlx: cpu or gpu (Metal) (required without --engine)")
    p.add_argument("--model", default="tiny", help="model shape: tiny, small, llama-3.2-1b, llama-3.2-3b, "
                   "llama-3.1-8b, qwen3-0.6b, qwen3-8b (default tiny)")
    for name in ("layers", "hidden", "heads", "kv-heads", "vocab", "intermediate", "head-dim"):
        p.add_argument(f"--{name}", type=int, default=None, metavar="N", help=f"override the shape's {name}")
    p.add_argument("--out", type=output_path, required=True,
                   help="profile file to write (JSON); the raw samples go to <out>.samples.jsonl while measuring "
                        "(a rerun resumes from it; removed once the profile is written)")
    p.add_argument("--quick", action="store_true", help="a 3x3 grid with few repeats (seconds on a CPU)")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None,
                   help="default: bfloat16 on cuda, float16 on Metal, float32 on CPUs")
    p.add_argument("--batch-sizes", type=_int_list, default=None, metavar="LIST", help="decode batch sizes, e.g. 1,4,16")
    p.add_argument("--contexts", type=_int_list, default=None, metavar="LIST", help="decode context lengths")
    p.add_argument("--extend-tokens", type=_int_list, default=None, metavar="LIST", help="prefill token counts")
    p.add_argument("--prefixes", type=_int_list, default=None, metavar="LIST", help="cached prefix lengths of prefills")
    p.add_argument("--bookkeeping-batch-sizes", type=_int_list, default=None, metavar="LIST",
                   help="batch sizes of the CPU bookkeeping")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per point")
    p.add_argument("--warmup", type=int, default=None, help="untimed runs per point")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-cuda-graph", action="store_true", help="run CUDA decode steps eagerly")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--note", default="", help="free text about the machine, stored in the profile")
    p.add_argument("--device-memory-gib", type=float, default=None, metavar="GIB",
                   help="size the grid to this much free device memory instead of what the device reports "
                        "(planning for another card; the grid is always cut to fit the memory)")
    p.add_argument("--card", default=None, metavar="CARD",
                   help="the card whose public specs price the duration estimate (overlap-sim transfer --list; "
                        "default: the CUDA device's name)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the sized grid and the duration estimate, measure nothing")
    p.add_argument("--fresh", action="store_true", help="discard samples of an interrupted run")
    p.add_argument("--quiet", action="store_true", help="no progress display")


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


# what only the framework calibration (--backend/--device) reads: with --engine they would be passed over
FRAMEWORK_ONLY = {"dry_run": False, "fresh": False, "backend": None, "device": None, "dtype": None, "threads": None,
                  "no_cuda_graph": False, "device_memory_gib": None, "warmup": None, "bookkeeping_batch_sizes": None,
                  "quick": False, "card": None, "model": "tiny", "seed": 0, "note": "", "layers": None, "hidden": None,
                  "heads": None, "kv_heads": None, "vocab": None, "intermediate": None, "head_dim": None}


def _refuse_framework_flags(args: argparse.Namespace) -> None:
    """With ``--engine``, a flag of the framework calibration (``FRAMEWORK_ONLY``) is refused: the
    engine's calibration would start without it (``--dry-run`` would run for real).

    Raises:
        CalibrationInputError: the first such flag given, by name.
    """
    for name, default in FRAMEWORK_ONLY.items():
        if getattr(args, name, default) != default:
            raise CalibrationInputError("--" + name.replace("_", "-"), "", f"not with --engine {args.engine} (only for "
                                        "the framework calibration with --backend/--device)")


def run(args: argparse.Namespace) -> int:
    """Run the calibration the arguments describe; print a summary. Returns 0."""
    from rich.console import Console

    from calibrate.measure import calibrate
    from sim.atomic import check_output_file

    if args.profile_server is not None:
        from calibrate.real.from_trace.profile import run_profile_server

        return run_profile_server(args)
    for flag in ("trace_dir", "num_steps", "max_batch"):
        if getattr(args, flag, None) is not None:
            raise CalibrationInputError("--" + flag.replace("_", "-"), "", "only with --profile-server")
    if args.from_trace is not None:
        from calibrate.real.from_trace.profile import run_from_trace

        return run_from_trace(args)
    for flag in ("server_log", "trace_context", "trace_prefix"):
        if getattr(args, flag, None) is not None:
            raise CalibrationInputError("--" + flag.replace("_", "-"), "", "only with --from-trace or --profile-server")
    if args.sessions is not None and not args.engine:
        raise CalibrationInputError("--sessions", "", "only with --engine")
    if args.sessions is not None and not 1 <= args.sessions <= MAX_SESSIONS:
        raise CalibrationInputError("--sessions", "", f"expected an integer from 1 to {MAX_SESSIONS} (got {args.sessions})")
    if args.speculative is not None and args.engine != "vllm":
        raise CalibrationInputError("--speculative", "", "only with --engine vllm")
    if args.structured_output and args.engine not in ("vllm", "sglang"):
        raise CalibrationInputError("--structured-output", "", "only with --engine vllm or --engine sglang")
    if args.structured_output and args.host_only and args.engine != "sglang":
        raise CalibrationInputError("--structured-output", "", "with --host-only only for --engine sglang (vLLM's "
                                    "grammar sessions time the real server)")
    if args.speculative is not None and args.host_only:
        raise CalibrationInputError("--speculative", "", "not with --host-only (the drafter's passes need the real "
                                    "forward)")
    if args.tensor_parallel_size is not None:
        if args.engine not in ("vllm", "sglang") or args.host_only:
            raise CalibrationInputError("--tensor-parallel-size", "", "only with --engine vllm or sglang (the real CPU "
                                        "server; not --host-only)")
        if args.tensor_parallel_size < 1:
            raise CalibrationInputError("--tensor-parallel-size", "", f"an integer >= 1 (got {args.tensor_parallel_size})")
        if args.engine == "sglang" and args.structured_output and args.tensor_parallel_size > 1:
            raise CalibrationInputError("--tensor-parallel-size", "", "not with --structured-output for sglang (its "
                                        "constrained runs are in-process, rank 0 alone)")
        from calibrate.real.environment import tp_bind

        tp_bind(args.tensor_parallel_size)  # refuses more ranks than cores
    for flag in ("feature_client", "feature_client_nice"):
        if getattr(args, flag, None) is not None and args.speculative is None and not args.structured_output:
            raise CalibrationInputError("--" + flag.replace("_", "-"), "", "only with --speculative or --structured-output")
    if args.feature_client_nice is not None:
        from calibrate.real.vllm.sessions import check_feature_client_nice

        check_feature_client_nice(args.feature_client_nice)
    if args.host_only and not args.engine:
        raise CalibrationInputError("--host-only", "", "only with --engine sglang or --engine vllm")
    if args.engine:
        _refuse_framework_flags(args)
    if args.host_only and args.engine == "vllm":
        from calibrate.host.vllm import run_host_calibration

        return run_host_calibration(args)
    if args.host_only:
        from calibrate.host.sglang import run_host_calibration

        return run_host_calibration(args)
    if args.engine:
        from calibrate.real.cli import run_calibrate

        return run_calibrate(args)
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


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (``python -m calibrate.cli``); bad input: one line, exit 2."""
    from sim.errors import UserInputError

    from sim.commands import OneLineParser, UsageError

    parser = OneLineParser(prog="calibrate", description=HELP)
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except UsageError as err:
        print(err, file=sys.stderr)
        return 2
    try:
        return run(args)
    except UserInputError as err:
        print(f"calibrate: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
