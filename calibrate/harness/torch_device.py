"""torch on a CPU as the harness's device: a separate process that runs the forwards in launch
order on its own core.

The device process has its own interpreter, so a forward never needs the scheduler's GIL. The
scheduler sends a launch message per batch (its composition: request slots, positions, KV
slots, prompt tokens for a prefill); the process keeps every request's last sampled token in
its own memory (its token buffer, indexed by request slot: SGLang's FutureMap) and, for a
``future`` decode, builds the batch's input ids from there, so the scheduler never reads a
token before launching. After the forward it reads the sampled tokens (the device-to-host
copy) and sends them back with the forward's start and end times. Both sides poll their pipe
instead of sleeping on it: a GPU polls its queue, and SGLang's ``copy_done.synchronize()``
spins; a sleeping reader would add a wake-up latency of ~35 us per message on this VM
(measured with a pipe echo: ~10 us polling).

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

        from calibrate.harness.workload import EosScript
        from calibrate.torch_model import TorchLlama

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


def device_main(conn, spec: DeviceSpec) -> None:
    """The device process: prepare, say ready, then run launch messages in order until ``None``.

    A step's device time runs from the moment its message is read (before unpickling: the
    host-to-device copy of its inputs) to the moment its tokens are about to be sent back (the
    device-to-host copy done). Control messages (``("kv", ...)``, ``("rows", ...)``, used by
    calibration) are not timed.
    """
    _pin(spec.core)
    runner = ForwardRunner(spec)
    runner.prepare()
    conn.send_bytes(pickle.dumps("ready"))
    while True:
        while not conn.poll(0):  # spin: see the module docstring
            pass
        t0 = time.perf_counter()
        msg = pickle.loads(conn.recv_bytes())
        if msg is None:
            break
        if msg[0] == "kv":
            runner.reallocate(*msg[1:])
            conn.send_bytes(pickle.dumps("ok"))
            continue
        if msg[0] == "rows":
            for slot, start, idx in msg[1]:
                runner.model.set_req_to_token(slot, start, idx)
            conn.send_bytes(pickle.dumps("ok"))
            continue
        toks = runner.run(msg)
        t1 = time.perf_counter()
        conn.send_bytes(pickle.dumps((msg[1], toks, t0, t1)))
    conn.close()


class ProcessDevice:
    """The scheduler's handle on the device process (``with`` closes it).

    Args:
        spec: what to build. scheduler_core: the core the calling (scheduler) process is pinned to.
    """

    def __init__(self, spec: DeviceSpec, scheduler_core: int | None = None):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=device_main, args=(child, spec), daemon=True, name="harness-device")
        self.proc.start()
        child.close()
        self.admitted: set = set()
        self._old_affinity = None
        if scheduler_core is not None and hasattr(os, "sched_getaffinity"):
            self._old_affinity = os.sched_getaffinity(0)
            _pin(scheduler_core)
        try:
            ready = self.conn.poll(600) and pickle.loads(self.conn.recv_bytes()) == "ready"
        except EOFError:
            ready = False
        if not ready:
            self.close()
            raise RuntimeError("the harness device process failed to start (in a script, run the harness under "
                               "`if __name__ == '__main__':`, which multiprocessing's spawn needs)")

    def launch(self, step: Step, inputs, future: bool) -> None:
        self.conn.send_bytes(pickle.dumps(launch_message(step, inputs, future, self.admitted)))

    def wait(self, step: Step) -> list[int]:
        conn, spins = self.conn, 0
        while not conn.poll(0):  # spin, as copy_done.synchronize() does
            spins += 1
            if spins % 100_000 == 0 and not self.proc.is_alive():
                raise RuntimeError(f"the harness device process died (exit code {self.proc.exitcode})")
        seq, toks, t0, t1 = pickle.loads(conn.recv_bytes())
        if seq != step.seq:
            raise RuntimeError(f"device returned step {seq}, expected {step.seq}")
        step.forward_start, step.forward_end = t0, t1
        return toks

    def control(self, msg: tuple) -> None:
        """An untimed control message (KV allocation, token-map rows); waits for its answer."""
        self.conn.send_bytes(pickle.dumps(msg))
        if pickle.loads(self.conn.recv_bytes()) != "ok":
            raise RuntimeError(f"the device process refused {msg[0]!r}")

    def close(self) -> None:
        try:
            self.conn.send_bytes(pickle.dumps(None))
        except (OSError, BrokenPipeError):
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)
        if self._old_affinity is not None:
            os.sched_setaffinity(0, self._old_affinity)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


__all__ = ["DeviceSpec", "ForwardRunner", "ProcessDevice", "clock"]
