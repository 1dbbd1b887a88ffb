"""Start a real server, wait until it answers, run loads against it, stop it: one session.

    python -m realengines.server SESSION.json OUT_DIR

SESSION (JSON)::

    {"engine": "sglang" | "vllm", "model_dir": str, "setting": str, "server_args": [extra flags],
     "port": int, "trace": bool, "ready_timeout_s": float, "env": {name: value} (optional: set in
     the server's environment over the engine's own, e.g. the vLLM host calibration's stub),
     "loads": [{"name": str, "concurrency": int, "warmup_requests": int, "requests": [...]}]}

A load with ``"client": "engine"`` is run by the engine's own benchmark client instead
(``realengines.<engine>.bench``: vLLM's ``vllm bench serve``, SGLang's
``sglang.benchmark.serving``), its results turned into the same records.

``client_nice`` (optional, an integer): once the server has started, this process (the load
generator, and the engine's benchmark client it starts) runs that much nicer (-10: ten steps
more favoured, which needs root): a CPU server that busy-waits on every core of a small host
otherwise starves a client on the same host, whose late sends and late reads then show as the
server's latency (a client on its own machine, as in a real deployment, has no such share).
The client is left free to run on any core (vLLM pins only its worker): kept off the worker's core
as well, a favoured client took so much from the engine core and the API server on the one core
left that async scheduling's measured throughput fell by up to 40% (c2, 256 in / 64 out: 379
against 647 tok/s unpinned, 4 December 2026); the measurement is documented in
docs/real-engines.md.

``setting`` is the engine's loop (SGLang: ``overlap`` or ``normal``; vLLM: ``async`` or
``sync``); the engine module (:mod:`realengines.sglang.launch`, :mod:`realengines.vllm.launch`)
turns it into a command line and environment. With ``trace``, the engine's phase tracer writes
``OUT_DIR/trace.<pid>.jsonl``. Each load runs through :mod:`realengines.client` in this process,
one after another, the engine's prefix cache flushed after each; OUT_DIR receives ``<name>.json`` per load (the client's records and its
window, and ``host_use``: each server process's and the session process's share of a core run
and waited for during the load, :mod:`realengines.procstat`), ``server.log`` and ``session.json`` (versions, command, when the server was ready and
stopped). The server runs in its own process group and is stopped with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


class ServerFailed(RuntimeError):
    """The server exited or did not answer in time (the message quotes the end of its log)."""


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_ready(proc: subprocess.Popen, url: str, timeout_s: float, log: Path) -> float:
    """Poll ``url`` until it answers 200; returns the seconds it took.

    Raises:
        ServerFailed: the process exited, or ``timeout_s`` passed.
    """
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise ServerFailed(f"the server exited with status {proc.returncode}:\n{_log_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(1.0)
    raise ServerFailed(f"the server did not answer {url} within {timeout_s:.0f} s:\n{_log_tail(log)}")


def stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM the server's process group, SIGKILL what is left after ``grace_s``."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def flush(url: str) -> None:
    """POST to the engine's cache-flush endpoint (best effort: a failure leaves the cache warm)."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=30).close()
    except OSError:
        pass


def run_session(session: dict, out_dir: Path) -> dict:
    from realengines import procstat
    from realengines.client import run_load

    engine = importlib.import_module(f"realengines.{session['engine']}.launch")
    out_dir.mkdir(parents=True, exist_ok=True)
    port = int(session.get("port", 30000))
    trace_prefix = str(out_dir / "trace") if session.get("trace") else None
    cmd, env = engine.command(session["model_dir"], session["setting"], list(session.get("server_args", [])),
                              port, trace_prefix)
    env.update({str(k): str(v) for k, v in (session.get("env") or {}).items()})
    log = out_dir / "server.log"
    meta = {"engine": session["engine"], "setting": session["setting"], "command": cmd,
            "versions": engine.versions(), "loads": []}
    with open(log, "w") as log_file:
        proc = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if nice := int(session.get("client_nice", 0)):  # after the server started: only the load generator
            os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) + nice)
            meta["client_nice"] = nice
        meta["ready_s"] = wait_ready(proc, f"http://127.0.0.1:{port}{engine.READY_PATH}",
                                     float(session.get("ready_timeout_s", 600)), log)
        url = f"http://127.0.0.1:{port}"
        for load in session["loads"]:
            pids = procstat.process_tree(proc.pid) + [os.getpid()]
            before, wall0 = procstat.snapshot(pids), time.perf_counter()
            if load.get("client") == "engine":
                bench = importlib.import_module(f"realengines.{session['engine']}.bench")
                result = bench.run(load, url, session["model_dir"], out_dir, getattr(engine, "SERVED_MODEL_NAME", "default"))
            else:
                result = asyncio.run(run_load({**load, "url": url, "api": engine.API}))
            result["name"] = load["name"]
            result["host_use"] = procstat.usage(before, procstat.snapshot(pids), time.perf_counter() - wall0)
            tmp = out_dir / f"{load['name']}.json.tmp"
            tmp.write_text(json.dumps(result))
            tmp.replace(out_dir / f"{load['name']}.json")
            meta["loads"].append({"name": load["name"], "start_s": result["start_s"], "end_s": result["end_s"]})
            time.sleep(float(session.get("pause_between_loads_s", 2.0)))  # idle: the tracer flushes
            flush(url + engine.FLUSH_PATH)  # the next load starts with an empty prefix cache
    finally:
        stop(proc)
    meta["exit_status"] = proc.returncode
    (out_dir / "session.json").write_text(json.dumps(meta, indent=1))
    return meta


def _exit_on_sigterm(signum, frame):
    raise SystemExit(f"stopped by signal {signum}")  # run_session's finally stops the server


def main(argv: list[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        sys.exit("usage: python -m realengines.server SESSION.json OUT_DIR")
    with open(argv[0]) as f:
        session = json.load(f)
    try:
        run_session(session, Path(argv[1]))
    except ServerFailed as err:
        sys.exit(f"server failed: {err}")


if __name__ == "__main__":
    main()
