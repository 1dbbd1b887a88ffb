"""``thread_overlap``: the forward runs in a worker thread of the scheduler process, as in SGLang
before October 2025 (0.5.3's ``TpModelWorkerClient``).

Source (sglang 0.5.3 wheel, ``managers/tp_worker_overlap_thread.py``, ``tp_worker.py``): the
scheduler builds the batch's host arrays and puts it on the input queue (``run_batch`` returns
future token ids at once); the forward thread resolves the future tokens from its token buffer,
runs the forward, sets ``launch_done``, samples, stores the tokens in the buffer and puts them on
the output queue (here already as a list: the model's EOS script needs them, see
:class:`calibrate.harness.workload.EosScript`). To process batch k-1 the scheduler takes k-1's result from the output queue,
waits for ``launch_done`` of batch k (the current one), synchronizes the copy and reads the
tokens (``tolist``). Both threads share the GIL: torch releases it inside each op, but every
op's Python part needs it back, so the scheduler's bookkeeping and the forward take turns.

The loop itself is :func:`calibrate.harness.loops.overlap_loop`; this module is its device.
A forward's recorded span is the forward thread's busy time (its CPU time, ending when its
tokens are ready), so time spent waiting for the GIL shows as a gap before it, as in the
simulator's thread loop.
The scheduler thread and the forward thread are pinned to the two cores the device-process
harness uses (a thread that wakes up on another core starts with cold caches: unpinned, the
forward ran ~10% slower than calibrated).
"""

from __future__ import annotations

import os
import queue
import threading
import time

import numpy as np

from calibrate.harness.torch_device import DeviceSpec, ForwardRunner
from calibrate.harness.trace import Step, clock


class ThreadWorker:
    """The forward thread and its queues (``with`` stops the thread)."""

    def __init__(self, spec: DeviceSpec, wait_launch_done: bool = True, scheduler_core: int | None = None):
        self._old_affinity = None
        if scheduler_core is not None and hasattr(os, "sched_setaffinity"):
            self._old_affinity = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {scheduler_core})  # this (the scheduler) thread only, on Linux
        self.runner = ForwardRunner(spec)
        self.runner.prepare()
        self.wait_launch_done = wait_launch_done
        self.inq: queue.Queue = queue.Queue()
        self.outq: queue.Queue = queue.Queue()
        self.current: Step | None = None
        self._admitted: set = set()
        self.thread = threading.Thread(target=self._forward_thread, name="forward-thread", daemon=True)
        self.thread.start()

    def launch(self, step: Step, inputs, future: bool) -> float:
        """``run_batch``: hand the batch over (``input_queue.put``); returns when the launch's CPU
        part ended (just before the hand-over: the forward thread may start before ``put`` returns)."""
        step.handle = threading.Event()  # launch_done
        self.current = step
        end = clock()
        self.inq.put((step, inputs))
        return end

    def wait(self, step: Step) -> list[int]:
        """``resolve_last_batch_result``: ``step``'s result, after the current batch's launch."""
        seq, toks, error = self.outq.get()
        if error is not None:
            raise RuntimeError(f"the forward thread failed: {error}")
        if seq != step.seq:
            raise RuntimeError(f"forward thread returned step {seq}, expected {step.seq}")
        cur, self.current = self.current, None
        if self.wait_launch_done and cur is not None and cur is not step:
            cur.handle.wait()
        return toks

    def _forward_thread(self) -> None:
        if self.runner.spec.core is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {self.runner.spec.core})  # pinned like the device process: no migrations
        r = self.runner
        t, m = r.torch, r.model
        while True:
            item = self.inq.get()
            if item is None:
                return
            step, inp = item
            try:
                cpu0 = time.thread_time()
                slots = inp.slots.tolist()
                if step.kind == "decode":
                    last = [True] * len(slots)
                    logits = m.decode_logits(t.from_numpy(r.tokens[inp.slots]), t.from_numpy(inp.slots),  # resolve_future
                                             t.from_numpy(inp.positions), t.from_numpy(inp.out_cache_loc),
                                             int(inp.positions.max()) + 1)
                else:
                    last = step.batch.is_last
                    self._admit(step, slots)
                    logits = m.extend_logits(t.from_numpy(inp.input_ids), slots, inp.prefix_lens, inp.extend_lens,
                                             t.from_numpy(inp.out_cache_loc),
                                             [t.from_numpy(np.asarray(p, dtype=np.int64)) for p in inp.prefix_indices])
                step.handle.set()  # launch_done: the forward is launched (on a CPU: computed)
                toks = t.argmax(logits, dim=-1).tolist()  # sample, copy to the host
                done = [i for i, is_last in enumerate(last) if is_last]
                if done:
                    fixed = r.script.apply([slots[i] for i in done], [toks[i] for i in done])
                    for i, tok in zip(done, fixed):
                        toks[i] = tok
                    r.tokens[[slots[i] for i in done]] = fixed  # store_to_map
                step.forward_end = clock()
                # the forward's busy time is this thread's CPU time: waits for the GIL show as gaps
                # before it, as in the simulator's thread loop
                step.forward_start = step.forward_end - (time.thread_time() - cpu0)
                self.outq.put((step.seq, toks, None))
            except Exception as err:  # noqa: BLE001  reported to the scheduler thread
                step.handle.set()
                self.outq.put((step.seq, None, f"{type(err).__name__}: {err}"))

    def _admit(self, step: Step, slots: list[int]) -> None:
        for req, slot in zip(step.batch.reqs, slots):
            if req.rid not in self._admitted:
                self._admitted.add(req.rid)
                self.runner.script.admit(slot, req.rid)

    def close(self) -> None:
        self.inq.put(None)
        self.thread.join(10)
        if self._old_affinity is not None:
            os.sched_setaffinity(0, self._old_affinity)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
