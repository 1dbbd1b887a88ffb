"""torch on a CPU as the harness's device: a separate process that runs the forwards in launch
order on its own core.

The device process has its own interpreter, so a forward never needs the scheduler's GIL. The
scheduler sends a launch message per batch (its composition: request slots, positions, KV
slots, prompt tokens for a prefill); the process keeps every request's last sampled token in
its own memory (its token buffer, indexed by request slot: SGLang's FutureMap) and, for a
``future`` decode, builds the batch's input ids from there, so the scheduler never reads a
token before launching. After the forward it reads the sampled tokens (the device-to-host
copy) and sends them back with the forward's start and end times. Both sides spin until a
message is there instead of sleeping on the pipe: a GPU polls its queue, and SGLang's
``copy_done.synchronize()`` spins; a sleeping reader added a wake-up latency of ~35 us per
message on this VM (pipe echo), spinning ~10 us (see :class:`Mailbox` for how they spin).

``prepare`` runs before the clock starts: the system prompt's KV, and warm-up forwards of the
run's shapes (first calls of torch ops are slow).
"""

from __future__ import annotations

import os
import pickle
import time
from dataclasses import dataclass

import numpy as np

from calibrate.harness.trace import Step, clock


@dataclass(frozen=True)
class DeviceSpec:
    """What the device process builds: the model, its KV cache, the EOS script."""

    shape: object  # ModelShape
    seed: int
    threads: int
    max_slots: int
    max_ctx: int
    pool_tokens: int
    eos_at: np.ndarray
    eos_id: int
    system_prompt: list
    system_slots: np.ndarray
    warmup_decode: tuple  # (batch size, context) pairs to run before the clock starts
    warmup_extend: tuple  # token counts
    core: int | None

    @classmethod
    def for_calibration(cls, shape, seed: int, threads: int, eos_id: int, core: int | None) -> "DeviceSpec":
        """A one-slot spec with no workload and no warm-up: calibration reallocates the KV cache
        point by point (:meth:`ForwardRunner.reallocate`)."""
        empty = np.zeros(0, dtype=np.int64)
        return cls(shape, seed, threads, max_slots=1, max_ctx=16, pool_tokens=16, eos_at=empty, eos_id=eos_id,
                   system_prompt=[], system_slots=empty, warmup_decode=(), warmup_extend=(), core=core)


def _pin(core: int | None) -> None:
    if core is not None and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {core})
        except OSError:
            pass


class ForwardRunner:
    """The model, its token buffer and EOS script: runs one launch message (shared by the
    device process and the forward thread of ``thread_overlap``)."""

    def __init__(self, spec: DeviceSpec):
        import torch

        from calibrate.forward.torch_model import TorchLlama
        from calibrate.harness.workload import EosScript

        torch.set_num_threads(spec.threads)
        self.torch = torch
        self.model = TorchLlama(spec.shape, "cpu", torch.float32, seed=spec.seed)
        self.model.allocate_kv(spec.max_slots, spec.max_ctx, spec.pool_tokens)
        self.tokens = np.zeros(spec.max_slots, dtype=np.int64)  # FutureMap: last sampled token per slot
        self.script = EosScript(spec.eos_at, spec.eos_id, spec.max_slots)
        self.spec = spec

    def reallocate(self, max_slots: int, max_ctx: int, pool_tokens: int) -> None:
        """A new KV cache, token buffer and EOS script (calibration's points)."""
        from calibrate.harness.workload import EosScript

        self.model.allocate_kv(max_slots, max_ctx, pool_tokens)
        self.tokens = np.zeros(max_slots, dtype=np.int64)
        self.script = EosScript(np.zeros(0, dtype=np.int64), self.spec.eos_id, max_slots)

    def prepare(self) -> None:
        """Compute the system prompt's KV and warm every shape up (before the clock starts)."""
        t = self.torch
        spec, m = self.spec, self.model
        if len(spec.system_prompt):
            n = len(spec.system_prompt)
            m.extend(t.tensor(spec.system_prompt), [0], [0], [n], t.from_numpy(spec.system_slots))
        for bs, ctx in spec.warmup_decode:
            bs = min(bs, spec.max_slots)
            pos = t.full((bs,), min(ctx, spec.max_ctx) - 1)
            for _ in range(2):
                m.decode(t.zeros(bs, dtype=t.int64), t.arange(bs), pos, t.zeros(bs, dtype=t.int64), int(pos[0]) + 1).tolist()
        for n in spec.warmup_extend:
            n = min(n, spec.max_ctx)
            m.extend(t.zeros(n, dtype=t.int64), [0], [0], [n], t.zeros(n, dtype=t.int64)).tolist()

    def run(self, msg: tuple) -> list[int]:
        """Run one launch message; returns the sampled tokens (after the EOS script)."""
        t = self.torch
        kind = msg[0]
        if kind == "decode":
            _, _, slots, pos, loc, host_ids = msg
            ids = self.tokens[slots] if host_ids is None else host_ids
            ctx = int(pos.max()) + 1
            out = self.model.decode(t.from_numpy(ids), t.from_numpy(slots), t.from_numpy(pos), t.from_numpy(loc), ctx)
            toks = self.script.apply(slots, out.tolist())  # tolist: the device-to-host copy
            self.tokens[slots] = toks
            return toks
        _, _, ids, slots, prefix_lens, extend_lens, loc, prefixes, last, admit = msg
        last = last if last is not None else [True] * len(slots)
        for slot, rid in admit:
            self.script.admit(slot, rid)
        pre = [t.from_numpy(p) for p in prefixes]
        out = self.model.extend(t.from_numpy(ids), slots, prefix_lens, extend_lens, t.from_numpy(loc), pre)
        toks = out.tolist()
        done = [s for s, is_last in zip(slots, last) if is_last]
        if done:
            fixed = self.script.apply(done, [tok for tok, is_last in zip(toks, last) if is_last])
            self.tokens[done] = fixed
            it = iter(fixed)
            toks = [next(it) if is_last else tok for tok, is_last in zip(toks, last)]
        return toks


