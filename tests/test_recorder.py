"""The steps table of :class:`sim.trace.recorder.TraceRecorder`: rows kept as one flat array of
doubles, read back as typed columns. A hand-written pair of steps first, then any values the
columns can hold (hypothesis: NaN, infinities, extremes) must come back exactly."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.model.batch import Batch
from sim.model.costs import DECODE, EXTEND
from sim.trace.recorder import STEP_COLUMNS, STEP_TYPES, TraceRecorder

TIMES = [c for c in STEP_COLUMNS if STEP_TYPES[c] == "float64"]


def _batch(seq: int, kind: int, times: list[float], **fields) -> Batch:
    b = Batch(seq, kind, fields.pop("num_reqs", 1), fields.pop("num_tokens", 1), fields.pop("sum_ctx", 1))
    for name, value in zip(TIMES, times):
        setattr(b, name, value)
    for name, value in fields.items():
        setattr(b, name, value)
    return b


def test_two_steps_out_of_order_come_back_sorted_and_typed():
    rec = TraceRecorder()
    rec.step(_batch(1, DECODE, [0.5 + i for i in range(10)], num_reqs=3, after_idle=True, kv_used_after_alloc=48))
    rec.step(_batch(0, EXTEND, [0, *[0.25] * 9], num_tokens=512, sum_ctx=512, finished=2))
    df = rec.step_columns().to_frame()
    assert list(df.columns) == STEP_COLUMNS
    assert df["seq"].tolist() == [0, 1] and df.index.tolist() == [0, 1]
    assert df["kind"].astype(str).tolist() == ["extend", "decode"]
    assert df["num_tokens"].tolist() == [512, 1] and df["num_reqs"].tolist() == [1, 3]
    assert df["after_idle"].tolist() == [False, True] and df["after_idle"].dtype == bool
    assert df["kv_used"].tolist() == [0, 48] and df["finished"].tolist() == [2, 0]
    assert df["recv_start"].tolist() == [0.0, 0.5] and df["process_end"].tolist() == [0.25, 9.5]
    for name, kind in STEP_TYPES.items():
        assert str(df[name].dtype) == ("category" if kind == "kind" else kind), name


def test_no_steps_gives_an_empty_table_with_every_column():
    df = TraceRecorder().step_columns().to_frame()
    assert list(df.columns) == STEP_COLUMNS and len(df) == 0


_ints = st.integers(-(2**53), 2**53)  # what a double holds exactly
_floats = st.floats(allow_nan=True, allow_infinity=True)


@given(rows=st.lists(st.tuples(st.sampled_from([EXTEND, DECODE]), st.lists(_ints, min_size=8, max_size=8),
                               st.booleans(), st.lists(_floats, min_size=10, max_size=10)), max_size=20))
@settings(max_examples=200, deadline=None)
def test_any_values_come_back_exactly(rows):
    rec = TraceRecorder()
    for seq, (kind, ints, idle, times) in enumerate(rows):
        rec.step(_batch(seq, kind, times, num_reqs=ints[0], num_tokens=ints[1], sum_ctx=ints[2], num_warmup=ints[3],
                        finished=ints[4], kv_used_after_alloc=ints[5], num_running=ints[6], num_queued=ints[7],
                        after_idle=idle))
    df = rec.step_columns().to_frame()
    assert len(df) == len(rows)
    for seq, (kind, ints, idle, times) in enumerate(rows):
        row = df.iloc[seq]
        assert row["kind"] == ("extend", "decode")[kind]
        got = [row[c] for c in ("num_reqs", "num_tokens", "sum_ctx", "num_warmup", "finished", "kv_used",
                                "num_running", "num_queued")]
        assert [int(v) for v in got] == ints
        assert bool(row["after_idle"]) is idle
        for name, want in zip(TIMES, times):
            value = float(row[name])
            assert (math.isnan(value) and math.isnan(want)) or (value == want and
                                                               math.copysign(1, value) == math.copysign(1, want))


def test_the_table_is_what_a_dataframe_of_the_rows_would_be():
    # the shipped recorder's columns against pandas' own inference over the same rows
    rec = TraceRecorder()
    rows = []
    for seq in range(5):
        b = _batch(seq, seq % 2, [seq + i / 8 for i in range(10)], num_reqs=seq + 1, after_idle=seq == 3)
        rec.step(b)
        rows.append((b.seq, ("extend", "decode")[b.kind], b.num_reqs, b.num_tokens, b.sum_ctx, b.num_warmup,
                     len(b.overshoot), b.finished, b.after_idle, b.kv_used_after_alloc, b.num_running, b.num_queued,
                     *[getattr(b, t) for t in TIMES]))
    want = pd.DataFrame(rows, columns=STEP_COLUMNS)
    got = rec.step_columns().to_frame()
    assert got["kind"].astype(str).tolist() == want["kind"].astype(str).tolist()
    pd.testing.assert_frame_equal(got.drop(columns="kind"), want.drop(columns="kind"))
    assert np.array_equal(got["forward_end"].to_numpy(), want["forward_end"].to_numpy())
