"""Validation against a real server: run it under each setting with a set of loads, repeats
interleaved, and compare what the simulator predicts from the calibration profile alone.

One *session* is one server start under one setting running every configuration's load in turn
(the radix cache flushed between loads); sessions alternate between the settings, the order
swapped every repeat, so a slow drift of the machine hits both. Each finished session is kept in
``out/sessions/`` and a rerun resumes. Measured metrics come from the client's records and the
tracer's steps through the simulator's own metrics code (:mod:`calibrate.real.server_runs`); the
prediction simulates the same requests (prompt lengths, radix hits and output lengths as the
real run had them), closed-loop at the same concurrency with the same warm-up, priced by the
profile.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Optional

from calibrate.errors import CalibrationInputError
from calibrate.real import server_runs, sglang_trace
from calibrate.real.environment import Engine, may_renice, mean_probe, run_module, run_probed
from calibrate.real.jobs import Workload
from calibrate.real.vllm.speculative import speculative_args
from calibrate.real import scoring
from calibrate.real.scoring import METRICS, noise_floor, noise_floor_line, pooled_line, pooled_speedup  # noqa: F401 (re-exported)
from calibrate.real.validation_loads import (  # noqa: F401 (re-exported)
    CLIENT_NICE, CONFIGS, ENGINE_CLIENT_BURSTY, ENGINE_PLANS, GRIDS, HELDOUT, SERVER_ARGS, SPECULATIVE, VLLM_SERVER_ARGS)

SESSION_TIMEOUT_S = 3600  # one server session: a few minutes here
PROBE_FILE = "host_speed.json"  # a session's host speed probes (calibrate.hostspeed), before and after it


@dataclass(frozen=True)
class Plan:
    """What to run: configurations, settings, repeats, the engine's extra launch flags.

    Raises:
        CalibrationInputError: ``repeats`` below 1 (named ``--repeats``) or ``client_nice`` outside
            -20..19 (``--client-nice``), when built.
    """

    configs: tuple[Workload, ...] = CONFIGS
    settings: tuple[str, ...] = ("overlap", "normal")
    repeats: int = 5
    server_args: tuple[str, ...] = SERVER_ARGS
    port: int = 30123
    engine: str = "sglang"
    client_nice: int = 0
    # vLLM speculative decoding: ``--speculative-config`` (method, model, num_speculative_tokens)
    # plus ``draft_cost_ratio`` for the prediction; None: plain decoding
    speculative: Optional[dict] = None
    # vLLM: ``--tensor-parallel-size`` of every session (its workers bound to their own cores,
    # calibrate.real.environment.tp_bind) and the scenario's server.tensor_parallel_size; SGLang:
    # --tp-size, SGLANG_CPU_OMP_THREADS_BIND, server.tp_size
    tensor_parallel_size: int = 1

    def __post_init__(self):
        if self.repeats < 1:
            raise CalibrationInputError("--repeats", "", "an integer >= 1")
        if not -20 <= self.client_nice <= 19:
            raise CalibrationInputError("--client-nice", "", f"a niceness from -20 to 19 (got {self.client_nice})")

    @classmethod
    def for_engine(cls, engine: str, grid: str = "default", **kwargs) -> "Plan":
        """The plan of ``engine`` over the loads of ``grid`` (:data:`GRIDS`).

        A load for the engine's client with arrivals that client cannot draw (gamma for SGLang,
        :data:`ENGINE_CLIENT_BURSTY`) or a grammar it cannot send (SGLang's) is sent by the own
        client (token-id prompts) instead.

        Raises:
            CalibrationInputError: an unknown grid or engine.
        """
        if grid not in GRIDS:
            raise CalibrationInputError("--grid", "", f"one of {', '.join(GRIDS)} (got {grid!r})")
        if engine not in ENGINE_PLANS:
            raise CalibrationInputError("--engine", "", f"one of {', '.join(ENGINE_PLANS)} (got {engine!r})")
        # SGLang's benchmark client sends no grammar: its constrained loads go by the own client
        configs = tuple(replace(c, client="own") if c.client == "engine" and (
                            (c.burstiness != 1.0 and not ENGINE_CLIENT_BURSTY[engine]) or (c.grammar and engine != "vllm"))
                        else c for c in GRIDS[grid])
        settings, args = ENGINE_PLANS[engine]
        kwargs.setdefault("client_nice", CLIENT_NICE[grid])  # ``--client-nice`` overrides the grid's
        return cls(configs=configs, settings=settings, server_args=args, engine=engine, **kwargs)

    def order(self) -> list[tuple[int, str]]:
        """(repeat, setting) sessions in run order: settings alternate, swapped every repeat."""
        out = []
        for r in range(self.repeats):
            names = self.settings if r % 2 == 0 else tuple(reversed(self.settings))
            out += [(r, s) for s in names]
        return out


def check_client_nice(plan: Plan) -> None:
    """Refuse, before anything starts, a plan whose load generator must run more favoured
    (``client_nice`` < 0) than this process may make itself (:func:`calibrate.real.environment.may_renice`).

    Raises:
        CalibrationInputError: naming ``--grid``.
    """
    if not may_renice(plan.client_nice):
        raise CalibrationInputError("--grid", "", f"this grid runs its load generator at niceness {plan.client_nice} "
                                    "(CLIENT_NICE: a starved client measures itself), which needs root or a "
                                    f"soft RLIMIT_NICE of at least {20 - os.getpriority(os.PRIO_PROCESS, 0) - plan.client_nice}")


def session_spec(engine: Engine, model_dir: Path, plan: Plan, setting: str) -> dict:
    loads = [c.engine_load() if c.client == "engine" else
             {"name": c.name, "concurrency": c.concurrency, "warmup_requests": c.warmup_requests,
              "requests": c.requests(prefix=f"{c.name}-")} for c in plan.configs]
    args = list(plan.server_args)
    if plan.speculative:
        args += speculative_args(plan.speculative)
    spec = {"engine": engine.name, "model_dir": str(model_dir), "setting": setting, "port": plan.port,
            "server_args": args, "trace": True, "loads": loads, "client_nice": plan.client_nice}
    if plan.tensor_parallel_size > 1:
        if engine.name == "vllm":
            from calibrate.real.vllm.sessions import tp_launch
        else:
            from calibrate.real.sglang_profile import tp_launch
        tp_args, spec["env"] = tp_launch(plan.tensor_parallel_size)
        spec["server_args"] += tp_args
    return spec


def run_sessions(engine: Engine, model_dir: Path, plan: Plan, out: Path, report: Callable[[str], None]) -> None:
    """Run every (repeat, setting) session not yet finished in ``out/sessions``."""
    for r, setting in plan.order():
        folder = out / "sessions" / f"{setting}-{r}"
        if (folder / "session.json").exists() and all((folder / f"{c.name}.json").exists() for c in plan.configs):
            continue
        spec = session_spec(engine, model_dir, plan, setting)
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*"):
            old.unlink()
        (folder.parent / f"{setting}-{r}.json").write_text(json.dumps(spec))
        report(f"session {setting} repeat {r + 1}/{plan.repeats}: server start and {len(plan.configs)} loads")
        run_probed(engine, folder / PROBE_FILE,
                   lambda: run_module(engine, "realengines.server", [str(folder.parent / f"{setting}-{r}.json"),
                                      str(folder)], folder.parent / f"{setting}-{r}.log", timeout_s=SESSION_TIMEOUT_S))


LIMIT_KEYS = ("max_total_num_tokens", "chunked_prefill_size", "max_running_requests", "page_size")


def server_limits(folder: Path) -> dict:
    """The limits the server resolved at start-up, read from its log: SGLang's line
    ``max_total_num_tokens=..., chunked_prefill_size=..., max_running_requests=...``; vLLM's
    ``CPU KV cache size: N tokens`` (as ``kv_cache_tokens``)."""
    import re

    text = (folder / "server.log").read_text(errors="replace")
    out = {k: int(m.group(1)) for k in LIMIT_KEYS if (m := re.search(rf"\b{k}=(\d+)", text))}
    if m := re.search(r"KV cache size: ([\d,]+) tokens", text):
        out["kv_cache_tokens"] = int(m.group(1).replace(",", ""))
    return out


def _trace_records(folder: Path) -> list[dict]:
    recs: list[dict] = []
    for path in sglang_trace.rank_zero(sorted(folder.glob("trace.*.jsonl"))):
        _, r, _ = sglang_trace.read_records(path)
        if any(x["ph"] == "schedule" for x in r):  # the scheduler's process
            recs += r
    return sorted(recs, key=lambda x: x["t0"] + x["dur"])  # calls in the order they ended


def _vllm_prefixes(steps) -> dict[str, int]:
    """Client request id -> tokens computed before its first step (the prefix cache's hit)."""
    from calibrate.real.vllm.trace import client_rid

    out: dict[str, int] = {}
    for s in steps:
        for rid, done in zip(s.reqs[:s.new], s.done[:s.new]):
            out.setdefault(client_rid(rid), int(done))
    return out


def measured_run(folder: Path, config: Workload, engine: str = "sglang") -> tuple[dict, list[dict]]:
    """(summary, request rows for the simulator) of one configuration's load in one session; the
    summary also holds ``hidden_cpu_share`` (:func:`sim.trace.metrics.hidden_cpu_share`)."""
    from sim.trace.metrics import hidden_cpu_share, measured_window, summarize

    load = server_runs.read_load(folder / f"{config.name}.json")
    if config.client == "engine":  # the benchmark drew the prompts: lengths from its records
        specs = {r["rid"]: {"rid": r["rid"], "input_len": int(r["input_len"]), "max_new_tokens": int(r["output_len"]),
                            "ignore_eos": True} for r in load["requests"]}
    else:
        specs = {r["rid"]: r for r in config.requests(prefix=f"{config.name}-")}
    warm = {r["rid"] for r in load["requests"] if r["warmup"]}
    t0 = min(r["send_s"] for r in load["requests"] if not r["warmup"])
    if engine == "vllm":
        from calibrate.real.vllm import trace as vllm_trace

        engine_records, worker_records = vllm_trace.read_files(sorted(folder.glob("trace.*.jsonl")))
        vsteps = vllm_trace.steps(engine_records, worker_records)
        prefix = _vllm_prefixes(vsteps)
    else:
        records = _trace_records(folder)
        prefix = _first_prefixes(records)
    if not set(prefix) & set(specs):
        raise CalibrationInputError(str(folder), config.name, "the server's trace names none of the load's requests "
                                    "(recorded before the client sent request ids?): delete the session and rerun")
    for rid, spec in specs.items():
        spec["cached_len"] = prefix.get(rid, 0)
    if engine == "vllm" and config.client == "engine":  # the server's own token count of each text prompt
        for rec in engine_records:
            if rec["ph"] == "add" and (c := vllm_trace.client_rid(rec["rid"])) in specs:
                specs[c]["input_len"] = int(rec["prompt"])
    requests, itl = server_runs.requests_frames(load, specs, t0)
    index = {rid: i for i, rid in enumerate(specs)}
    if engine == "vllm":
        steps = server_runs.vllm_steps_frame(vsteps, t0, load["end_s"], index, warm)
    else:
        steps = server_runs.sglang_steps_frame(records, t0, load["end_s"], index, warm)
    rows = [{"input_len": server_runs.prompt_len(specs[r["rid"]]), "cached_len": specs[r["rid"]]["cached_len"],
             "output_len": max(int(r["output_len"]), 1), "max_new_tokens": specs[r["rid"]]["max_new_tokens"],
             "ignore_eos": bool(specs[r["rid"]].get("ignore_eos", True)),
             "arrival_s": max(r["send_s"] - t0, 0.0) if config.open_loop else 0.0}
            for r in load["requests"] if not (config.open_loop and r["warmup"])]
    summary = summarize(steps, requests, itl)
    summary["hidden_cpu_share"] = hidden_cpu_share(steps, *measured_window(requests))
    if engine == "vllm":
        summary["spec_accepted"] = accepted_counts(engine_records, t0, load["end_s"])
    return summary, rows


def accepted_counts(engine_records: list[dict], t0: float, t1: float) -> list[int]:
    """Speculative decoding: how often a request-step of the window [t0, t1] (s, the trace's
    clock) accepted 0, 1, ... of its drafts, over requests given the full k drafts that did not
    stop in that step (the tracer's ``update`` records, ``accepted``); [] without speculation."""
    pairs = [p for rec in engine_records if rec["ph"] == "update" and t0 <= rec["t0"] <= t1
             for p in rec.get("accepted", ())]
    if not pairs:
        return []
    k = max(d for d, _ in pairs)
    counts = [0] * (k + 1)
    for drafts, acc in pairs:
        if drafts == k:
            counts[min(max(acc, 0), k)] += 1
    return counts


def _first_prefixes(records: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for rec in records:
        b = rec.get("batch") if rec["ph"] == "schedule" else None
        if b and b.get("pre"):
            for rid, pre in zip(b["rids"], b["pre"]):
                out.setdefault(rid, int(pre))
    return out


def scenario(config: Workload, rows: list[dict], profile: Path, settings: tuple[str, ...], folder: Path,
             limits: dict, engine: str = "sglang") -> dict:
    """The simulator's scenario of one configuration: its requests replayed as the client sent
    them. A closed loop replays the lengths at the same concurrency, the warm-up first (the own
    client's; the engine's client keeps no record of its warm-up, which leaves the server only its
    first prompt cached: that request's hit is read from the trace). An open loop replays the
    measured requests at the instants the client really sent them (``arrival_s`` from the first
    measured send; a client that fell behind its schedule is replayed as it sent), without the
    warm-up, which ended before the first of them."""
    trace = folder / f"{config.name}.requests.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    warmup = 0 if config.client == "engine" or config.open_loop else config.warmup_requests
    workload = {"arrival": "trace" if config.open_loop else "closed_loop", "trace": str(trace.resolve()),
                "concurrency": config.concurrency or 1, "num_requests": len(rows), "warmup_requests": warmup,
                "warmup_before_benchmark": bool(warmup),
                "prefix_sharing": "shared" if config.shared_prefix else "private"}
    if engine == "vllm":
        args = dict(zip(VLLM_SERVER_ARGS[::2], VLLM_SERVER_ARGS[1::2]))
        server = {"engine": "vllm", "device": "cpu", "settings": list(settings), "version": "0.32.0",
                  "max_num_seqs": int(args["--max-num-seqs"]), "max_model_len": int(args["--max-model-len"]),
                  "block_size": 128}
        if limits.get("kv_cache_tokens"):
            server["num_gpu_blocks"] = int(limits["kv_cache_tokens"]) // 128
        return {"name": config.name, "seed": 0, "workload": workload, "server": server,
                "costs": {"profile": str(Path(profile).resolve()), "profile_statistic": "mean"}}
    return {"name": config.name, "seed": 0,
            "workload": workload,
            "server": {"device": "cpu", "settings": list(settings), "version": "0.5.23",
                       "max_running_requests": int(limits.get("max_running_requests") or 16),
                       "chunked_prefill_size": int(limits.get("chunked_prefill_size") or 4096),
                       "kv_pool_tokens": int(limits.get("max_total_num_tokens") or 400_000)},
            "costs": {"profile": str(Path(profile).resolve()), "profile_statistic": "mean"}}


def measured_speculative(spec: dict, runs: dict[str, list[dict]]) -> dict:
    """The scenario's ``server.speculative`` for a load: ``spec``'s method, k and
    ``draft_cost_ratio``, and the accepted-draft histogram pooled over the load's sessions
    (``spec_accepted`` of :func:`measured_run`).

    Raises:
        CalibrationInputError: the sessions recorded no speculative step (the server ran without
            ``--speculative-config``, or the trace predates the ``accepted`` field)."""
    k = int(spec["num_speculative_tokens"])
    counts = [0] * (k + 1)
    for summaries in runs.values():
        for summary in summaries:
            for a, n in enumerate(summary.get("spec_accepted") or ()):
                counts[min(a, k)] += n
    if not sum(counts):
        raise CalibrationInputError("sessions", "accepted", "no speculative step in the trace: rerun the sessions "
                                    "with --speculative-config (and the current tracer)")
    return {"method": spec["method"], "num_speculative_tokens": k,
            "accepted_histogram": [n / sum(counts) for n in counts],
            "draft_cost_ratio": float(spec["draft_cost_ratio"]), "measured_request_steps": sum(counts)}


def session_drift(out: Path, plan: Plan, profile: dict) -> dict[tuple[int, str], dict] | None:
    """(repeat, setting) -> the drift of the host from the calibration to that session:
    ``{"cpu": x, "gpu": y}`` (:func:`calibrate.hostspeed.drift` of the mean of the session's
    probes before and after it, against the profile's ``metadata.host_speed``). None when the
    profile or a session has no probe readings (recorded before probes existed)."""
    from calibrate.hostspeed import drift

    reference = profile.get("metadata", {}).get("host_speed")
    if not reference:
        return None
    out_: dict[tuple[int, str], dict] = {}
    for r, setting in plan.order():
        reading = mean_probe([out / "sessions" / f"{setting}-{r}" / PROBE_FILE])
        if reading is None:
            return None
        out_[(r, setting)] = drift(reading, reference)
    return out_


def _scaled(sc: dict, scales: dict) -> dict:
    """The scenario with the profile's CPU and forward curves multiplied by ``scales``."""
    costs = {**sc["costs"], "cpu": {"scale": scales["cpu"]}, "gpu": {"scale": scales["gpu"]}}
    return {**sc, "costs": costs}


def compare(out: Path, plan: Plan, profile: Path) -> dict:
    """Measured (per repeat and median) against predicted, per configuration and setting, and
    the overlap/normal speedup with its 95% interval over the repeats (paired by repeat), and the
    share of the scheduler's CPU time hidden behind a forward (``hidden_cpu_share``: the median
    of the runs, and the prediction's).

    With host speed probes in the profile and every session (:mod:`calibrate.hostspeed`), the
    result also holds ``drift_corrected``: the same comparison with each session predicted from
    the profile scaled by the host's drift from calibration to that session (CPU curves by the
    Python probe's ratio, forward by the torch probe's), the prediction of a setting the median
    of its sessions' predictions, the predicted speedup the mean of the per-repeat ratios."""
    import sim
    from sim.trace.metrics import hidden_cpu_share, measured_window

    drifts = session_drift(out, plan, json.loads(Path(profile).read_text()))
    cases, corrected = [], []
    for config in plan.configs:
        runs = {s: [] for s in plan.settings}
        preds = {s: [] for s in plan.settings}
        rows = None
        for r, setting in plan.order():
            summary, rows_r = measured_run(out / "sessions" / f"{setting}-{r}", config, plan.engine)
            runs[setting].append(summary)
            rows = rows or rows_r
        limits = server_limits(out / "sessions" / f"{plan.settings[0]}-0")
        sc = scenario(config, rows, profile, plan.settings, out, limits, plan.engine)
        case = {"name": config.name, "config": asdict(config), "settings": {}}
        if plan.tensor_parallel_size > 1:
            sc["server"]["tensor_parallel_size" if plan.engine == "vllm" else "tp_size"] = plan.tensor_parallel_size
        if config.grammar:  # every request constrained
            sc["server"]["structured_output"] = {"share": 1.0, "kind": config.grammar}
        if plan.speculative:  # the acceptance the server measured, over every session of this load
            case["speculative"] = measured_speculative(plan.speculative, runs)
            sc["server"]["speculative"] = {k: v for k, v in case["speculative"].items() if k != "measured_request_steps"}
        fixed = {"name": config.name, "settings": {}}
        for setting in plan.settings:
            res = sim.simulate(sc, setting)
            pred = res.summary()
            meas = {m: statistics.median(run[m] for run in runs[setting]) for m in METRICS}
            case["settings"][setting] = {
                "measured": meas, "predicted": {m: pred[m] for m in METRICS},
                "error": {m: pred[m] / meas[m] - 1 for m in METRICS},
                "runs": [{m: run[m] for m in METRICS} for run in runs[setting]],
                "hidden_cpu_share": {"measured": statistics.median(run["hidden_cpu_share"] for run in runs[setting]),
                                     "predicted": hidden_cpu_share(res.steps, *measured_window(res.requests))}}
            if drifts:
                scales = [drifts[(r, setting)] for r in range(plan.repeats)]
                preds[setting] = [sim.simulate(_scaled(sc, x), setting).summary() for x in scales]
                med = {m: statistics.median(p[m] for p in preds[setting]) for m in METRICS}
                fixed["settings"][setting] = {"measured": meas, "predicted": med,
                                              "error": {m: med[m] / meas[m] - 1 for m in METRICS},
                                              "drift": scales, "runs_predicted": [{m: p[m] for m in METRICS}
                                                                                  for p in preds[setting]]}
        if len(plan.settings) == 2:
            a, b = plan.settings
            thr = {s: [x["output_throughput"] for x in runs[s]] for s in plan.settings}
            pa, pb = (case["settings"][s]["predicted"]["output_throughput"] for s in (a, b))
            case["speedup"] = scoring.speedup(thr[a], thr[b], pa / pb, f"{a}/{b}")
            if drifts:
                ratio = statistics.fmean(x["output_throughput"] / y["output_throughput"]
                                         for x, y in zip(preds[a], preds[b]))
                fixed["speedup"] = scoring.speedup(thr[a], thr[b], ratio, f"{a}/{b}")
        cases.append(case)
        corrected.append(fixed)
    result = {"cases": cases, **scoring.summary(cases, plan.settings),
              "plan": {"settings": list(plan.settings), "repeats": plan.repeats, "server_args": list(plan.server_args),
                       "client_nice": plan.client_nice, "loads": [asdict(c) for c in plan.configs]}}
    if drifts:
        result["drift_corrected"] = {"cases": corrected, **scoring.summary(corrected, plan.settings)}
    return result


def validate(engine: Engine, model_dir: Path, profile: Path, out: Path, plan: Plan,
             report: Callable[[str], None] = print, command: str = "") -> dict:
    """Run the sessions (resuming), compare, write ``out/validation.json``; returns it."""
    from sim.atomic import atomic_path
    from sim.model.profile import load_profile

    if plan.engine == "vllm":
        from sim.engines.vllm.profile import load_vllm_profile

        load_vllm_profile(profile)  # fail now, not after the sessions
    else:
        load_profile(profile)
    check_client_nice(plan)
    run_sessions(engine, model_dir, plan, out, report)
    result = compare(out, plan, profile)
    result["profile"] = str(profile)
    result["engine"] = {"name": engine.name, "version": engine.version}
    result["command"] = command
    with atomic_path(out / "validation.json") as tmp:
        tmp.write_text(json.dumps(result, indent=1) + "\n")
    return result


__all__ = ["CONFIGS", "Plan", "validate", "compare", "run_sessions", "pooled_speedup", "pooled_line", "noise_floor",
           "noise_floor_line", "replace"]
