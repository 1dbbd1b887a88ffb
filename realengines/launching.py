"""What the engines' launchers share: the environment of a server whose processes load the
engine's shims (``sitecustomize``) and, when tracing, write ``OVERLAP_SIM_TRACE.<pid>.jsonl``."""

from __future__ import annotations

import os
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
