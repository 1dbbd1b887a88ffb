"""The command line and environment of a real SGLang 0.5.23 server on this machine's CPU.

``SGLANG_USE_CPU_ENGINE=1 --device cpu`` selects SGLang's CPU engine; ``torch_native``
attention and the ``pytorch`` sampler need no compiled kernels; ``OMP_NUM_THREADS=1`` and
``--sleep-on-idle`` keep the idle scheduler from spinning (without them it stalls the machine
for seconds); ``--skip-server-warmup`` because the load's warm-up requests do that. Setting
``normal`` adds ``--disable-overlap-schedule`` (``event_loop_normal``); ``overlap`` runs
``event_loop_overlap``, which on the CPU engine cannot hide anything: the forward runs inside
``run_batch`` on the scheduler's own thread.
"""

from __future__ import annotations

import sys
from pathlib import Path

from realengines.launching import server_environment

API = "sglang"
READY_PATH = "/model_info"
FLUSH_PATH = "/flush_cache"
SETTINGS = ("overlap", "normal")
SHIMS = Path(__file__).resolve().parent / "shims"

# the CPU engine's flags, shared with the in-process driver (realengines.sglang.drive)
ENGINE_ARGS = ["--load-format", "dummy", "--device", "cpu", "--attention-backend", "torch_native",
               "--sampling-backend", "pytorch", "--disable-cuda-graph", "--dtype", "float32",
               "--skip-server-warmup"]


def environment(trace_prefix: str | None = None) -> dict:
    """The process environment: shims on PYTHONPATH (every child process loads them), one OpenMP
    thread, no CUDA device; ``OVERLAP_SIM_TRACE`` when tracing."""
    return server_environment(SHIMS, trace_prefix,
                              {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})


def command(model_dir: str, setting: str, extra_args: list[str], port: int,
            trace_prefix: str | None) -> tuple[list[str], dict]:
    """(argv, environment) of a server for ``setting`` (``overlap`` or ``normal``)."""
    if setting not in SETTINGS:
        raise ValueError(f"setting {setting!r}: expected one of {SETTINGS}")
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_dir, *ENGINE_ARGS, "--sleep-on-idle",
            "--host", "127.0.0.1", "--port", str(port), *extra_args]
    if setting == "normal":
        argv.append("--disable-overlap-schedule")
    return argv, environment(trace_prefix)


def versions() -> dict:
    import sglang
    import torch

    return {"sglang": sglang.__version__, "torch": torch.__version__, "python": sys.version.split()[0]}
