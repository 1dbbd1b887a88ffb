"""MLX as the harness's device: lazy graphs submitted with ``mx.async_eval``, evaluated by MLX's
stream on its own worker thread (also on the CPU backend, ``pip install "mlx[cpu]"``).

``launch`` builds the step's lazy graph (a ``future`` decode takes its input ids from the
in-flight step's still-lazy tokens: SGLang's ``event_loop_overlap_mlx`` chain) and submits it;
``wait`` reads the tokens (``tolist`` blocks until they exist). ``mx.async_eval`` itself may
block: MLX walks the graph on the calling thread and waits while more than ``MAX_ACTIVE_TASKS``
tasks are outstanding, so it returns only when the device is near the end of the step. The
launch's CPU part ends when ``mx.async_eval`` is called; the blocked time shows as a gap in
the scheduler's phases, as the simulator models it (:meth:`sim.model.costs.CostModel.submit_s`).

When a step ends on the device is observed by a watcher thread that blocks on each step in
launch order (``mx.eval`` releases the GIL while it waits) and stamps the time; the switch
interval is lowered to 0.1 ms during the run so the stamp is not held back by the
scheduler's Python for up to CPython's default 5 ms. A step starts on the device when it is
submitted or when the previous one ended, whichever is later.
"""

from __future__ import annotations

import queue
import sys
import threading

import numpy as np

from calibrate.harness.trace import Step, clock
from calibrate.harness.workload import EosScript

STAMP_SWITCH_INTERVAL_S = 1e-4


class MlxDevice:
    """The MLX model and its in-flight steps.

    Args:
        cfg: the harness configuration (``device``: ``cpu`` or ``gpu``). spec: sizes, EOS script,
            warm-up shapes (:class:`calibrate.harness.torch_device.DeviceSpec`).
    """

    def __init__(self, cfg, spec):
        import mlx.core as mx

        from calibrate.forward.mlx_model import MlxLlama

        self.mx = mx
        mx.set_default_device(mx.gpu if cfg.device == "gpu" else mx.cpu)
        self.model = MlxLlama(spec.shape, seed=spec.seed)
        self.model.allocate_kv(spec.max_slots, spec.max_ctx, spec.pool_tokens)
        self.script = EosScript(spec.eos_at, spec.eos_id, spec.max_slots)
        self.spec = spec
        self._prepare()
        self.launched: list[tuple[Step, float]] = []  # (step, submit time)
        self.ends: dict[int, float] = {}  # the watcher's stamps
        self.read: dict[int, float] = {}  # when the scheduler had each step's tokens
        self._last = None  # (slots, lazy tokens) of the last launched decode
        self._admitted: set = set()
        self._queue: queue.Queue = queue.Queue()
        self._old_interval = sys.getswitchinterval()
        sys.setswitchinterval(STAMP_SWITCH_INTERVAL_S)
        self._watcher = threading.Thread(target=self._watch, name="mlx-step-watcher", daemon=True)
        self._watcher.start()

    def _prepare(self) -> None:
        mx, m, spec = self.mx, self.model, self.spec
        if len(spec.system_prompt):
            n = len(spec.system_prompt)
            mx.eval(m.extend(mx.array(spec.system_prompt), [0], [0], [n], mx.array(spec.system_slots.astype(np.int32))))
        for bs, ctx in spec.warmup_decode:
            bs, ctx = min(bs, spec.max_slots), min(ctx, spec.max_ctx)
            z = mx.zeros((bs,), dtype=mx.int32)
            for _ in range(2):
                m.decode(z, mx.arange(bs), mx.full((bs,), ctx - 1, dtype=mx.int32), z, ctx).tolist()
        for n in spec.warmup_extend:
            n = min(n, spec.max_ctx)
            m.extend(mx.zeros((n,), dtype=mx.int32), [0], [0], [n], mx.zeros((n,), dtype=mx.int32)).tolist()

    def _watch(self) -> None:
        mx = self.mx
        while True:
            item = self._queue.get()
            if item is None:
                return
            seq, marker = item
            mx.eval(marker)
            self.ends[seq] = clock()

    def launch(self, step: Step, inputs, future: bool) -> float:
        """Build ``step``'s lazy graph and submit it; returns when the CPU part ended (the call
        to ``mx.async_eval``, which may then block)."""
        mx, m = self.mx, self.model
        i32 = lambda a: mx.array(np.asarray(a, dtype=np.int32))  # noqa: E731
        if step.kind == "decode":
            slots = inputs.slots
            if future:
                last_slots, ids = self._last
                if not np.array_equal(last_slots, slots):
                    raise RuntimeError("a chained decode must have the in-flight decode's members")
            else:
                ids = i32(inputs.input_ids)
            out = m.decode(ids, i32(slots), i32(inputs.positions), i32(inputs.out_cache_loc),
                           int(inputs.positions.max()) + 1)
            self._last = (slots, out)
        else:
            slots = inputs.slots.tolist()
            for req, slot in zip(step.batch.reqs, slots):
                if req.rid not in self._admitted:
                    self._admitted.add(req.rid)
                    self.script.admit(slot, req.rid)
            prefixes = [i32(p) for p in inputs.prefix_indices]
            out = m.extend(i32(inputs.input_ids), slots, inputs.prefix_lens, inputs.extend_lens,
                           i32(inputs.out_cache_loc), prefixes)
            self._last = None
        marker = out + 0  # the watcher's handle: done when the step's tokens are
        slot_list = inputs.slots.tolist()
        step.handle = (out, slot_list, [True] * len(slot_list) if step.kind == "decode" else step.batch.is_last)
        end = clock()
        mx.async_eval(out, marker)
        self.launched.append((step, end))
        self._queue.put((step.seq, marker))
        return end

    def wait(self, step: Step) -> list[int]:
        """The step's tokens on the host (blocks until the step is done), after the EOS script."""
        out, slots, last = step.handle
        step.handle = None
        toks = out.tolist()
        self.read[step.seq] = clock()
        done = [i for i, is_last in enumerate(last) if is_last]
        fixed = self.script.apply([slots[i] for i in done], [toks[i] for i in done])
        for i, tok in zip(done, fixed):
            toks[i] = tok
        return toks

    def finish(self) -> dict:
        """Stop the watcher, restore the switch interval, stamp every step's forward (start: its
        submission or the previous step's end, whichever is later; end: the watcher's stamp or
        the scheduler's read of its tokens, whichever is earlier)."""
        self._queue.put(None)
        self._watcher.join(30)
        sys.setswitchinterval(self._old_interval)
        prev_end = -np.inf
        for step, submitted in self.launched:
            step.forward_start = max(submitted, prev_end)
            # the watcher needs the GIL to stamp: when the scheduler read the tokens first, that
            # read is the later bound of the step's end
            end = min(self.ends[step.seq], self.read.get(step.seq, np.inf))
            step.forward_end = prev_end = max(end, step.forward_start)
        return {"stamp_switch_interval_s": STAMP_SWITCH_INTERVAL_S}
