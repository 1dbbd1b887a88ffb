"""The harness's event loops over :class:`calibrate.harness.serving.Serving` and a device.

They read as the simulator's loops (:mod:`sim.engines.sglang.loops`), phase for phase; only the device differs
(a torch device process, MLX's lazy evaluation, CUDA streams). ``thread_overlap`` is in
:mod:`calibrate.harness.thread_loop`.
"""

from __future__ import annotations

from calibrate.harness.serving import Serving


def normal_loop(s: Serving, dev) -> None:
    """``event_loop_normal``: recv -> schedule k -> launch k -> wait for k -> process k."""
    while not s.done:
        step = s.recv_and_schedule()
        if step is None:
            s.stalled()
        s.launch(step, dev, future=False)
        s.sync(step, dev)
        s.process(step)


def overlap_loop(s: Serving, dev) -> None:
    """``event_loop_overlap``: recv -> schedule k (state as of k-2) -> launch k (its decode
    inputs read from the device's token buffer) -> wait for k-1 -> process k-1 while the device
    runs k. A request finishing by length in k-1 is left out of k (the schedule's exclusion);
    one finishing by EOS overshoots into k, whose token for it is discarded."""
    last = None
    while not s.done or last is not None:
        step = s.recv_and_schedule()
        if step is not None:
            s.launch(step, dev, future=True)
        if last is not None:
            s.sync(last, dev)
            s.process(last)
        elif step is None:
            s.stalled()
        last = step


def overlap_mlx_loop(s: Serving, dev) -> None:
    """``event_loop_overlap_mlx``: while the step in flight is a decode, no request waits and
    none finished in the last processed step, build the next decode on the in-flight step's
    lazy tokens and queue it (``mx.async_eval``) before blocking on the in-flight one;
    otherwise block on it, process it, and schedule a fresh step next iteration."""
    inflight = None
    finished_last = False
    while not s.done or inflight is not None:
        s.recv()
        chain = inflight is not None and inflight.kind == "decode" and not finished_last and not s.has_queued_work
        step = None
        if inflight is None or chain:
            step = s.schedule()
        if step is not None:
            s.launch(step, dev, future=chain)
        if inflight is not None:
            s.sync(inflight, dev)
            s.process(inflight)
            finished_last = step is not None and inflight.finished > 0
        elif step is None:
            s.stalled()
        inflight = step


LOOPS = {"normal": normal_loop, "overlap": overlap_loop, "overlap_mlx": overlap_mlx_loop}
