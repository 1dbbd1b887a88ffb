"""Long steady runs of vLLM's loops at once, with numpy: the iterations that
:class:`sim.engines.vllm.leap.loop.Leap` performs one at a time, as array operations that perform each
iteration's float operations exactly as its loop does.

Taken where the leap's loop would take the iterations anyway (the same run: a batch that keeps its
members, nothing arriving or waiting) and no phase has jitter (``costs.noise`` off), for runs of
:data:`MIN_RUN` or more iterations. Within such a run every phase's cost is the same at each
iteration (they depend on the batch size alone) but the forward's, which grows with the context
(:meth:`decode_forward_array` of the cost model). The engine core's clock then follows one of a
few closed forms, each a running sum (``np.add.accumulate``: the same additions in the same order
as the loop's):

- synchronous loop (vLLM V1 ``EngineCore.step``): each iteration schedules, dispatches, and waits
  for the worker's output; the clock is the running sum of schedule + dispatch, prepare, then the
  forward and collect (the forward is the longer of it and the RPC's round trip and sampling) or
  the round trip, sampling and collect, then update;
- async scheduling (``EngineCore.step_with_batch_queue``): each iteration schedules the next step
  and then waits for the one before it. **Device-bound** (the result is not back when the engine
  core asks for it, the device busy at every launch): the forwards run back to back (a running
  sum of the forwards) and each iteration ends at the step before's output back plus update.
  **Pipelined** (each wait blocks, each launch finds the device idle, or the two alternate, as
  at 8 clients of the ``vllm-h200`` scenario): iteration i + 2 starts when step i's output is
  back and updated, so the even and the odd iterations are two interleaved running sums (a
  parity whose launches queue follows the other's forward ends). **Host-bound** (the output
  already back): the clock is the running sum of schedule + dispatch and update; each forward
  starts when its preparation ends.

Sources: vLLM 0.32.0 ``vllm/v1/engine/core.py`` (``EngineCore.step``, ``step_with_batch_queue``),
as :mod:`sim.engines.vllm.loops` models them; this module adds no behaviour of its own.

The API server's output side (each step's tokens out after the step before's where it is backlogged)
is a running sum where every step waits, a sum per step where none does, and settles by a few passes
of its recurrence over that candidate where they alternate (:data:`EGRESS_PASSES`: the two parities
of a pipelined run, as the H200 vLLM profile at 64 clients has it since its re-measurement).

A candidate timeline is built in the form the run's first iterations are in; then every iteration is
computed again from the candidate's state before it (clock, device, output back, the API server's
output side) with the loop's own expressions (its comparisons and maxima included), and the run is
cut where the candidate and the computed state part (a float that rounds otherwise, a change of
regime) or where the loop would stop (the KV check, the next event, the horizon). Every iteration
kept was computed from the state the one before it left, so the run is the loop's to the last bit;
the leap's loop goes on from its end. Not taken with jitter (each draw is the loop's to make).
"""

from __future__ import annotations

import numpy as np

from sim.engines.vllm.core import TIME_EPS_S
from sim.model.costs import DECODE, kept
from sim.trace.recorder import fill_decode_rows

RUN_ARRAYS_KEPT = 16  # runs' constant arrays kept (_run_arrays; memory: 32 bytes an iteration of each run kept)
EGRESS_PASSES = 3  # passes of the output side's recurrence over a candidate (each settles one more step of a
# backlog; the check cuts the run where it still differs)
MIN_RUN = 64  # shorter runs go through the leap's own loop (a run's fixed numpy cost is that of dozens of its
# iterations, as for SGLang's numpy runs: docs/speed.md)


def step_phases(costs, n: int, async_scheduling: bool) -> tuple[float, ...]:
    """The phases of a decode step of ``n`` requests before jitter (s), as the processes price
    them: schedule, dispatch, prepare, the output's hand-off (async scheduling: the worker taking
    an already queued RPC, ``pickup``; synchronous: the ``roundtrip``), sample, collect, update."""
    phase = costs.phase_s
    return (phase("schedule", n), phase("dispatch", n), phase("prepare", n),
            costs.pickup_s(n) if async_scheduling else phase("roundtrip", n),
            phase("sample", n), phase("collect", n), phase("update", n))


