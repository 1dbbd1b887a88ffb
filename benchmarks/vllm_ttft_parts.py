"""What a vLLM validation's TTFT is made of, measured against predicted (run by hand).

A request's time to first token, split at the engine step that produced its first token (the
one that scheduled its prompt; every prompt of the validation's loads fits one step):

- ``in``: from the client's send to the start of that step (the API server, then the wait for
  the engine core to reach a step boundary: it drains its input queue only there);
- ``step``: that step, from ``Scheduler.schedule`` to the end of ``update_from_output``;
- ``out``: from there to the client's receipt of the token (engine core output thread, API
  server, stream).

Measured from the traces of every session of a validation folder (the client's send and first
token, the engine core's ``add``/``schedule``/``update`` records, :mod:`calibrate.real.vllm.trace`);
predicted from the simulator's tables for the same requests and profile as
:func:`calibrate.real.validate.compare` builds them (``in``: from the arrival to the start of
the step whose output is the last before the first token, ``step`` to its ``process_end``,
``out`` the rest). Medians over the measured requests (warm-up excluded), in ms.

    python benchmarks/vllm_ttft_parts.py results/il/vllm/validate results/il/vllm/profile.json
    python benchmarks/vllm_ttft_parts.py results/il/vllm/validate results/il/vllm/profile.json --only c8-stop
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

PARTS = ("in", "step", "out", "ttft")


def measured_parts(sessions: Path, load: str, setting: str) -> dict[str, list[float]]:
    """Seconds per part, one value per measured request of every ``setting-<r>`` session."""
    from calibrate.real.vllm.trace import client_rid, read_files, steps

    out: dict[str, list[float]] = {p: [] for p in PARTS}
    for sess in sorted(p for p in sessions.glob(f"{setting}-*") if p.is_dir()):
        engine, worker = read_files(sorted(sess.glob("trace.*.jsonl")))
        adds = {client_rid(r["rid"]): r for r in engine if r["ph"] == "add"}
        first: dict[str, object] = {}
        for s in steps(engine, worker):
            for rid in s.reqs:
                first.setdefault(client_rid(rid), s)
        for r in json.loads((sess / f"{load}.json").read_text())["requests"]:
            s = first.get(r["rid"])
            if r.get("warmup") or r.get("error") or r["rid"] not in adds or s is None or s.update is None:
                continue
            end = s.update["t0"] + s.update["dur"]
            for part, v in zip(PARTS, (s.schedule["t0"] - r["send_s"], end - s.schedule["t0"], r["first_s"] - end,
                                       r["first_s"] - r["send_s"])):
                out[part].append(v)
    return out


def predicted_parts(validate_dir: Path, profile: Path, load: str, setting: str) -> dict[str, list[float]]:
    """Seconds per part, one value per measured request of the simulated run."""
    import numpy as np

    import sim
    from calibrate.real.validate import CONFIGS, measured_run, scenario, server_limits

    config = next(c for c in CONFIGS if c.name == load)
    sessions = validate_dir / "sessions"
    _, rows = measured_run(sessions / f"{setting}-0", config, "vllm")
    sc = scenario(config, rows, profile, ("async", "sync"), validate_dir, server_limits(sessions / "async-0"), "vllm")
    res = sim.simulate(sc, setting)
    req, st = res.requests[~res.requests["warmup"]], res.steps
    ends, starts = st["process_end"].to_numpy(), st["recv_start"].to_numpy()
    out: dict[str, list[float]] = {p: [] for p in PARTS}
    for arrival, first in zip(req["arrival_s"], req["first_token_s"]):
        i = int(np.searchsorted(ends, first, side="right")) - 1
        for part, v in zip(PARTS, (starts[i] - arrival, ends[i] - starts[i], first - ends[i], first - arrival)):
            out[part].append(v)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("validate_dir", type=Path, help="a vLLM validation folder (its sessions/ and request traces)")
    ap.add_argument("profile", type=Path, help="the vLLM profile the validation was scored with")
    ap.add_argument("--only", nargs="*", help="configurations whose name contains one of these")
    args = ap.parse_args(argv)
    from calibrate.real.validate import CONFIGS

    if not (args.validate_dir / "sessions").is_dir() or not args.profile.is_file():
        print(f"vllm_ttft_parts.py: {args.validate_dir}/sessions or {args.profile}: not found", file=sys.stderr)
        return 2
    print(f"{'configuration':10s} {'setting':7s} " + "  ".join(f"{p:>15s}" for p in PARTS)
          + "   (median ms: measured -> predicted)")
    for config in CONFIGS:
        if args.only and not any(s in config.name for s in args.only):
            continue
        for setting in ("async", "sync"):
            m = measured_parts(args.validate_dir / "sessions", config.name, setting)
            p = predicted_parts(args.validate_dir, args.profile, config.name, setting)
            cells = "  ".join(f"{statistics.median(m[k]) * 1e3:6.1f} -> {statistics.median(p[k]) * 1e3:5.1f}"
                              for k in PARTS)
            print(f"{config.name:10s} {setting:7s} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
