"""Run SGLang 0.5.23's real ``Scheduler`` in-process, its own event loop included, on a given
request list, and record every phase and every batch decision.

    python -m realengines.sglang.drive JOB.json OUT.jsonl

The scheduler is built as ``run_scheduler_process`` builds it (``scheduler.py``: ``publish``,
``configure_scheduler_process``, ``Scheduler(server_args, port_args)``) and runs its real
``event_loop_normal`` or ``event_loop_overlap`` (``run_event_loop``). Requests enter where the
tokenizer's would: the request receiver's ``_pull_raw_reqs`` polls its real ZMQ socket (empty)
and then hands over the job's requests that are due, as ``TokenizedGenerateReqInput`` objects;
everything after that is SGLang's code. Arrivals are logical, not timed: ``closed`` keeps
``concurrency`` requests in flight (a request is sent at the first receive after one
finishes), ``at_iter`` sends each request at a given loop iteration, ``waves`` sends the next
group of requests once everything sent before has finished and nothing is in flight. The loop ends when every
request has finished and nothing is in flight (the scheduler's own ``gracefully_exit``).

JOB (JSON)::

    {"model_dir": str, "overlap": bool, "server_args": [extra launch flags],
     "arrival": {"kind": "closed", "concurrency": int} | {"kind": "at_iter", "iters": [int per request]}
                | {"kind": "waves", "waves": [[rid, ...], ...]} (the requests, listed wave by wave),
     "requests": [{"rid": str, "input_ids": [int], "max_new_tokens": int, "ignore_eos": bool,
                   "stop_token_ids": [int] (optional), "stop": [str] (optional),
                   "temperature": float (default 0: greedy), "sampling_seed": int (optional),
                   "stream": bool (default true),
                   "json_schema": object (optional: the request's output is constrained to this JSON
                                  schema, ``SamplingParams.json_schema``; the server's grammar backend)}],
     "wait_before_process_s": float (optional: a blocking sleep after each sampling, before the
                                     result is processed, as a GPU host blocks on its copy),
     "stub_forward": bool (optional: the model's forward replaced by a stub, :func:`_stub_forward`),
     "stub_touch_bytes": int (optional, with stub_forward: the stub also reads this many bytes, as a
                              CPU forward streams its weights through the host's caches)}

Requests stream by default, as every client of a server does (``bench_serving``, ``vllm bench
serve``, this project's): ``process_batch_result`` then sends each step's new tokens of every
streaming request to the detokenizer (``stream_output``, ``scheduler_output_processor_mixin.py``),
a per-step cost of the loop. Non-streaming requests (what this driver sent until 4 December 2026)
send only when they finish: in the held-out validation's server sessions that step's
``process`` phase took 0.28-0.58 ms against 0.15-0.36 ms in the non-streaming calibration at the
same batch sizes (``docs/real-engines.md``).

OUT (JSON lines): ``{"kind": "meta", ...}`` (versions, the scheduler's resolved limits), then
the tracer's phase records (:mod:`realengines.sglang.tracer`) interleaved with one
``{"ph": "iter", "k", "t0", "sent": [rids], "hook_s"}`` record per receive (``hook_s``: the
driver's own time inside that receive, to subtract), then one ``{"kind": "req", "rid",
"output_ids", "finish"}`` record per request.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import sys
import time
from array import array

def build_scheduler(model_dir: str, overlap: bool, extra_args: list[str]):
    """A real Scheduler, constructed as ``run_scheduler_process`` does (TP rank 0, one GPU id 0)."""
    from sglang.srt.managers import scheduler as S
    from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank
    from sglang.srt.server_args import PortArgs, prepare_server_args

    from realengines.sglang.launch import ENGINE_ARGS

    argv = ["--model-path", model_dir, *ENGINE_ARGS, *extra_args]
    if not overlap:
        argv.append("--disable-overlap-schedule")
    server_args = prepare_server_args(argv)
    port_args = PortArgs.init_new(server_args)
    publish(server_args, role="scheduler",
            ranks=SpawnRanks(world_rank=spawn_world_rank(server_args, tp_rank=0, pp_rank=0), dp_rank=None, gpu_id=0))
    S.configure_scheduler_process(server_args, 0)
    return S.Scheduler(server_args, port_args)


def make_request(spec: dict, tokenizer):
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=int(spec["max_new_tokens"]), temperature=float(spec.get("temperature", 0.0)),
                            ignore_eos=bool(spec.get("ignore_eos", True)), sampling_seed=spec.get("sampling_seed"),
                            stop_token_ids=set(spec["stop_token_ids"]) if spec.get("stop_token_ids") else None,
                            stop=spec.get("stop") or None,
                            json_schema=json.dumps(spec["json_schema"]) if spec.get("json_schema") else None)
    params.normalize(tokenizer)
    return TokenizedGenerateReqInput(
        rid=str(spec["rid"]), input_text=None, input_ids=array("q", spec["input_ids"]), input_embeds=None,
        mm_inputs=None, token_type_ids=None, sampling_params=params, return_logprob=False, logprob_start_len=-1,
        top_logprobs_num=0, token_ids_logprob=None, stream=bool(spec.get("stream", True)))


class Client:
    """Hands the job's requests to the scheduler's receiver, in logical order, and stops the
    loop when all have finished. Every call of :meth:`pull` is one receive of the event loop."""

    def __init__(self, scheduler, job: dict, sink):
        self.s = scheduler
        self.sink = sink
        self.specs = job["requests"]
        self.pending = [make_request(spec, scheduler.tokenizer) for spec in self.specs]
        arrival = job["arrival"]
        self.kind = arrival["kind"]
        self.concurrency = int(arrival.get("concurrency", 0))
        self.at_iter = list(arrival.get("iters", []))
        self.waves = [len(g) for g in arrival.get("waves", [])]  # requests are listed wave by wave
        self.wave_ends = list(itertools.accumulate(self.waves))
        self.next = 0  # index of the next request to send
        self.sent: dict[str, object] = {}  # rid -> Req (once seen in the scheduler)
        self.unseen: list[str] = []
        self.done: set[str] = set()
        self.k = 0
        # a safety stop: a run that never drains (a request the engine never finishes) must not
        # grow the trace without bound; the output's iteration count shows it was hit
        self.max_iters = int(job.get("max_iters", 200_000))
        receiver = scheduler.request_receiver
        original = type(receiver)._pull_raw_reqs
        self.real_pull = lambda: original(receiver)
        type(receiver)._pull_raw_reqs = lambda _receiver: self.pull()  # a slotted class: patch the type

    def pull(self):
        raw = self.real_pull()  # the real, empty, ZMQ poll
        t0 = time.perf_counter()
        self._track()
        due = self.pending[self.next:self.next + self._num_due()]
        self.next += len(due)
        for req in due:
            self.sent[req.rid] = None
            self.unseen.append(req.rid)
        finished = self.next == len(self.pending) and len(self.done) == len(self.pending) and self.s.last_batch is None
        if finished or self.k >= self.max_iters:
            self.s.gracefully_exit = True
        self.sink.add({"ph": "iter", "k": self.k, "t0": t0, "sent": [r.rid for r in due],
                       "hook_s": time.perf_counter() - t0})
        self.k += 1
        return (raw or []) + due

    def _num_due(self) -> int:
        in_flight = len(self.sent) - len(self.done)
        if self.kind == "closed":
            return max(0, self.concurrency - in_flight)
        if self.kind == "at_iter":
            n = 0
            while self.next + n < len(self.pending) and self.at_iter[self.next + n] <= self.k:
                n += 1
            return n
        if in_flight or self.s.last_batch is not None:  # waves: the next one once all is done
            return 0
        wave = bisect.bisect_right(self.wave_ends, self.next)  # waves sent so far
        return self.waves[wave] if wave < len(self.waves) else 0

    def _track(self) -> None:
        if self.unseen:
            s = self.s
            places = [s.waiting_queue, s.running_batch.reqs if s.running_batch else [],
                      s.last_batch.reqs if s.last_batch else [], [s.chunked_req] if s.chunked_req else []]
            for reqs in places:
                for req in reqs or ():
                    if req.rid in self.sent and self.sent[req.rid] is None:
                        self.sent[req.rid] = req
            self.unseen = [rid for rid in self.unseen if self.sent[rid] is None]
        for rid, req in self.sent.items():
            if req is not None and rid not in self.done and req.finished():
                self.done.add(rid)


def _wait_after_sample(wait_s: float):
    from sglang.srt.model_executor import model_runner

    original = model_runner.ModelRunner.sample

    def sample(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        time.sleep(wait_s)
        return out

    model_runner.ModelRunner.sample = sample


def _stub_forward(touch_bytes: int = 0):
    """Replace the model's forward by a stub that returns well-formed outputs at once: every host
    function of the scheduler (receive, ``get_next_batch_to_run``, ``run_batch`` with its
    ``ForwardBatch`` building, ``ModelRunner.forward``'s own wrapper, the real sampler,
    ``process_batch_result``) runs as in a server, on any batch size and context, with no model
    compute.

    What is replaced: ``ModelRunner._forward_raw`` (``srt/model_executor/model_runner.py``,
    0.5.23), the part of ``ModelRunner.forward`` that runs the model (graph replay or the eager
    runner, and the attention backend's ``init_forward_metadata`` inside it). The stub returns
    ``ModelRunnerOutput(logits_output=LogitsProcessorOutput(next_token_logits=zeros[rows,
    vocab]))``, one row per request (decode, and a prefill without logprobs: its last token), as
    the logits processor does. The greedy sampler then picks token 0 for every request: the
    requests must stop by length (``ignore_eos``), as the calibration's do. SGLang's own
    ``tools/sglang-simulator`` replaces the forward at the same place.

    What it cannot see: the KV writes and cache pollution of a real forward (the host phases
    after it run on a warmer cache here), the attention backend's metadata planning (FlashInfer
    plans on the host; the CPU engine's torch_native backend does nothing there), and the wait
    for the device, which the simulator prices from the device curves. ``touch_bytes`` > 0 makes
    the stub read a buffer of that size (a sum over it) before it returns: the cache pollution of
    a forward that runs on the host's CPU (the CPU engine), to measure how much of the host phases'
    cost is that (docs/real-engines.md).
    """
    import torch
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.model_executor import model_runner

    buffer = torch.ones(max(int(touch_bytes) // 4, 1), dtype=torch.float32)

    def forward_raw(self, forward_batch, *args, **kwargs):
        if touch_bytes:
            buffer.sum()
        logits = torch.zeros((forward_batch.batch_size, self.model_config.vocab_size), dtype=torch.float32)
        return model_runner.ModelRunnerOutput(logits_output=LogitsProcessorOutput(next_token_logits=logits),
                                              can_run_graph=False)

    model_runner.ModelRunner._forward_raw = forward_raw


def _meta(s, job: dict, init_s: float) -> dict:
    import sglang
    import torch

    def attr(name):
        value = getattr(s, name, None)
        return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)

    return {"kind": "meta", "engine": "sglang", "sglang": sglang.__version__, "torch": torch.__version__,
            "python": sys.version.split()[0], "overlap": bool(s.enable_overlap), "init_s": init_s,
            "limits": {**{n: attr(n) for n in ("max_running_requests", "max_total_num_tokens", "chunked_prefill_size",
                                               "page_size", "max_prefill_tokens", "max_req_len", "max_req_input_len")},
                       "init_new_token_ratio": getattr(getattr(s, "new_token_ratio_tracker", None), "init", None)},
            "server_args": job.get("server_args", []), "torch_threads": torch.get_num_threads(),
            "stub_forward": bool(job.get("stub_forward"))}


def run(job: dict, out_path: str) -> None:
    from realengines.sglang import tracer

    if job.get("stub_forward"):
        # no model runs, so a context past the tiny model's max_position_embeddings (4096) is
        # only bookkeeping: let SGLang accept it (model_config.py's own override switch)
        os.environ["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"
    t = time.perf_counter()
    scheduler = build_scheduler(job["model_dir"], bool(job.get("overlap")), list(job.get("server_args", [])))
    init_s = time.perf_counter() - t
    if job.get("stub_forward"):
        _stub_forward(int(job.get("stub_touch_bytes", 0)))
    if job.get("wait_before_process_s"):
        _wait_after_sample(float(job["wait_before_process_s"]))
    sink = tracer.ListSink()
    tracer.install(sink)
    client = Client(scheduler, job, sink)  # receives through it from now on
    scheduler.run_event_loop()
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(_meta(scheduler, job, init_s)) + "\n")
        for rec in sink.records:
            f.write(json.dumps(rec) + "\n")
        for rid, req in client.sent.items():
            f.write(json.dumps({"kind": "req", "rid": rid, "output_ids": list(req.output_ids) if req else [],
                                "finish": type(getattr(req, "finished_reason", None)).__name__}) + "\n")
    os.replace(tmp, out_path)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        sys.exit("usage: python -m realengines.sglang.drive JOB.json OUT.jsonl")
    with open(argv[0]) as f:
        job = json.load(f)
    run(job, argv[1])


if __name__ == "__main__":
    main()