def numpy_steps(leap, prev, run: tuple, k0: int, k_max: int, state: tuple):
    """Iterations ``k0`` .. at most ``k_max - 1`` of the leap's run at once.

    Args:
        leap: the :class:`sim.engines.vllm.leap.loop.Leap` (engine core, worker, recorder).
        prev: async scheduling's step in flight at the run's start (a Batch; stamped here when
            ``k0`` is 0), else None.
        run: the run's constants: (running requests n, block size, blocks each iteration
            allocates by its index modulo the block size, the first iteration's summed context,
            shared prefix tokens, warm-up members, measured members, the first step's number,
            usable blocks, the next SimPy event's time, the next input's time, the run's start,
            async scheduling, the requests waiting).
        k0, k_max: the first iteration's index in the run, and the run's bound.
        state: the loop's state before iteration ``k0``: (clock, the last step's sampling end
            (async; else -inf), the step in flight's output back (async), the device's busy-until,
            free blocks, peak used blocks, the API server's output side free at, the last
            delivery, the row of the step in flight (async; None before the first)).

    Returns:
        None (no iteration taken), or (iterations taken, the state after them, as ``state``).
    """
    n, bs, hist, ctx0, shared, warm, measured, seq0, usable, horizon, inbox_next, now, async_, queued = run
    c0, w3_prev0, back_prev0, busy0, free0, peak0, free_s0, last0, head = state
    core = leap.core
    costs, frontend, rec = core.costs, core.frontend, core.recorder
    m = k_max - k0
    S, D, P, rt, sm, cc, u = step_phases(costs, n, async_)
    sd, p0 = 0.0 + (S + D), 0.0 + P
    ctx, fwd, need, need_sum = _run_arrays(leap, costs, n, bs, hist, ctx0, shared, k0, k_max)
    free_after = free0 - need_sum

    # a candidate timeline, in the form of the first iteration
    if async_:
        c_in, fe_c, back_c = _async_candidate(m, c0, busy0, back_prev0, fwd, sd, p0, rt, sm, cc, u)
        back_in = np.concatenate(([back_prev0], back_c[:-1]))
    else:
        w1_0 = (c0 + sd) + p0
        if (w1_0 if w1_0 > busy0 else busy0) + fwd[0] > (w1_0 + rt) + sm:  # the forward outlasts the round
            clock = _running_sum(c0, (sd, p0, fwd, cc, u), m)  # trip and sampling
            c_in, fe_c = clock[0:5 * m:5], clock[3::5]
        else:
            clock = _running_sum(c0, (sd, p0, rt, sm, cc, u), m)
            c_in, fe_c = clock[0:6 * m:6], clock[2::6] + fwd

    # every iteration again, from the candidate's state before it, with the loop's expressions
    launch = (c_in + 0.0) + S
    a1 = c_in + sd
    w1 = a1 + p0
    busy_in = np.concatenate(([busy0], fe_c[:-1]))
    fs = np.where(w1 > busy_in, w1, busy_in)
    fe = fs + fwd
    w3 = (w1 + rt) + sm
    back = np.where(w3 >= fe, w3, fe) + cc
    if async_:
        r, waited = a1, back_in - a1
    else:
        r, waited = w3, back - w3
    a2 = r + np.where(waited > 0.0, waited, 0.0)
    end = a2 + u
    egress = frontend.egress_terms(n)
    if egress is None:
        deliver = end
    else:
        wait, work = egress
        out = end + wait
        if free_s0 > out[0]:  # the output side backlogged: one step's work after another
            free_c = np.add.accumulate(np.concatenate(([free_s0], np.full(m, work))))[1:]
        else:
            free_c = out + work
        free_in = np.concatenate(([free_s0], free_c[:-1]))
        deliver = np.where(free_in > out, free_in, out) + work
        for _ in range(EGRESS_PASSES):  # backlogged at some steps only (the two parities of a pipelined
            # run: one step's output waits for the other's): the recurrence from the candidate, until it holds
            if np.array_equal(deliver, free_c):
                break
            free_c = deliver
            free_in = np.concatenate(([free_s0], free_c[:-1]))
            deliver = np.where(free_in > out, free_in, out) + work

    # the iterations the loop takes: its own stops, and the candidate's state where it holds
    ok = ((need <= free_after + need) & (c_in + TIME_EPS_S < inbox_next) & (end < horizon)
          & (now + (end - now) == end))
    if async_:
        ok &= (a1 > np.concatenate(([w3_prev0], w3[:-1]))) & (w3 < end)
    else:
        ok &= a1 > w3_prev0
    held = (end[:-1] == c_in[1:]) & (fe[:-1] == fe_c[:-1])
    if async_:
        held &= back[:-1] == back_in[1:]
    if egress is not None:
        held &= deliver[:-1] == free_c[:-1]
    k = int(np.argmin(ok)) if not ok.all() else m
    if not held.all():
        k = min(k, int(np.argmin(held)) + 1)
    if k == 0:
        return None

    # taken: the effects of iterations k0 .. k0+k-1, in the order the loop makes them
    used = usable - free_after[:k]
    peak = max(peak0, int(used.max()))
    if async_:  # each step's row is stamped by the iteration after it (its wait and update)
        rows = np.empty((k, 22))
        if head is None:  # the step in flight at the run's start: its own object
            prev.sync_start, prev.process_start, prev.process_end, prev.finished = (
                float(a1[0]), float(a2[0]), float(end[0]), 0)
            core._results.pop(prev.seq)
            rec.step(prev)
            rows = rows[1:]
        else:
            rows[0, :19] = head
        j = k - 1
        fill_decode_rows(rows[len(rows) - j:], rec.keeps_rows, seq0 + k0, n, warm, ctx[:j], used[:j], bs, c_in[:j],
                         0.0, S, launch[:j], launch[:j] + D, fs[:j], fe[:j], queued)
        stamped = slice(k - len(rows), k)
        rows[:, 19], rows[:, 20], rows[:, 21] = a1[stamped], a2[stamped], end[stamped]
        if len(rows):
            rec.step_rows(rows)
        i = k - 1
        head = (seq0 + k0 + i, DECODE, n, n, int(ctx[i]), warm, 0, 0, False, int(used[i]) * bs, n, queued,
                float(c_in[i]), float(c_in[i] + 0.0), float(c_in[i] + 0.0 + S), float(launch[i]),
                float(launch[i] + D), float(fs[i]), float(fe[i]))
    else:
        rows = np.empty((k, 22))
        fill_decode_rows(rows, rec.keeps_rows, seq0 + k0, n, warm, ctx[:k], used, bs, c_in[:k], 0.0, S, launch[:k],
                         launch[:k] + D, fs[:k], fe[:k], queued)
        rows[:, 19], rows[:, 20], rows[:, 21] = a1[:k], a2[:k], end[:k]
        rec.step_rows(rows)
    if measured:
        itl = np.empty(k)
        itl[0] = deliver[0] - last0
        itl[1:] = deliver[1:k] - deliver[:k - 1]
        rec.itl_many(itl, np.full(k, measured, dtype=np.int64))
    i = k - 1
    free_s = float(deliver[i]) if egress is not None else free_s0
    state = (float(end[i]), float(w3[i]) if async_ else -float("inf"), float(back[i]), float(fe[i]),
             int(free_after[i]), peak, free_s, float(deliver[i]), head)
    return k, state



