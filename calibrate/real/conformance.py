"""Policy conformance: the same requests, in the same logical order, to SGLang's real scheduler
and to the simulator's policy; the two batch sequences compared step by step.

The real scheduler runs in-process with its own event loop (:mod:`realengines.sglang.drive`),
its clients closed-loop in logical time (a request is sent at the first receive after one
finishes). Its trace gives, per loop iteration, the requests received and the batch scheduled.
The simulator's :class:`~sim.engines.sglang.policy.scheduler.Scheduler` is then driven through the
same iterations (plain calls, no SimPy): the requests the real scheduler received in iteration
k are submitted at logical time k, then ``recv``, ``get_next_batch`` and, as the loop under test
does (``event_loop_normal``: this batch; ``event_loop_overlap``: the previous one),
``process_batch_result``. Each request carries what the real run showed: its prompt length, the
prefix the radix cache matched at its first prefill (``cached_len``) and the number of tokens
it produced before it stopped.

A step is identical when both scheduled, in the same iteration, a batch of the same kind with
the same requests, the same new tokens per request (chunks), and the same retractions.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from calibrate.real import sglang_trace
from calibrate.real.jobs import Workload


WORKLOADS = (
    Workload("closed-length"),
    Workload("chunked", num_requests=24, concurrency=4, input_len=(300, 900), output_len=(8, 32),
             server_args=("--chunked-prefill-size", "256")),
    Workload("kv-pressure", num_requests=48, concurrency=16, input_len=(96, 160), output_len=(64, 128),
             server_args=("--max-total-tokens", "2600")),
    Workload("stop-token", num_requests=40, concurrency=8, output_len=(64, 256), stop=True),
    Workload("shared-prefix", num_requests=40, concurrency=8, input_len=(16, 64), shared_prefix=256),
    # stop-token finishes (no ignore_eos) in a small pool: the running offset decays with the
    # new-token ratio, admission over-commits, decode retracts
    Workload("kv-pressure-stop", num_requests=48, concurrency=16, input_len=(64, 160), output_len=(128, 384),
             stop=True, server_args=("--max-total-tokens", "3000")),
    # long answers that are not ignore_eos: admission discounts them by the ratio, the pool runs out
    Workload("retract", num_requests=40, concurrency=16, input_len=(64, 160), output_len=(200, 400),
             stop=True, stop_tokens=1, server_args=("--max-total-tokens", "3000", "--schedule-conservativeness", "0.3")),
    Workload("paged", num_requests=24, concurrency=6, input_len=(40, 700), output_len=(8, 64),
             server_args=("--page-size", "16", "--chunked-prefill-size", "256")),
)


@dataclass
class StepView:
    """A scheduled batch as compared: kind, requests (sorted), new tokens per request (extend),
    requests retracted while scheduling it."""

    kind: str
    rids: tuple
    ext: tuple = ()
    retracted: tuple = ()

    def text(self) -> str:
        ext = f" ext={list(self.ext)}" if self.ext else ""
        ret = f" retracted={list(self.retracted)}" if self.retracted else ""
        return f"{self.kind}[{len(self.rids)}] {list(self.rids)}{ext}{ret}"


@dataclass
class Comparison:
    """Per iteration the real and simulated steps (None: no batch), and the summary."""

    workload: str
    setting: str
    real: list = field(default_factory=list)
    sim: list = field(default_factory=list)

    @property
    def num_steps(self) -> int:
        return sum(r is not None for r in self.real)

    @property
    def identical(self) -> int:
        return sum(r is not None and r == s for r, s in zip(self.real, self.sim))

    def first_difference(self) -> tuple[int, str, str] | None:
        for k, (r, s) in enumerate(zip(self.real, self.sim)):
            if r != s:
                return k, r.text() if r else "no batch", s.text() if s else "no batch"
        return None

    def summary(self) -> dict:
        diff = self.first_difference()
        return {"workload": self.workload, "setting": self.setting, "steps": self.num_steps,
                "identical": self.identical, "share": self.identical / self.num_steps if self.num_steps else float("nan"),
                "first_difference": None if diff is None else {"iteration": diff[0], "real": diff[1], "sim": diff[2]}}


def real_views(its: list[sglang_trace.Iteration]) -> list[StepView | None]:
    out = []
    for it in its:
        s = it.step
        if s is None:
            out.append(None)
            continue
        kind = "decode" if s.mode == "DECODE" else "extend"
        order = sorted(range(len(s.rids)), key=lambda i: s.rids[i])
        ext = tuple(s.ext[i] for i in order) if kind == "extend" else ()
        out.append(StepView(kind, tuple(s.rids[i] for i in order), ext, tuple(sorted(s.retracted))))
    return out


def replay(its: list[sglang_trace.Iteration], reqs: list[dict], outputs: dict[str, int], meta: dict,
           overlap: bool) -> list[StepView | None]:
    """Drive the simulator's policy through the real run's iterations (see the module docstring).

    Args:
        its: the real run's iterations (who was received when).
        reqs: the requests of the job (prompt ids, max_new_tokens, stop tokens).
        outputs: request id -> output tokens it produced in the real run.
        meta: the driver's meta record (the scheduler's resolved limits).
        overlap: drive as ``event_loop_overlap`` (process the previous batch after scheduling).
    """
    from sim.engines.sglang.policy.scheduler import Scheduler
    from sim.engines.sglang.server import Server
    from sim.model.costs import DECODE
    from sim.model.workload import RequestSpecs
    from sim.trace.recorder import TraceRecorder

    rid_of = [r["rid"] for r in reqs]
    index = {rid: i for i, rid in enumerate(rid_of)}
    first_prefix: dict[str, int] = {}
    for it in its:
        if it.step is not None and it.step.mode != "DECODE":
            for rid, pre in zip(it.step.rids, it.step.pre):
                first_prefix.setdefault(rid, pre)
    specs = RequestSpecs(np.array([len(r["input_ids"]) for r in reqs], dtype=np.int64),
                         np.array([first_prefix.get(r["rid"], 0) for r in reqs], dtype=np.int64),
                         np.array([max(outputs.get(r["rid"], r["max_new_tokens"]), 1) for r in reqs], dtype=np.int64),
                         None, np.array([r["max_new_tokens"] for r in reqs], dtype=np.int64),
                         np.array([bool(r.get("ignore_eos", True)) for r in reqs]))
    lim = meta.get("limits", {})
    server = Server(device="cpu", settings=["overlap" if overlap else "normal"], version="0.5.23",
                    max_running_requests=int(lim.get("max_running_requests") or 64),
                    chunked_prefill_size=int(lim.get("chunked_prefill_size") or 8192),
                    max_prefill_tokens=int(lim.get("max_prefill_tokens") or 16384),
                    kv_pool_tokens=int(lim.get("max_total_num_tokens") or 400_000),
                    page_size=int(lim.get("page_size") or 1),
                    init_new_token_ratio=float(lim.get("init_new_token_ratio") or 0.7))
    sched = Scheduler(specs, server, 0, True, TraceRecorder(), lambda rid, t: None, lookahead_policy=True,
                      deferred_results=overlap)
    views: list[StepView | None] = []
    last = None
    for k, it in enumerate(its):
        for rid in it.sent:
            sched.submit(index[rid], float(k))
        held = {r.rid: r.retractions for bucket in sched.finishing_at.values() for r in bucket}
        sched.recv(float(k))
        batch = sched.get_next_batch()
        if batch is None:
            views.append(None)
        elif batch.kind == DECODE:
            running = [r for bucket in sched.finishing_at.values() for r in bucket]
            _, _, _, _, excluded = sched._compose_decode(batch.decode_seq)
            skip = {id(r) for r in excluded}
            members = sorted(rid_of[r.rid] for r in running if id(r) not in skip)
            retracted = tuple(sorted(rid_of[r.rid] for r in sched.waiting
                                     if r.rid in held and r.retractions > held[r.rid]))
            views.append(StepView("decode", tuple(members), (), retracted))
        else:
            chunks = sorted((rid_of[c[0].rid], c[1]) for c in batch.chunks)
            views.append(StepView("extend", tuple(c[0] for c in chunks), tuple(c[1] for c in chunks)))
        if overlap:
            if last is not None:
                sched.process_batch_result(last, k + 0.5)
            last = batch
        elif batch is not None:
            sched.process_batch_result(batch, k + 0.5)
    return views


def compare_run(trace: Path, job: dict, workload: str) -> Comparison:
    """Compare one driver run (its trace and job) with the simulator's policy."""
    meta, records, req_recs = sglang_trace.read_records(trace)
    its = sglang_trace.iterations(records)
    outputs = {r["rid"]: len(r["output_ids"]) for r in req_recs}
    overlap = bool(job.get("overlap"))
    comp = Comparison(workload, "overlap" if overlap else "normal")
    comp.real = real_views(its)
    comp.sim = replay(its, job["requests"], outputs, meta or {}, overlap)
    return comp


