"""Metrics computed as the run goes, without per-step tables (``tables: summary | none``).

Memory holds no step (the recorder's part is bounded by the requests in flight; the workload's
lengths drawn up front are the run's): counts and the measured window are exact, sums exact but
for their order (a mean or the idle fraction may differ from the tables' in its last digit);
quantiles (median, p99) come from DDSketch (:mod:`sim.trace.sketch`): within 0.5% of the sample at
the quantile's rank, where the tables' quantile interpolates between the two samples around it
(on a small or two-humped sample those two can be far apart, and so can the two answers). The measured window and
the steps inside it follow :func:`sim.trace.metrics.summarize` exactly: a step counts when its forward
starts inside [first measured arrival, last measured finish). Steps reach the recorder in launch
order (every loop processes results in the order it launched them), so a step's gap is its
forward start minus the previous step's forward end.
"""

from __future__ import annotations

import math

import numpy as np

from sim.model.batch import FINISHED, Batch, Req
from sim.trace.metrics import GROWTH_KEYS, SUMMARY_KEYS, ttft_growth
from sim.trace.columns import Columns
from sim.trace.recorder import FAILURE_KINDS, REQUEST_COLUMNS, TraceRecorder, rows_to_columns
from sim.trace.sketch import Stat, running_sum

FLUSH_AT = 1024  # pending steps held before a window end's advance counts them (:meth:`StreamingRecorder._end_at`)