def decode_message(seq: int, inputs, future: bool) -> tuple:
    """A decode's launch message: slots, positions, KV slots; the input ids only when they come
    from the host (``future``: the device takes them from its token buffer)."""
    return ("decode", seq, inputs.slots, inputs.positions, inputs.out_cache_loc, None if future else inputs.input_ids)


def extend_message(seq: int, inputs, is_last: list[bool], admit: list) -> tuple:
    """A prefill's launch message: prompt tokens, slots, prefix and extend lengths, KV slots,
    the prefix's KV slots per request, which requests end their prompt here, and the
    (slot, request id) of requests whose prefill starts here."""
    return ("extend", seq, inputs.input_ids, inputs.slots.tolist(), inputs.prefix_lens, inputs.extend_lens,
            inputs.out_cache_loc, [np.asarray(p, dtype=np.int64) for p in inputs.prefix_indices], is_last, admit)


def launch_message(step: Step, inputs, future: bool, admitted: set) -> tuple:
    """The launch message of ``step``. ``admitted``: request ids whose prefill started earlier."""
    if step.kind == "decode":
        return decode_message(step.seq, inputs, future)
    b = step.batch
    admit = []
    for r, slot in zip(b.reqs, inputs.slots.tolist()):
        if r.rid not in admitted:
            admitted.add(r.rid)
            admit.append((slot, r.rid))
    return extend_message(step.seq, inputs, b.is_last, admit)


STAMPS = 1 << 16  # device-side end stamps kept in shared memory (by step number, modulo this)
SENT, REPLIED = STAMPS, STAMPS + 1  # message counters after the stamps (written by host / device only)
IDLE_SPIN_S = 0.02  # the device process spins this long for the next message, then sleeps on the pipe


class Mailbox:
    """One side of the pipe between the scheduler and the device process, with message counters
    in shared memory: a reader spins on the counter (user space, as a CUDA event sync spins on a
    memory word) and reads the pipe only once a message is there. Spinning on ``poll`` instead
    enters the kernel a million times a second, and the scheduler's Python then ran measurably
    colder than in the isolated timings (process and launch phases up to 1.5-2x slower)."""

    def __init__(self, conn, shm, mine: int, theirs: int):
        self.conn = conn
        self.words = np.ndarray((STAMPS + 2,), dtype=np.float64, buffer=shm.buf)
        self.ends = self.words[:STAMPS]
        self.mine, self.theirs = mine, theirs
        self.read = 0

    def send(self, data: bytes) -> None:
        self.conn.send_bytes(data)
        self.words[self.mine] += 1.0

    def ready(self) -> bool:
        return self.words[self.theirs] > self.read

    def recv(self) -> bytes:
        words, theirs, read = self.words, self.theirs, self.read
        while words[theirs] <= read:
            pass
        self.read = read + 1
        return self.conn.recv_bytes()


