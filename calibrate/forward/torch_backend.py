"""Timing :class:`calibrate.forward.torch_model.TorchLlama` on a CPU or a CUDA GPU.

Per sample, one step as a serving loop runs it: build the batch's host arrays from the
requests (:class:`calibrate.bookkeeping.bookkeeper.Bookkeeper`), copy them to the device, launch the
forward (CUDA: replay the decode step's CUDA graph, as SGLang's ``CudaGraphRunner`` does;
extend and ``--no-cuda-graph`` decode run eagerly), sample (argmax) and read the tokens back.

- CUDA: the launch is CPU time (``perf_counter``) from the first array built to the last
  kernel queued; the forward is device time between two CUDA events around the step. The
  stream is first held by a short ``torch.cuda._sleep`` so the whole step is queued before the
  first event fires: the events then time the device alone, not the launch.
- CPU: the forward runs on the calling thread, so the launch is only building the inputs, and
  the forward is ``perf_counter`` time of the forward, argmax and ``tolist()``.
"""

from __future__ import annotations

import platform
import sys
import time
from typing import Callable

import numpy as np
import torch

from calibrate.bookkeeping.bookkeeper import StepInputs
from calibrate.config import SLEEP_CLOCK_HZ, SLEEP_MAX_CYCLES, SLEEP_MIN_CYCLES, CalibrationConfig
from calibrate.errors import CalibrationInputError
from calibrate.forward.torch_model import CudaGraphDecode, TorchLlama
from calibrate.shapes import ModelShape

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class TorchBackend:
    """Model creation and step timing with torch on ``cfg.device`` (``cpu`` or ``cuda``).

    Raises:
        CalibrationInputError: CUDA requested but not available.
    """

    name = "torch"

    def __init__(self, cfg: CalibrationConfig):
        self.cfg = cfg
        self.cuda = cfg.device == "cuda"
        if self.cuda and not torch.cuda.is_available():
            raise CalibrationInputError("--device", "", "cuda, but torch.cuda.is_available() is False on this "
                                        f"machine (torch {torch.__version__}); use --device cpu")
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.dtype = DTYPES[cfg.resolved_dtype]
        self.dev = torch.device(cfg.device)
        self.graphs = self.cuda and cfg.cuda_graph
        self.eager_points: list[str] = []  # decode points where capture failed
        self.outlived_hold: list[str] = []  # points whose launch outlived the stream hold (this process's)
        self.attention = "not run"

    def describe(self) -> dict:
        """Device name, library versions and how steps are run (for the profile's metadata)."""
        libs = {"torch": torch.__version__, "numpy": np.__version__}
        if self.cuda:
            libs["cuda"] = torch.version.cuda
            name = torch.cuda.get_device_name(self.dev)
        else:
            name = f"cpu ({torch.get_num_threads()} torch threads)"
        mode = "cuda_graph" if self.graphs else "eager"
        return {"device_name": name, "libraries": libs, "dtype": self.cfg.resolved_dtype,
                "decode_mode": mode, "extend_mode": "eager", "torch_threads": torch.get_num_threads(),
                "graph_capture_failures": self.eager_points, "attention": self.attention, "machine": platform.machine(),
                **({"launch_outlived_hold": self.outlived_hold} if self.cuda else {})}

    def create_model(self, shape: ModelShape) -> TorchLlama:
        model = TorchLlama(shape, self.cfg.device, self.dtype, seed=self.cfg.seed)
        self.attention = model.check_attention()
        return model

    def free_bytes(self) -> int | None:
        """Free device memory (CUDA), None on a CPU."""
        return torch.cuda.mem_get_info(self.dev)[0] if self.cuda else None

    def to_device(self, a: np.ndarray) -> torch.Tensor:
        """Host int64 array -> device tensor (pinned staging and an async copy on CUDA)."""
        t = torch.from_numpy(a)
        return t.pin_memory().to(self.dev, non_blocking=True) if self.cuda else t

    # --- one step ----------------------------------------------------------------------------------
    def _timed(self, make_inputs: Callable[[], StepInputs], launch: Callable[[StepInputs], torch.Tensor],
               n_out: int, sleep_cycles: int) -> tuple[float, float, list[int], bool]:
        """One step: (forward s, launch s, the tokens read back, whether the launch outlived the
        stream's hold: the step's start event already passed when it returned; never on a CPU)."""
        if not self.cuda:
            t0 = time.perf_counter()
            inp = make_inputs()
            t1 = time.perf_counter()
            tokens = launch(inp).tolist()
            t2 = time.perf_counter()
            return t2 - t1, t1 - t0, tokens, False
        host = torch.empty(n_out, dtype=torch.int64, pin_memory=True)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        torch.cuda._sleep(sleep_cycles)
        t0 = time.perf_counter()
        start.record()
        out = launch(make_inputs())
        host.copy_(out, non_blocking=True)
        end.record()
        t1 = time.perf_counter()
        outlived = start.query()  # the hold ended (the step began) before the launch did
        end.synchronize()
        tokens = host.tolist()
        return start.elapsed_time(end) / 1e3, t1 - t0, tokens, outlived

    def _repeat(self, make_inputs, launch, n_out, warmup, repeats, label="") -> tuple[list[float], list[float]]:
        """(forward, launch) samples of ``repeats`` steps after ``warmup``. On CUDA a launch that
        outlives the stream's hold (the step's start event already passed when the launch returns)
        is counted: the device then ran during the launch, and a launch that filled CUDA's queue of
        pending kernels waited for it (its time counts device time; docs/calibration.md). Points
        where any did are said on stderr and kept in :attr:`outlived_hold` (``label``: the point,
        in words, or a callable giving them once the point has run), for the profile's metadata
        (the points this process measured: a resumed calibration's earlier points are judged by
        ``overlap-sim compose`` from their times, :func:`calibrate.host.compose.launches_outliving_hold`)."""
        fwd, lau, outlived = [], [], 0
        cycles = SLEEP_MAX_CYCLES  # until this point's launch time is known
        for k in range(warmup + repeats):
            f, la, _, late = self._timed(make_inputs, launch, n_out, cycles)
            outlived += k >= warmup and late
            lau.append(la)
            fwd.append(f)
            # hold the stream ~4x the median launch so far (at a 2 GHz clock), within bounds: a
            # low idle clock only lengthens the hold, a slow outlier launch cannot blow it up
            est = sorted(lau)[len(lau) // 2]
            cycles = int(min(max(4 * est * SLEEP_CLOCK_HZ, SLEEP_MIN_CYCLES), SLEEP_MAX_CYCLES))
        if outlived:
            label = label() if callable(label) else label
            self.outlived_hold.append(f"{label}: {outlived} of {repeats}")
            print(f"the launch outlived the stream hold at {label} in {outlived} of {repeats} samples: it may count "
                  "time the CPU waited for the device (docs/calibration.md)", file=sys.stderr)
        return fwd[warmup:], lau[warmup:]

    def measure_decode(self, model: TorchLlama, make_inputs: Callable[[], StepInputs], batch_size: int, ctx: int,
                       warmup: int, repeats: int) -> tuple[list[float], list[float]]:
        """(forward seconds, launch seconds) samples of decode steps of ``batch_size`` requests
        attending over ``ctx`` keys each."""
        runner = None
        if self.graphs:
            try:
                runner = CudaGraphDecode(model, batch_size, ctx)
            except Exception as err:  # noqa: BLE001  this point runs eagerly, and the profile says so
                self.eager_points.append(f"{batch_size}x{ctx}: {type(err).__name__}: {err}"[:300])
                print(f"CUDA graph capture failed at batch {batch_size} x ctx {ctx}; timing it eagerly: "
                      f"{type(err).__name__}: {err}", file=sys.stderr)
                torch.cuda.synchronize()

        def launch(inp: StepInputs) -> torch.Tensor:
            args = [self.to_device(a) for a in (inp.input_ids, inp.slots, inp.positions, inp.out_cache_loc)]
            if runner is not None:
                return runner.launch(*args)
            return model.decode(*args, ctx)

        try:
            return self._repeat(make_inputs, launch, batch_size, warmup, repeats, f"decode {batch_size} x ctx {ctx}")
        finally:
            del runner

    def measure_extend(self, model: TorchLlama, make_inputs: Callable[[], StepInputs], warmup: int,
                       repeats: int) -> tuple[list[float], list[float]]:
        """(forward seconds, launch seconds) samples of one prefill batch (eager)."""

        seen = {}

        def launch(inp: StepInputs) -> torch.Tensor:
            seen["tokens"] = sum(inp.extend_lens)
            prefix = [self.to_device(a) for a in inp.prefix_indices] if inp.prefix_indices else None
            return model.extend(self.to_device(inp.input_ids), inp.slots.tolist(), inp.prefix_lens, inp.extend_lens,
                                self.to_device(inp.out_cache_loc), prefix)

        return self._repeat(make_inputs, launch, 1, warmup, repeats, lambda: f"extend {seen.get('tokens')} tokens")
