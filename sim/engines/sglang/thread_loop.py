"""``thread_overlap``: SGLang's overlap loop before October 2025 (0.5.3 and earlier), where a
forward thread (``TpModelWorkerClient``) launched the kernels and both threads shared the GIL.

Source (sglang 0.5.3 wheel): ``Scheduler.event_loop_overlap`` and
``managers/tp_worker_overlap_thread.py``. The scheduler thread schedules batch k, puts it on
the forward thread's input queue and, to process batch k-1, calls
``resolve_last_batch_result``: it blocks on the output queue (k-1's result), on
``launch_done`` of batch k (the blocking wait on launch completion) and on k-1's
``copy_done``; then it processes k-1 and goes on to schedule k+1, all Python, holding the GIL.
The forward thread takes a batch, launches the forward op by op (each op takes the GIL for its
Python part and releases it for its device/compute part), sets ``launch_done``, then launches
sampling and the device-to-host copy (Python again) and puts the result on the output queue.
PR #11210 replaced this with two CUDA streams in one thread (:func:`sim.engines.sglang.loops.overlap_loop`).

Parameters (``costs.gil``): ``switch_interval`` (CPython's 5 ms), ``ops_per_forward`` (GIL
acquisitions per forward), ``sample_launch`` (Python after the forward), ``sample_compute``
(the sampling op after ``launch_done``, GIL released), ``wake_latency`` (a woken thread runs
that much later: queue, event and contended GIL hand-overs). On ``server.device:
cpu`` the forward thread computes each op itself (torch releases the GIL inside the op), so
op i+1 starts after op i's compute; on an accelerator the ops are only enqueued.
``wait_launch_done: false`` drops the wait on the current batch's launch (a worker-thread loop
that processes k-1 while k runs). Left out: ``sampling_info_done`` (the forward thread waits
for it only for grammar-constrained requests).
"""

from __future__ import annotations

from collections import deque

from sim.engines.sglang.gil import GIL
from sim.engines.sglang.phases import Phases
from sim.model.batch import Batch

MAIN, FORWARD = "scheduler", "forward"


class ForwardThread:
    """The forward thread (``TpModelWorkerClient.forward_thread_func_``) as a SimPy process."""

    def __init__(self, env, p: Phases, gil: GIL, ops: int, sample_launch_s: float, synchronous: bool,
                 sample_compute_s: float = 0.0, wake_latency_s: float = 0.0):
        self.env = env
        self.p = p
        self.gil = gil
        self.ops = max(1, ops)
        self.sample_launch_s = sample_launch_s
        self.sample_compute_s = sample_compute_s
        self.wake_latency_s = wake_latency_s
        self.synchronous = synchronous
        self._queue: deque[Batch] = deque()
        self._wake = None
        self._launch_done: dict[int, object] = {}
        self._result: dict[int, object] = {}

    def submit(self, batch: Batch) -> None:
        """``input_queue.put``: the scheduler hands over a batch."""
        self._launch_done[batch.seq] = self.env.event()
        self._result[batch.seq] = self.env.event()
        self._queue.append(batch)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def launch_done(self, batch: Batch):
        """Event: the forward of ``batch`` has been launched (``launch_done.set()``)."""
        return self._launch_done[batch.seq]

    def take_result(self, batch: Batch):
        """``output_queue.get()``: a generator that waits for ``batch``'s result and drops the
        thread's bookkeeping of it."""
        yield from self.wait(self._result[batch.seq])
        del self._result[batch.seq], self._launch_done[batch.seq]

    def wait(self, event):
        """Block on ``event`` (a queue or threading event); a thread that had to sleep runs
        ``wake_latency`` after the event fires."""
        if event.triggered:
            return
        yield event
        if self.wake_latency_s > 0:
            yield self.env.timeout(self.wake_latency_s)

    def run(self):
        env, p, gil = self.env, self.p, self.gil
        while True:
            if not self._queue:
                self._wake = env.event()
                yield from self.wait(self._wake)
                continue
            batch = self._queue.popleft()
            k, n, tok, ctx = batch.kind, batch.num_reqs, batch.num_tokens, batch.sum_ctx
            launch = p.costs.launch_s(k, n, tok, ctx) * p.cpu_jitter()
            device = p.costs.forward_s(k, n, tok, ctx, batch.attn_pairs) * p.gpu_jitter() + p.forward_extra_s
            batch.launch_start = env.now
            for _ in range(self.ops):
                yield from gil.run(FORWARD, launch / self.ops)  # the op's Python part
                gil.release(FORWARD)  # the op releases the GIL for its device/compute part
                p.stream.enqueue(batch, env.now, device / self.ops)
                if self.synchronous:  # CPU: this thread computes the op itself
                    yield env.timeout(batch.forward_end - env.now)
            batch.forward_start = batch.forward_end - device  # busy time; GIL stalls show as gaps
            batch.launch_end = env.now
            self._launch_done[batch.seq].succeed()
            if self.sample_compute_s > 0:  # the sampling op, GIL released: the woken scheduler may take it
                yield env.timeout(self.sample_compute_s)
            yield from gil.run(FORWARD, self.sample_launch_s)  # future map, D2H copy launch, queue put
            gil.release(FORWARD)  # blocks on the input queue
            self._result[batch.seq].succeed()


def thread_overlap_loop(env, p: Phases, server):
    """``event_loop_overlap`` with the forward thread: schedule k and hand it over, then wait
    for k-1's result, k's launch and k-1's copy (GIL free), then process k-1 (GIL held)."""
    sched = p.scheduler
    g = p.costs.gil
    gil = GIL(env, g.switch_interval, g.wake_latency)
    worker = ForwardThread(env, p, gil, g.ops_per_forward, g.sample_launch, server.device == "cpu",
                           g.sample_compute, g.wake_latency)
    env.process(worker.run())
    last = None
    while not sched.all_done or last is not None:
        batch, cpu = p.recv_and_schedule()
        yield from gil.run(MAIN, cpu)
        if batch is not None:
            worker.submit(batch)  # run_batch: returns future token ids at once
        if last is not None:
            last.sync_start = env.now
            gil.release(MAIN)
            yield from worker.take_result(last)  # output_queue.get()
            if batch is not None and g.wait_launch_done:
                yield from worker.wait(worker.launch_done(batch))  # launch_done.wait(): the current batch is launched
            yield env.timeout(p.result_wait_s(last, env.now))  # copy_done.synchronize()
            yield from _process(env, p, gil, last)
        elif batch is None:
            gil.release(MAIN)
            yield p.idle()
        last = batch


def _process(env, p: Phases, gil: GIL, batch: Batch):
    """``process_batch_result`` under the GIL; tokens reach the clients when it ends."""
    p.check_faults(batch)
    batch.process_start = env.now
    dur = p.costs.process_s(batch.kind, batch.num_reqs, batch.num_tokens, batch.sum_ctx) * p.cpu_jitter()
    yield from gil.run(MAIN, dur)
    batch.process_end = env.now
    p.scheduler.process_batch_result(batch, env.now)
    p.recorder.step(batch)
