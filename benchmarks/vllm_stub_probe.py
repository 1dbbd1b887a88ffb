"""vLLM 0.32's host phases at larger batches, with the model forward stubbed, in-process.

    .venvs/vllm/bin/python benchmarks/vllm_stub_probe.py OUT.json [--batch-sizes 16,64,256] [--steps 32]

(run from the repository root with the vLLM environment's python). For each batch size B, one
process builds vLLM's ``LLMEngine`` in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
``distributed_executor_backend="uni"``: engine core and worker in this process, no RPC), with
``GPUModelRunner._model_forward`` (``v1/worker/gpu_model_runner.py``) replaced by a function that
returns zero hidden states, adds B requests of 200 prompt tokens and ``--steps`` output tokens
(``ignore_eos``), and steps the engine until they finish, timing vLLM's own functions with the
project's tracer (``realengines/vllm/tracer.py``): ``Scheduler.schedule``, the worker's
``execute_model`` (its input preparation and logits: ``vllm.prepare``), ``sample_tokens``,
``Scheduler.update_from_output``. It writes the median per phase and batch size.

This is a probe, not a calibration: synchronous only (no async scheduling in-process), no RPC
(``dispatch``/``roundtrip``/``collect`` are the server's), the CPU platform's input preparation,
and warm caches (no real forward between the phases). It shows how far the vLLM profile's linear
extension beyond its measured 16 requests is from vLLM's own functions at 64 and 256.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHASES = {"schedule": "vllm.schedule", "execute": "vllm.prepare", "sample": "vllm.sample", "update": "vllm.update"}


def child(batch: int, steps: int) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    sys.path.insert(0, str(ROOT))
    from realengines import tracing
    from realengines.vllm import tracer

    recs: list[dict] = []

    class Sink:
        def add(self, rec: dict) -> None:
            recs.append(rec)

        def flush(self) -> None:
            pass

    tracing.install_on_import(tracer.tracing_patches(Sink()))
    import torch
    from vllm import EngineArgs, SamplingParams
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.worker import gpu_model_runner

    def stub(self, input_ids=None, positions=None, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        rows = (input_ids if input_ids is not None else inputs_embeds).shape[0]
        return torch.zeros((rows, self.model_config.get_hidden_size()), dtype=self.dtype)

    gpu_model_runner.GPUModelRunner._model_forward = stub
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=str(ROOT / ".venvs" / "models" / "tiny-llama"), load_format="dummy", dtype="float32", max_model_len=2048,
        max_num_seqs=max(batch, 16), max_num_batched_tokens=max(2048, 256 * batch), distributed_executor_backend="uni",
        enforce_eager=True))
    params = SamplingParams(max_tokens=steps, ignore_eos=True, temperature=0)
    for i in range(batch):
        engine.add_request(f"r{i}", {"prompt_token_ids": [3 + (i + j) % 1000 for j in range(200)]}, params)
    recs.clear()  # the steps only
    while engine.has_unfinished_requests():
        engine.step()
    # decode steps only: every request scheduled with one token
    decode = {r["t0"] for r in recs if r["ph"] == "schedule" and len(r.get("tok", [])) == batch
              and set(r["tok"]) == {1}}
    out, order = {}, sorted(recs, key=lambda r: r["t0"])
    step = None
    for r in order:
        if r["ph"] == "schedule":
            step = r["t0"] if r["t0"] in decode else None
        if step is not None and r["ph"] in PHASES:
            out.setdefault(PHASES[r["ph"]], []).append(r["dur"])
    return {name: {"median_ms": statistics.median(v) * 1e3, "steps": len(v)} for name, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, nargs="?")
    p.add_argument("--batch-sizes", default="16,64,256")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.steps)))
        return 0
    result = {"command": " ".join([".venvs/vllm/bin/python", "benchmarks/vllm_stub_probe.py", *(argv or sys.argv[1:])]),
              "by_batch": {}}
    for b in (int(x) for x in args.batch_sizes.split(",")):
        got = subprocess.run([sys.executable, __file__, "--child", str(b), "--steps", str(args.steps)],
                             capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=ROOT)
        if got.returncode != 0:
            print(got.stderr[-2000:], file=sys.stderr)
            return 1
        result["by_batch"][b] = json.loads(got.stdout.strip().splitlines()[-1])
        print(b, result["by_batch"][b], flush=True)
    profile = json.loads((ROOT / "scenarios/profiles/cpu-vllm-tiny.json").read_text())
    ext = {}
    for name in PHASES.values():  # the shipped profile's value there: its curve's linear edge extension
        c = profile["curves"][name]
        g, v = c["grid"][0], c["values_s"]
        slope = (v[-1] - v[-2]) / (g[-1] - g[-2])
        ext[name] = {b: max(v[-1] + slope * (b - g[-1]), 0.0) * 1e3 for b in result["by_batch"]}
    result["shipped_profile_ms"] = ext
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
