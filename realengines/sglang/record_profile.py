"""Record a torch.profiler trace of a real SGLang 0.5.23 server under load, the way a user would
record their own server's (``/start_profile``), for ``overlap-sim calibrate --from-trace``.

    python -m realengines.sglang.record_profile OUT_DIR [--setting normal|overlap] [--num-steps 24] ...

(run from the project's environment, it runs itself again in the SGLang environment's python,
``$OVERLAP_SIM_SGLANG_PYTHON`` or ``.venvs/sglang/bin/python``, with the import shims)

Starts the server (:mod:`realengines.sglang.launch`, this machine's CPU engine, with
``--decode-log-interval 1`` so the log has one ``Decode batch`` line per step), POSTs
``/start_profile`` while idle, then runs a closed-loop streaming load (:mod:`realengines.client`);
the scheduler stops profiling by itself after ``num_steps`` forwards. OUT_DIR receives
``server.log``, ``load.json`` (the client's records), ``record.json`` (the request sent and the
command) and the scheduler's trace in ``OUT_DIR/profile/<profile_id>-TP-0.trace.json.gz``.

What SGLang 0.5.23 does with the request (read in its source): the HTTP handler
``start_profile_async`` (``srt/entrypoints/http_server.py``) passes a ``ProfileReq``
(``srt/managers/io_struct.py``) to ``TokenizerManager.start_profile``
(``srt/managers/tokenizer_control_mixin.py``), which turns ``with_stack`` and ``record_shapes`` on
unless they are ``false`` (or ``SGLANG_PROFILE_WITH_STACK`` / ``SGLANG_PROFILE_RECORD_SHAPES`` are
false). The scheduler's ``SchedulerProfilerManager`` (``srt/managers/scheduler_components/
profiler_manager.py``) starts ``torch.profiler.profile(activities=...)`` at once (no
``torch.profiler.schedule``: the trace has no ``ProfilerStep#N`` markers), stops it when
``forward_ct`` reaches start + ``num_steps`` + 1, and exports
``<output_dir>/<profile_id>-TP-<rank>.trace.json.gz``. ``detailed_annotations: true`` makes every
``ModelRunner.forward`` span (``profile_range(build_step_span_name(...))``,
``srt/model_executor/model_runner.py``, ``srt/utils/profile_utils.py``) carry the batch's
token aggregates: ``step[DECODE bs=4 g_sq=4 g_sqsq=4 g_sqsk=.. g_sk=.. forward_id=..]``,
``step[EXTEND bs=4 toks=512 c_sq=512 c_sqsq=.. c_sqsk=.. c_sk=.. forward_id=..]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

from realengines.launching import REPO


def _requests(n: int, input_len: int, output_len: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"rid": f"p{i}", "input_ids": [rng.randrange(10, 1000) for _ in range(input_len)],
             "max_new_tokens": output_len, "ignore_eos": True} for i in range(n)]


async def _post(url: str, body: dict | None) -> str:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=body) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"{url}: HTTP {resp.status}: {text[:200]}")
            return text


async def _record(base: str, profile_req: dict, load: dict) -> dict:
    from realengines.client import run_load

    await _post(base + "/start_profile", profile_req)
    return await run_load(load)


# the Python functions calibrate.real.from_trace.torch_trace reads (file suffix, function)
KEEP_FUNCS = {("sglang/srt/managers/scheduler.py", f) for f in (
    "ingest_requests", "get_next_batch_to_run", "run_batch", "process_batch_result", "handle_generate_request",
    "event_loop_normal", "event_loop_overlap")} | {("sglang/srt/model_executor/model_runner.py", "sample")}


def trim(src: Path, dst: Path) -> dict:
    """Write a small copy of a scheduler trace for tests: every event except the Python function
    events that the importer does not read (:data:`KEEP_FUNCS`) and the CPU ops (``cpu_op``,
    inside the step spans: their sum is not used). Returns ``{"events_in", "events_out"}``."""
    import gzip
    import re

    pattern = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<func>[\w<>]+)$")
    data = json.loads(gzip.decompress(src.read_bytes()) if src.suffix == ".gz" else src.read_bytes())
    events = data["traceEvents"]

    def keep(e: dict) -> bool:
        if e.get("cat") == "cpu_op":
            return False
        if e.get("cat") != "python_function":
            return True
        m = pattern.match(e.get("name", ""))
        return bool(m) and any(m.group("file").endswith(f) and m.group("func") == fn for f, fn in KEEP_FUNCS)

    data["traceEvents"] = [e for e in events if keep(e)]
    text = json.dumps(data, separators=(",", ":")).encode()
    dst.write_bytes(gzip.compress(text, mtime=0) if dst.suffix == ".gz" else text)
    return {"events_in": len(events), "events_out": len(data["traceEvents"])}


def _in_sglang_environment(argv: list[str], module: str = "realengines.sglang.record_profile") -> None:
    """Run this module again with the SGLang environment's python when this one cannot import
    SGLang (``$OVERLAP_SIM_SGLANG_PYTHON``, else ``.venvs/sglang/bin/python``), with its import
    shims on PYTHONPATH; returns only when SGLang imports here."""
    import os

    try:
        import sglang  # noqa: F401
        return
    except Exception:
        pass
    python = os.environ.get("OVERLAP_SIM_SGLANG_PYTHON") or str(REPO / ".venvs" / "sglang" / "bin" / "python")
    if not Path(python).exists() or Path(sys.prefix).resolve() == Path(python).parent.parent.resolve():
        sys.exit(f"{module}: SGLang does not import here and there is no SGLang environment at {python} "
                 "(realengines/sglang/setup.sh)")
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parent / "shims"), str(REPO)]))
    os.execve(python, [python, "-m", module, *argv], env)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--trim" not in argv:
        _in_sglang_environment(argv)
    from realengines.server import stop, wait_ready
    from realengines.sglang import launch

    p = argparse.ArgumentParser(prog="record_profile", description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, nargs="?", help="the folder to write into (required unless --trim)")
    p.add_argument("--setting", choices=launch.SETTINGS, default="normal")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--num-steps", type=int, default=24, help="forwards to profile (SGLang stops by itself)")
    p.add_argument("--no-stack", action="store_true", help="with_stack false (no Python function events)")
    p.add_argument("--port", type=int, default=30123)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trim", nargs=2, type=Path, metavar=("TRACE", "OUT"),
                   help="only write a trimmed copy of TRACE to OUT (see trim()); no server")
    args = p.parse_args(argv)
    if args.trim:
        print(json.dumps(trim(*args.trim)))
        return 0
    if args.out is None:
        p.error("OUT is required")

    out = args.out.resolve()
    prof_dir = out / "profile"
    prof_dir.mkdir(parents=True, exist_ok=True)
    model = REPO / ".venvs" / "models" / "tiny-llama"
    server_args = ["--decode-log-interval", "1", "--log-level", "info", "--context-length", "2048",
                   "--max-running-requests", "16", "--mem-fraction-static", "0.05"]
    cmd, env = launch.command(str(model), args.setting, server_args, args.port, None)
    env["SGLANG_TORCH_PROFILER_DIR"] = str(prof_dir)
    profile_req = {"output_dir": str(prof_dir), "num_steps": args.num_steps, "activities": ["CPU"],
                   "with_stack": not args.no_stack, "record_shapes": False, "detailed_annotations": True,
                   "profile_id": "overlap-sim"}
    load = {"url": f"http://127.0.0.1:{args.port}", "api": "sglang", "concurrency": args.concurrency,
            "warmup_requests": 0, "requests": _requests(args.requests, args.input_len, args.output_len, args.seed)}
    import subprocess

    log = out / "server.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ready_s = wait_ready(proc, f"http://127.0.0.1:{args.port}{launch.READY_PATH}", 600, log)
        result = asyncio.run(_record(f"http://127.0.0.1:{args.port}", profile_req, load))
        trace = prof_dir / "overlap-sim-TP-0.trace.json.gz"
        deadline = time.monotonic() + 120
        while not trace.exists() and time.monotonic() < deadline:
            time.sleep(1.0)
    finally:
        stop(proc)
    (out / "load.json").write_text(json.dumps(result))
    record = {"command": cmd, "server_args": server_args, "profile_request": profile_req, "ready_s": ready_s,
              "load": {k: v for k, v in load.items() if k != "requests"}, "num_requests": args.requests,
              "input_len": args.input_len, "output_len": args.output_len, "versions": launch.versions(),
              "trace": str(trace) if trace.exists() else None}
    (out / "record.json").write_text(json.dumps(record, indent=1))
    if not trace.exists():
        print(f"no trace was written to {prof_dir}; see {log}", file=sys.stderr)
        return 1
    print(trace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
