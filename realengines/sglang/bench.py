"""SGLang's own benchmark client (``python -m sglang.benchmark.serving``, the 0.5.23 home of
``sglang.bench_serving``) as a session's load generator, its requests turned into
:mod:`realengines.client`'s records.

A load with ``"client": "engine"`` names the benchmark's knobs (:meth:`calibrate.real.jobs.Workload.engine_load`)::

    {"name": str, "client": "engine", "num_requests": int, "warmup_requests": int,
     "concurrency": int (0: no cap), "rate_per_s": float (0: all at once), "burstiness": 1.0,
     "input_range": [lo, hi], "output_range": [lo, hi], "seed": int}

The benchmark runs unchanged, in the engine's environment, through :func:`main` here: its own
``cli_main`` (parser and ``run_benchmark``, ``sglang/benchmark/serving.py``), the
``random-ids`` dataset (token ids in a run, decoded to text: the server tokenizes a text prompt;
``random`` would sample ShareGPT, a download), ``--backend sglang`` (the native ``/generate``,
streamed), ``--random-input-len hi --random-range-ratio lo/hi`` (SGLang draws a length uniform
on ``[int(hi * ratio), hi]``, ``datasets/common.py::compute_random_lens``; the ratio is shared by
input and output as in vLLM), ``--request-rate`` (exponential gaps: ``get_request``; 0.5.23
has no burstiness knob, so a load with ``burstiness != 1`` is refused here) and
``--max-concurrency``, ``--warmup-requests`` (the first prompt, at most 32 tokens out, awaited
before the benchmark; then a 1 s sleep), ``--seed``.

Two things the benchmark does not keep are recorded by wrapping, without changing what it sends
or when: its request function (``ASYNC_REQUEST_FUNCS["sglang"]``) gets ``rid = <name>-<i>`` in
each request's extra body (the scheduler's request id: the engine's trace names the benchmark's
requests) and hands back each request's ``RequestFuncOutput`` (``start_time``, the
``time.perf_counter`` instant just before the POST: the tracers' clock; ``ttft``; ``itl``: one
entry per token after the first, a chunk of n tokens spread as n equal gaps, the benchmark's own
rule; ``latency``; ``output_len`` and the server's ``prompt_tokens``); its arrival generator
(``get_request``) is passed through with the instant each request was drawn to go, so
``send_lag_s`` is the time from that instant to the POST. A request's token times are
``start + ttft`` then the running sum of its ``itl``. The warm-ups leave no record (as vLLM's
benchmark); the session notes their number.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from realengines.client import benchmark_load, benchmark_record
from realengines.launching import run_benchmark
from realengines.sglang.launch import environment


def range_ratio(span: list[int]) -> float:
    """SGLang's ``--random-range-ratio`` for a uniform length range ``[lo, hi]``: ``lo / hi``
    (1.0 for a fixed length). Raises ValueError for an empty or negative range."""
    lo, hi = int(span[0]), int(span[1])
    if not 0 < lo <= hi:
        raise ValueError(f"a length range 0 < lo <= hi, not {span}")
    return lo / hi


def command(load: dict, url: str, model_dir: str, out_file: Path) -> list[str]:
    """The argv that runs ``sglang.benchmark.serving`` for ``load`` through :func:`main`.

    Raises:
        ValueError: the load asks for gamma arrivals (``burstiness != 1``), which SGLang 0.5.23's
            benchmark cannot draw, or its input and output ranges have different ratios.
    """
    if float(load.get("burstiness", 1.0)) != 1.0:
        raise ValueError(f"{load['name']}: sglang.benchmark.serving (0.5.23) draws only Poisson arrivals "
                         "(no --burstiness); send this load with the own client")
    ratio = range_ratio(load["input_range"])
    if abs(ratio - range_ratio(load["output_range"])) > 1e-9:
        raise ValueError(f"{load['name']}: one --random-range-ratio for input {load['input_range']} "
                         f"and output {load['output_range']}")
    argv = [sys.executable, "-m", "realengines.sglang.bench", str(out_file), load["name"],
            "--backend", "sglang", "--base-url", url, "--model", model_dir, "--tokenizer", model_dir,
            "--dataset-name", "random-ids", "--random-input-len", str(int(load["input_range"][1])),
            "--random-output-len", str(int(load["output_range"][1])), "--random-range-ratio", repr(ratio),
            "--num-prompts", str(int(load["num_requests"])),
            "--warmup-requests", str(int(load.get("warmup_requests", 0))),
            "--seed", str(int(load.get("seed", 0))), "--disable-tqdm",
            "--output-file", str(out_file.with_suffix(".jsonl"))]
    rate = float(load.get("rate_per_s") or 0.0)
    if rate > 0:
        argv += ["--request-rate", repr(rate)]
    if int(load.get("concurrency") or 0) > 0:
        argv += ["--max-concurrency", str(int(load["concurrency"]))]
    return argv


def record(name: str, i: int, out: dict) -> dict:
    """One request's record (:func:`realengines.client.benchmark_record`) from what the wrapper
    kept of its ``RequestFuncOutput``: ``{"start_time", "drawn_s", "success", "error", "ttft",
    "itl", "latency", "output_len", "prompt_len"}`` (seconds, ``time.perf_counter``)."""
    send = float(out["start_time"])
    lag = max(0.0, send - float(out["drawn_s"])) if out.get("drawn_s") is not None else None
    return benchmark_record(f"{name}-{i}", send, float(out.get("ttft") or 0.0), out.get("itl") or [],
                            float(out.get("latency") or 0.0), int(out.get("output_len") or 0),
                            "" if out.get("success") else (out.get("error") or "failed"),
                            int(out.get("prompt_len") or 0), lag)


def records(kept: list[dict], name: str) -> dict:
    """The wrapper's kept outputs (measured requests, in the order they were sent) as the
    client's load records."""
    return benchmark_load([record(name, i, out) for i, out in enumerate(kept)], "sglang.benchmark.serving")