def _run_arrays(leap, costs, n: int, bs: int, hist, ctx0: int, shared: int, k0: int, k_max: int):
    """The arrays of iterations ``k0`` .. ``k_max - 1`` of a run that its constants decide:
    (summed contexts, forward prices (``decode_forward_array``), blocks each allocates, their
    running sum), read-only. Kept on the leap (:attr:`Leap.run_arrays`, at most
    :data:`RUN_ARRAYS_KEPT`) by those constants: a closed loop of equal requests repeats its runs
    (at 8 clients of ``vllm-h200`` two keys cover 80% of them)."""
    def make():
        ks = np.arange(k0, k_max, dtype=np.int64)
        ctx = ctx0 + ks * n
        need = np.asarray(hist, dtype=np.int64)[ks % bs]
        arrays = (ctx, costs.decode_forward_array(n, ctx, shared), need, np.cumsum(need))
        for a in arrays:
            a.setflags(write=False)
        return arrays

    return kept(leap.run_arrays, (n, bs, tuple(hist), ctx0, shared, k0, k_max), make, RUN_ARRAYS_KEPT)


def _running_sum(start: float, parts: tuple, m: int) -> np.ndarray:
    """The clock that starts at ``start`` and adds, at each of ``m`` iterations, ``parts`` in order
    (scalars, or arrays of ``m`` values), with ``np.add.accumulate``: the loop's additions in its
    order. Returns the ``len(parts) * m + 1`` sums: with w parts, ``[w * j]`` is iteration j's start
    and ``[w * j + i + 1]`` the clock after its part i."""
    w = len(parts)
    seq = np.empty(w * m + 1)
    seq[0] = start
    for i, part in enumerate(parts):
        seq[1 + i::w] = part
    return np.add.accumulate(seq)


