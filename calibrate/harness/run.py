"""Run the harness: one configuration under one schedule, recorded in the simulator's trace schema.

    >>> res = run_harness(HarnessConfig("demo"), "overlap")
    >>> res.summary()["output_throughput"]

The torch and MLX frameworks are imported here only when their backend runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pandas as pd

from calibrate.bookkeeping.requests import build_tokenizer
from calibrate.errors import CalibrationInputError
from calibrate.harness.config import HarnessConfig
from calibrate.harness.loops import LOOPS
from calibrate.harness.serving import Serving
from calibrate.harness.workload import build_workload


@dataclass
class HarnessResult:
    """A measured run: trace tables with :mod:`sim.trace.recorder`'s columns (seconds from the start)."""

    config: HarnessConfig
    setting: str
    steps: pd.DataFrame
    requests: pd.DataFrame
    itl: pd.DataFrame
    info: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """:func:`sim.trace.metrics.summarize` of the measured trace (the simulator's keys)."""
        from sim.trace.metrics import summarize

        return summarize(self.steps, self.requests, self.itl)

    def phase_means_ms(self) -> dict:
        """Mean measured duration (ms) of each CPU phase and forward, per batch kind."""
        s = self.steps
        out = {}
        spans = {"recv": ("recv_start", "schedule_start"), "schedule": ("schedule_start", "schedule_end"),
                 "launch": ("launch_start", "launch_end"), "forward": ("forward_start", "forward_end"),
                 "process": ("process_start", "process_end")}
        for kind in ("extend", "decode"):
            sub = s[s["kind"] == kind]
            for name, (a, b) in spans.items():
                out[f"{name}.{kind}"] = float((sub[b] - sub[a]).mean() * 1e3) if len(sub) else float("nan")
        return out


def _cores() -> tuple[int | None, int | None]:
    """(scheduler core, device core): the first two CPUs this process may use, if there are two."""
    if not hasattr(os, "sched_getaffinity"):
        return None, None
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[0], cpus[1]) if len(cpus) >= 2 else (None, None)


def run_harness(cfg: HarnessConfig, setting: str, tokenizer=None) -> HarnessResult:
    """Serve ``cfg``'s requests under ``setting`` for real and record the timeline.

    Raises:
        CalibrationInputError: a setting this backend does not run, a missing framework or device.
    """
    if setting not in cfg.settings:
        raise CalibrationInputError("harness", "setting", f"one of {', '.join(cfg.settings)} for {cfg.backend} "
                                    f"(got {setting!r})")
    tokenizer = tokenizer or build_tokenizer(cfg.tokenizer_vocab)
    workload = build_workload(cfg, tokenizer)
    serving = Serving(cfg, workload, tokenizer, exclude_finishing=setting in ("overlap", "thread_overlap"))
    info: dict = {}
    if cfg.backend == "torch" and cfg.device == "cpu":
        if setting == "thread_overlap":
            from calibrate.harness.thread_loop import ThreadWorker

            sched_core, dev_core = _cores()
            with ThreadWorker(_device_spec(cfg, serving, workload, dev_core), scheduler_core=sched_core) as worker:
                serving.start()
                LOOPS["overlap"](serving, worker)
        else:
            from calibrate.harness.torch_device import ProcessDevice

            sched_core, dev_core = _cores()
            with ProcessDevice(_device_spec(cfg, serving, workload, dev_core), sched_core) as dev:
                serving.start()
                LOOPS[setting](serving, dev)
                dev.finish()
    elif cfg.backend == "torch":
        from calibrate.harness.cuda_device import CudaDevice

        dev = CudaDevice(_device_spec(cfg, serving, workload, None))
        serving.start()
        dev.set_origin()
        LOOPS[setting](serving, dev)
        dev.finish()
    else:
        from calibrate.harness.mlx_device import MlxDevice

        dev = MlxDevice(cfg, _device_spec(cfg, serving, workload, None))
        serving.start()
        LOOPS[setting](serving, dev)
        info = dev.finish()
    serving.finish_steps()
    steps, requests, itl = serving.recorder.frames(serving.clients.arrival, workload)
    return HarnessResult(cfg, setting, steps, requests, itl, info)


def _device_spec(cfg: HarnessConfig, serving: Serving, workload, core):
    from calibrate.harness.torch_device import DeviceSpec

    per_req = int(workload.input_len.max() - workload.cached_len.min())
    decode_ctx = int(workload.input_len.max() + workload.output_len.max())
    return DeviceSpec(cfg.shape, cfg.seed, cfg.torch_threads, serving.max_reqs, serving.max_ctx,
                      cfg.kv_pool_tokens(), workload.eos_at, workload.eos_id, list(workload.system_prompt),
                      serving.system_slots, ((1, 64), (cfg.concurrency, decode_ctx)),
                      (per_req, min(cfg.chunked_prefill_size, per_req * cfg.concurrency)), core)