def conformance(engine, model_dir: Path, folder: Path, workloads=WORKLOADS, settings=("normal", "overlap"),
                report: Callable[[str], None] = print) -> list[Comparison]:
    """Run every workload under every setting on the real scheduler (reusing finished runs in
    ``folder``) and compare each with the simulator's policy."""
    from calibrate.real.sglang_profile import run_job

    out = []
    for w in workloads:
        reqs = w.requests()
        for setting in settings:
            job = {"model_dir": str(model_dir), "overlap": setting == "overlap",
                   "server_args": ["--context-length", "2048", "--max-running-requests", "16",
                                   "--mem-fraction-static", "0.05", *w.server_args],
                   "arrival": {"kind": "closed", "concurrency": w.concurrency}, "requests": reqs}
            trace = run_job(engine, job, folder, f"conform-{w.name}-{setting}", report)
            comp = compare_run(trace, job, w.name)
            report(f"{w.name} {setting}: {comp.identical}/{comp.num_steps} steps identical")
            out.append(comp)
    return out


def write_report(comps: list[Comparison], path: Path, extra: dict | None = None) -> dict:
    """Write the comparisons as JSON (summary and per-iteration steps); returns the summary."""
    from sim.atomic import atomic_path

    total = sum(c.num_steps for c in comps)
    same = sum(c.identical for c in comps)
    summary = {"steps": total, "identical": same, "share": same / total if total else float("nan"),
               "runs": [c.summary() for c in comps], **(extra or {})}
    detail = {**summary, "steps_by_run": [
        {"workload": c.workload, "setting": c.setting,
         "real": [r.text() if r else None for r in c.real], "sim": [s.text() if s else None for s in c.sim]}
        for c in comps]}
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(detail, indent=1) + "\n")
    return summary


__all__ = ["WORKLOADS", "Comparison", "StepView", "conformance", "compare_run", "write_report", "asdict"]
