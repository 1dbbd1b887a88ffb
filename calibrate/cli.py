"""``overlap-sim calibrate``: measure this device and write a calibration profile.

Also runnable on its own as ``python -m calibrate.cli ...`` on a machine that has torch (or MLX),
numpy, tokenizers and rich but not the simulator's own dependencies (pydantic, SimPy, PyYAML,
ddsketch, pandas, matplotlib, SciPy, pyarrow, packaging): the framework calibration
(``--backend``/``--device``, ``--dry-run``) imports only sim's light modules (``sim/__init__.py``
passes over the simulator's API where those are missing; ``tests/test_calibrate_run.py`` runs it
with them blocked). ``--engine``, ``--from-trace`` and ``--profile-server`` need them all.
"""

from __future__ import annotations

import argparse
import sys
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


# what only the framework calibration (--backend/--device) reads: with --engine they would be passed over
FRAMEWORK_ONLY = ("dry_run", "fresh", "backend", "device", "dtype", "threads", "no_cuda_graph", "device_memory_gib",
                  "warmup", "bookkeeping_batch_sizes", "quick", "card", "model", "seed", "note", "layers", "hidden",
                  "heads", "kv_heads", "vocab", "intermediate", "head_dim")


def _refuse_framework_flags(args: argparse.Namespace) -> None:
    """With ``--engine``, a flag of the framework calibration (``FRAMEWORK_ONLY``) given another
    value than its default (:func:`add_arguments`') is refused: the engine's calibration would
    start without it (``--dry-run`` would run for real).

    Raises:
        CalibrationInputError: the first such flag given, by name.
    """
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for name in FRAMEWORK_ONLY:
        if getattr(args, name, None) != parser.get_default(name):
            raise CalibrationInputError("--" + name.replace("_", "-"), "", f"not with --engine {args.engine} (only for "
                                        "the framework calibration with --backend/--device)")


def run(args: argparse.Namespace) -> int:
    """Run the calibration the arguments describe: a real engine's (``--engine``, ``--host-only``),
    from a server's trace, or the framework's (:mod:`calibrate.framework`). Returns 0."""
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
    from calibrate.framework import run_framework

    return run_framework(args)


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
