"""Record what a user of a real SGLang 0.5.23 server does to calibrate from it, and what the
same server then does unprofiled: the ground truth of ``benchmarks/own_server.py``.

    python -m realengines.sglang.own_server PLAN.json OUT_DIR

(run from the project's environment it runs itself again in the SGLang environment's python,
as :mod:`realengines.sglang.record_profile` does.)

PLAN (JSON): ``{"setting": "normal"|"overlap", "server_args": [...], "num_steps": int, "truth":
[LOAD, ...], "repeats": int, "port": int}`` with LOAD = ``{"name", "concurrency", "requests",
"input_len", "output_len", "warmup_requests", "seed"}``.

One server (this machine's CPU engine, ``--decode-log-interval 1``) serves:

1. the profile windows exactly as docs/real-engines.md tells a user to take them, ``overlap-sim
   calibrate --profile-server URL``'s recording (:func:`calibrate.real.from_trace.record.record_windows`
   over :func:`~calibrate.real.from_trace.record.design`'s stages for this server's limits) into
   ``OUT_DIR/profile/``; the server log up to then is copied to ``OUT_DIR/recipe.server.log``
   (what the user has when the profile is built);
2. then the **truth** loads unprofiled, ``repeats`` rounds of each in turn, each client record
   in ``OUT_DIR/truth/<name>-<round>.json`` (:mod:`realengines.client`'s format).

Everything finished is kept: ``OUT_DIR/record.json`` is written last, and a folder that has it
is not recorded again.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from realengines.launching import REPO


def _load(spec: dict, port: int, prefix: str) -> dict:
    from realengines.sglang.record_profile import _requests

    reqs = _requests(spec["requests"] + spec.get("warmup_requests", 0), spec["input_len"], spec["output_len"],
                     spec.get("seed", 0))
    for r in reqs:
        r["rid"] = f"{prefix}-{r['rid']}"
    return {"url": f"http://127.0.0.1:{port}", "api": "sglang", "concurrency": spec["concurrency"],
            "warmup_requests": spec.get("warmup_requests", 0), "requests": reqs}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from realengines.sglang.record_profile import _in_sglang_environment

    _in_sglang_environment(argv, "realengines.sglang.own_server")
    from realengines.client import run_load
    from realengines.server import flush, stop, wait_ready
    from realengines.sglang import launch

    plan_path, out = Path(argv[0]), Path(argv[1]).resolve()
    plan = json.loads(plan_path.read_text())
    if (out / "record.json").exists():
        print(f"{out}: recorded already")
        return 0
    prof_dir, truth_dir = out / "profile", out / "truth"
    for d in (prof_dir, truth_dir):
        d.mkdir(parents=True, exist_ok=True)
    port = int(plan.get("port", 30124))
    model = REPO / ".venvs" / "models" / "tiny-llama"
    server_args = ["--decode-log-interval", "1", "--log-level", "info", *plan["server_args"]]
    cmd, env = launch.command(str(model), plan["setting"], server_args, port, None)
    env["SGLANG_TORCH_PROFILER_DIR"] = str(prof_dir)
    log = out / "server.log"
    base = f"http://127.0.0.1:{port}"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    record = {"command": cmd, "plan": plan, "versions": launch.versions()}
    try:
        record["ready_s"] = wait_ready(proc, base + launch.READY_PATH, 600, log)
        from calibrate.real.from_trace import record as recording

        limits = recording.server_limits(base)
        stages = recording.design(int(limits["max_running_requests"]), int(limits.get("context_length") or 4096),
                                  plan["num_steps"], limits.get("max_total_num_tokens"))
        t0 = time.time()
        traces = recording.record_windows(base, prof_dir, stages, plan["num_steps"], device="cpu")
        record["recording_s"] = time.time() - t0
        time.sleep(2.0)
        shutil.copyfile(log, out / "recipe.server.log")
        record["limits"] = limits
        record["windows"] = [{"stage": vars(st), "trace": str(t)} for st, t in zip(stages, traces)]
        for rnd in range(plan["repeats"]):
            for spec in plan["truth"]:
                flush(base + launch.FLUSH_PATH)
                res = asyncio.run(run_load(_load(spec, port, f"{spec['name']}-{rnd}")))
                (truth_dir / f"{spec['name']}-{rnd}.json").write_text(json.dumps(res))
                time.sleep(1.0)
    finally:
        stop(proc)
    (out / "record.json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
