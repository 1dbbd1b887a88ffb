"""Long steady decode runs at once, with numpy: the timeline of ``event_loop_overlap`` (and of
``event_loop_normal``, :func:`normal_run`) over k iterations whose batch keeps its members, as
array operations that perform each step's float operations exactly as the loop does.

Within such a run (no request finishes in a processed batch, nothing waits or arrives, no jitter,
``after_wait_scale`` 1) the batch size is constant, the context grows by one token per member per
step, and the CPU thread's clock follows one of two closed forms:

- **device-bound** (every launch finds the device busy and every result wait blocks): the
  forwards run back to back, ``forward_end[i] = forward_end[i-1] + forward[i]`` (a running sum,
  ``np.add.accumulate``, the same additions in the same order), and iteration i ends at
  ``forward_end[i-1] + sync_latency + process[i-1]``;
- **CPU-bound** (the device is idle at every launch and every result is ready when asked for):
  the clock is the running sum of recv + schedule, launch and the previous batch's process, one
  phase after another, and each forward starts at its launch's end.

The normal loop has one form: each iteration's clock is the running sum of recv + schedule,
launch, the forward, the sync latency and the process (the device idle at each launch, each
result waited for). The MLX chain (:func:`mlx_run`) is taken with the device busy or idle at each
launch's end, its clocks solved as a fixed point (its loop advances the clock by the iteration's
summed phases, not to the result's time). A cost model with a submission block (MLX profiles:
each launch returns near its forward's end, :func:`_launch_returns`) is taken in the normal loop
and the MLX chain, not in the overlap loop.

The run is computed for the regime its first step is in and cut at the first step that leaves it
(or reaches the next arrival, or fails the KV check); :class:`sim.engines.sglang.leap.Leap` goes
on step by step from there. Costs come from the cost model's ``decode_arrays`` (the inline terms
and profile curves evaluated over arrays with the scalar path's operations, elementwise).
"""

from __future__ import annotations

import numpy as np

from sim.engines.sglang.policy.decode import DECODE_LOG_INTERVAL
from sim.model.costs import DECODE, kept
from sim.trace.recorder import fill_decode_rows

MIN_RUN = 64  # shorter runs go through the leap's own loop (a run's fixed numpy cost is that of dozens of its
# iterations; see docs/speed.md for the threshold's measurement)


def overlap_run(leap, now: float, k_max: int, prev_fe: float, prev_proc: float, prev_row: tuple):
    """Up to ``k_max`` iterations of the overlap loop from ``now`` over a running batch that keeps
    its members, decode g-1 in flight (ending at ``prev_fe``, its process cost ``prev_proc``,
    its row but for what processing stamps ``prev_row``). Returns None (nothing done: too short,
    or the first step in neither regime) or (iterations k, now, forward end, process cost and row
    of the batch then in flight)."""
    s, p = leap.s, leap.p
    costs = p.costs
    g0 = s.next_decode_seq
    n = s.n_running
    g, used_after, k = _kv_fits(s, g0, k_max)  # check_decode_mem, allocation by allocation
    if k < MIN_RUN or p._was_idle or n == 0:
        return None
    ctx = s.ctx_offset + n * g
    recv, sched, rs, launch, forward, process = _decode_costs(leap, n, ctx[:k])
    lat = costs.sync_latency_s
    proc_prev = np.empty(k)
    proc_prev[0] = prev_proc
    proc_prev[1:] = process[:k - 1]
    # which regime the first step is in
    le0 = (now + rs[0]) + launch[0]
    if le0 <= prev_fe and prev_fe + lat > le0:  # device-bound
        ends = np.empty(k + 1)  # the forward ends from decode g-1's: a running sum
        ends[0] = prev_fe
        ends[1:] = forward
        np.add.accumulate(ends, out=ends)
        fe_prev, fe = ends[:k], ends[1:]
        ready = fe_prev + lat
        clock = np.empty(k + 1)  # each iteration's start, then its end: the next one's start
        clock[0] = now
        np.add(ready, proc_prev, out=clock[1:])
        starts, done = clock[:k], clock[1:]
        ls = starts + rs
        le = ls + launch
        ok = (le <= fe_prev) & (ready > le)
        fs = fe_prev
        ps = ready
    elif le0 > prev_fe and prev_fe + lat <= le0:  # CPU-bound
        seq = np.empty(3 * k + 1)
        seq[0] = now
        seq[1::3], seq[2::3], seq[3::3] = rs, launch, proc_prev
        clock = np.add.accumulate(seq)
        starts, ls, le, done = clock[0:3 * k:3], clock[1::3], clock[2::3], clock[3::3]
        fe = le + forward
        fe_prev = np.empty(k)
        fe_prev[0] = prev_fe
        fe_prev[1:] = fe[:k - 1]
        ok = (le > fe_prev) & (fe_prev + lat <= le)
        fs = le
        ps = le
    else:
        return None
    if p.horizon < np.inf:  # (a closed loop has no next arrival to stop at)
        ok &= starts < p.horizon
    k = _cut(ok, k)
    if k is None:
        return None
    row = _deferred_rows(leap, g0, k, used_after, ctx, recv, sched, prev_row,
                         (starts, ls, le, fs, fe, le, ps, done))
    return k, float(done[k - 1]), float(fe[k - 1]), float(process[k - 1]), row


