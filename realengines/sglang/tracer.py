"""Time the real SGLang 0.5.23 scheduler's phases, call by call, without editing SGLang.

:func:`install` wraps these functions (``python/sglang/srt/managers/scheduler.py``,
``schedule_batch.py``, ``model_executor/model_runner.py`` of the 0.5.23 wheel) so that every call
appends one record to a sink:

==================  ==========================================  =====================================
record ``ph``       wrapped function                            what the simulator calls it
==================  ==========================================  =====================================
``recv``            ``Scheduler.ingest_requests``               recv (ZMQ drain + process_input)
``process_input``   ``Scheduler.process_input_requests``        (inside recv) building ``Req``s
``schedule``        ``Scheduler.get_next_batch_to_run``         schedule
``run_batch``       ``Scheduler.run_batch``                     launch + forward (CPU engine)
``forward``         ``ModelRunner.forward``                     (inside run_batch) the forward
``sample``          ``ModelRunner.sample``                      (inside run_batch) sampling
``process``         ``Scheduler.process_batch_result``          process
``retract``         ``ScheduleBatch.retract_decode``            (inside schedule) retraction
``mask``            ``SamplingBatchInfo.update_regex_vocab_mask``  (inside sample) the grammars' mask
``idle``            ``Scheduler.on_idle``                       nothing to run
``init``            ``Scheduler.__init__``                      (once) the process's ``tp_rank``
==================  ==========================================  =====================================

A record is ``{"ph", "t0", "dur", "cpu", ...}``: ``t0`` from ``time.perf_counter`` (the
machine's monotonic clock, comparable across processes), ``dur`` wall seconds, ``cpu`` the
calling thread's CPU seconds (``time.thread_time``). ``recv`` records carry the request ids
received (``rids``) and the type names of the control messages received with them (``other``:
``FlushCacheReqInput`` between loads, the profiler's requests); ``schedule``, ``run_batch`` and
``process`` records carry the batch (``batch``: ``iter`` (SGLang's ``forward_iter``, set by
run_batch), ``mode``, ``rids``, ``ctx`` (prompt plus output tokens, summed over the requests), ``ext`` (new
tokens per request), ``pre`` (cached prefix per request)), and
``schedule`` the queue state after it (``running``, ``waiting``, ``kv_free`` tokens available in
the KV pool plus evictable radix-cache tokens). The wrappers add about 10 us per call; the
information is gathered after the clock stops.

In the server (``OVERLAP_SIM_TRACE=PREFIX``, see shims/sitecustomize.py) the records go to
``PREFIX.<pid>.jsonl``, flushed when the scheduler goes idle and every 4096 records.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import os
import sys

from realengines import tracing
from realengines.tracing import wrap


class ListSink:
    """Keeps records in memory (the in-process driver)."""

    def __init__(self):
        self.records: list[dict] = []

    def add(self, rec: dict) -> None:
        self.records.append(rec)

    def flush(self) -> None:
        pass


class FileSink:
    """Appends records to ``{prefix}.{pid}.jsonl`` in batches (one file per process)."""

    FLUSH_EVERY = 4096

    def __init__(self, prefix: str):
        self.path = f"{prefix}.{os.getpid()}.jsonl"
        self._buf: list[dict] = []
        atexit.register(self.flush)

    def add(self, rec: dict) -> None:
        self._buf.append(rec)
        if len(self._buf) >= self.FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        if self._buf:
            with open(self.path, "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in self._buf))
            self._buf = []


def _mode(forward_mode) -> str:
    return getattr(forward_mode, "name", str(forward_mode))


def batch_info(batch) -> dict | None:
    """The composition of a ``ScheduleBatch`` (None for no batch)."""
    if batch is None:
        return None
    mode = _mode(batch.forward_mode)
    reqs = batch.reqs
    info = {"iter": getattr(batch, "forward_iter", None), "mode": mode, "rids": [r.rid for r in reqs],
            "ctx": sum(len(r.origin_input_ids) + len(r.output_ids) for r in reqs)}
    if mode in ("EXTEND", "MIXED"):
        info["ext"] = [int(x) for x in (batch.extend_lens or [])]
        info["pre"] = [int(x) for x in (batch.prefix_lens or [])]
    return info


def _kv_free(scheduler) -> int | None:
    try:
        return int(scheduler.token_to_kv_pool_allocator.available_size() + scheduler.tree_cache.evictable_size())
    except Exception:  # allocator API differs: leave it out
        return None


def _recv_info(rec, self, args, kwargs, out):
    rec["n"] = len(out) if out else 0
    if out:
        # generate requests carry a rid; control messages (the cache flush between loads,
        # profiler start/stop) do not: they are named by their type
        rec["rids"] = [r.rid for r in out if getattr(r, "rid", None) is not None]
        other = [type(r).__name__ for r in out if getattr(r, "rid", None) is None]
        if other:
            rec["other"] = other


def _input_info(rec, self, args, kwargs, out):
    reqs = args[0] if args else kwargs.get("recv_reqs", [])
    rec["n"] = len(reqs)


def _schedule_info(rec, self, args, kwargs, out):
    rec["batch"] = batch_info(getattr(out, "batch_to_run", None))
    running = getattr(out, "running_batch", None)
    rec["running"] = len(running.reqs) if running is not None and running.reqs is not None else 0
    rec["waiting"] = len(self.waiting_queue)
    rec["kv_free"] = _kv_free(self)


def _batch_arg_info(rec, self, args, kwargs, out):
    batch = args[0] if args else kwargs.get("batch")
    rec["batch"] = {"iter": getattr(batch, "forward_iter", None), "mode": _mode(batch.forward_mode),
                    "bs": len(batch.reqs)}


def _forward_info(rec, self, args, kwargs, out):
    fb = args[0] if args else kwargs.get("forward_batch")
    rec["mode"] = _mode(getattr(fb, "forward_mode", None))
    rec["bs"] = getattr(fb, "batch_size", None)


def _retract_info(rec, self, args, kwargs, out):
    retracted = out[0] if isinstance(out, tuple) else []
    rec["rids"] = [r.rid for r in retracted]


def _idle_info(sink):
    def info(rec, self, args, kwargs, out):
        sink.flush()  # nothing runs now: writing costs the scheduler nothing
    return info


def _init_info(rec, self, args, kwargs, out):
    # 0.5.23 keeps the ranks in its runtime context (``get_parallel()``), not on the scheduler
    par = None
    try:
        from sglang.srt.runtime_context import get_parallel

        par = get_parallel()
    except Exception:  # another release: the scheduler's own attributes, if any
        par = self
    for name, default in (("tp_rank", 0), ("tp_size", 1)):
        try:
            rec[name] = int(getattr(par, name))
        except Exception:  # not published in this process: the single-process default
            rec[name] = default


def patch_scheduler(module, sink) -> None:
    s = module.Scheduler
    wrap(s, "__init__", "init", sink, _init_info)  # which rank this process is (tensor parallelism)
    wrap(s, "ingest_requests", "recv", sink, _recv_info)
    wrap(s, "process_input_requests", "process_input", sink, _input_info)
    wrap(s, "get_next_batch_to_run", "schedule", sink, _schedule_info)
    wrap(s, "run_batch", "run_batch", sink, _batch_arg_info)
    wrap(s, "process_batch_result", "process", sink, _batch_arg_info)
    wrap(s, "on_idle", "idle", sink, _idle_info(sink))


def patch_schedule_batch(module, sink) -> None:
    wrap(module.ScheduleBatch, "retract_decode", "retract", sink, _retract_info)


def patch_model_runner(module, sink) -> None:
    wrap(module.ModelRunner, "forward", "forward", sink, _forward_info)
    wrap(module.ModelRunner, "sample", "sample", sink)


def _mask_info(rec, self, args, kwargs, out):
    grammars = self.grammars or ()
    rec["n"] = sum(1 for g in grammars if g and not g.finished and not g.is_terminated())
    rec["bs"] = len(self.temperatures)


def patch_sampling_info(module, sink) -> None:
    wrap(module.SamplingBatchInfo, "update_regex_vocab_mask", "mask", sink, _mask_info)


_PATCHES = {
    "sglang.srt.sampling.sampling_batch_info": patch_sampling_info,
    "sglang.srt.managers.scheduler": patch_scheduler,
    "sglang.srt.managers.schedule_batch": patch_schedule_batch,
    "sglang.srt.model_executor.model_runner": patch_model_runner,
}


def install(sink) -> None:
    """Wrap the functions of modules already imported (the in-process driver imports them first)."""
    for name, patch in _PATCHES.items():
        module = sys.modules.get(name) or importlib.import_module(name)
        patch(module, sink)


def install_on_import(sink) -> None:
    """Patch the target modules when they are first imported."""
    tracing.install_on_import({name: functools.partial(patch, sink=sink) for name, patch in _PATCHES.items()})
