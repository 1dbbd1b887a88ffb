"""The device stream: forwards run in launch order, one at a time.

A CUDA stream (and MLX's stream) executes work in the order it was enqueued; a forward starts
when it has been launched and the previous forward has ended. Because nothing preempts a
forward, its start and end are known the moment it is launched: the stream computes them
then, and the CPU side waits on them (``copy_done.synchronize()``) with a SimPy timeout. This
gives the same timeline as a SimPy process per forward at a fraction of the events.
"""

from __future__ import annotations

from sim.model.batch import Batch


class DeviceStream:
    """One in-order device stream. ``busy_until`` is when the last enqueued forward ends (s)."""

    def __init__(self) -> None:
        self.busy_until = 0.0

    def enqueue(self, batch: Batch, ready_s: float, duration_s: float) -> None:
        """Enqueue ``batch``'s forward, launched at ``ready_s``, taking ``duration_s`` on the device;
        sets ``batch.forward_start`` and ``batch.forward_end``."""
        start = ready_s if ready_s > self.busy_until else self.busy_until
        batch.forward_start = start
        batch.forward_end = self.busy_until = start + duration_s

    def enqueue_eager(self, batch: Batch, first_kernel_s: float, last_kernel_s: float, duration_s: float) -> None:
        """Enqueue a forward whose kernels are launched one by one from ``first_kernel_s`` to
        ``last_kernel_s`` (an eager CUDA prefill), which the device runs as they come: it may start
        at the first, after the previous forward, and ends no earlier than the last; its
        ``duration_s`` of device time are placed last in that window (``forward_start`` its end
        less them: the device's wait on the launch before it is idle time). Sets
        ``batch.forward_start`` and ``batch.forward_end``."""
        self.enqueue(batch, first_kernel_s, duration_s)
        if batch.forward_end < last_kernel_s:
            batch.forward_end = self.busy_until = last_kernel_s
            batch.forward_start = last_kernel_s - duration_s

    def hold(self, batch: Batch, until_s: float) -> None:
        """``batch``'s sampling waits for the host until ``until_s`` (SGLang's grammar mask,
        :mod:`sim.engines.sglang.structured`): its result is ready no earlier
        (``batch.mask_end``), and the stream runs nothing after it before then. Only for the
        last batch enqueued."""
        batch.mask_end = until_s
        if until_s > self.busy_until:
            self.busy_until = until_s

    @staticmethod
    def wait_s(batch: Batch, now: float) -> float:
        """How long a host that synchronizes on ``batch`` at ``now`` blocks (s, >= 0)."""
        return batch.forward_end - now if batch.forward_end > now else 0.0