def mlx_run(leap, now: float, k_max: int, prev_fe: float, prev_proc: float, prev_row: tuple):
    """Up to ``k_max`` iterations of the MLX chain (``overlap_mlx_loop``) from ``now`` over a
    running batch that keeps its members, decode g-1 in flight (as :func:`overlap_run`). The
    loop adds each phase to the iteration's ``t`` and the clock by ``t`` (``now' = now + (((rs +
    launch) + wait) + process)``, the wait ``ready - (now + rs + launch)`` or 0.0), so an
    iteration's start depends on the one before through its roundings; the starts are solved as
    a fixed point of the loop's expressions, applied to every iteration at once, a few passes at
    most, and the run is cut at the first iteration whose start they do not give back. Two
    regimes, as the first iteration finds the device:

    - **busy** at each launch's end: the forwards back to back (a running sum), each iteration
      ending about when the result it waits for is ready (``ready + process``): a pass sets
      each start from the one before's expressions;
    - **idle** at each launch's end: each forward starts at its launch's end, each iteration's
      length depends on its start only through roundings: a pass sums the iterations' lengths
      from the run's start (``np.add.accumulate``, the loop's additions in its order).

    With a submission block (MLX profiles) each launch returns near its forward's end
    (:func:`_launch_returns`), which the same expressions carry. Returns None (too short, or the
    first iterations in neither regime) or (iterations k, the clock after them, forward end,
    process cost and row of the batch then in flight)."""
    s, p = leap.s, leap.p
    costs = p.costs
    g0 = s.next_decode_seq
    n = s.n_running
    g, used_after, k = _kv_fits(s, g0, k_max)
    if k < MIN_RUN or p._was_idle or n == 0:
        return None
    ctx = s.ctx_offset + n * g
    recv, sched, rs, launch, forward, process = _decode_costs(leap, n, ctx[:k])
    lat = costs.sync_latency_s
    proc_prev = np.empty(k)
    proc_prev[0] = prev_proc
    proc_prev[1:] = process[:k - 1]
    submit = costs.decode_submit_arrays(n, ctx[:k].astype(np.float64)) if costs.decode_submits else None
    busy = (now + rs[0]) + launch[0] <= prev_fe  # the first launch ends with the device busy
    if busy:  # the forwards back to back, whatever the starts
        queued = np.add.accumulate(np.concatenate(([prev_fe], forward)))
    starts = np.empty(k + 1)
    starts[0] = now

    def iterate(begin):
        """The loop's expressions from each iteration's start: (launch start and end, forward
        start and end, the forward before's end, t, sync start, the iteration's length)."""
        ls = begin + rs
        le = ls + launch
        if busy:
            fe_prev, fe = queued[:k], queued[1:]
            fs = fe_prev
        else:
            fs, fe = le, le + forward
            fe_prev = np.concatenate(([prev_fe], fe[:-1]))
        ready = fe_prev + lat
        t_launch = rs + (launch if submit is None else _launch_returns(submit, launch, ls, fs, forward))
        a = begin + t_launch
        t = t_launch + np.where(ready > a, ready - a, a - a)  # Phases.sync: ready - at, or at - at
        return ls, le, fs, fe, fe_prev, t, a, t + proc_prev

    if busy:  # the candidate: each iteration ends when its processing does, after the result (or after
        # the submission's block, near the forward's end)
        ready = queued[:k] + lat
        starts[1:] = (ready if submit is None else np.maximum(ready, queued[:k] + np.minimum(submit, forward))) + proc_prev
    else:  # the candidate: the lengths of iterations all started at the run's start, summed
        starts[1:] = _summed(now, iterate(np.full(k, now))[-1])
    for _ in range(MLX_PASSES):
        ls, le, fs, fe, fe_prev, t, a, length = iterate(starts[:k])
        end = starts[:k] + length if busy else _summed(now, length)
        if (end == starts[1:]).all():
            break
        starts[1:] = end
    else:
        ls, le, fs, fe, fe_prev, t, a, length = iterate(starts[:k])
    ok = (starts[:k] + length == starts[1:]) & (starts[:k] < p.horizon)
    ok &= (le <= fe_prev) if busy else (le >= fe_prev)
    k = _cut(ok, k)
    if k is None:
        return None
    ps = starts[:k] + t[:k]
    done = ps + proc_prev[:k]
    row = _deferred_rows(leap, g0, k, used_after, ctx, recv, sched, prev_row,
                         (starts, ls, le, fs, fe, a, ps, done))
    return k, float(starts[k]), float(fe[k - 1]), float(process[k - 1]), row


