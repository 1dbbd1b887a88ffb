"""The harness scheduler's state and its CPU phases (recv, schedule, launch, sync, process) over
the real bookkeeping (:class:`calibrate.bookkeeping.bookkeeper.Bookkeeper`), with the simulator's policy.

Policy (as :class:`sim.engines.sglang.policy.scheduler.Scheduler`, from SGLang's ``get_next_batch_to_run``): prefill
first (FCFS, chunked at ``chunked_prefill_size`` tokens, while the running batch plus the new
requests stay under ``max_running_requests``), otherwise one decode of the whole running
batch; under ``overlap`` the decode leaves out requests whose in-flight tokens reach their
length limit (SGLang 0.5.22). The KV pool is sized so that admission never waits (see
:meth:`calibrate.harness.config.HarnessConfig.kv_pool_tokens`).

Each phase stamps the step's timeline with :data:`calibrate.harness.trace.clock`. A device
object (torch process, MLX, CUDA streams) provides ``launch(step, inputs, future)`` and
``wait(step) -> tokens`` (which also stamps the forward's start and end, or the device does
it after the run).
"""

from __future__ import annotations

import numpy as np

from calibrate.bookkeeping.bookkeeper import Bookkeeper, DecodeBatch
from calibrate.harness.config import EOS_SLACK, HarnessConfig
from calibrate.harness.trace import Step, TraceRecorder, clock
from calibrate.harness.workload import ClosedLoopClients, Workload


class ServingStalled(RuntimeError):
    """Nothing can run and nothing is in flight, yet requests remain (a harness bug)."""


class Serving:
    """Scheduler state of one run.

    Args:
        cfg: the configuration. workload: its requests. tokenizer: the detokenizer's.
        exclude_finishing: apply SGLang 0.5.22's exclusion of requests finishing in the
            in-flight batch (``overlap`` only, as the simulator's ``lookahead_policy``).
    """

    def __init__(self, cfg: HarnessConfig, workload: Workload, tokenizer, exclude_finishing: bool):
        self.cfg = cfg
        self.workload = workload
        max_ctx = int(workload.input_len.max() + workload.output_len.max()) + EOS_SLACK + 2
        self.max_reqs = cfg.max_running_requests + 2
        self.bk = Bookkeeper(tokenizer, kv_tokens=cfg.kv_pool_tokens(), max_reqs=self.max_reqs, max_ctx=max_ctx)
        self.max_ctx = max_ctx
        self.system_slots = self._cache_system_prompt(workload.system_prompt)
        self.exclude = exclude_finishing
        self.clients = ClosedLoopClients(workload, cfg.concurrency)
        self.recorder: TraceRecorder | None = None
        self.num_done = 0
        self._seq = 0
        self._recv_start = 0.0

    def _cache_system_prompt(self, system: list[int]) -> np.ndarray:
        # the shared prefix is resident in the radix cache before the first request (the
        # simulator's assumption); its KV is computed by the device before the run
        if not system:
            return np.empty(0, dtype=np.int64)
        loc = self.bk.alloc_tokens(len(system))
        self.bk.tree.insert(system, loc.copy())
        return loc

    def start(self) -> None:
        """Start the clock and the clients (call right before the loop)."""
        t0 = clock()
        self.recorder = TraceRecorder(t0, len(self.workload), self.cfg.warmup_requests)
        self.clients.start(t0)

    @property
    def done(self) -> bool:
        return self.num_done >= len(self.workload)

    @property
    def has_queued_work(self) -> bool:
        return bool(self.bk.waiting) or self.bk.chunked_req is not None

    # --- phases ------------------------------------------------------------------------------
    def recv(self) -> None:
        """``recv_requests`` + ``process_input_requests``."""
        self._recv_start = clock()
        self.bk.recv(self.clients.drain())

    def schedule(self) -> Step | None:
        """``get_next_batch_to_run``: a prefill if one fits, else a decode of the running batch."""
        t = clock()
        bk, cfg = self.bk, self.cfg
        batch = bk.schedule_extend(cfg.max_running_requests, cfg.chunked_prefill_size)
        kind = "extend"
        if batch is None:
            batch = bk.schedule_decode(self.exclude)
            kind = "decode"
        end = clock()
        if batch is None:
            return None
        step = Step(self._seq, kind, batch, len(batch.reqs), 0, 0, 0, len(bk.running),
                    len(bk.waiting) + (bk.chunked_req is not None), bk.kv.size - len(bk.kv.free_slots),
                    recv_start=self._recv_start, schedule_start=t, schedule_end=end)
        self._seq += 1
        return step

    def recv_and_schedule(self) -> Step | None:
        self.recv()
        return self.schedule()

    def launch(self, step: Step, device, future: bool) -> None:
        """The CPU part of ``run_batch``: the batch's host arrays, then the device's launch.
        ``future``: decode inputs come from the device's token buffer (FutureMap)."""
        step.launch_start = clock()
        batch = step.batch
        inputs = Bookkeeper.decode_inputs(batch) if step.kind == "decode" else Bookkeeper.extend_inputs(batch)
        end = device.launch(step, inputs, future)  # a device whose submission may block says when the CPU part ended
        step.launch_end = clock() if end is None else end

    def sync(self, step: Step, device) -> None:
        """Block until ``step``'s tokens are on the host (``copy_done.synchronize()``)."""
        step.sync_start = clock()
        step.tokens = device.wait(step)

    def process(self, step: Step) -> None:
        """``process_batch_result``: deliver the tokens; finished requests' clients send their
        next request at the end of the phase."""
        batch, bk = step.batch, self.bk
        if step.kind == "decode":
            got = [r.rid for r in batch.reqs if r.finished_reason is None]
            step.process_start = clock()
            finished = bk.process_decode(batch, step.tokens)
        else:
            last = batch.is_last
            got = [r.rid for r, is_last in zip(batch.reqs, last) if is_last]
            step.process_start = clock()
            finished = bk.process_extend(batch, step.tokens)
        t = step.process_end = clock()
        for _ in finished:
            self.clients.send(t)
        self.num_done += len(finished)
        step.finished = len(finished)
        step.overshoot = len(batch.reqs) - len(got) if step.kind == "decode" else 0
        self.recorder.processed(step, got, [r.rid for r in finished], t)

    def stalled(self) -> None:
        """Nothing to run and nothing in flight: with closed-loop clients this cannot happen
        before the end (every finish sends a request)."""
        raise ServingStalled(f"nothing to schedule with {len(self.workload) - self.num_done} requests left "
                             f"(waiting {len(self.bk.waiting)}, running {len(self.bk.running)})")

    def finish_steps(self) -> None:
        """Fill in each step's sizes from its batch (after the run: no cost inside the loop)."""
        warm = self.cfg.warmup_requests
        for step in self.recorder.steps:
            b = step.batch
            step.num_warmup = sum(r.rid < warm for r in b.reqs)
            if isinstance(b, DecodeBatch):
                step.num_tokens = len(b.reqs)
                step.sum_ctx = int(b.positions.sum()) + len(b.reqs)
            else:
                step.num_tokens = int(sum(b.extend_lens))
                step.sum_ctx = int(sum(b.prefix_lens)) + step.num_tokens
            step.batch = None
