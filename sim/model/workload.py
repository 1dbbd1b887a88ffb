"""Request lengths and arrival processes (SimPy) for a scenario's workload.

Lengths are drawn up front with a seeded numpy Generator, so a run is reproducible from the
scenario and its seed. Arrivals are SimPy processes that hand requests to the scheduler's
inbox: a Poisson process, a replayed trace, or closed-loop clients that each send their next
request when the previous one finished (SGLang ``bench_serving --max-concurrency``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import simpy

from sim.errors import UserInputError
from sim.model.schema import ChoiceLength, Length, LognormalLength, NormalLength, UniformLength


# max_new_tokens of an EOS-finishing request when the workload gives none: SGLang's own estimate
# for an unknown output length (CLIP_MAX_NEW_TOKENS); the server clips it to the KV pool
EOS_MAX_NEW_TOKENS = 4096


@dataclass(frozen=True)
class RequestSpecs:
    """Per-request lengths (arrays of shape (num_requests,), int64) and, for open-loop arrival,
    arrival times in seconds (float64) or None for closed loop. ``output_len`` is where a request
    stops; ``max_new_tokens`` (the client's cap, known to the scheduler) and ``ignore_eos``
    (bool) are optional per-request arrays."""

    input_len: np.ndarray
    cached_len: np.ndarray
    output_len: np.ndarray
    arrival_s: np.ndarray | None
    max_new_tokens: np.ndarray | None = None  # per request; None: the scheduler's default (output_len for length)
    ignore_eos: np.ndarray | None = None  # per request (bool); None: True for finish: length

    def __len__(self) -> int:
        return len(self.input_len)


def sample_lengths(spec: Length, n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``n`` integer lengths from a length spec (an int or a distribution); shape (n,)."""
    if isinstance(spec, int):
        return np.full(n, spec, dtype=np.int64)
    if isinstance(spec, UniformLength):
        return rng.integers(spec.low, spec.high + 1, size=n, dtype=np.int64)
    if isinstance(spec, ChoiceLength):
        p = None if spec.weights is None else np.asarray(spec.weights) / sum(spec.weights)
        return rng.choice(np.asarray(spec.values, dtype=np.int64), size=n, p=p)
    if isinstance(spec, NormalLength):
        raw = rng.normal(spec.mean, spec.std, size=n)
    elif isinstance(spec, LognormalLength):
        mu = np.log(spec.mean) - spec.sigma**2 / 2  # arithmetic mean == spec.mean
        raw = rng.lognormal(mu, spec.sigma, size=n)
    else:  # pragma: no cover - the schema admits nothing else
        raise TypeError(f"unknown length spec {spec!r}")
    hi = spec.max if spec.max is not None else np.iinfo(np.int64).max
    return np.clip(np.rint(raw), spec.min, hi).astype(np.int64)


def make_requests(scenario) -> RequestSpecs:
    """The scenario's requests: lengths and (open loop) arrival times, seeded by ``scenario.seed``.

    ``scenario``: a :class:`sim.scenario.Scenario` (its ``workload``, ``seed`` and
    ``resolve_path`` are read).

    ``input_len`` is at least 1 and ``cached_len`` at most ``input_len - 1`` (a prefill always
    extends at least one token, as in SGLang); ``output_len`` is at least 1.

    Raises:
        UserInputError: a trace file that cannot be read or has a bad line.
    """
    w = scenario.workload
    if w.trace:
        specs = _read_trace(scenario)
        return specs if w.arrival == "trace" else replace(specs, arrival_s=None)
    rng = np.random.default_rng([scenario.seed, 1])
    n = w.num_requests
    input_len = np.maximum(sample_lengths(w.input_len, n, rng), 1)
    cached = np.minimum(sample_lengths(w.cached_len, n, rng), input_len - 1)
    output_len = np.maximum(sample_lengths(w.output_len, n, rng), 1)
    arrival = None
    if w.arrival == "poisson":
        arrival = np.cumsum(rng.exponential(1.0 / w.rate_per_s, size=n))
    if w.max_new_tokens is not None:  # drawn after the others: scenarios without it keep their lengths
        max_new = np.maximum(sample_lengths(w.max_new_tokens, n, np.random.default_rng([scenario.seed, 4])), output_len)
    else:
        max_new = output_len if w.finish == "length" else np.maximum(output_len, EOS_MAX_NEW_TOKENS)
    ignore = np.full(n, w.finish == "length" if w.ignore_eos is None else w.ignore_eos)
    return RequestSpecs(input_len, cached, output_len, arrival, max_new, ignore)


def _read_trace(scenario) -> RequestSpecs:
    path = scenario.resolve_path(scenario.workload.trace)
    by_length = scenario.workload.finish == "length"
    rows = []
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise UserInputError(str(path), "", f"cannot read trace ({err})") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            out = int(rec["output_len"])
            # defaults follow the scenario's finish: length (max_new = output, ignore_eos) or eos
            max_new = int(rec.get("max_new_tokens", out if by_length else max(out, EOS_MAX_NEW_TOKENS)))
            row = (float(rec.get("arrival_s", 0.0)), int(rec["input_len"]), int(rec.get("cached_len", 0)), out,
                   max_new, float(bool(rec.get("ignore_eos", by_length))))
        except (ValueError, KeyError, TypeError) as err:
            raise UserInputError(
                str(path), f"line {lineno}",
                f"expected JSON with arrival_s, input_len, output_len[, cached_len, max_new_tokens, ignore_eos] "
                f"({type(err).__name__}: {err})",
            ) from None
        if not np.isfinite(row[0]) or row[0] < 0 or row[1] < 1 or row[3] < 1 or row[2] < 0 or row[4] < row[3]:
            raise UserInputError(str(path), f"line {lineno}", "expected a finite arrival_s >= 0, input_len >= 1, "
                                 "output_len >= 1, cached_len >= 0, max_new_tokens >= output_len")
        rows.append(row)
    if not rows:
        raise UserInputError(str(path), "", "trace has no requests")
    if scenario.workload.arrival == "trace":
        rows.sort(key=lambda r: r[0])
    arr = np.asarray(rows, dtype=np.float64)
    input_len = arr[:, 1].astype(np.int64)
    return RequestSpecs(input_len, np.minimum(arr[:, 2].astype(np.int64), input_len - 1), arr[:, 3].astype(np.int64),
                        arr[:, 0], arr[:, 4].astype(np.int64), arr[:, 5].astype(bool))


def open_loop_arrivals(env: simpy.Environment, arrival_s: np.ndarray, submit: Callable[[int, float], None]):
    """SimPy process: submit request ``i`` at ``arrival_s[i]`` (sorted, seconds)."""
    for i, t in enumerate(arrival_s.tolist()):
        if t > env.now:
            yield env.timeout(t - env.now)
        submit(i, t)


class ClosedLoopClients:
    """``concurrency`` clients; each sends its next request the moment its previous one finished.

    Request ids are handed out in order, so request ``i`` is the ``i``-th sent. ``on_finish``
    is called by the scheduler with the time the request's last token was delivered (or it
    failed); the next request arrives at that time.

    With ``warmup_first`` > 0 (``bench_serving``'s warm-up), requests ``0..warmup_first-1`` are
    sent first, up to ``concurrency`` at a time, and the benchmark's clients start only when all
    of them have finished.
    """

    def __init__(self, num_requests: int, concurrency: int, submit: Callable[[int, float], None],
                 warmup_first: int = 0):
        self._next = 0
        self._num = num_requests
        self._submit = submit
        self._concurrency = concurrency
        self._initial = min(concurrency, num_requests)
        self._warmup_left = min(warmup_first, num_requests)
        self._warmup_done = 0

    def start(self) -> None:
        first = min(self._initial, self._warmup_left) if self._warmup_left else self._initial
        for _ in range(first):
            self._send(0.0)

    def on_finish(self, req_id: int, time_s: float) -> None:
        if self._warmup_left:
            if req_id < self._warmup_left:
                self._warmup_done += 1
                if self._warmup_done == self._warmup_left:
                    self._warmup_left = 0
                    for _ in range(self._concurrency):
                        self._send(time_s)
                elif self._next < self._warmup_left:
                    self._send(time_s)
            return
        self._send(time_s)

    def _send(self, time_s: float) -> None:
        if self._next < self._num:
            self._next += 1
            self._submit(self._next - 1, time_s)
