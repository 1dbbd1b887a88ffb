"""Calibration of the harness's torch device process: each step timed the way the harness runs
it, one step at a time (isolated), through the same process and pipe.

The simulator is then fed with what this device costs: ``launch`` = building the batch's host
arrays, pickling and sending the launch message (scheduler CPU time); ``forward`` = the device
process's own stamps, from reading the message to the tokens ready to send back (unpickling,
token buffer, forward, sampling, reading the tokens); ``metadata.sync_latency_s`` = the median
time from there until the scheduler has read the tokens (the pipe back; the simulator's
``costs.gpu.sync_latency``). Used by ``overlap-sim validate`` in place
of :class:`calibrate.forward.torch_backend.TorchBackend` (which times the forward on the calling thread,
as the ``thread_overlap`` harness runs it).
"""

from __future__ import annotations

import pickle
import platform

import numpy as np

from calibrate.bookkeeping.bookkeeper import StepInputs
from calibrate.config import CalibrationConfig
from calibrate.harness.torch_device import DeviceSpec, ProcessDevice, decode_message, extend_message
from calibrate.harness.trace import clock
from calibrate.shapes import ModelShape

DECODES_BEFORE_PREFILL = 4


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
                "device_gap_s": self.device_gap_s(),
                "timing": "forward: the harness device process's stamps from reading the launch message to the "
                          "tokens ready to send; launch: inputs + pickling + sending the message; sync_latency_s: "
                          "from the tokens ready on the device to read by the host (median); device_gap_s: the "
                          "device's idle time between back-to-back forwards (median)"}

    def create_model(self, shape: ModelShape) -> RemoteModel:
        spec = DeviceSpec.for_calibration(shape, self.cfg.seed, self.cfg.threads or 1, self.eos_id, self.cores[1])
        self.close()
        self.device = ProcessDevice(spec, self.cores[0])
        return RemoteModel(self.device)

    @staticmethod
    def free_bytes() -> None:
        return None

    def _step(self, message) -> tuple[float, float, float]:
        """Send one launch message, wait for its tokens as the harness does (spinning); returns
        (launch seconds: pickling and sending, device seconds, sync latency seconds)."""
        dev = self.device
        self._seq += 1
        t0 = clock()
        dev.box.send(pickle.dumps(message(self._seq)))
        t1 = clock()
        raw = dev.box.recv()
        got = clock()
        _seq, _toks, f0 = pickle.loads(raw)
        have = clock()  # the tokens are usable by the scheduler
        f1 = dev.end_stamp(self._seq, got)
        self.latencies.append(have - f1)
        return t1 - t0, f1 - f0, have - f1

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
        """(forward, launch) seconds of decode steps; the launch includes building the inputs.

        As in serving, consecutive samples are consecutive steps of the same requests: each
        writes the next KV position and attends over one more token (contexts centred on
        ``ctx``), instead of repeating one identical step (which stays warmer in the caches)."""
        n = warmup + repeats
        first = ctx - n // 2
        if first < 1 or ctx - 1 + n - n // 2 > model.max_ctx:  # no room to advance: repeat the step
            return self._measure(make_inputs, lambda seq, inp: decode_message(seq, inp, False), warmup, repeats)
        row = model.max_ctx
        base = make_inputs()
        rows = [(i, 0, 1 + i * row + np.arange(first + n, dtype=np.int64)) for i in range(batch_size)]
        self.device.control(("rows", rows))
        fwd, lau = [], []
        for k in range(n):
            pos = np.full(batch_size, first - 1 + k, dtype=np.int64)
            t0 = clock()
            inp = make_inputs()
            inp = StepInputs(inp.input_ids, inp.slots, pos, 1 + inp.slots * row + pos)
            t1 = clock()
            send, device, _lat = self._step(lambda seq: decode_message(seq, inp, False))
            if k >= warmup:
                fwd.append(device)
                lau.append(send + t1 - t0)
        del base
        return fwd, lau

    def measure_extend(self, model, make_inputs, warmup: int, repeats: int) -> tuple[list[float], list[float]]:
        """(forward, launch) seconds of one prefill batch, each sample taken right after
        :data:`DECODES_BEFORE_PREFILL` untimed decode steps of the batch's requests: in serving a
        prefill follows decodes, and measured back to back (warm caches) it was about 10% faster
        here (3.83 against 4.2 ms for 8 x 64 tokens of ``tiny``, 2 layers)."""
        fwd, lau = [], []
        for k in range(warmup + repeats):
            inp = make_inputs()
            n = len(inp.prefix_lens)
            p = int(min(inp.prefix_lens))
            loc = inp.out_cache_loc[:n]
            dec = StepInputs(np.zeros(n, dtype=np.int64), inp.slots, np.full(n, p, dtype=np.int64), loc)
            for _ in range(DECODES_BEFORE_PREFILL):
                self._step(lambda seq: decode_message(seq, dec, False))
            t0 = clock()
            inp = make_inputs()
            t1 = clock()
            send, device, _lat = self._step(lambda seq: extend_message(seq, inp, None, []))
            if k >= warmup:
                fwd.append(device)
                lau.append(send + t1 - t0)
        return fwd, lau

    def _probe_device(self) -> RemoteModel:
        model = self.create_model(self.cfg.shape) if self.device is None else RemoteModel(self.device)
        model.allocate_kv(1, 16, 16)
        return model

    def sync_latency_s(self) -> float:
        """Median time from a step's end on the device to its tokens read by the host (the
        latencies seen by every step measured so far, or 40 one-request decodes if none were)."""
        if not self.latencies:
            self._probe_device()
            one = np.zeros(1, dtype=np.int64)
            inp = StepInputs(one, one, one, one + 1)
            for _ in range(40):
                self._step(lambda seq: decode_message(seq, inp, False))
        return float(np.median(self.latencies))

    def device_gap_s(self) -> float:
        """Median idle time of the device between two forwards whose launch messages were
        already waiting (as under overlap): reading the next message after sending the last
        tokens. The validation gives it to the simulator as ``costs.gpu.overlap_residue``."""
        self._probe_device()
        dev = self.device
        one = np.zeros(1, dtype=np.int64)
        inp = StepInputs(one, one, one, one + 1)
        gaps = []
        for _ in range(30):
            seqs = []
            for _ in range(2):
                self._seq += 1
                seqs.append(self._seq)
                dev.box.send(pickle.dumps(decode_message(self._seq, inp, False)))
            got = []
            for _ in range(2):
                raw = dev.box.recv()
                got.append((pickle.loads(raw)[2], clock()))
            end_first = dev.end_stamp(seqs[0], got[0][1])
            dev.end_stamp(seqs[1], got[1][1])
            gaps.append(got[1][0] - end_first)
        return float(np.median(gaps))

    def close(self) -> None:
        if self.device is not None:
            self.device.close()
            self.device = None
