"""torch on CUDA as the harness's device: SGLang's two-stream overlap in one thread.

The forward (and sampling, the token buffer, the device-to-host copy) is queued on a forward
stream; the scheduler thread only queues work and waits on events. The token buffer (SGLang's
FutureMap) is a device tensor indexed by request slot: a ``future`` decode gathers its input ids
there, so the host never reads a token before launching. The EOS script runs on the device too
(two small tensors per slot). Each step records CUDA events around its work; after the run
their times are put on the host clock through an origin event recorded at a known host time.

Not run in this project's CI (no GPU); the harness tests skip it cleanly without CUDA.
"""

from __future__ import annotations

import numpy as np

from calibrate.harness.trace import Step, clock


class CudaDevice:
    """The model on ``cuda`` (bfloat16, eager) with its forward stream and token buffer."""

    def __init__(self, spec, dtype: str = "bfloat16"):
        import torch

        from calibrate.forward.torch_model import TorchLlama

        if not torch.cuda.is_available():
            raise RuntimeError("the CUDA harness needs a CUDA GPU (torch.cuda.is_available() is False)")
        self.torch = torch
        dev = self.dev = torch.device("cuda")
        self.model = TorchLlama(spec.shape, "cuda", getattr(torch, dtype), seed=spec.seed)
        self.model.allocate_kv(spec.max_slots, spec.max_ctx, spec.pool_tokens)
        self.model.check_attention()
        self.model.allocate_kv(spec.max_slots, spec.max_ctx, spec.pool_tokens)
        self.tokens = torch.zeros(spec.max_slots, dtype=torch.int64, device=dev)  # FutureMap
        self.eos_at = torch.from_numpy(np.asarray(spec.eos_at, dtype=np.int64)).to(dev)
        self.slot_eos = torch.zeros(spec.max_slots, dtype=torch.int64, device=dev)
        self.produced = torch.zeros(spec.max_slots, dtype=torch.int64, device=dev)
        self.eos_id = spec.eos_id
        self.stream = torch.cuda.Stream()
        self.events: list[tuple[Step, object, object]] = []
        self._admitted: set = set()
        if len(spec.system_prompt):
            n = len(spec.system_prompt)
            self.model.extend(torch.tensor(spec.system_prompt, device=dev), [0], [0], [n],
                              torch.from_numpy(spec.system_slots).to(dev))
        torch.cuda.synchronize()
        self.origin = None

    def set_origin(self) -> None:
        """Anchor device event times to the host clock (call when the run starts)."""
        t = self.torch
        t.cuda.synchronize()
        ev = t.cuda.Event(enable_timing=True)
        host = clock()
        ev.record(self.stream)
        ev.synchronize()
        self.origin = (host, ev)

    def _h2d(self, a) -> object:
        return self.torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).pin_memory().to(self.dev, non_blocking=True)

    def _script(self, slots, toks):
        t = self.torch
        self.produced[slots] += 1
        eos = self.produced[slots] == self.slot_eos[slots]
        toks = t.where(toks == self.eos_id, t.full_like(toks, self.eos_id + 1), toks)
        return t.where(eos, t.full_like(toks, self.eos_id), toks)

    def launch(self, step: Step, inputs, future: bool) -> None:
        """Queue the step on the forward stream (returns once queued)."""
        t, m = self.torch, self.model
        start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        with t.cuda.stream(self.stream):
            start.record(self.stream)
            slots = self._h2d(inputs.slots)
            if step.kind == "decode":
                ids = self.tokens[slots] if future else self._h2d(inputs.input_ids)
                toks = m.decode(ids, slots, self._h2d(inputs.positions), self._h2d(inputs.out_cache_loc),
                                int(inputs.positions.max()) + 1)
                done = slots
            else:
                for req, slot in zip(step.batch.reqs, inputs.slots.tolist()):
                    if req.rid not in self._admitted:
                        self._admitted.add(req.rid)
                        self.slot_eos[slot] = self.eos_at[req.rid]
                        self.produced[slot] = 0
                toks = m.extend(self._h2d(inputs.input_ids), inputs.slots.tolist(), inputs.prefix_lens,
                                inputs.extend_lens, self._h2d(inputs.out_cache_loc),
                                [self._h2d(p) for p in inputs.prefix_indices])
                keep = t.tensor(step.batch.is_last, device=self.dev)
                done = slots[keep]
                toks = toks.clone()
                toks[keep] = self._script(done, toks[keep])
            if step.kind == "decode":
                toks = self._script(done, toks)
            self.tokens[done] = toks if step.kind == "decode" else toks[keep]
            host = t.empty(len(toks), dtype=t.int64, pin_memory=True)
            host.copy_(toks, non_blocking=True)
            end.record(self.stream)
        step.handle = (host, end)
        self.events.append((step, start, end))

    def wait(self, step: Step) -> list[int]:
        """``copy_done.synchronize()``, then the tokens."""
        host, end = step.handle
        step.handle = None
        end.synchronize()
        return host.tolist()

    def finish(self) -> dict:
        """Put every step's forward on the host clock."""
        self.torch.cuda.synchronize()
        host0, ev0 = self.origin
        for step, start, end in self.events:
            # the stream may start on the input copies while the host still queues kernels: the
            # simulator's forward starts when its launch is queued, so the trace does too
            step.forward_start = max(host0 + ev0.elapsed_time(start) / 1e3, step.launch_end)
            step.forward_end = host0 + ev0.elapsed_time(end) / 1e3
        return {"device": self.torch.cuda.get_device_name(self.dev)}
