"""What the engines' launchers share: the environment of a server whose processes load the
engine's shims (``sitecustomize``) and, when tracing, write ``OVERLAP_SIM_TRACE.<pid>.jsonl``;
running an engine's own benchmark client with its output in a log."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def server_environment(shims: Path, trace_prefix: str | None, settings: dict[str, str]) -> dict:
    """This process's environment with ``shims`` and the repository first on PYTHONPATH (every
    child process loads them), ``settings`` applied, and ``OVERLAP_SIM_TRACE`` set to
    ``trace_prefix`` (or removed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(shims), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(settings)
    env.pop("OVERLAP_SIM_TRACE", None)
    if trace_prefix:
        env["OVERLAP_SIM_TRACE"] = trace_prefix
    return env


def run_benchmark(argv: list[str], out_file: Path, log: Path, what: str, env: dict | None = None) -> None:
    """Run an engine's benchmark client (``argv``), stdout and stderr to ``log``.

    Raises:
        RuntimeError: it exited non-zero or wrote no ``out_file`` (the message quotes the end of
            ``log``, prefixed by ``what``).
    """
    with open(log, "w") as f:
        proc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0 or not out_file.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-10:])
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{tail}")