class StreamingRecorder:
    """Drop-in for :class:`sim.trace.recorder.TraceRecorder` that keeps no step rows.

    Args:
        warmup_requests: request ids below this are warm-up; request ``warmup_requests`` is the
            first measured one (ids are handed out in arrival order).
        keep_requests: keep the per-request table (``tables: summary``); False keeps nothing
            per request (``tables: none``).
    """

    # a step row's columns read here: kind, num_reqs, overshoot, after_idle, forward start and end,
    # sync start and process start (1, 2, 6, 8, 17-20); the leap's numpy runs fill only these
    keeps_rows = False

    def __init__(self, warmup_requests: int, keep_requests: bool, open_loop: bool = True,
                 probes_s: tuple[float, float] = (math.nan, math.nan)):
        """``open_loop``: the TTFT's growth and the requests in the server are followed (a closed
        loop's clients send as answers come: no backlog to grow); ``probes_s``: the midpoint of
        the measured arrivals and the last of them (seconds), where the requests in the server
        are counted (:func:`sim.trace.metrics.probe_times`)."""
        self._first_measured = warmup_requests
        self._rows = TraceRecorder() if keep_requests else None
        self.window_start = math.nan
        self.window_end = -math.inf
        self._early: list[tuple] = []  # steps seen before the window start was known
        self._pending: list[tuple] = []  # steps since the last measured finish
        self._prev_forward_end = math.nan
        self.completed = self.failed = self.input_tokens = self.output_tokens = 0
        self.failures = dict.fromkeys(FAILURE_KINDS, 0)
        self.steps = self.decode_steps = self.decode_reqs = self.overshoot = self.sync_count = 0
        self.busy_s = self.sync_wait_s = 0.0
        # sums over the completed measured requests of t, t², TTFT and t x TTFT (t: the arrival
        # less the window's start, seconds): the TTFT's growth through the run (metrics.ttft_growth);
        # None in a closed loop, whose clients send as answers come (no queue to grow: not summed)
        self._growth = [0.0, 0.0, 0.0, 0.0] if open_loop else None
        # the measured requests in the server (arrived, not yet finished) at the two probes,
        # counted as each leaves (metrics.in_server); None in a closed loop
        self._probes = probes_s if open_loop else None
        self._in_server = [0, 0]
        self.ttft, self.tpot, self.itl_stat, self.e2e, self.gap = Stat(), Stat(), Stat(), Stat(), Stat()
        self.itl = self.itl_stat.add  # :meth:`itl`, without a call in between (several per decode step)

    # --- recorder interface -------------------------------------------------------------------
    def arrivals(self, first_rid: int, count: int, arrival_s: float) -> None:
        if first_rid <= self._first_measured < first_rid + count:
            self.arrival(self._first_measured, arrival_s)

    def arrival(self, rid: int, arrival_s: float) -> None:
        if rid == self._first_measured:
            self.window_start = arrival_s
            early, self._early = self._early, []
            for rec in early:
                self._admit(rec)

    def step(self, b: Batch) -> None:
        self._record(b.forward_start, b.forward_end, b.after_idle, b.kind, b.num_reqs, len(b.overshoot),
                     b.process_start - b.sync_start)

    def step_row(self, row: tuple) -> None:
        """A step given as its row (:meth:`sim.trace.recorder.TraceRecorder.step_row`): the same
        record as :meth:`step` of that batch."""
        self._record(row[17], row[18], row[8], row[1], row[2], row[6], row[20] - row[19])

    def decode_row(self, head: tuple, finished: int, mid: tuple, sync_start: float, process_start: float,
                   process_end: float) -> None:
        """A step in the leap's parts (:meth:`sim.trace.recorder.TraceRecorder.decode_row`): the
        same record as :meth:`step_row` of the whole row (:meth:`_record`'s body, without the call:
        it runs once per leapt step)."""
        fs = mid[9]
        gap = fs - self._prev_forward_end
        self._prev_forward_end = mid[10]
        rec = (fs, mid[10], gap if gap > 0 else (0.0 if gap == gap else math.nan), mid[0], head[1], head[2], head[6],
               process_start - sync_start, True)
        start = self.window_start
        if start != start:
            self._early.append(rec)
        elif fs >= start:
            self._pending.append(rec)
        else:
            self._admit(rec)

    def _record(self, fs: float, fe: float, after_idle, kind: int, num_reqs: int, overshoot: int,
                sync_wait: float) -> None:
        """One step: its forward's start and end, whether it followed an idle wait, its kind, batch
        size, overshoot and sync wait (seconds); its gap is to the previous step's forward end."""
        gap = fs - self._prev_forward_end  # NaN for the first step
        self._prev_forward_end = fe
        rec = (fs, fe, gap if gap > 0 else (0.0 if gap == gap else math.nan), after_idle, kind, num_reqs, overshoot,
               sync_wait, True)
        start = self.window_start
        if start != start:  # NaN: the window has not started yet
            self._early.append(rec)
        elif fs >= start:  # :meth:`_admit`'s common case, without the call
            self._pending.append(rec)
        else:
            self._admit(rec)

    def step_rows(self, rows: np.ndarray, decodes: bool = False) -> None:
        """Steps given as rows of a (k, 22) array (:meth:`step_row` of each, in order; ``decodes``:
        the caller knows every row is a decode step): decode steps inside the measured window are
        kept as one record of arrays."""
        start = self.window_start
        if (start != start or rows[0, 17] < start or rows[0, 8] or (not decodes and (rows[:, 1] != 1).any())
                or self._prev_forward_end != self._prev_forward_end):
            for row in rows.tolist():  # the window's start, an idle step, a prefill: row by row
                # (the counts as ints, as a batch gives them: the summary writes 0, not 0.0)
                self._record(row[17], row[18], bool(row[8]), int(row[1]), int(row[2]), int(row[6]), row[20] - row[19])
            return
        fs, fe = rows[:, 17], rows[:, 18]
        gap = np.empty(len(fs))
        gap[0] = fs[0] - self._prev_forward_end
        gap[1:] = fs[1:] - fe[:-1]
        self._prev_forward_end = float(fe[-1])
        self._pending.append(_Steps(fs, fe, np.where(gap > 0, gap, 0.0), rows[:, 2], rows[:, 6],
                                    rows[:, 20] - rows[:, 19]))

    def itl_many(self, values_s: np.ndarray, weights: np.ndarray) -> None:
        """Several ITL samples at once (:meth:`itl` of each, in order)."""
        self.itl_stat.add_many(values_s, weights)

    def itl_once_each(self, values_s: list[float]) -> None:
        """:meth:`itl` of each of ``values_s`` (seconds) with weight 1, in order."""
        self.itl_stat.add_once_each(values_s)

    def request(self, r: Req) -> None:
        # (one request: the per-request path of vLLM's engine and of a lone SGLang finish, kept
        # apart from requests_finished's lists; the same values in the same order)
        if self._rows is not None:
            self._rows.request(r)
        self._one(r)

    def _one(self, r: Req) -> None:
        """:meth:`request` of ``r`` without the requests table: the window's end, and the
        failure's kind or the completed request's latencies."""
        if r.warmup:
            return
        finish = r.finish_s
        if finish > self.window_end:
            self._end_at(finish)
        if self._probes is not None:  # (_count_in_server of one, without the call)
            mid, last = self._probes
            arrival = r.arrival_s
            if arrival <= mid < finish:
                self._in_server[0] += 1
            if arrival <= last < finish:
                self._in_server[1] += 1
        if r.status != FINISHED:
            self.failed += 1
            if r.failure in self.failures:
                self.failures[r.failure] += 1
            return
        self._completed_one(r)

    def _completed_one(self, r: Req) -> None:
        """A measured request completed (:meth:`_completed` of one): counted, its TTFT,
        end-to-end latency and TPOT added."""
        out = r.output_done
        ttft = r.first_token_s - r.arrival_s
        e2e = r.finish_s - r.arrival_s
        self.completed += 1
        self.input_tokens += r.input_len
        self.output_tokens += out
        g = self._growth
        if g is not None:
            t = r.arrival_s - self.window_start
            g[0] += t
            g[1] += t * t
            g[2] += ttft
            g[3] += t * ttft
        self.ttft.add(ttft)
        self.e2e.add(e2e)
        if out > 1:
            self.tpot.add((e2e - ttft) / (out - 1))

    def requests_finished(self, reqs: list[Req]) -> None:
        """:meth:`request` of each of ``reqs``, finished (``FINISHED``) at one time, in order: the
        window's end moved once, each metric's values given together (the same values in the
        same order: each metric's sum runs in the order its values came)."""
        if self._rows is not None:
            self._rows.requests_finished(reqs)
        if len(reqs) == 1:  # (a lone request: :meth:`request`'s path, the same values)
            self._one(reqs[0])
            return
        measured = [r for r in reqs if not r.warmup]
        if not measured:
            return
        if self._probes is not None:
            self._count_in_server(measured)
        if measured[0].finish_s > self.window_end:  # (one time for all)
            self._end_at(measured[0].finish_s)
        ttfts, e2es, tpots = self._completed(measured)
        self.ttft.add_once_each(ttfts)
        self.e2e.add_once_each(e2es)
        if tpots:
            self.tpot.add_once_each(tpots)

    def _completed(self, reqs) -> tuple[list[float], list[float], list[float]]:
        """Measured requests completed: counted, and their TTFTs, end-to-end latencies and TPOTs
        (seconds, in order; no TPOT for a request of a single output token)."""
        ttfts, e2es, tpots = [], [], []
        input_tokens = output_tokens = 0
        for r in reqs:
            input_tokens += r.input_len
            out = r.output_done
            output_tokens += out
            ttft = r.first_token_s - r.arrival_s
            e2e = r.finish_s - r.arrival_s
            ttfts.append(ttft)
            e2es.append(e2e)
            if out > 1:
                tpots.append((e2e - ttft) / (out - 1))
        g = self._growth
        if g is not None:  # (the growth's sums in locals through the group, in the same order)
            st, stt, sy, sty = g
            start = self.window_start
            for r, ttft in zip(reqs, ttfts):
                t = r.arrival_s - start
                st += t
                stt += t * t
                sy += ttft
                sty += t * ttft
            g[:] = st, stt, sy, sty
        self.completed += len(ttfts)
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        return ttfts, e2es, tpots

    def _count_in_server(self, reqs) -> None:
        """Count each of ``reqs`` (measured, leaving now) that was in the server at either probe:
        arrived at or before it, finished (or failed) after it."""
        mid, last = self._probes
        counts = self._in_server
        for r in reqs:
            a, f = r.arrival_s, r.finish_s
            if a <= mid < f:
                counts[0] += 1
            if a <= last < f:
                counts[1] += 1

    def itl(self, value_s: float, weight: int) -> None:
        self.itl_stat.add(value_s, weight)

    # --- window bookkeeping ---------------------------------------------------------------
    def _admit(self, rec: tuple) -> None:
        start = self.window_start
        if rec[0] >= start:
            self._pending.append(rec)
        elif rec[1] > start:  # a forward running across the window start: its busy time inside only
            self._pending.append((start,) + rec[1:-1] + (False,))

    def _end_at(self, end: float) -> None:
        """The measured window now ends at ``end`` (seconds, later than before): the pending steps
        all count. They are counted here only once :data:`FLUSH_AT` of them are held, or where
        one's forward ends after ``end`` (its busy time is cut at the window's end as it stands
        now): until then, each would add the same values in the same order at a later flush (a
        forward that ended by ``end`` ends by any later end; every later finish is later)."""
        self.window_end = end
        if len(self._pending) >= FLUSH_AT or self._prev_forward_end > end:
            self._flush_pending()

    def _flush_pending(self) -> None:
        """Count the pending steps: busy time up to the window end, and for the steps that
        started inside the window their gap, decode batch size, overshoot and sync wait."""
        # every pending step was processed by now, so its forward started before this finish
        end = self.window_end
        busy, sync_wait_s, steps, decode_steps, decode_reqs, overshoot = (
            self.busy_s, self.sync_wait_s, self.steps, self.decode_steps, self.decode_reqs, self.overshoot)
        gaps = []  # the gaps to count, in order (given to the gap metric together: a call less per step)
        for rec in self._pending:
            if type(rec) is _Steps:  # decode steps of a leapt run, all inside the window
                busy = running_sum(busy, np.minimum(rec.fe, end) - rec.fs)
                if gaps:
                    self.gap.add_once_each(gaps)
                    gaps = []
                self.gap.add_once_each(rec.gap)
                steps += len(rec.fs)
                decode_steps += len(rec.fs)
                decode_reqs += int(np.add.reduce(rec.num_reqs))  # (counts held as doubles: exact sums)
                overshoot += int(np.add.reduce(rec.overshoot))
                sync_wait_s = running_sum(sync_wait_s, rec.sync_wait)
                continue
            fs, fe, gap, after_idle, kind, num_reqs, over, sync_wait, counted = rec
            busy += (end if end < fe else fe) - fs  # min(fe, end), without the call
            if not counted:
                continue
            steps += 1
            if not after_idle and gap == gap:
                gaps.append(gap)
            if kind == 1:
                decode_steps += 1
                decode_reqs += num_reqs
            overshoot += over
            sync_wait_s += sync_wait
        if gaps:
            self.gap.add_once_each(gaps)
        self.sync_count += steps - self.steps
        self.busy_s, self.sync_wait_s, self.steps, self.decode_steps, self.decode_reqs, self.overshoot = (
            busy, sync_wait_s, steps, decode_steps, decode_reqs, overshoot)
        self._pending.clear()

    # --- results ------------------------------------------------------------------------------
    def finish(self) -> None:
        """Count the steps still pending that started before the last measured finish."""
        end = self.window_end
        kept = []
        for rec in self._pending:
            if type(rec) is _Steps:
                rec = rec.before(end)
                if rec is not None:
                    kept.append(rec)
            elif rec[0] < end:
                kept.append(rec)
        self._pending = kept
        self._flush_pending()

    def request_columns(self) -> Columns:
        """The requests table kept (``keep_requests``) as columns, by request id; empty without."""
        if self._rows is None:
            return rows_to_columns([], REQUEST_COLUMNS)
        return self._rows.request_columns()

    def summary(self) -> dict:
        """The same keys as :func:`sim.trace.metrics.summarize`, plus failure counts by kind."""
        out: dict = {"completed": self.completed, "failed": self.failed}
        duration = self.window_end - self.window_start if self.completed + self.failed else 0.0
        duration = duration if duration == duration and duration > 0 else 0.0
        out["duration_s"] = duration
        out["total_input_tokens"] = self.input_tokens
        out["total_output_tokens"] = self.output_tokens
        out["request_throughput"] = self.completed / duration if duration > 0 else 0.0
        out["output_throughput"] = self.output_tokens / duration if duration > 0 else 0.0
        self.ttft.into("ttft", out)
        out["ttft_growth"] = ttft_growth(self.completed, *self._growth) if self._growth is not None else math.nan
        out["in_server_mid"], out["in_server_last"] = (
            self._in_server if self._probes is not None and self.completed + self.failed else (math.nan, math.nan))
        self.tpot.into("tpot", out)
        self.itl_stat.into("itl", out)
        self.e2e.into("e2e_latency", out)
        self.gap.into("gap", out)
        recorded = self._prev_forward_end == self._prev_forward_end  # a step ran, in the window or not
        if recorded and duration > 0:  # (summarize's rule: a window with no step in it was idle throughout)
            out["num_steps"] = self.steps
            out["gpu_idle_fraction"] = max(0.0, 1.0 - self.busy_s / duration)
            out["mean_sync_wait_ms"] = self.sync_wait_s / self.sync_count * 1e3 if self.sync_count else math.nan
            out["mean_decode_batch_size"] = self.decode_reqs / self.decode_steps if self.decode_steps else math.nan
            out["overshoot_tokens"] = self.overshoot
        else:
            out.update(num_steps=0, gpu_idle_fraction=math.nan, mean_sync_wait_ms=math.nan,
                       mean_decode_batch_size=math.nan, overshoot_tokens=0)
        return {**{k: out[k] for k in SUMMARY_KEYS + GROWTH_KEYS}, **self.failures}


class _Steps:
    """Consecutive decode steps inside the measured window, as arrays (one per column the
    window's counters read): forward start and end, gap to the previous forward, batch size,
    overshoot, sync wait (seconds)."""

    __slots__ = ("fs", "fe", "gap", "num_reqs", "overshoot", "sync_wait")

    def __init__(self, fs, fe, gap, num_reqs, overshoot, sync_wait):
        self.fs, self.fe, self.gap = fs, fe, gap
        self.num_reqs, self.overshoot, self.sync_wait = num_reqs, overshoot, sync_wait

    def before(self, end: float) -> "_Steps | None":
        """The steps whose forward started before ``end`` (None if none)."""
        k = int(np.searchsorted(self.fs, end, side="left"))
        if k == 0:
            return None
        return _Steps(self.fs[:k], self.fe[:k], self.gap[:k], self.num_reqs[:k], self.overshoot[:k],
                      self.sync_wait[:k])
