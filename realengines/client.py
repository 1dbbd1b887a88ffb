"""A closed-loop streaming load generator for a real server, with bench_serving's metrics.

    python -m realengines.client LOAD.json OUT.json

LOAD (JSON)::

    {"url": "http://127.0.0.1:30000", "api": "sglang" | "openai", "concurrency": int,
     "warmup_requests": int, "requests": [{"rid": str, "input_ids": [int], "max_new_tokens": int,
     "ignore_eos": bool, "stop_token_ids": [int] (optional), "temperature": float (default 0),
     "sampling_seed": int (optional)}]}

``concurrency`` clients each send their next request when their previous one has finished
(bench_serving's ``--max-concurrency`` with an infinite request rate behaves the same). An open
loop instead: when the measured requests carry ``arrival_s`` (seconds after the measured window
starts, non-decreasing), each is sent at that instant whatever is in flight, as ``vllm bench
serve --request-rate`` and ``sglang.bench_serving --request-rate`` do (``concurrency`` 0: no cap;
otherwise at most that many in flight, the others wait for a slot as those clients' semaphore
makes them). The instant each request was really sent is its record's ``send_s``. The first
``warmup_requests`` are sent and awaited before the measured ones, concurrently, as
bench_serving's warm-up. ``api: sglang`` posts to SGLang's native ``/generate`` with
``input_ids`` (what ``bench_serving --backend sglang`` does); ``openai`` posts to
``/v1/completions`` with the token ids as the prompt (vLLM). Tokens are counted from the server's
own count (SGLang: ``meta_info.completion_tokens``; OpenAI: each chunk's ``token_ids``, asked
for with ``return_token_ids``, checked against ``usage.completion_tokens``; until 6 December 2026
one token per chunk with text, so a stubbed vLLM server's empty-text tokens went uncounted until
the last chunk and their times were spread evenly over the request).

OUT (JSON): ``{"start_s", "end_s", "requests": [{"rid", "warmup", "send_s", "first_s", "end_s",
"output_len", "token_times_s": [...] (one per token, a chunk of n tokens spread evenly over its
gap as bench_serving does), "error"}]}``; times from ``time.perf_counter`` (the machine's
monotonic clock, the same clock as the engine tracers).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import zlib

clock = time.perf_counter


def _sglang_body(req: dict) -> tuple[str, dict]:
    params = {"max_new_tokens": int(req["max_new_tokens"]), "ignore_eos": bool(req.get("ignore_eos", True)),
              "temperature": float(req.get("temperature", 0.0))}
    if req.get("stop_token_ids"):
        params["stop_token_ids"] = list(req["stop_token_ids"])
    if req.get("sampling_seed") is not None:
        params["sampling_seed"] = int(req["sampling_seed"])
    if req.get("structured_outputs"):  # a grammar (vLLM's field, e.g. {"json": schema}) as SGLang takes it
        params["json_schema"] = json.dumps(req["structured_outputs"]["json"])
        if "temperature" not in req:
            # SGLang finishes a request whose grammar ended, and greedy decoding on the random-weight
            # model closes the schema's one string within about 14 tokens: sampled, it stays inside
            params["temperature"] = 1.0
            params["sampling_seed"] = zlib.crc32(str(req["rid"]).encode())
    # rid: the scheduler's request id is ours, so its trace names the client's requests
    return "/generate", {"rid": req["rid"], "input_ids": req["input_ids"], "sampling_params": params, "stream": True}


def _openai_body(req: dict) -> tuple[str, dict]:
    body = {"model": req.get("model", "default"), "prompt": req["input_ids"], "max_tokens": int(req["max_new_tokens"]),
            "ignore_eos": bool(req.get("ignore_eos", True)), "temperature": float(req.get("temperature", 0.0)),
            "stream": True, "stream_options": {"include_usage": True},
            # each chunk's token ids: a token whose text is empty (the stubbed forward's, or bytes of a
            # character not yet complete) is still counted when it arrives (vLLM 0.32's
            # CompletionRequest.return_token_ids; without it every stubbed session's stream counted
            # no token until the usage chunk, and its token times were spread over the request)
            "return_token_ids": True,
            "request_id": req["rid"]}  # vLLM's engine id becomes cmpl-<rid>-<n> (its trace names our requests)
    if req.get("stop_token_ids"):
        body["stop_token_ids"] = list(req["stop_token_ids"])
    if req.get("sampling_seed") is not None:
        body["seed"] = int(req["sampling_seed"])
    if req.get("structured_outputs"):  # vLLM 0.32's grammar field (e.g. {"json": schema})
        body["structured_outputs"] = req["structured_outputs"]
    return "/v1/completions", body


def _count_sglang(data: dict, count: int) -> int:
    return int((data.get("meta_info") or {}).get("completion_tokens", count))


def _count_openai(data: dict, count: int) -> int:
    """The tokens received so far after the chunk ``data``: its ``token_ids`` counted where the
    server sends them (:func:`_openai_body` asks for them), else one token for a chunk with text,
    else the usage's count (the last chunk)."""
    choices = data.get("choices") or []
    if choices and choices[0].get("token_ids") is not None:
        return count + len(choices[0]["token_ids"])
    if choices and choices[0].get("text"):
        return count + 1
    usage = data.get("usage") or {}
    return int(usage.get("completion_tokens") or count)