def _async_candidate(m: int, c0: float, busy0: float, back_prev0: float, fwd, sd: float, p0: float, rt: float,
                     sm: float, cc: float, u: float):
    """Async scheduling's candidate timeline: (iteration starts, forward ends, outputs back), arrays
    of ``m``. Each iteration launches its step, then waits for the step before's output; from the
    first two iterations (computed here as the loop computes them) each parity of iterations takes
    one form: the launch finds the device busy (the forward starts when the one before ends) or
    idle (it starts when its preparation ends), and the output is back when the forward ends or,
    if later, when the RPC's round trip and sampling end. Where every wait blocks, iteration i + 2
    starts when step i's output is back and updated: the even and the odd iterations are each a
    running sum from their start (``c0``; the first iteration's end), but for a parity whose output
    follows a forward that queued behind the other parity's: that one follows the other's forward
    ends (and where both queue, the forwards run back to back: one running sum of them). Where no
    wait blocks: the running sum of schedule + dispatch and update. Other mixes get the first form
    of these; the check after it cuts the run where the candidate fails."""
    forms, waits = [], []
    c, busy, back_prev = c0, busy0, back_prev0
    for k in range(min(2, m)):
        a1 = c + sd
        w1 = a1 + p0
        idle = w1 > busy
        fe = (w1 if idle else busy) + fwd[k]
        w3 = (w1 + rt) + sm
        forms.append((idle, fe > w3))
        waits.append(back_prev - a1 > 0.0)
        c, busy, back_prev = (a1 + max(0.0, back_prev - a1)) + u, fe, (w3 if w3 >= fe else fe) + cc
    if not any(waits):  # host-bound: schedule + dispatch, update
        clock = _running_sum(c0, (sd, u), m)
        w1 = clock[1::2] + p0
        fe_c = w1 + fwd
        w3 = (w1 + rt) + sm
        return clock[0:2 * m:2], fe_c, np.where(w3 >= fe_c, w3, fe_c) + cc
    c_in, fe_c, back_c = np.empty(m), np.empty(m), np.empty(m)
    starts = (c0, back_prev0 + u)
    if len(forms) == 1:
        forms.append(forms[0])
    if not forms[0][0] and not forms[1][0]:  # every launch queues: the forwards back to back
        fe_c[:] = np.add.accumulate(np.concatenate(([busy0], fwd)))[1:]
    for first, (idle, forward_bound) in enumerate(forms):
        f = fwd[first::2]
        j = len(f)
        if idle and forward_bound:  # start, prepare, forward, collect, update: the next start of this parity
            clock = _running_sum(starts[first], (sd, p0, f, cc, u), j)
            c_in[first::2], fe_c[first::2], back_c[first::2] = clock[0:5 * j:5], clock[3::5], clock[4::5]
        elif not forward_bound:  # the round trip and sampling decide: a running sum whatever the device does
            clock = _running_sum(starts[first], (sd, p0, rt, sm, cc, u), j)
            c_in[first::2], back_c[first::2] = clock[0:6 * j:6], clock[5::6]
            if idle:
                fe_c[first::2] = clock[2::6] + f
    for first, (idle, forward_bound) in enumerate(forms):  # the parities whose forward queues
        if idle:
            continue
        if forms[1 - first][0]:  # behind the other parity's forward (computed above)
            before = np.concatenate(([busy0], fe_c[1::2])) if first == 0 else fe_c[0::2]
            fe_c[first::2] = before[:len(fwd[first::2])] + fwd[first::2]
        if forward_bound:
            back_c[first::2] = fe_c[first::2] + cc
            c_in[first::2] = np.concatenate(([starts[first]], back_c[first::2][:-1] + u))[:len(fwd[first::2])]
    return c_in, fe_c, back_c
