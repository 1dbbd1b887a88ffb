"""Request lengths, arrival processes (SimPy) and which requests carry a grammar, for a scenario's
workload.

Lengths are drawn up front with a seeded numpy Generator, so a run is reproducible from the
scenario and its seed. Arrivals hand requests to the scheduler's inbox: a Poisson process or a
replayed trace (a SimPy process, or :class:`PulledArrivals`, the same process run by an event
loop that leaps), or closed-loop clients that each send their next request when the previous one
finished (SGLang ``bench_serving --max-concurrency``).
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, ClassVar, Literal

import numpy as np
import simpy
from pydantic import Field

from sim.errors import UserInputError, shown
from sim.jsonio import DuplicateKeyError, unique_keys
from sim.model.costs import SeededGenerator
from sim.model.schema import MAX_TOKENS, StrictModel, ChoiceLength, Length, LognormalLength, NormalLength, UniformLength

MAX_ARRIVAL_S = 1.0e9  # about 32 years of arrivals: a later one is a corrupt value


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
    # per request (bool): whether the client sends max_new_tokens (False: an EOS request without a
    # cap, whose max_new_tokens is the server's estimate); None: every request sends it
    max_new_sent: np.ndarray | None = None

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
    hi = spec.max if spec.max is not None else MAX_TOKENS
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
        specs = read_trace(scenario.resolve_path(w.trace), sort=w.arrival == "trace", by_length=w.finish == "length")
        return specs if w.arrival == "trace" else replace(specs, arrival_s=None)
    rng = SeededGenerator([scenario.seed, 1])
    n = w.num_requests
    input_len = np.maximum(sample_lengths(w.input_len, n, rng), 1)
    cached = np.minimum(sample_lengths(w.cached_len, n, rng), input_len - 1)
    output_len = np.maximum(sample_lengths(w.output_len, n, rng), 1)
    arrival = None
    if w.arrival == "poisson":
        arrival = np.cumsum(rng.exponential(1.0 / w.rate_per_s, size=n))
    if w.max_new_tokens is not None:  # drawn after the others: scenarios without it keep their lengths
        max_new = np.maximum(sample_lengths(w.max_new_tokens, n, SeededGenerator([scenario.seed, 4])), output_len)
    else:
        max_new = output_len if w.finish == "length" else np.maximum(output_len, EOS_MAX_NEW_TOKENS)
    ignore = np.full(n, w.finish == "length" if w.ignore_eos is None else w.ignore_eos)
    sent = np.full(n, w.max_new_tokens is not None or w.finish == "length")
    return RequestSpecs(input_len, cached, output_len, arrival, max_new, ignore, sent)


TRACE_KEYS = ("arrival_s", "input_len", "output_len", "cached_len")
TRACE_FIELDS = TRACE_KEYS + ("max_new_tokens", "ignore_eos")  # every key a trace line may hold
_trace_cache: dict = {}  # (path, mtime, size) -> parsed rows: a trace is read once per process
# a line's reader, refusing a key given twice (made once: json.loads with a hook builds a decoder per
# call, which made a 100,000-line trace 1.35x slower to read)
_TRACE_JSON = json.JSONDecoder(object_pairs_hook=unique_keys)


def read_trace(path: Path, sort: bool = True, by_length: bool = True) -> RequestSpecs:
    """A JSON-lines trace (one request per line: ``arrival_s``, ``input_len``, ``output_len``,
    optional ``cached_len``, ``max_new_tokens`` and ``ignore_eos``) as request specs, sorted by
    arrival when ``sort`` (open loop) or in file order (a closed-loop replay); ``cached_len`` is at
    most ``input_len - 1`` per request (the last prompt token is always computed). A line without
    ``max_new_tokens`` / ``ignore_eos`` takes them from the workload's finish: ``by_length`` (the
    output is the cap, ignore_eos) or eos (cap :data:`EOS_MAX_NEW_TOKENS`, EOS honoured).

    Raises:
        UserInputError: the file cannot be read, a line is not such an object, a value is not
            a finite number in range (arrival_s 0 to 1e9 s; lengths integers, input_len and
            output_len >= 1, 0 <= cached_len <= input_len, max_new_tokens >= output_len,
            ignore_eos a boolean), a key given twice in one line, or the trace has no request. The
            message names the file, the line and the key.
    """
    path = Path(path)
    try:
        stat = path.stat()
        key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    except OSError as err:
        raise UserInputError(str(path), "", f"cannot read trace ({err.strerror or err})") from None
    if key not in _trace_cache:
        _trace_cache.clear()
        _trace_cache[key] = _parse_trace(path)
    rows = sorted(_trace_cache[key], key=lambda r: r[0]) if sort else _trace_cache[key]
    arrival = np.asarray([r[0] for r in rows], dtype=np.float64)
    input_len = np.asarray([r[1] for r in rows], dtype=np.int64)
    output_len = np.asarray([r[2] for r in rows], dtype=np.int64)
    cached = np.minimum(np.asarray([r[3] for r in rows], dtype=np.int64), input_len - 1)
    default_cap = output_len if by_length else np.maximum(output_len, EOS_MAX_NEW_TOKENS)
    given = np.asarray([r[4] for r in rows]) >= 0
    max_new = np.where(given, [r[4] for r in rows], default_cap).astype(np.int64)
    ignore = np.asarray([by_length if r[5] is None else r[5] for r in rows], dtype=bool)
    return RequestSpecs(input_len, cached, output_len, arrival, max_new, ignore, given | by_length)


def _trace_value(rec: dict, key: str, where: str, source: str):
    v = rec.get(key, 0 if key == "cached_len" else None)
    if v is None:
        what = f"{key!r} is null" if key in rec else f"missing key {key!r}"
        raise UserInputError(source, where, f"{what} (a request is a JSON object with arrival_s, "
                             "input_len, output_len[, cached_len, max_new_tokens, ignore_eos])")
    # (an integer too large for a float fails the range checks below, compared exactly: math.isfinite
    # of 10**400 would raise OverflowError, so only floats are asked whether they are finite)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or isinstance(v, float) and not math.isfinite(v):
        raise UserInputError(source, f"{where}: {key}", f"expected a finite number (got {v!r})")
    if key == "arrival_s":
        if not 0 <= v <= MAX_ARRIVAL_S:
            raise UserInputError(source, f"{where}: {key}", f"expected seconds from 0 to {MAX_ARRIVAL_S:g} "
                                 f"(got {shown(v)})")
        return float(v)
    low = 0 if key == "cached_len" else 1
    if not low <= v <= MAX_TOKENS or v != int(v):
        raise UserInputError(source, f"{where}: {key}", f"expected an integer from {low} to {MAX_TOKENS} "
                             f"(got {shown(v)})")
    return int(v)


def _parse_trace(path: Path) -> list[tuple]:
    """Rows (arrival_s, input_len, output_len, cached_len, max_new_tokens or -1, ignore_eos or None)
    in file order."""
    source = str(path)
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()  # a byte-order mark (Windows editors) is not data
    except OSError as err:
        raise UserInputError(source, "", f"cannot read trace ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        raise UserInputError(source, "", f"not a text file ({err.reason} at byte {err.start}): expected JSON "
                             "lines") from None
    rows = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"line {lineno}"
        try:
            rec = _TRACE_JSON.decode(line)
        except DuplicateKeyError as err:
            raise UserInputError(source, f"{where}: {err.key}", "given twice in one request (JSON would keep the "
                                 "last in silence): give each key once") from None
        except ValueError as err:
            raise UserInputError(source, where, f"not valid JSON ({err}); expected one request per line: "
                                 "{\"arrival_s\": ..., \"input_len\": ..., \"output_len\": ...}") from None
        if not isinstance(rec, dict):
            raise UserInputError(source, where, f"expected a JSON object with arrival_s, input_len, output_len"
                                 f"[, cached_len] (got {type(rec).__name__})")
        unknown = next((k for k in rec if k not in TRACE_FIELDS), None)
        if unknown is not None:  # a misspelt key would be read as its default, in silence
            close = difflib.get_close_matches(unknown, TRACE_FIELDS, n=1)
            raise UserInputError(source, f"{where}: {unknown}", "unknown key" + (f" (did you mean {close[0]!r}?)" if close
                                 else f" (expected {', '.join(TRACE_FIELDS)})"))
        row = tuple(_trace_value(rec, k, where, source) for k in TRACE_KEYS)
        if row[3] > row[1]:
            raise UserInputError(source, f"{where}: cached_len", f"must be <= input_len (got cached_len {row[3]} > "
                                 f"input_len {row[1]})")
        max_new = _trace_value(rec, "max_new_tokens", where, source) if "max_new_tokens" in rec else -1
        if "max_new_tokens" in rec and max_new < row[2]:
            raise UserInputError(source, f"{where}: max_new_tokens", f"must be >= output_len (got {max_new} < "
                                 f"{row[2]}): a request stops at its cap")
        ignore = rec.get("ignore_eos")
        if ignore is not None and not isinstance(ignore, bool):
            raise UserInputError(source, f"{where}: ignore_eos", f"expected true or false (got {ignore!r})")
        rows.append((*row, max_new, ignore))
    if not rows:
        raise UserInputError(source, "", "trace has no requests")
    return rows


def open_loop_arrivals(env: simpy.Environment, arrival_s: np.ndarray, submit: Callable[[int, float], None]):
    """SimPy process: submit request ``i`` at ``arrival_s[i]`` (sorted, seconds)."""
    for i, t in enumerate(arrival_s.tolist()):
        if t > env.now:
            yield env.timeout(t - env.now)
        submit(i, t)


class PulledArrivals:
    """:func:`open_loop_arrivals` run inside the event loop's own process: where the loop is the
    only other SimPy process (SGLang's loops that leap, :mod:`sim.engines.sglang.leap`), it asks
    this object, wherever it would hand control to SimPy, what that process would have submitted
    by then, and SimPy schedules no event per arrival.

    The order is SimPy's own, float for float (SimPy 4.1, ``Environment.schedule`` and ``step``):
    a timeout of ``delay`` yielded at ``env.now`` fires at ``env.now + delay``; events fire by time,
    then creation order; the arrival process, created before the loop, holds at most one pending
    timeout. So when the loop's timeout fires at T, the arrival process's pending one fired before
    it if due before T, or at T and created before the loop's (as every one pending when the loop
    yields is); one it creates meanwhile fires first only if due before T. :attr:`clock` is the
    loop's ``env.now`` as its yields would have set it. ``--no-leap`` runs the SimPy process (the
    reference): ``tests/test_pulled_arrivals.py`` holds this object to SimPy's own run of it,
    ``tests/test_leap.py`` and ``tests/test_lazy_yield.py`` the runs (bursts, idle stretches and a
    dying server included).

    Args:
        arrival_s: arrival times (s, Python floats as ``open_loop_arrivals`` reads them), sorted; read,
            not copied (the loop's ``Phases`` holds the same list). submit: ``submit(i, arrival_s[i])``,
            as the process calls it.
    """

    def __init__(self, arrival_s: list[float], submit: Callable[[int, float], None]):
        self._t = arrival_s
        self._submit = submit
        self._next = 0  # the next request to submit
        self.clock = 0.0  # the loop's env.now
        self.due: float | None = None  # when the process's pending timeout fires; None: all submitted
        self._older = False  # that timeout was created before the loop's latest one
        self._run(0.0)  # its first step, at time 0 (created before the loop, it runs first)
        self._older = True

    def _run(self, now: float) -> None:
        """The process from the top of its loop at ``env.now == now``: submit what is due by
        then, and hold until the next arrival."""
        t, i = self._t, self._next
        while i < len(t):
            if t[i] > now:
                self._next, self.due, self._older = i, now + (t[i] - now), False
                return
            self._next = i + 1
            self._submit(i, t[i])
            i += 1
        self._next, self.due = i, None

    def fire(self) -> None:
        """The pending timeout fires: its request is submitted and the process runs on."""
        due, i = self.due, self._next
        self._next = i + 1
        self._submit(i, self._t[i])
        self._run(due)

    def advance(self, delay: float) -> float:
        """The loop yields a timeout of ``delay`` (s) from :attr:`clock`: submit what the process
        would have by the time it fires; returns that time, the new clock."""
        fire = self.clock + delay
        due = self.due
        while due is not None and (due < fire or (due == fire and self._older)):
            self.fire()
            due = self.due
        self._older = True
        self.clock = fire
        return fire

    def wait(self) -> float | None:
        """The loop waits for the next request (nothing received is left): the process's pending
        timeout fires and the loop resumes then (SimPy's wake-up event, triggered by the
        submission). Returns the new clock, or None when no request is left to arrive."""
        if self.due is None:
            return None
        self.clock = self.due
        self.fire()
        self._older = True
        return self.clock


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
                 warmup_first: int = 0, submit_range: Callable[[int, int, float], None] | None = None):
        self._next = 0
        self._num = num_requests
        self._submit = submit
        # submit_range(first, count, time_s): submit of requests first .. first + count - 1 at time_s
        self._submit_range = submit_range
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

    def on_finish_all(self, req_ids: list[int], time_s: float) -> None:
        """:meth:`on_finish` of each of ``req_ids``, in order, all finished at ``time_s``: their
        clients' next requests sent together (one ``submit_range`` where the clients have one)."""
        if self._warmup_left or self._submit_range is None:
            for rid in req_ids:
                self.on_finish(rid, time_s)
            return
        count = min(len(req_ids), self._num - self._next)
        if count > 0:
            first = self._next
            self._next = first + count
            self._submit_range(first, count, time_s)

    def _send(self, time_s: float) -> None:
        if self._next < self._num:
            self._next += 1
            self._submit(self._next - 1, time_s)


# --- structured output: which requests carry a grammar ---------------------------------------
# A grammar (a JSON schema, a regex, an EBNF grammar or a choice) is per request in both engines
# (SGLang's SamplingParams.json_schema/regex/ebnf, vLLM's structured_outputs); each engine's
# server.structured_output section (sim.engines.<engine>.structured) subclasses GrammarShare
# with what the grammar costs where that engine runs it.
GRAMMAR_SEED = 11  # the stream that draws which requests carry a grammar: rng([seed, 11])
KINDS = ("json_schema", "regex", "grammar", "choice")


class GrammarShare(StrictModel):
    """``share`` (0-1, the requests with a grammar) and ``kind`` (one of :data:`KINDS`: what the
    grammar's costs were measured or given for).

    Raises (pydantic ValidationError, as ValueError): a share outside [0, 1], an unknown kind.
    """

    share: float = Field(ge=0.0, le=1.0)
    kind: Literal["json_schema", "regex", "grammar", "choice"] = "json_schema"

    COSTS: ClassVar[str] = "the grammar's costs"  # what the engine's grammar costs are, named in the run's warning
    # how far the engine's grammar model was checked against its real server (the run's warning)
    CHECKED: ClassVar[str] = "not checked against a real server"

    def given_costs(self) -> str:
        """The section's given costs, as the warning names them (each engine's section says)."""
        raise NotImplementedError

    def caveats(self, measured: dict | None) -> list[str]:
        """The warning line every run carries. ``measured``: the profile's
        ``metadata.structured_output`` when it has the grammar curves, else None (the section's
        given costs, :meth:`given_costs`)."""
        head = (f"warning: server.structured_output: {self.share * 100:g}% of the requests carry a {self.kind} grammar "
                "(drawn per request); ")
        if measured:
            kind = measured.get("kind")
            head += f"its costs ({self.COSTS}) are the profile's, measured with {kind} grammars"
            if kind != self.kind:
                head += f" (this scenario's {self.kind} grammars are assumed to cost alike)"
        else:
            head += f"its costs are the given {self.given_costs()}, not measured"
        return [head + "; grammar compilation (a schema's first request) and grammars that end early are not "
                f"modelled; {self.CHECKED}"]

    def draw(self, num_requests: int, seed: int) -> np.ndarray:
        """Which of ``num_requests`` requests carry a grammar: bool, shape (num_requests,),
        seeded by ``[seed, GRAMMAR_SEED]`` (the same requests under every setting)."""
        if self.share >= 1.0:
            return np.ones(num_requests, dtype=bool)
        return np.random.default_rng([seed, GRAMMAR_SEED]).random(num_requests) < self.share
