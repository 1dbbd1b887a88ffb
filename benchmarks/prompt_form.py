"""What a text prompt costs a real server over the same prompt sent as token ids (run by hand).

    python benchmarks/prompt_form.py --engine vllm [--repeats 2] [--work results/prompt-form-vllm]

The calibration's own client sends token ids (``realengines/client.py``); the engines' own
benchmark clients, and real users, send text, which the server tokenizes before the request
reaches the scheduler (vLLM: the API server's renderer; SGLang: the tokenizer manager). One
server session per setting and repeat (settings alternating, as the validation runs them, the
client at niceness -10 as the held-out grid runs it) sends, one request at a time (nothing else
in flight, so nothing queues), 10 requests of each prompt length in :data:`LENGTHS` twice: as
token ids through the own client (``tok-<L>``) and as text through the engine's benchmark client
(``txt-<L>``, random token ids decoded to text; the server's own token count is read back), 8
output tokens each. Per load it reports the median TTFT and, for vLLM, the median time from the
client's send to ``EngineCore.add_request`` (the engine core's trace): the front end alone.
Writes ``--out`` (default ``benchmarks/results/<engine>-prompt-form.json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

LENGTHS = (64, 256, 512)


def loads():
    from calibrate.real.jobs import Workload

    out = []
    for i, n in enumerate(LENGTHS):
        out.append(Workload(f"tok-{n}", num_requests=11, warmup_requests=1, concurrency=1, input_len=(n, n),
                            output_len=(8, 8), seed=40 + i))
        out.append(Workload(f"txt-{n}", num_requests=11, warmup_requests=1, concurrency=1, input_len=(n, n),
                            output_len=(8, 8), client="engine", seed=50 + i))
    return tuple(out)


def front_end(folder: Path, name: str, engine: str) -> dict:
    """Median TTFT, prompt tokens and (vLLM) send-to-``add_request`` of one load in one session (ms)."""
    recs = [r for r in json.loads((folder / f"{name}.json").read_text())["requests"]
            if not r["warmup"] and not r.get("error") and r["first_s"] is not None]
    out = {"ttft_ms": statistics.median((r["first_s"] - r["send_s"]) * 1e3 for r in recs), "requests": len(recs)}
    if engine == "vllm":
        from calibrate.real.vllm import trace as vllm_trace

        records, _ = vllm_trace.read_files(sorted(folder.glob("trace.*.jsonl")))
        added = {vllm_trace.client_rid(r["rid"]): r for r in records if r["ph"] == "add"}
        pairs = [(r, added[r["rid"]]) for r in recs if r["rid"] in added]
        out["send_to_add_ms"] = statistics.median((a["t0"] - r["send_s"]) * 1e3 for r, a in pairs)
        out["prompt_tokens"] = statistics.median(int(a["prompt"]) for _, a in pairs)
    elif recs and "input_len" in recs[0]:
        out["prompt_tokens"] = statistics.median(int(r["input_len"]) for r in recs)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("vllm", "sglang"), default="vllm")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    from calibrate.errors import CalibrationInputError
    from calibrate.real.environment import REPO, find_engine, test_model
    from calibrate.real.validate import Plan, check_client_nice, run_sessions

    try:  # a bad --repeats, a client that may not be favoured, no environment: one line, before anything runs
        plan = replace(Plan.for_engine(args.engine, "heldout", repeats=args.repeats), configs=loads())
        check_client_nice(plan)
        engine = find_engine(args.engine)
    except CalibrationInputError as e:
        print(f"prompt_form.py: {e}", file=sys.stderr)
        return 2
    model = test_model(engine, REPO / ".venvs" / "models" / "tiny-llama")
    work = args.work or Path("results") / f"prompt-form-{args.engine}"
    run_sessions(engine, model, plan, work, lambda m: print(m, file=sys.stderr, flush=True))
    rows = []
    for r, setting in plan.order():
        folder = work / "sessions" / f"{setting}-{r}"
        for c in plan.configs:
            rows.append({"setting": setting, "repeat": r, "load": c.name, **front_end(folder, c.name, args.engine)})
    summary = {}
    for n in LENGTHS:
        for setting in plan.settings:
            pick = {form: [x for x in rows if x["load"] == f"{form}-{n}" and x["setting"] == setting]
                    for form in ("tok", "txt")}
            summary[f"{setting}-{n}"] = {f"{form}_{k}": statistics.median(x[k] for x in xs)
                                         for form, xs in pick.items() for k in ("ttft_ms", "send_to_add_ms",
                                                                                 "prompt_tokens") if k in xs[0]}
    result = {"engine": {"name": engine.name, "version": engine.version}, "plan": plan.order(),
              "command": " ".join(["python", "benchmarks/prompt_form.py", *(argv or sys.argv[1:])]),
              "rows": rows, "summary": summary}
    out = args.out or Path("benchmarks/results") / f"{args.engine}-prompt-form.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    for key, v in summary.items():
        print(key, ", ".join(f"{k} {x:.1f}" for k, x in v.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
