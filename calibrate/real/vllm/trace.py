"""Read what the vLLM tracer (:mod:`realengines.vllm.tracer`) wrote in a server's processes and
join it into engine steps.

A vLLM 0.32 server writes one file per process (``trace.<pid>.jsonl``): the engine core's
(``schedule``, ``update``, ``add``, ``step``/``step_bq`` records) and the worker's
(``execute``, ``forward``, ``sample``). Steps are joined by order, which vLLM keeps: the engine
core hands every ``SchedulerOutput`` to the worker's ``execute_model`` in the order it scheduled
them (``EngineCore.step`` and ``step_with_batch_queue``, ``v1/engine/core.py``; the ``mp``
executor's broadcast queue is FIFO), the worker calls ``sample_tokens`` once after each
``execute_model`` that scheduled tokens, and ``update_from_output`` runs once per step in the
same order (the batch queue is a FIFO of at most two). Each join is checked (token counts, request
counts); a mismatch raises rather than pairing the wrong calls. The client's records (send time,
each token's arrival, the same clock) joined with those steps give the API server's latencies
(:func:`frontend_samples`).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from calibrate.errors import CalibrationInputError

ENGINE_PHASES = {"schedule", "update", "add", "step", "step_bq", "bitmask", "accept", "compile"}
WORKER_PHASES = {"execute", "forward", "sample", "draft", "mask"}
BACKLOG_FACTOR = 2.0  # frontend samples: a delivery delay above this x the median is a backlog


@dataclass
class VllmStep:
    """One engine step. ``reqs``/``tok``/``done``: request ids, tokens scheduled and tokens
    computed before the step, per request; wall clock (``perf_counter``) starts and ends in
    seconds, CPU seconds of the calling thread. Worker fields are NaN for a step with no tokens."""

    k: int
    reqs: list
    tok: list
    done: list
    new: int
    preempted: list
    running: int
    waiting: int
    free_blocks: int | None
    schedule: dict
    execute: dict | None = None
    forward: float = float("nan")  # summed forward seconds inside execute (wall)
    forward_cpu: float = float("nan")  # and the thread CPU seconds of those calls
    forward_start: float = float("nan")  # wall clock of the first forward's start in execute
    forward_end: float = float("nan")  # and of the last one's end
    sample: dict | None = None
    draft: dict | None = None  # speculative decoding: the drafter's proposal inside ``sample``
    bitmask: dict | None = None  # structured output: get_grammar_bitmask for this step (E)
    update: dict | None = None
    finished: list = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.reqs)

    @property
    def num_tokens(self) -> int:
        return int(sum(self.tok))

    @property
    def ctx(self) -> float:
        """Mean over the step's requests of computed + scheduled tokens (the forward's context)."""
        return sum(d + t for d, t in zip(self.done, self.tok)) / len(self.reqs) if self.reqs else 0.0

    @property
    def is_decode(self) -> bool:
        return bool(self.reqs) and all(t == 1 for t in self.tok)


def client_rid(engine_id: str) -> str:
    """The client's request id in a vLLM 0.32 engine request id: the OpenAI server names a
    completion's prompt ``cmpl-<request_id>-<prompt index>-<8 hex>``
    (``vllm/entrypoints/openai/completion/serving.py``)."""
    body = engine_id[5:] if engine_id.startswith("cmpl-") else engine_id
    parts = body.rsplit("-", 2)
    return parts[0] if len(parts) == 3 else body


def read_files(paths: list[Path]) -> tuple[list[dict], list[dict]]:
    """(engine-core records, worker records), each in call-end order, from a server's trace files.

    Raises:
        CalibrationInputError: an unreadable file, a line that is not JSON, or no engine core /
            no worker among the files.
    """
    engine, workers = [], []
    for path in paths:
        try:
            lines = Path(path).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise CalibrationInputError(str(path), "", f"cannot read the trace ({err})") from None
        recs = []
        for n, line in enumerate(lines, 1):
            if line.strip():
                try:
                    recs.append(json.loads(line))
                except json.JSONDecodeError:
                    raise CalibrationInputError(str(path), f"line {n}", "not JSON: the trace is corrupt") from None
        phases = {r.get("ph") for r in recs}
        if phases & ENGINE_PHASES:
            engine += [r for r in recs if r.get("ph") in ENGINE_PHASES]
        if phases & WORKER_PHASES:
            workers.append((path, [r for r in recs if r.get("ph") in WORKER_PHASES]))
    if not engine or not workers:
        raise CalibrationInputError(str(paths[0].parent if paths else "trace"), "",
                                    "needs the engine core's and the worker's trace files (a traced vLLM server)")
    end = lambda r: r["t0"] + r["dur"]  # noqa: E731
    return sorted(engine, key=end), sorted(output_rank(workers), key=end)


def output_work_samples(paths: list[Path], sizes: set[int]) -> list[dict]:
    """Samples of ``vllm.frontend_work`` (``num_reqs``): the API server's
    ``OutputProcessor.process_outputs`` (the tracer's ``output`` records, in the API server's
    file) for an engine-core output of ``num_reqs`` requests, ``num_reqs`` in ``sizes``. Files
    that cannot be read are skipped (:func:`read_files` names them)."""
    acc: dict[int, list[float]] = {}
    for path in paths:
        try:
            lines = Path(path).read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for line in lines:
            if '"output"' not in line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("ph") == "output" and rec.get("n") in sizes:
                acc.setdefault(int(rec["n"]), []).append(float(rec["dur"]))
    return [{"curve": "vllm.frontend_work", "point": {"num_reqs": n}, "times_s": ts} for n, ts in sorted(acc.items())]


def worker_rank(records: list[dict]) -> int | None:
    """A worker file's tensor-parallel rank (its ``execute`` records' ``rank``; None: not recorded)."""
    return next((r["rank"] for r in records if r.get("ph") == "execute" and r.get("rank") is not None), None)


def output_rank(workers: list[tuple[Path, list[dict]]]) -> list[dict]:
    """The records of the worker whose output the engine core takes: with one worker, its own;
    with tensor parallelism (one file per rank), rank 0's (vLLM 0.32 ``MultiprocExecutor``:
    ``output_rank`` is the first rank of the last pipeline stage, ``v1/executor/multiproc_executor.py``).
    Every rank runs every step in lockstep (the all-reduces inside the forward), so rank 0's
    phases carry the waits for the others.

    Raises:
        CalibrationInputError: several worker files and no rank 0 among the recorded ranks.
    """
    if len(workers) == 1:
        return workers[0][1]
    ranks = {worker_rank(recs): (path, recs) for path, recs in workers}
    if 0 not in ranks:
        raise CalibrationInputError(str(workers[0][0].parent), "", f"{len(workers)} worker trace files and no rank 0 "
                                    f"among them (ranks {sorted(map(str, ranks))}): traced by an older tracer?")
    return ranks[0][1]



def steps(engine: list[dict], worker: list[dict]) -> list[VllmStep]:
    """The engine steps, schedule, worker calls and update joined (see the module docstring).

    Raises:
        CalibrationInputError: the worker's calls do not match the scheduled steps.
    """
    out = [VllmStep(k=k, reqs=r["reqs"], tok=r["tok"], done=r["done"], new=r.get("new", 0),
                    preempted=r.get("preempted", []), running=r.get("running", 0), waiting=r.get("waiting", 0),
                    free_blocks=r.get("free_blocks"), schedule=r)
           for k, r in enumerate(x for x in engine if x["ph"] == "schedule")]
    executes = [r for r in worker if r["ph"] == "execute"]
    forwards = [r for r in worker if r["ph"] == "forward"]
    samples = [r for r in worker if r["ph"] == "sample"]
    drafts = [r for r in worker if r["ph"] == "draft"]
    updates = [r for r in engine if r["ph"] == "update"]
    n = min(len(out), len(executes))
    fi, si, di = 0, 0, 0
    for step, ex in zip(out[:n], executes[:n]):
        if ex.get("n_tok", step.num_tokens) != step.num_tokens:
            raise CalibrationInputError("trace", f"step {step.k}", f"the worker executed {ex.get('n_tok')} tokens, "
                                        f"the scheduler scheduled {step.num_tokens}: the files do not belong together")
        step.execute = ex
        fwd = fwd_cpu = 0.0
        while fi < len(forwards) and forwards[fi]["t0"] < ex["t0"] + ex["dur"]:
            f = forwards[fi]
            if f["t0"] >= ex["t0"]:
                fwd += f["dur"]
                fwd_cpu += f.get("cpu", float("nan"))
                if step.forward_start != step.forward_start:
                    step.forward_start = f["t0"]
                step.forward_end = f["t0"] + f["dur"]
            fi += 1
        step.forward = fwd if step.num_tokens else float("nan")
        step.forward_cpu = fwd_cpu if step.num_tokens else float("nan")
        if step.num_tokens and si < len(samples):
            step.sample = samples[si]
            si += 1
            sa_end = step.sample["t0"] + step.sample["dur"]
            while di < len(drafts) and drafts[di]["t0"] + drafts[di]["dur"] <= sa_end:
                if drafts[di]["t0"] >= step.sample["t0"]:
                    step.draft = drafts[di]
                di += 1
    for step, up in zip([s for s in out if s.num_reqs], [u for u in updates if u.get("n", 1)]):
        step.update = up
        step.finished = up.get("finished", [])
    _join_bitmasks(out, [r for r in engine if r["ph"] == "bitmask"])
    return out


def _join_bitmasks(out: list[VllmStep], bitmasks: list[dict]) -> None:
    """Give each step its ``get_grammar_bitmask`` call: the first that starts after its
    ``schedule`` ended and before the next step's began (synchronously before its update;
    under async scheduling a deferred one after the previous step's update)."""
    bi = 0
    for step, nxt in zip(out, out[1:] + [None]):
        end = step.schedule["t0"] + step.schedule["dur"]
        limit = nxt.schedule["t0"] if nxt is not None else float("inf")
        while bi < len(bitmasks) and bitmasks[bi]["t0"] < end:
            bi += 1
        if bi < len(bitmasks) and bitmasks[bi]["t0"] < limit:
            step.bitmask = bitmasks[bi]
            bi += 1


