"""The API server's latencies in front of vLLM's engine core, from a calibration session's client
records joined with the engine core's trace: the curves ``vllm.frontend_in`` and
``vllm.frontend_out`` that :mod:`sim.engines.vllm.frontend` models."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from calibrate.real import vllm_trace

BACKLOG_FACTOR = 2.0  # frontend_out: a delivery delay above this x the median is a backlog


def frontend_samples(folder: Path, engine_records: list[dict], steps: list[vllm_trace.VllmStep],
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

    ``loads``: the session's loads (``name``, ``concurrency``), as its spec lists them. A request's j-th token is paired with the j-th step that
      sampled for it (its prompt complete), for the requests whose client received as many
      chunks as steps sampled for them (no two tokens in one chunk, no preemption). When the
      client falls behind the stream, its delays grow token by token (a backlog: up to 150 ms
      here): that is queueing, which the simulator's API server produces itself, not the service
      time; delays above :data:`BACKLOG_FACTOR` times the point's median are left out (in the
      shipped profile's sessions 13-47% of a point's samples, the most at batch 1 and 16). The
      same cut applies to ``frontend_in``: a lone request that took 5-15 times the median (the
      session's first, up to 104 ms) waited behind something else.
    """
    prompt = {vllm_trace.client_rid(r["rid"]): r["prompt"] for r in engine_records if r["ph"] == "add"}
    added = {vllm_trace.client_rid(r["rid"]): r["t0"] for r in engine_records if r["ph"] == "add"}
    delivered: dict[str, list[tuple[float, int]]] = {}
    for st in steps:
        if st.update is None:
            continue
        end = st.update["t0"] + st.update["dur"]
        for rid, tok, done in zip(st.reqs, st.tok, st.done):
            c = vllm_trace.client_rid(rid)
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