def device_main(conn, spec: DeviceSpec, stamps_name: str) -> None:
    """The device process: prepare, say ready, then run launch messages in order until ``None``.

    A step's device time runs from the moment its message is there (reading and unpickling it:
    the host-to-device copy of its inputs) to the moment its tokens have been sent back (the
    device-to-host copy); that end is written to shared memory after the send (the reply itself
    carries the start). Control messages (``("kv", ...)``, ``("rows", ...)``, used by
    calibration) are not timed.
    """
    from multiprocessing import shared_memory

    _pin(spec.core)
    shm = shared_memory.SharedMemory(name=stamps_name)
    box = Mailbox(conn, shm, REPLIED, SENT)
    runner = ForwardRunner(spec)
    runner.prepare()
    box.send(pickle.dumps("ready"))
    words, read = box.words, 0
    while True:
        spin_until, n = time.perf_counter() + IDLE_SPIN_S, 0
        while words[SENT] <= read:  # spin (see Mailbox); idle for long (between runs): sleep on the pipe
            n += 1
            if n % 1024 == 0 and time.perf_counter() > spin_until:
                conn.poll(0.05)
        read += 1
        t0 = time.perf_counter()
        msg = pickle.loads(conn.recv_bytes())
        if msg is None:
            break
        if msg[0] == "kv":
            runner.reallocate(*msg[1:])
            box.send(pickle.dumps("ok"))
            continue
        if msg[0] == "rows":
            for slot, start, idx in msg[1]:
                runner.model.set_req_to_token(slot, start, idx)
            box.send(pickle.dumps("ok"))
            continue
        toks = runner.run(msg)
        box.send(pickle.dumps((msg[1], toks, t0)))
        box.ends[msg[1] % STAMPS] = time.perf_counter()
    del words, box
    shm.close()
    conn.close()


class ProcessDevice:
    """The scheduler's handle on the device process (``with`` closes it).

    Args:
        spec: what to build. scheduler_core: the core the calling (scheduler) process is pinned to.
    """

    def __init__(self, spec: DeviceSpec, scheduler_core: int | None = None):
        import multiprocessing as mp
        from multiprocessing import shared_memory

        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.shm = shared_memory.SharedMemory(create=True, size=8 * (STAMPS + 2))
        self.box = Mailbox(self.conn, self.shm, SENT, REPLIED)
        self.box.words[:] = 0.0
        self.ends = self.box.ends
        self.received: list[tuple[Step, float]] = []  # (step, when the host had its tokens)
        self.proc = ctx.Process(target=device_main, args=(child, spec, self.shm.name), daemon=True,
                                name="harness-device")
        self.proc.start()
        child.close()
        self.admitted: set = set()
        self._old_affinity = None
        if scheduler_core is not None and hasattr(os, "sched_getaffinity"):
            self._old_affinity = os.sched_getaffinity(0)
            _pin(scheduler_core)
        deadline = time.monotonic() + 600
        while not self.box.ready() and self.proc.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            ready = self.box.ready() and pickle.loads(self.box.recv()) == "ready"
        except EOFError:
            ready = False
        if not ready:
            self.close()
            raise RuntimeError("the harness device process failed to start (in a script, run the harness under "
                               "`if __name__ == '__main__':`, which multiprocessing's spawn needs)")

    def launch(self, step: Step, inputs, future: bool) -> float:
        """Post the launch message; returns when the launch's CPU part ended (just before the
        post: the device process may pick the message up before ``send`` returns)."""
        payload = pickle.dumps(launch_message(step, inputs, future, self.admitted))
        end = clock()
        self.box.send(payload)
        return end

    def wait(self, step: Step) -> list[int]:
        box, spins = self.box, 0
        while not box.ready():  # spin, as copy_done.synchronize() does
            spins += 1
            if spins % 1_000_000 == 0 and not self.proc.is_alive():
                raise RuntimeError(f"the harness device process died (exit code {self.proc.exitcode})")
        raw = box.recv()
        got = clock()
        seq, toks, t0 = pickle.loads(raw)
        if seq != step.seq:
            raise RuntimeError(f"device returned step {seq}, expected {step.seq}")
        step.forward_start = t0
        step.forward_end = got  # until finish() reads the device's own end stamp
        self.received.append((step, got))
        return toks

    def end_stamp(self, seq: int, received: float) -> float:
        """When step ``seq`` ended on the device (its tokens sent), at most when the host had
        them (the send call may return after the reader already woke up)."""
        i = seq % STAMPS
        while self.ends[i] == 0.0:  # written right after the send: wait for it
            pass
        end, self.ends[i] = float(self.ends[i]), 0.0
        return min(end, received)

    def finish(self) -> None:
        """Stamp every received step's forward end from the device's shared-memory stamps."""
        for step, got in self.received:
            step.forward_end = self.end_stamp(step.seq, got)
        self.received.clear()

    def control(self, msg: tuple) -> None:
        """An untimed control message (KV allocation, token-map rows); waits for its answer."""
        self.box.send(pickle.dumps(msg))
        if pickle.loads(self.box.recv()) != "ok":
            raise RuntimeError(f"the device process refused {msg[0]!r}")

    def close(self) -> None:
        try:
            self.box.send(pickle.dumps(None))
        except (OSError, BrokenPipeError):
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)
        if self.shm is not None:
            del self.ends, self.box
            self.shm.close()
            self.shm.unlink()
            self.shm = None
        if self._old_affinity is not None:
            os.sched_setaffinity(0, self._old_affinity)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


__all__ = ["DeviceSpec", "ForwardRunner", "ProcessDevice", "clock"]