MLX_PASSES = 4  # fixed-point passes over an MLX chain run's iteration starts (two settle them in practice)


def _decode_costs(leap, n: int, ctx: np.ndarray) -> tuple:
    """The phases of decodes of ``n`` requests at the contexts ``ctx`` (an int array, ``ctx[0] +
    n * i`` at decode i: a run's): (recv, schedule, recv + schedule, launch, forward with the
    loop's extra, process), the cost model's ``decode_arrays`` with the sums the loops make,
    elementwise. Kept by the leap per (n, first context, length): requests that join and leave
    together (a closed loop of equal requests) repeat a run's contexts, and the same arguments
    give the same floats (recv and the extra are the run's constants). The arrays are read,
    never written."""
    return kept(leap.decode_costs, (n, int(ctx[0]), len(ctx)), lambda: _priced(leap.p, n, ctx), DECODE_COSTS_KEPT)


def _priced(p, n: int, ctx: np.ndarray) -> tuple:
    """:func:`_decode_costs`'s arrays, computed."""
    sched, launch, forward, process = p.costs.decode_arrays(n, ctx.astype(np.float64))
    recv = p.costs.recv_s(0)
    return recv, sched, recv + sched, launch, forward + p.forward_extra_s, process


DECODE_COSTS_KEPT = 16  # runs' costs the leap keeps (memory: 5 arrays of up to MAX_RUN doubles each, 5 MiB at most)


def _summed(start: float, lengths: np.ndarray) -> np.ndarray:
    """The clock after each of ``lengths`` added to ``start`` in turn (the loop's additions in its
    order): the next iterations' starts."""
    return np.add.accumulate(np.concatenate(([start], lengths)))[1:]


def _cut(ok: np.ndarray, k: int) -> int | None:
    """How many iterations of a run to keep: all ``k`` if ``ok`` holds for all, else up to the
    first that fails; None if that is under :data:`MIN_RUN`."""
    if np.count_nonzero(ok) == k:  # (ok.all(), without its Python wrapper)
        return k
    k = int(np.argmin(ok))
    return None if k < MIN_RUN else k


