"""Calibration of the harness's torch device process: each step timed the way the harness runs
it, one step at a time (isolated), through the same process and pipe.

The simulator is then fed with what this device costs: ``launch`` = building the batch's host
arrays, pickling and sending the launch message (scheduler CPU time); ``forward`` = the device
process's own stamps, from reading the message to the tokens ready to send back (unpickling,
token buffer, forward, sampling, reading the tokens); ``metadata.sync_latency_s`` = the median
time from there until the scheduler has read the tokens (the pipe back; the simulator's
``costs.gpu.sync_latency``). Used by ``overlap-sim validate`` in place
of :class:`calibrate.torch_backend.TorchBackend` (which times the forward on the calling thread,
as the ``thread_overlap`` harness runs it).
"""

from __future__ import annotations

import pickle
import platform

import numpy as np

from calibrate.config import CalibrationConfig
from calibrate.harness.torch_device import DeviceSpec, ProcessDevice, decode_message, extend_message
from calibrate.harness.trace import clock
from calibrate.shapes import ModelShape


class RemoteModel:
    """What :class:`calibrate.measure.Measurer` needs of a model, forwarded to the device process."""

    def __init__(self, device: ProcessDevice):
        self.device = device
        self.max_ctx = 0

    def allocate_kv(self, max_slots: int, max_ctx: int, pool_tokens: int | None = None) -> None:
        self.device.control(("kv", max_slots, max_ctx, pool_tokens or max_slots * max_ctx))
        self.max_ctx = max_ctx

    def set_req_to_token(self, slot: int, start: int, indices) -> None:
        self.device.control(("rows", [(slot, start, np.asarray(indices, dtype=np.int64))]))


class ProcessTorchBackend:
    """Times steps through a harness device process (torch on the CPU, ``cfg.threads`` threads).

    Args:
        cfg: the calibration. cores: (scheduler core, device core), as the harness pins them.
        eos_id: the tokenizer's EOS id (the device's EOS script never fires here).
    """

    name = "torch"

    def __init__(self, cfg: CalibrationConfig, cores: tuple[int | None, int | None] = (None, None), eos_id: int = 0):
        self.cfg = cfg
        self.cores = cores
        self.eos_id = eos_id
        self.device: ProcessDevice | None = None
        self._seq = 0
        self.latencies: list[float] = []

    def describe(self) -> dict:
        import torch

        return {"device_name": f"cpu (harness device process, {self.cfg.threads or 1} torch thread(s))",
                "libraries": {"torch": torch.__version__, "numpy": np.__version__}, "dtype": "float32",
                "decode_mode": "eager", "extend_mode": "eager", "torch_threads": self.cfg.threads or 1,
                "machine": platform.machine(), "sync_latency_s": self.sync_latency_s(),
                "timing": "forward: the harness device process's stamps from reading the launch message to the "
                          "tokens ready to send; launch: inputs + pickling + sending the message; sync_latency_s: "
                          "from the tokens ready on the device to read by the host (median)"}

    def create_model(self, shape: ModelShape) -> RemoteModel:
        spec = DeviceSpec(shape, self.cfg.seed, self.cfg.threads or 1, max_slots=1, max_ctx=16, pool_tokens=16,
                          eos_at=np.zeros(0, dtype=np.int64), eos_id=self.eos_id, system_prompt=[],
                          system_slots=np.zeros(0, dtype=np.int64), warmup_decode=(), warmup_extend=(),
                          core=self.cores[1])
        self.close()
        self.device = ProcessDevice(spec, self.cores[0])
        return RemoteModel(self.device)

    @staticmethod
    def free_bytes() -> None:
        return None

    def _step(self, message) -> tuple[float, float, float]:
        """Send one launch message, wait for its tokens as the harness does (polling); returns
        (launch seconds: pickling and sending, device seconds, sync latency seconds)."""
        dev = self.device
        self._seq += 1
        t0 = clock()
        dev.conn.send_bytes(pickle.dumps(message(self._seq)))
        t1 = clock()
        while not dev.conn.poll(0):
            pass
        _seq, _toks, f0, f1 = pickle.loads(dev.conn.recv_bytes())
        self.latencies.append(clock() - f1)
        return t1 - t0, f1 - f0, clock() - f1

    def _measure(self, make_inputs, message, warmup: int, repeats: int) -> tuple[list[float], list[float]]:
        fwd, lau = [], []
        for k in range(warmup + repeats):
            t0 = clock()
            inp = make_inputs()
            t1 = clock()
            send, device, _lat = self._step(lambda seq: message(seq, inp))
            if k >= warmup:
                fwd.append(device)
                lau.append(send + t1 - t0)
        return fwd, lau

    def measure_decode(self, model, make_inputs, batch_size: int, ctx: int, warmup: int,
                       repeats: int) -> tuple[list[float], list[float]]:
        """(forward, launch) seconds of decode steps; the launch includes building the inputs."""
        return self._measure(make_inputs, lambda seq, inp: decode_message(seq, inp, False), warmup, repeats)

    def measure_extend(self, model, make_inputs, warmup: int, repeats: int) -> tuple[list[float], list[float]]:
        """(forward, launch) seconds of one prefill batch."""
        return self._measure(make_inputs, lambda seq, inp: extend_message(seq, inp, None, []), warmup, repeats)

    def sync_latency_s(self) -> float:
        """Median time from a step's end on the device to its tokens read by the host (the
        latencies seen by every step measured so far, or 40 one-request decodes if none were)."""
        if not self.latencies:
            model = self.create_model(self.cfg.shape) if self.device is None else RemoteModel(self.device)
            model.allocate_kv(1, 16, 16)
            from calibrate.bookkeeping import StepInputs

            one = np.zeros(1, dtype=np.int64)
            inp = StepInputs(one, one, one, one + 1)
            for _ in range(40):
                self._step(lambda seq: decode_message(seq, inp, False))
        return float(np.median(self.latencies))

    def close(self) -> None:
        if self.device is not None:
            self.device.close()
            self.device = None