def steps_of_session(folder: Path) -> list[VllmStep]:
    """The steps of one traced server session (``folder/trace.*.jsonl``)."""
    return steps(*read_files(sorted(Path(folder).glob("trace.*.jsonl"))))


def frontend_samples(folder: Path, engine_records: list[dict], steps: list[VllmStep],
                     loads: list[dict], sizes: set[int] | None = None) -> list[dict]:
    """The API server's share of a request's latency, from the client's records (``<load>.json``
    in ``folder``: send time and each token's arrival, ``perf_counter``) joined with the engine
    core's trace (same clock):

    - ``vllm.frontend_in`` (num_reqs n): from the client's send to ``EngineCore.add_request``:
      HTTP handling, ``OpenAIServingCompletion``, the input processor and the trip to the engine
      core's input queue. n = 1: the requests of the loads that run one request at a time (the
      engine idle when each is sent, no other request in the API server); n > 1: the first
      ``add_request`` after a burst of the load's first n requests, sent together to an idle
      server (the handlers interleave, so the first of them reaches the engine core late);
    - ``vllm.frontend_out`` (num_reqs n): from the end of ``update_from_output`` of a step that
      ran the load's full concurrency n (n in ``sizes``, default any) to the client's receipt of
      each of that step's tokens: the engine core's output thread,
      ``OutputProcessor.process_outputs`` in the API server, the streamed chunk.

    ``loads``: the session's loads (``name``, ``concurrency``), as its spec lists them. A request's
    j-th token is paired with the j-th step that sampled for it (its prompt complete), for the
    requests whose client received as many chunks as steps sampled for them (no two tokens in one
    chunk, no preemption). When the client falls behind the stream, its delays grow token by token
    (a backlog: up to 150 ms here): that is queueing, which the simulator's API server produces
    itself, not the service time; delays above :data:`BACKLOG_FACTOR` times the point's median are
    left out (in the shipped profile's sessions 13-47% of a point's samples, the most at batch 1 and
    16). The same cut applies to ``frontend_in``: a lone request that took 5-15 times the median
    (the session's first, up to 104 ms) waited behind something else.
    """
    prompt = {client_rid(r["rid"]): r["prompt"] for r in engine_records if r["ph"] == "add"}
    added = {client_rid(r["rid"]): r["t0"] for r in engine_records if r["ph"] == "add"}
    delivered: dict[str, list[tuple[float, int]]] = {}
    for st in steps:
        if st.update is None:
            continue
        end = st.update["t0"] + st.update["dur"]
        for rid, tok, done in zip(st.reqs, st.tok, st.done):
            c = client_rid(rid)
            if done + tok >= prompt.get(c, float("inf")):
                delivered.setdefault(c, []).append((end, st.num_reqs))
    acc: dict[str, dict[int, list[float]]] = {"vllm.frontend_in": {}, "vllm.frontend_out": {}}
    for load in loads:
        path = folder / f"{load['name']}.json"
        if not path.exists():
            continue
        recs = json.loads(path.read_text()).get("requests", [])
        burst = sorted(recs, key=lambda r: r["send_s"])[:load["concurrency"]]
        if load["concurrency"] > 1 and all(r["rid"] in added and not r.get("error") for r in burst):
            acc["vllm.frontend_in"].setdefault(load["concurrency"], []).append(
                min(added[r["rid"]] for r in burst) - burst[0]["send_s"])
        for r in recs:
            if r.get("error") or r["rid"] not in added:
                continue
            if load["concurrency"] == 1:
                acc["vllm.frontend_in"].setdefault(1, []).append(added[r["rid"]] - r["send_s"])
            steps_of = delivered.get(r["rid"], [])
            if len(r.get("token_times_s", [])) == len(steps_of):
                for t, (end, n) in zip(r["token_times_s"], steps_of):
                    if n == load["concurrency"] and (sizes is None or n in sizes):
                        acc["vllm.frontend_out"].setdefault(n, []).append(t - end)
    out = []
    for c, by in acc.items():
        for n, ts in sorted(by.items()):
            ts = [x for x in ts if x >= 0]
            if ts:  # a backlog's queueing (or a wait behind what the loads did not show) is not the latency
                cap = BACKLOG_FACTOR * statistics.median(ts)
                ts = [x for x in ts if x <= cap]
            if ts:
                out.append({"curve": c, "point": {"num_reqs": n}, "times_s": ts})
    return out
