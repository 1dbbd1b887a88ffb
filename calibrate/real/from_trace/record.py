"""Profile windows across a short designed load, sent to the user's running SGLang server
(``overlap-sim calibrate --profile-server URL --trace-dir DIR``).

One closed-loop load at the user's own traffic holds one batch size: its trace cannot tell a
per-request cost from a base cost, and the fitted form then prices every other batch size at
that one (measured: three windows over a 12-client load predicted the same server's batch-4
load 42% slow and its batch-16 load 45% fast in throughput, docs/real-engines.md). So the load is designed: **stages** of
``B`` requests sent at once to the idle server, ``B`` from 1 up to the server's
``max_running_requests`` by factors of 4, each with short prompts, and one stage at the largest
``B`` with long prompts (the context axis at a fixed batch). Before each stage
``/start_profile`` (SGLang 0.5.23, ``entrypoints/http_server.py:start_profile_async``) asks
for ``num_steps`` forwards with Python stacks and token counts (``detailed_annotations``) and
profile id ``<stage>``: the window then holds the stage's prefill and ``num_steps - 1``
decodes at batch ``B``; each request asks for ``2 num_steps + 2`` tokens, so as many decodes
at the same batch follow unprofiled, the log lines the profiler's slowdown is measured from.
Requests are token ids (``/generate`` with ``input_ids``, ``ignore_eos``, not streamed: see
:func:`_generate`), ids drawn in
[100, 1000) (valid for any vocabulary of 1000 or more), different per stage so no prefix hits
(the profile's prefix axis is then not measured: the forms set its term to 0 and say so).

Run it on the server's machine: the traces are written by the server into ``DIR`` (its path),
and each stage waits for its trace (``<stage>-TP-0.trace.json.gz``) before the next. A stage
whose trace exists already is not sent again (an interrupted recording resumes).

Standard library only (``urllib``, threads): it runs wherever the project is installed.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sim.errors import UserInputError

SHORT_INPUT = 128   # tokens per prompt of the batch stages
LONG_INPUT = 1024   # tokens per prompt of the long stage (at most half the context length)
FACTOR = 4          # between the batch sizes of the stages


@dataclass(frozen=True)
class Stage:
    """One profile window: ``batch`` requests of ``input_len`` prompt and ``output_len`` output
    tokens, sent at once."""

    batch: int
    input_len: int
    output_len: int

    @property
    def profile_id(self) -> str:
        return f"b{self.batch}-in{self.input_len}"


def design(max_batch: int, context_length: int, num_steps: int, kv_tokens: int | None = None) -> list[Stage]:
    """The stages for a server that runs at most ``max_batch`` requests with contexts up to
    ``context_length`` tokens (and ``kv_tokens`` in its KV pool, when known): batch sizes 1, 4,
    16, ... and ``max_batch`` itself at :data:`SHORT_INPUT`, then ``max_batch`` (fewer if the
    pool cannot hold them) at :data:`LONG_INPUT` (at most half the context).

    Raises:
        ValueError: ``max_batch``, ``context_length`` or ``num_steps`` below 1.
    """
    if max_batch < 1 or context_length < 1 or num_steps < 1:
        raise ValueError("max_batch, context_length and num_steps must be at least 1")
    out_len = 2 * num_steps + 2
    short = max(1, min(SHORT_INPUT, context_length - out_len - 1))
    batches, b = [], 1
    while b < max_batch:
        batches.append(b)
        b *= FACTOR
    batches.append(max_batch)
    stages = [Stage(b, short, out_len) for b in batches]
    long = min(LONG_INPUT, (context_length - out_len) // 2)
    if long > 2 * short:
        b = max_batch if kv_tokens is None else max(1, min(max_batch, int(0.8 * kv_tokens) // (long + out_len)))
        stages.append(Stage(b, long, out_len))
    return stages


def _request(url: str, body: dict | None, timeout_s: float, method: str = "POST") -> dict | str:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        text = resp.read().decode(errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def server_limits(url: str, timeout_s: float = 30.0) -> dict:
    """``max_running_requests``, ``context_length``, ``max_total_num_tokens`` and ``device`` of
    the server at ``url``, from ``/server_info`` (its resolved start-up configuration; SGLang
    0.5.23). Missing keys are absent.

    Raises:
        UserInputError: the server does not answer (``--profile-server``)."""
    try:
        info = _request(url.rstrip("/") + "/server_info", None, timeout_s, method="GET")
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise UserInputError("--profile-server", "", f"no SGLang server answers at {url} ({err})") from None
    if not isinstance(info, dict):
        raise UserInputError("--profile-server", "", f"{url}/server_info did not answer JSON: not an SGLang server?")
    states = info.get("internal_states") or [{}]
    out = {}
    for key in ("max_running_requests", "context_length", "max_total_num_tokens", "device"):
        value = states[0].get(key) if isinstance(states[0], dict) and states[0].get(key) else info.get(key)
        if value is not None:
            out[key] = value
    return out


def _generate(url: str, ids: list[int], out_len: int, timeout_s: float) -> None:
    """One request, answered whole (not streamed): the recording's own client then sleeps while
    the server decodes. Measured here, 16 streaming client threads in this process slowed the
    windows' decode steps of 16 requests from 25 to 48 ms on the 2-vCPU VM, and the profile
    then predicted the same server 12-19% off in throughput; unstreamed, within 6%."""
    _request(url + "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": out_len, "ignore_eos": True,
                                                                         "temperature": 0.0}}, timeout_s)


def record_windows(url: str, trace_dir: Path, stages: list[Stage], num_steps: int, device: str = "cpu",
                   timeout_s: float = 900.0, seed: int = 0, say=print) -> list[Path]:
    """Send each stage to the idle server at ``url`` with a profile window over it; returns the
    traces (one per stage, in order).

    Raises:
        UserInputError: the server refuses, or a stage's trace does not appear in ``trace_dir``
            within ``timeout_s`` (one line naming ``--trace-dir``)."""
    url = url.rstrip("/")
    trace_dir = Path(trace_dir).resolve()
    trace_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    traces = []
    for stage in stages:
        prompts = [[rng.randrange(100, 1000) for _ in range(stage.input_len)] for _ in range(stage.batch)]
        trace = trace_dir / f"{stage.profile_id}-TP-0.trace.json.gz"
        traces.append(trace)
        if trace.exists():
            say(f"{stage.profile_id}: recorded already ({trace})")
            continue
        body = {"output_dir": str(trace_dir), "num_steps": num_steps, "with_stack": True, "record_shapes": False,
                "detailed_annotations": True, "profile_id": stage.profile_id,
                "activities": ["CPU", "GPU"] if device == "cuda" else ["CPU"]}
        try:
            _request(url + "/start_profile", body, 60.0)
            t0 = time.monotonic()
            with ThreadPoolExecutor(max_workers=stage.batch) as pool:
                list(pool.map(lambda ids: _generate(url, ids, stage.output_len, timeout_s), prompts))
        except (urllib.error.URLError, OSError) as err:
            raise UserInputError("--profile-server", "", f"{url} failed during {stage.profile_id} ({err})") from None
        while not trace.exists():
            if time.monotonic() - t0 > timeout_s:
                raise UserInputError("--trace-dir", "", f"no {trace.name} in {trace_dir} after {timeout_s:g} s: run on "
                                     "the server's machine and name the folder the server writes to")
            time.sleep(0.5)
        _settled(trace)
        say(f"{stage.profile_id}: {stage.batch} requests of {stage.input_len}+{stage.output_len} tokens, "
            f"{time.monotonic() - t0:.1f} s: {trace}")
    return traces


def _settled(path: Path, quiet_s: float = 1.0) -> None:
    """Wait until the server has finished writing ``path`` (its size unchanged for ``quiet_s``)."""
    size = -1
    while (now := path.stat().st_size) != size:
        size = now
        time.sleep(quiet_s)
