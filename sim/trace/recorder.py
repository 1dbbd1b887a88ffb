"""The event trace of one run: per-step timeline, per-request outcomes, ITL samples.

The same schema is produced by the simulator and (later) by the ground-truth harness, so one
metrics function reads both. Times are seconds from the start of the run.

steps (one row per batch, in launch order):
    seq, kind ('extend'|'decode'), num_reqs, num_tokens, sum_ctx, num_warmup, overshoot,
    finished, after_idle, kv_used, num_running, num_queued, recv_start, schedule_start, schedule_end, launch_start, launch_end,
    forward_start, forward_end, sync_start, process_start, process_end
requests (one row per request):
    rid, arrival_s, input_len, cached_len, output_len, output_tokens, first_token_s,
    finish_s, status ('completed'|'failed'), warmup, retractions,
    failure ('' | 'cut_off': in the server when it died | 'could_not_connect': sent after it
    died | 'aborted': aborted out of KV memory | 'too_long': larger than the KV pool)
itl (weighted inter-token latencies of measured requests):
    itl_s, weight
"""

from __future__ import annotations

from array import array
from operator import itemgetter
import numpy as np

from sim.model.batch import FINISHED, Batch, Req
from sim.model.costs import DECODE, KIND_NAMES
from sim.trace.columns import Columns

FAILURE_KINDS = ("cut_off", "could_not_connect", "aborted", "too_long")  # summary counts these

STEP_COLUMNS = [
    "seq", "kind", "num_reqs", "num_tokens", "sum_ctx", "num_warmup", "overshoot", "finished",
    "after_idle", "kv_used", "num_running", "num_queued", "recv_start", "schedule_start", "schedule_end", "launch_start", "launch_end",
    "forward_start", "forward_end", "sync_start", "process_start", "process_end",
]
REQUEST_COLUMNS = [
    "rid", "arrival_s", "input_len", "cached_len", "output_len", "output_tokens", "first_token_s",
    "finish_s", "status", "warmup", "retractions", "failure",
]


# each step column's type in the steps table: int64, float64 (seconds), bool, or the step's kind
# (int8 codes of :data:`sim.model.costs.KIND_NAMES`, a categorical column)
STEP_TYPES = dict.fromkeys(STEP_COLUMNS, "int64") | dict.fromkeys(
    ["recv_start", "schedule_start", "schedule_end", "launch_start", "launch_end", "forward_start", "forward_end",
     "sync_start", "process_start", "process_end"], "float64") | {"kind": "kind", "after_idle": "bool"}


def fill_decode_rows(rows: np.ndarray, full: bool, first_seq: int, n: int, warm: int, ctx, used_after, page: int,
                     starts, recv: float, sched, ls, le, fs, fe, queued: int = 0) -> None:
    """Columns ``seq`` to ``forward_end`` (:data:`STEP_COLUMNS`) of the rows (a (k, 22) float64
    array) of k consecutive decode batches of ``n`` requests (``warm`` warm-up), the first numbered
    ``first_seq``: contexts, KV pages used after each allocation (``page`` tokens each), iteration
    starts, recv and schedule costs, launch starts and ends, forward starts and ends (arrays, one
    value per batch, or a scalar for all; seconds), ``queued`` requests waiting at each. The
    leaps' numpy runs write their steps with it (:mod:`sim.engines.sglang.leap_runs`,
    :mod:`sim.engines.vllm.leap.runs`). ``full`` False (a
    recorder that keeps no rows, :attr:`sim.trace.streaming.StreamingRecorder.keeps_rows`): only
    the columns it reads (kind, size, overshoot, after_idle, the forward's start and end); the
    others are left as they are."""
    rows[:, 1] = DECODE
    rows[:, 2] = n  # num_reqs (no member leaves)
    rows[:, 6] = rows[:, 8] = 0  # overshoot, after_idle
    rows[:, 17], rows[:, 18] = fs, fe
    if not full:
        return
    rows[:, 0] = np.arange(first_seq, first_seq + len(rows))
    rows[:, 3] = rows[:, 10] = n  # num_tokens, num_running
    rows[:, 4] = ctx
    rows[:, 5] = warm
    rows[:, 7] = 0  # finished
    rows[:, 11] = queued  # num_queued
    rows[:, 9] = used_after * page
    rows[:, 12] = starts
    rows[:, 13] = starts + recv
    rows[:, 14] = rows[:, 13] + sched
    rows[:, 15], rows[:, 16] = ls, le


