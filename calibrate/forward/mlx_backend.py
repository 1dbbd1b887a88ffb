"""Timing :class:`calibrate.forward.mlx_model.MlxLlama` with MLX on its CPU backend or on Metal.

Per sample, as SGLang's MLX loop runs a step: build the host arrays from the requests, wrap
them as ``mx.array`` and build the lazy forward graph and argmax (the launch: ``perf_counter``
CPU time); then submit it with ``mx.async_eval``, wait at an ``mx.eval`` barrier and read the
tokens with ``tolist()`` (the forward: from the submission to the tokens on the host).

The submission is counted in the forward because on MLX's CPU backend ``mx.async_eval`` itself
runs a large share of the computation before returning (measured here: 15 of 28 ms of a
256-token prefill of the ``tiny`` shape): it is device work, not launch overhead, although
the calling thread is blocked while it runs. How long it blocks is kept as its own curve
(``submit.*``): MLX dispatches the graph on the calling thread and waits while more than
``MAX_ACTIVE_TASKS`` (10) tasks of ``DISPATCHES_PER_TASK`` (10) ops are outstanding
(``mlx/transforms.cpp``, ``backend/cpu/encoder.h``), so the call returns only when the device is
within its last tasks; the simulator holds the host that long after each launch.
"""

from __future__ import annotations

import platform
import time
from typing import Callable

import mlx.core as mx
import numpy as np

from calibrate.bookkeeping.bookkeeper import StepInputs
from calibrate.config import CalibrationConfig
from calibrate.errors import CalibrationInputError
from calibrate.forward.mlx_model import MlxLlama
from calibrate.shapes import ModelShape

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def metal_available() -> bool:
    """Whether MLX can run on a Metal GPU here."""
    try:
        return bool(mx.metal.is_available())
    except AttributeError:
        return False


class MlxBackend:
    """Model creation and step timing with MLX on ``cfg.device`` (``cpu`` or ``gpu``).

    Raises:
        CalibrationInputError: ``gpu`` requested where Metal is not available.
    """

    name = "mlx"

    def __init__(self, cfg: CalibrationConfig):
        self.cfg = cfg
        if cfg.device == "gpu" and not metal_available():
            raise CalibrationInputError("--device", "", "gpu, but MLX has no Metal device on this machine; "
                                        "use --device cpu")
        mx.set_default_device(mx.gpu if cfg.device == "gpu" else mx.cpu)
        self.dtype = DTYPES[cfg.resolved_dtype]

    def describe(self) -> dict:
        import importlib.metadata as md

        name = "cpu (MLX CPU backend)"
        if self.cfg.device == "gpu":
            info = mx.metal.device_info() if hasattr(mx.metal, "device_info") else {}
            name = str(info.get("device_name", "Apple Metal GPU"))
        try:
            version = md.version("mlx")
        except md.PackageNotFoundError:
            version = getattr(mx, "__version__", "unknown")
        return {"device_name": name, "libraries": {"mlx": version, "numpy": np.__version__},
                "dtype": self.cfg.resolved_dtype, "decode_mode": "lazy graph + mx.async_eval",
                "extend_mode": "lazy graph + mx.async_eval", "machine": platform.machine()}

    def create_model(self, shape: ModelShape) -> MlxLlama:
        return MlxLlama(shape, self.dtype, seed=self.cfg.seed)

    def free_bytes(self) -> int | None:
        return None

    @staticmethod
    def to_device(a: np.ndarray) -> mx.array:
        return mx.array(a.astype(np.int32))

    def _repeat(self, make_inputs: Callable[[], StepInputs], build: Callable[[StepInputs], mx.array],
                warmup: int, repeats: int) -> tuple[list[float], list[float], list[float]]:
        fwd, lau, sub = [], [], []
        for k in range(warmup + repeats):
            t0 = time.perf_counter()
            out = build(make_inputs())
            t1 = time.perf_counter()
            mx.async_eval(out)
            ts = time.perf_counter()
            mx.eval(out)
            out.tolist()
            t2 = time.perf_counter()
            if k >= warmup:
                fwd.append(t2 - t1)
                lau.append(t1 - t0)
                sub.append(ts - t1)
        return fwd, lau, sub

    def measure_decode(self, model: MlxLlama, make_inputs, batch_size: int, ctx: int, warmup: int,
                       repeats: int) -> tuple[list[float], list[float], list[float]]:
        """(forward, launch, submit) seconds of decode steps (see module docstring); submit: how
        long ``mx.async_eval`` blocked the caller (part of the forward)."""

        def build(inp: StepInputs) -> mx.array:
            return model.decode(*[self.to_device(a) for a in (inp.input_ids, inp.slots, inp.positions,
                                                             inp.out_cache_loc)], ctx)

        return self._repeat(make_inputs, build, warmup, repeats)

    def measure_extend(self, model: MlxLlama, make_inputs, warmup: int,
                       repeats: int) -> tuple[list[float], list[float], list[float]]:
        """(forward, launch, submit) seconds of one prefill batch."""

        def build(inp: StepInputs) -> mx.array:
            prefix = [self.to_device(a) for a in inp.prefix_indices] if inp.prefix_indices else None
            return model.extend(self.to_device(inp.input_ids), inp.slots.tolist(), inp.prefix_lens, inp.extend_lens,
                                self.to_device(inp.out_cache_loc), prefix)

        return self._repeat(make_inputs, build, warmup, repeats)
