"""Calibration of the ``thread_overlap`` harness's forward thread: each step timed the way that
harness runs it, one step at a time, on a forward thread pinned to the device core and fed
through a queue by the calibrating thread (pinned to the scheduler core), which then blocks
on the result queue, as the scheduler does.

Same measurements as :class:`calibrate.harness.process_backend.ProcessTorchBackend` (decode
steps in serving order, prefills after decodes); only the transport differs: no process, no
pipe, a queue hand-over. Timed on the calling thread with no hand-over at all (the stock
:class:`calibrate.forward.torch_backend.TorchBackend`), the forward was 5-13% faster than the forward
thread ran it in the harness.
"""

from __future__ import annotations

import os
import platform
import queue
import threading

import numpy as np

from calibrate.harness.process_backend import ProcessTorchBackend, RemoteModel
from calibrate.harness.torch_device import DeviceSpec, ForwardRunner
from calibrate.harness.trace import clock
from calibrate.shapes import ModelShape


class ThreadDevice:
    """A :class:`ForwardRunner` on its own (pinned) thread, driven through queues."""

    def __init__(self, spec: DeviceSpec, scheduler_core: int | None):
        self.runner = ForwardRunner(spec)
        self.inq: queue.Queue = queue.Queue()
        self.outq: queue.Queue = queue.Queue()
        self._old = None
        if scheduler_core is not None and hasattr(os, "sched_setaffinity"):
            self._old = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {scheduler_core})
        self.thread = threading.Thread(target=self._run, name="calibration-forward-thread", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        if self.runner.spec.core is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {self.runner.spec.core})
        while True:
            msg = self.inq.get()
            if msg is None:
                return
            t0 = clock()
            try:
                self.runner.run(msg)
                self.outq.put((t0, clock(), None))
            except Exception as err:  # noqa: BLE001  reported to the calibrating thread
                self.outq.put((t0, clock(), err))

    def control(self, msg: tuple) -> None:
        """KV allocation and token-map rows (the forward thread is idle between steps)."""
        if msg[0] == "kv":
            self.runner.reallocate(*msg[1:])
        else:
            for slot, start, idx in msg[1]:
                self.runner.model.set_req_to_token(slot, start, idx)

    def step(self, msg: tuple) -> tuple[float, float]:
        self.inq.put(msg)
        t0, t1, err = self.outq.get()
        if err is not None:
            raise err
        return t0, t1

    def close(self) -> None:
        self.inq.put(None)
        self.thread.join(10)
        if self._old is not None:
            os.sched_setaffinity(0, self._old)


class ThreadTorchBackend(ProcessTorchBackend):
    """Times steps on a forward thread (see the module docstring)."""

    def describe(self) -> dict:
        import torch

        return {"device_name": f"cpu (harness forward thread, {self.cfg.threads or 1} torch thread(s))",
                "libraries": {"torch": torch.__version__, "numpy": np.__version__}, "dtype": "float32",
                "decode_mode": "eager", "extend_mode": "eager", "torch_threads": self.cfg.threads or 1,
                "machine": platform.machine(),
                "timing": "forward: the forward thread's stamps from taking the step off its queue to the tokens "
                          "read; launch: inputs + the queue put"}

    def create_model(self, shape: ModelShape) -> RemoteModel:
        spec = DeviceSpec.for_calibration(shape, self.cfg.seed, self.cfg.threads or 1, self.eos_id, self.cores[1])
        self.close()
        self.device = ThreadDevice(spec, self.cores[0])
        return RemoteModel(self.device)

    def _step(self, message) -> tuple[float, float, float]:
        self._seq += 1
        t0 = clock()
        msg = message(self._seq)
        self.device.inq.put(msg)
        t1 = clock()
        f0, f1, err = self.device.outq.get()
        if err is not None:
            raise err
        return t1 - t0, f1 - f0, 0.0