class TraceRecorder:
    """Collects rows as the simulation runs, handed over once at the end as numpy columns
    (:class:`sim.trace.columns.Columns`; DataFrames are made of them when asked for).

    A step's 22 values go into one flat array of doubles (``array('d')``: ints and bools up to
    2**53 are exact there), a row at a time, so a long run keeps 8 bytes per value rather than a
    Python object each, and the steps table is views of that buffer, not a walk over millions
    of objects; the requests table (strings among its columns) keeps tuples; the ITL samples
    arrays of doubles and ints.
    """

    keeps_rows = True  # every column of a step row is kept (the leap's numpy runs fill them all)

    def __init__(self):
        self._step_values = array("d")
        self._requests: list[tuple] = []
        self._itl_values = array("d")  # 16 bytes a sample with its weight (a list: about 40)
        self._itl_weights = array("q")

    def arrival(self, rid: int, arrival_s: float) -> None:
        """A request was sent (the full trace gets arrivals from the request rows instead)."""

    def arrivals(self, first_rid: int, count: int, arrival_s: float) -> None:
        """:meth:`arrival` of requests ``first_rid .. first_rid + count - 1``, all sent at ``arrival_s``."""

    def step(self, b: Batch) -> None:
        self.step_row((
            b.seq, b.kind, b.num_reqs, b.num_tokens, b.sum_ctx, b.num_warmup, len(b.overshoot), b.finished,
            b.after_idle, b.kv_used_after_alloc, b.num_running, b.num_queued, b.recv_start, b.schedule_start, b.schedule_end, b.launch_start, b.launch_end,
            b.forward_start, b.forward_end, b.sync_start, b.process_start, b.process_end,
        ))

    def step_row(self, row: tuple) -> None:
        """A step given as its row: the values of :data:`STEP_COLUMNS` in order (``kind`` as its
        code); what :meth:`step` records for a batch."""
        self._step_values.extend(row)

    def decode_row(self, head: tuple, finished: int, mid: tuple, sync_start: float, process_start: float,
                   process_end: float) -> None:
        """A step given in the leap's parts (:mod:`sim.engines.sglang.leap`): its row's values up to
        ``overshoot`` (``head``), ``finished``, from ``after_idle`` to ``forward_end`` (``mid``),
        then the three stamps of its processing; :meth:`step_row` of the whole row."""
        self._step_values.extend(head + (finished,) + mid + (sync_start, process_start, process_end))

    def step_rows(self, rows: np.ndarray, decodes: bool = False) -> None:
        """Steps given as rows of a (k, 22) float64 array (:meth:`step_row`'s values), in order
        (``decodes``: every row a decode step; not read here)."""
        self._step_values.frombytes(np.ascontiguousarray(rows, dtype=np.float64).tobytes())

    def request(self, r: Req) -> None:
        ok = r.status == FINISHED
        self._requests.append((
            r.rid, r.arrival_s, r.input_len, r.cached_len, r.output_len, r.output_done if ok else 0,
            r.first_token_s, r.finish_s, "completed" if ok else "failed", r.warmup, r.retractions, r.failure,
        ))

    def requests_finished(self, reqs: list[Req]) -> None:
        """:meth:`request` of each of ``reqs`` (finished together, settled), in order."""
        for r in reqs:
            self.request(r)

    def itl(self, value_s: float, weight: int) -> None:
        self._itl_values.append(value_s)
        self._itl_weights.append(weight)

    def itl_once_each(self, values_s: list[float]) -> None:
        """:meth:`itl` of each of ``values_s`` (seconds) with weight 1, in order."""
        self._itl_values.fromlist(values_s)
        self._itl_weights.fromlist([1] * len(values_s))

    def itl_many(self, values_s: np.ndarray, weights: np.ndarray) -> None:
        """Several ITL samples at once (:meth:`itl` of each, in order)."""
        self._itl_values.frombytes(np.ascontiguousarray(values_s, dtype=np.float64).tobytes())
        self._itl_weights.frombytes(np.ascontiguousarray(weights, dtype=np.int64).tobytes())

    def step_columns(self) -> Columns:
        """The steps table as columns, in launch order (``seq``): views of the rows' buffer (no
        copy; the recorder lets go of it), each column typed as :data:`STEP_TYPES` says when
        a DataFrame or Parquet is made (``kind``: codes of :data:`sim.model.costs.KIND_NAMES`;
        counts and flags are exact doubles until then)."""
        values = np.frombuffer(self._step_values, dtype=np.float64).reshape(-1, len(STEP_COLUMNS))
        self._step_values = array("d")  # the buffer lives on in the views
        types = {name: kind for name, kind in STEP_TYPES.items() if kind not in ("float64", "kind")}
        return Columns({name: values[:, i] for i, name in enumerate(STEP_COLUMNS)}, {"kind": tuple(KIND_NAMES)},
                       types).sorted_by("seq")

    def request_columns(self) -> Columns:
        """The requests table as columns, by request id (the rows put in that order first, a stable
        sort, so the columns need no second, sorted copy); the recorder lets go of its rows, as
        of its steps: a recorder hands its tables over once."""
        rows, self._requests = self._requests, []
        rows.sort(key=itemgetter(0))
        return rows_to_columns(rows, REQUEST_COLUMNS)

    def itl_columns(self) -> Columns:
        """The ITL table as columns (``itl_s`` float64 seconds, ``weight`` int64), in the order
        recorded: views of the recorder's buffers, which it lets go of."""
        values = np.frombuffer(self._itl_values, dtype=np.float64)
        weights = np.frombuffer(self._itl_weights, dtype=np.int64)
        self._itl_values, self._itl_weights = array("d"), array("q")
        return Columns({"itl_s": values, "weight": weights})


def rows_to_columns(rows: list[tuple], names: list[str]) -> Columns:
    """:class:`Columns` of ``rows`` (tuples in ``names`` order), built column by column (numpy
    infers each column's type once: int64, float64, bool or object, as ``pd.DataFrame(rows)``
    does); no rows: empty object columns, as ``pd.DataFrame([], columns=names)`` has."""
    if not rows:
        return Columns({name: np.array([], dtype=object) for name in names})
    return Columns({name: _column(values) for name, values in zip(names, zip(*rows))})


def _column(values: tuple) -> np.ndarray:
    """One column as ``pd.DataFrame(rows)`` would type it: numpy's bool, int64 or float64 where
    numpy finds one of those, else objects (strings)."""
    array = np.array(values)
    return array if array.dtype.kind in "bif" else np.array(values, dtype=object)