async def send(session, url: str, api: str, req: dict) -> dict:
    """One streamed request; returns its record (see the module docstring)."""
    path, body = (_sglang_body if api == "sglang" else _openai_body)(req)
    count_of = _count_sglang if api == "sglang" else _count_openai
    out = {"rid": req["rid"], "send_s": clock(), "first_s": None, "end_s": None, "output_len": 0,
           "token_times_s": [], "error": ""}
    times = out["token_times_s"]
    last_t, count = out["send_s"], 0
    try:
        async with session.post(url + path, json=body) as resp:
            if resp.status != 200:
                out["error"] = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return out
            async for line in resp.content:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                now = clock()
                new = count_of(json.loads(payload), count)
                if new > count:
                    step = (now - last_t) / (new - count)
                    times.extend(last_t + step * (i + 1) for i in range(new - count))
                    if out["first_s"] is None:
                        out["first_s"] = now
                    last_t, count = now, new
    except Exception as err:  # connection refused, reset: the request failed
        out["error"] = f"{type(err).__name__}: {err}"
        return out
    out["end_s"] = clock()
    out["output_len"] = count
    return out


async def _closed_loop(session, url: str, api: str, reqs: list[dict], concurrency: int) -> list[dict]:
    """``concurrency`` clients, each sending its next request when its previous one finished."""
    queue = list(reversed(reqs))
    measured: list[dict] = []

    async def client():
        while queue:
            measured.append(await send(session, url, api, queue.pop()))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return measured


async def _open_loop(session, url: str, api: str, reqs: list[dict], cap: int, start: float) -> list[dict]:
    """Each request sent at ``start + arrival_s`` (a request without one at ``start``), with at
    most ``cap`` in flight when ``cap`` > 0."""
    slots = asyncio.Semaphore(cap) if cap > 0 else None

    async def one(req: dict) -> dict:
        delay = start + float(req.get("arrival_s", 0.0)) - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        if slots is None:
            return await send(session, url, api, req)
        async with slots:
            return await send(session, url, api, req)

    return list(await asyncio.gather(*(one(r) for r in reqs)))


async def run_load(load: dict) -> dict:
    import aiohttp

    url, api, reqs = load["url"].rstrip("/"), load.get("api", "sglang"), load["requests"]
    warm = int(load.get("warmup_requests", 0))
    timeout = aiohttp.ClientTimeout(total=None, sock_read=float(load.get("read_timeout_s", 300)))
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        warm_out = await asyncio.gather(*(send(session, url, api, r) for r in reqs[:warm]))
        start = clock()
        if any("arrival_s" in r for r in reqs[warm:]):
            measured = await _open_loop(session, url, api, reqs[warm:], int(load.get("concurrency") or 0), start)
        else:
            measured = await _closed_loop(session, url, api, reqs[warm:], int(load["concurrency"]))
        end = clock()
    for rec in warm_out:
        rec["warmup"] = True
    for rec in measured:
        rec["warmup"] = False
    order = {r["rid"]: i for i, r in enumerate(reqs)}
    records = sorted([*warm_out, *measured], key=lambda r: order[r["rid"]])
    return {"start_s": start, "end_s": end, "requests": records}


def benchmark_record(rid: str, send_s: float, ttft_s: float, gaps_s: list[float], latency_s: float,
                     output_len: int, error: str, input_len: int, send_lag_s: float | None) -> dict:
    """One request's record from what an engine's own benchmark client measured of it (seconds,
    ``time.perf_counter``): its send instant, time to first token, the gaps after it (one per
    streamed chunk, or per token where the benchmark spreads a chunk's tokens) and latency. The
    token times are the first token then the running sum of the gaps; a stream short of
    ``output_len`` puts the rest at its last time. A request without error but without a token
    gets the error ``no output token``."""
    rec = {"rid": rid, "warmup": False, "send_s": send_s, "first_s": None, "end_s": None, "output_len": output_len,
           "token_times_s": [], "error": error, "input_len": input_len, "send_lag_s": send_lag_s}
    if not error and output_len > 0:
        times = [send_s + ttft_s]
        for gap in gaps_s:
            times.append(times[-1] + float(gap))
        times = times[:output_len] + [times[-1]] * max(0, output_len - len(times))
        rec.update(first_s=times[0], end_s=send_s + latency_s, token_times_s=times)
    elif not error:
        rec["error"] = "no output token"
    return rec


def benchmark_load(reqs: list[dict], client: str) -> dict:
    """A load's records (:func:`benchmark_record` each) with their window: from the first send to
    the last finish."""
    start = min((r["send_s"] for r in reqs), default=0.0)
    end = max((r["end_s"] for r in reqs if r["end_s"] is not None), default=start)
    return {"start_s": start, "end_s": end, "requests": reqs, "client": client}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        sys.exit("usage: python -m realengines.client LOAD.json OUT.json")
    with open(argv[0]) as f:
        load = json.load(f)
    result = asyncio.run(run_load(load))
    tmp = argv[1] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, argv[1])


if __name__ == "__main__":
    main()