def run(load: dict, url: str, model_dir: str, out_dir: Path, served_model_name: str = "") -> dict:
    """Run the benchmark for ``load``; what it kept is ``<name>.bench.json`` in ``out_dir``, its
    own result line ``<name>.bench.jsonl`` and its output ``<name>.bench.log``.

    Raises:
        RuntimeError: the benchmark failed (the message quotes the end of its output).
    """
    out_file = out_dir / f"{load['name']}.bench.json"
    log = out_dir / f"{load['name']}.bench.log"
    # the server's shims (the CPU stubs: sglang's modules import torchvision), no tracer
    run_benchmark(command(load, url, model_dir, out_file), out_file, log,
                  f"sglang.benchmark.serving for load {load['name']}", env=environment(None))
    out = records(json.loads(out_file.read_text()), load["name"])
    out["warmup_requests"] = int(load.get("warmup_requests", 0))
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m realengines.sglang.bench OUT.json NAME <sglang.benchmark.serving args>``, in
    SGLang's environment: the benchmark's own ``cli_main`` parsing and run, wrapped as the module
    docstring says; OUT.json receives the measured requests' outputs in the order they were sent."""
    from sglang.benchmark import serving

    argv = sys.argv[1:] if argv is None else argv
    out_file, name, bench_argv = Path(argv[0]), argv[1], argv[2:]
    drawn: list[float] = []  # instant the generator let request j go, in yield order
    kept: list[dict] = []
    original_get, original_send = serving.get_request, serving.ASYNC_REQUEST_FUNCS["sglang"]

    async def get_request(*args, **kwargs):
        async for row in original_get(*args, **kwargs):
            drawn.append(time.perf_counter())
            yield row

    async def send(request_func_input, pbar=None):
        if not drawn:  # the warm-up runs before the generator's first request
            return await original_send(request_func_input, pbar=pbar)
        i = len(kept)
        kept.append({"drawn_s": drawn[i] if i < len(drawn) else None})
        request_func_input.extra_request_body = {**request_func_input.extra_request_body, "rid": f"{name}-{i}"}
        out = await original_send(request_func_input, pbar=pbar)
        kept[i].update(start_time=out.start_time, success=bool(out.success), error=out.error, ttft=out.ttft,
                       itl=list(out.itl), latency=out.latency, output_len=out.output_len, prompt_len=out.prompt_len)
        return out

    serving.get_request = get_request
    serving.ASYNC_REQUEST_FUNCS["sglang"] = send
    sys.argv = ["sglang.benchmark.serving", *bench_argv]  # its own parser reads them
    serving.cli_main()
    out_file.write_text(json.dumps(kept))


if __name__ == "__main__":
    main()
