"""Digests of what runs give a user, to show that a speed change moves no answer (run by hand).

For a fixed family of scenarios of both engines (every setting; closed and open loop, finishes
by EOS and by length, KV pressure with retraction or preemption, noise on, prefix hits, chunked
prefill, the shipped scenarios and issue 31's open-loop workload) it runs each setting with the
steps tables and writes, per run, the summary and outcome as JSON text and a SHA-1 of each
table's CSV text (steps, requests, ITL); SGLang's runs also with ``--tables none``. Two trees
are compared by their files: equal files, equal answers.

    python benchmarks/golden_outputs.py --out /tmp/now.json
    python benchmarks/golden_outputs.py --out /tmp/before.json --tree /tmp/prev   # another checkout
    python benchmarks/golden_outputs.py --compare /tmp/before.json /tmp/now.json

``--tree DIR`` imports the simulator of another checkout (``git archive <commit> | tar -x -C
DIR``); the scenarios are this tree's. About 10 s.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = Path(sys.argv[sys.argv.index("--tree") + 1]) if "--tree" in sys.argv else ROOT
sys.path.insert(0, str(TREE))

import sim  # noqa: E402  (the tree's simulator, imported after the path is set)

INLINE_COSTS = {"gpu": {"decode": {"base": 0.004, "per_req": 1e-4, "per_ctx_token": 1e-8},
                        "prefill": {"base": 0.002, "per_token": 2e-5}},
                "cpu": {"recv": {"base": 2e-5, "per_req": 1e-5}, "schedule": {"base": 1.5e-4, "per_req": 4e-6},
                        "launch": {"base": 3e-4}, "process": {"base": 2e-4, "per_req": 1.2e-5}},
                "noise": {"gpu_cv": 0.0, "cpu_cv": 0.0}}
SETTINGS = {"sglang": ["overlap", "normal", "overlap_mlx", "thread_overlap"], "vllm": ["async", "sync"]}


def scenario(engine: str, server: dict | None = None, costs: dict | None = None, **workload) -> dict:
    """A small scenario of ``engine`` (inline costs), the workload's fields changed by ``workload``."""
    wl = {"arrival": "closed_loop", "concurrency": 8, "num_requests": 150, "warmup_requests": 4, "input_len": 300,
          "output_len": 60, "finish": "length", **workload}
    srv = {"settings": SETTINGS[engine], **({"engine": "vllm", "device": "cuda"} if engine == "vllm" else {}),
           **(server or {})}
    return {"name": "golden", "seed": 3, "workload": wl, "server": srv, "costs": {**INLINE_COSTS, **(costs or {})}}


def cases() -> dict[str, dict | Path]:
    """The family, by name: scenario dicts and shipped scenario files."""
    noisy = {"noise": {"gpu_cv": 0.05, "cpu_cv": 0.1}}
    out: dict[str, dict | Path] = {}
    for engine in ("sglang", "vllm"):
        out.update({
            f"{engine}-closed-length": scenario(engine),
            f"{engine}-closed-eos": scenario(engine, finish="eos"),
            f"{engine}-open": scenario(engine, arrival="poisson", rate_per_s=60.0, num_requests=300),
            f"{engine}-prefix": scenario(engine, cached_len=256, concurrency=16),
            f"{engine}-noisy": scenario(engine, costs=noisy, concurrency=32, num_requests=200),
        })
    out["sglang-kv-pressure"] = scenario("sglang", {"kv_pool_tokens": 20000}, arrival="poisson", rate_per_s=300.0,
                                         num_requests=300, output_len=300)
    out["sglang-chunked"] = scenario("sglang", {"chunked_prefill_size": 128})
    out["vllm-preemption"] = scenario("vllm", {"num_gpu_blocks": 300, "max_model_len": 1024}, arrival="poisson",
                                      rate_per_s=200.0, num_requests=300, output_len=200)
    out["vllm-chunked"] = scenario("vllm", {"max_num_seqs": 4, "max_num_batched_tokens": 256})
    out["vllm-threshold"] = scenario("vllm", {"long_prefill_token_threshold": 64})
    out["vllm-grammar"] = scenario("vllm", {"structured_output": {"share": 0.5, "bitmask_us_per_request": 20,
                                                                  "apply_us_per_request": 10,
                                                                  "accept_us_per_request": 15}})
    out["vllm-max-model-len"] = scenario("vllm", {"max_model_len": 330})
    out["sglang-issue-31-open"] = {
        "name": "open-loop-512-128", "seed": 0,
        "workload": {"arrival": "poisson", "rate_per_s": 4.0, "num_requests": 3000, "warmup_requests": 0,
                     "input_len": 512, "output_len": 128, "finish": "length"},
        "server": {"device": "cuda", "settings": ["overlap", "normal"], "max_running_requests": 64},
        "costs": {**INLINE_COSTS, "gpu": {"decode": {"base": 0.025, "per_req": 1.0e-4, "per_ctx_token": 1.0e-8},
                                          "prefill": {"base": 0.005, "per_token": 1.1e-4}}}}
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        out[path.stem] = path
    return out


def digest(res) -> dict:
    """The summary and outcome (JSON text) and a SHA-1 of each table's CSV text."""
    out = {"summary": json.dumps(res.summary(), sort_keys=True, default=str),
           "outcome": json.dumps(res.outcome, sort_keys=True, default=str),
           "stats": repr((res.stats["steps"], res.stats["sim_time_s"]))}
    for table in ("steps", "requests", "itl"):
        out[table] = hashlib.sha1(getattr(res, table).to_csv().encode()).hexdigest()
    return out


def run_all() -> dict:
    out = {}
    for name, spec in cases().items():
        sc = sim.load_scenario(spec)
        for setting in sc.server.settings:
            out[f"{name}/{setting}"] = digest(sim.simulate(sc, setting, tables="steps"))
            if sc.server.engine == "sglang":
                out[f"{name}/{setting}/streamed"] = json.dumps(sim.simulate(sc, setting, tables="none").summary(),
                                                               sort_keys=True, default=str)
    return out


def compare(before: Path, after: Path) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    for key in differ:
        parts = sorted(p for p in (a.get(key) or {}) if (a.get(key) or {}).get(p) != (b.get(key) or {}).get(p)) \
            if isinstance(a.get(key), dict) else ["value"]
        print(f"differs: {key}: {', '.join(parts)}")
    print(f"{len(a.keys() & b.keys()) - len(differ)} of {len(a.keys() | b.keys())} runs identical")
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write the digests here (JSON)")
    ap.add_argument("--tree", type=Path, default=None, help="another checkout's simulator (read before the imports)")
    ap.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"), help="compare two digest files")
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        ap.error("--out or --compare")
    result = run_all()
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"{len(result)} runs written to {args.out} (simulator {Path(sim.__file__).parent})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