def _deferred_rows(leap, g0: int, k: int, used_after, ctx, recv: float, sched, prev_row: tuple,
                   timeline: tuple) -> tuple:
    """The end of a run of a loop that processes each decode in the next iteration (overlap, the
    MLX chain): the state after its ``k`` iterations, the rows of decode g0-1 (``prev_row``, in
    flight at the start) and g0 .. g0+k-2 (each stamped by the iteration after it), their ITL
    samples. ``timeline``: per-iteration arrays (starts, launch starts and ends, forward starts
    and ends, sync starts, process starts and ends). Returns the row of the decode then in flight
    (up to its forward's end)."""
    s, p = leap.s, leap.p
    n, warm, page = s.n_running, s.n_running_warmup, s.kv.page_size
    starts, ls, le, fs, fe, sync, ps, done = (x[:k] for x in timeline)
    _commit(leap, g0, k, n, used_after, ctx, float(starts[k - 1]), float(fe[k - 1]))
    rows = np.empty((k, 22))
    rows[0, :19] = prev_row
    j = k - 1
    full = p.recorder.keeps_rows
    fill_decode_rows(rows[1:], full, s.next_step_seq - k, n, warm, ctx[:j], used_after[:j] if full else None, page,
                     starts[:j], recv, sched[:j], ls[:j], le[:j], fs[:j], fe[:j], len(s.waiting))
    rows[:, 19] = sync
    rows[:, 20] = ps
    rows[:, 21] = done
    _deliver(s, rows, done, prev_row[2] - prev_row[5], n - warm, s.next_decode_seq - 2)
    i = k - 1
    return (s.next_step_seq - 1, DECODE, n, n, int(ctx[i]), warm, 0, 0, False, int(used_after[i]) * page, n,
            len(s.waiting), float(starts[i]), float(starts[i] + recv), float(starts[i] + recv + sched[i]), float(ls[i]),
            float(le[i]), float(fs[i]), float(fe[i]))


def normal_run(leap, now: float, k_max: int) -> tuple[int, float] | None:
    """Up to ``k_max`` iterations of the normal loop from ``now`` over a running batch that keeps
    its members: each forward launched on an idle device, each result waited for. Returns None
    (nothing done) or (iterations k, the CPU clock after them)."""
    s, p = leap.s, leap.p
    costs, kv = p.costs, s.kv
    g0 = s.next_decode_seq
    n, warm = s.n_running, s.n_running_warmup
    g, used_after, k = _kv_fits(s, g0, k_max)
    if k < MIN_RUN or p._was_idle or n == 0:
        return None
    ctx = s.ctx_offset + n * g[:k]
    recv, sched, rs, launch, forward, process = _decode_costs(leap, n, ctx)
    seq = np.empty(5 * k + 1)
    seq[0] = now
    seq[1::5], seq[2::5], seq[3::5], seq[4::5], seq[5::5] = rs, launch, forward, costs.sync_latency_s, process
    clock = np.add.accumulate(seq)
    starts, ls, le, fe, ready, done = (clock[0:5 * k:5], clock[1::5], clock[2::5], clock[3::5], clock[4::5],
                                       clock[5::5])
    fe_prev = np.empty(k)
    fe_prev[0] = p.stream.busy_until
    fe_prev[1:] = fe[:k - 1]
    after = le  # the launch's return: its end, or where a submission blocks, later
    if costs.decode_submits:
        sub = costs.decode_submit_arrays(n, ctx.astype(np.float64))
        after = ls + _launch_returns(sub, launch, ls, le, forward)
    ok = (le >= fe_prev) & (ready > after)
    if p.horizon < np.inf:
        ok &= starts < p.horizon
    k = _cut(ok, k)
    if k is None:
        return None
    _commit(leap, g0, k, n, used_after, ctx, float(starts[k - 1]), float(fe[k - 1]))
    rows = np.empty((k, 22))
    full = p.recorder.keeps_rows
    fill_decode_rows(rows, full, s.next_step_seq - k, n, warm, ctx[:k], used_after[:k] if full else None, kv.page_size,
                     starts[:k], recv, sched[:k], ls[:k], le[:k], le[:k], fe[:k],  # each forward starts at its launch's end
                     len(s.waiting))
    rows[:, 19], rows[:, 20], rows[:, 21] = after[:k], ready[:k], done[:k]
    _deliver(s, rows, done[:k], n - warm, n - warm, s.next_decode_seq - 1)
    return k, float(done[k - 1])


def _launch_returns(submit, launch, ls, fs, forward):
    """:func:`sim.engines.sglang.phases.launch_return` for each step (arrays: submission block
    ``submit``, launch time ``launch``, launch start ``ls``, forward start ``fs``, forward
    ``forward`` with its extra), the same floats elementwise."""
    blocked = (fs + np.where(submit <= forward, submit, forward)) - ls
    return np.where((submit > 0.0) & (blocked > launch), blocked, launch)


def _kv_fits(s, g0: int, k_max: int):
    """Decodes g0 .. g0+k_max-1 of the running batch: (their seqs, pages used after each
    allocation, how many in a row pass ``check_decode_mem``). A decode passes when
    its pages fit in what is free before it, that is when the pages used after it are at most the
    pool's (the pages used only grow over a run). With one token a page every decode takes the
    same pages, and the pages used after each are a line (:class:`_Line`), not an array."""
    kv = s.kv
    g = np.arange(g0, g0 + k_max, dtype=np.int64)
    counts = s.demand._count
    if kv.page_size == 1:
        need = counts[0]
        room = kv.total_pages - kv.used_pages
        k = k_max if need * k_max <= room else room // need  # (need > 0 here: else every decode fits)
        return g, _Line(kv.used_pages, need), k
    need = np.asarray(counts, dtype=np.int64)[(-g) % kv.page_size]
    used_after = kv.used_pages + np.cumsum(need)
    fits = used_after <= kv.total_pages
    return g, used_after, (k_max if fits.all() else int(np.argmin(fits)))


class _Line:
    """The pages used after each decode of a run whose decodes each take ``need`` pages, from
    ``used``: ``used + (i + 1) * need`` at decode i (an int), and ``[:j]`` the first j as an array;
    what ``used + np.cumsum(need)`` gives, without computing it where only a few are read."""

    __slots__ = ("used", "need")

    def __init__(self, used: int, need: int):
        self.used, self.need = used, need

    def __getitem__(self, i):
        if isinstance(i, slice):  # [:j]
            return self.used + self.need * np.arange(1, i.stop + 1, dtype=np.int64)
        return self.used + (i + 1) * self.need


def _commit(leap, g0: int, k: int, n: int, used_after, ctx: np.ndarray,
            last_start: float, last_forward_end: float) -> None:
    """The state after k iterations that scheduled decodes g0 .. g0+k-1 of ``n`` requests at the
    contexts ``ctx`` (KV pages used after each ``used_after``: an array or a :class:`_Line`), the last starting at
    ``last_start``, its forward ending at ``last_forward_end``: the scheduler's (as
    :meth:`_decode_batch` leaves it), the phases' and the device stream's, and the cost model's
    count of steps priced beyond its data."""
    s, p = leap.s, leap.p
    s.now = last_start
    p._was_idle = False
    p.stream.busy_until = last_forward_end
    if hasattr(p.costs, "count_decode_steps"):
        p.costs.count_decode_steps(n, ctx[:k], ascending=True)
    kv = s.kv
    for _ in range(k):  # NewTokenRatioTracker decay, step by step until it reaches its floor
        if s.new_token_ratio <= s.min_ratio:
            break
        s.new_token_ratio = max(s.new_token_ratio - s.ratio_decay, s.min_ratio)
    kv.alloc(int(used_after[k - 1]) - kv.used_pages)
    logged = k - 1 - (g0 + k - 1) % DECODE_LOG_INTERVAL  # the last of them whose seq the log interval divides
    if logged >= 0:
        s.last_logged_usage = int(used_after[logged]) / kv.total_pages
    s.next_decode_seq = g0 + k
    s.next_step_seq += k
    s._idle_calls = 0


def _deliver(s, rows: np.ndarray, done: np.ndarray, first_weight: int, weight: int, last_decode: int) -> None:
    """The results of the k processed decodes (the last of them decode ``last_decode``): ITL
    samples (the first decode's weighs ``first_weight`` measured members, each later one's
    ``weight``; a decode of none gives no sample), the recorder's rows, the scheduler's last
    processed decode (none of them finishes a request)."""
    k = len(done)
    itl = np.empty(k)
    itl[0] = done[0] - s.last_decode_delivery_s
    itl[1:] = done[1:] - done[:-1]
    rec = s.recorder
    if first_weight > 0 and (weight > 0 or k == 1):
        weights = np.full(k, weight, dtype=np.int64)
        weights[0] = first_weight
        rec.itl_many(itl, weights)
    elif first_weight > 0:
        rec.itl_many(itl[:1], np.full(1, first_weight, dtype=np.int64))
    elif weight > 0 and k > 1:
        rec.itl_many(itl[1:], np.full(k - 1, weight, dtype=np.int64))
    rec.step_rows(rows, decodes=True)
    s.last_processed_decode = last_decode
    s.last_decode_delivery_s = float(done[-1])
