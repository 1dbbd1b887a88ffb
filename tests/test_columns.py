"""A run's tables as numpy columns (sim.trace.columns): summarised and written without pandas,
with the same answer as the DataFrames they become.

Closed forms first (a hand-made table), then hypothesis: the summary of Columns equals the
summary of the same DataFrame to the bit (NaN, infinities, -0.0, empty tables, warm-up and
failed requests), the gaps equal pandas' shift and clip, and the Parquet file written from
Columns reads back as the DataFrame pandas writes."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.output.run_files import atomic_write_frame
from sim.trace.columns import Columns, matches, values_of
from sim.trace.metrics import GROWTH_KEYS, SUMMARY_KEYS, forward_gaps, measured_window, step_gaps, summarize
from sim.trace.recorder import REQUEST_COLUMNS, STEP_COLUMNS, rows_to_columns

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("extend", "decode")


def test_columns_by_hand():
    c = Columns({"seq": np.array([2, 0, 1]), "kind": np.array([1, 0, 1], dtype=np.int8),
                 "status": np.array(["completed", "failed", "completed"], dtype=object)}, {"kind": KINDS})
    assert len(c) == 3 and c.names == ["seq", "kind", "status"]
    assert c.matches("kind", "decode").tolist() == [True, False, True]
    assert c.matches("kind", "verify").tolist() == [False, False, False]  # not a category: nowhere
    assert c.matches("status", "failed").tolist() == [False, True, False]
    ordered = c.sorted_by("seq")
    assert ordered["seq"].tolist() == [0, 1, 2] and ordered["kind"].tolist() == [0, 1, 1]
    assert ordered.sorted_by("seq") is ordered  # already in order: itself
    frame = ordered.to_frame()
    assert frame["kind"].tolist() == ["extend", "decode", "decode"] and list(frame.index) == [0, 1, 2]
    assert values_of(frame, "seq").tolist() == [0, 1, 2] and matches(frame, "kind", "decode").tolist() == [
        False, True, True]


def test_columns_refuse_what_is_not_a_table():
    with pytest.raises(ValueError, match="different lengths"):
        Columns({"a": np.zeros(2), "b": np.zeros(3)})
    with pytest.raises(ValueError, match="outside its 2 categories"):
        Columns({"kind": np.array([0, 2], dtype=np.int8)}, {"kind": KINDS})
    with pytest.raises(TypeError, match="other than strings"):
        next(Columns({"s": np.array(["a", None], dtype=object)}).arrow_batches(10))


def test_summary_by_hand():
    """Two measured requests (one warm-up left out), three forwards: the summary's figures by hand."""
    requests = rows_to_columns([
        (0, 0.0, 10, 0, 4, 4, 0.5, 1.0, "completed", True, 0, ""),
        (1, 1.0, 10, 0, 3, 3, 1.25, 2.0, "completed", False, 0, ""),
        (2, 1.5, 20, 0, 5, 5, 1.75, 3.0, "completed", False, 0, ""),
    ], REQUEST_COLUMNS)
    steps = Columns({name: np.zeros(3) for name in STEP_COLUMNS} | {
        "kind": np.array([0, 1, 1], dtype=np.int8), "num_reqs": np.array([1, 2, 2]),
        "forward_start": np.array([1.0, 1.5, 2.5]), "forward_end": np.array([1.25, 2.0, 3.0]),
        "after_idle": np.zeros(3, dtype=bool), "overshoot": np.zeros(3, dtype=np.int64)}, {"kind": KINDS})
    itl = Columns({"itl_s": np.array([0.25, 0.5]), "weight": np.array([1, 3])})
    s = summarize(steps, requests, itl)
    assert s["completed"] == 2 and s["failed"] == 0 and s["duration_s"] == 2.0  # 1.0 .. 3.0
    assert s["total_output_tokens"] == 8 and s["output_throughput"] == 4.0
    assert s["mean_ttft_ms"] == 250.0  # 0.25 s each
    assert s["mean_tpot_ms"] == pytest.approx((0.75 / 2 + 1.25 / 4) / 2 * 1e3)
    assert s["mean_itl_ms"] == pytest.approx((0.25 + 3 * 0.5) / 4 * 1e3)
    assert s["num_steps"] == 3 and s["mean_decode_batch_size"] == 2.0
    assert s["mean_gap_ms"] == pytest.approx(375.0)  # gaps 0.25 and 0.5 s after the first forward
    assert s["gpu_idle_fraction"] == pytest.approx(1 - 1.25 / 2.0)
    assert measured_window(requests) == (1.0, 3.0)


floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1e-300, math.nan])
small = st.integers(min_value=-3, max_value=50)


@st.composite
def tables(draw):
    n_req = draw(st.integers(min_value=0, max_value=8))
    rows = [(rid, draw(floats), draw(small), draw(small), draw(small), draw(small), draw(floats), draw(floats),
             draw(st.sampled_from(["completed", "failed"])), draw(st.booleans()), draw(small),
             draw(st.sampled_from(["", "cut_off", "aborted", "too_long"]))) for rid in range(n_req)]
    n_steps = draw(st.integers(min_value=0, max_value=8))
    steps = {name: np.array([draw(floats) for _ in range(n_steps)], dtype=np.float64) for name in STEP_COLUMNS}
    for name in ("seq", "num_reqs", "overshoot"):
        steps[name] = np.array([draw(small) for _ in range(n_steps)], dtype=np.int64)
    steps["kind"] = np.array([draw(st.integers(0, 1)) for _ in range(n_steps)], dtype=np.int8)
    steps["after_idle"] = np.array([draw(st.booleans()) for _ in range(n_steps)], dtype=bool)
    n_itl = draw(st.integers(min_value=0, max_value=6))
    itl = Columns({"itl_s": np.array([draw(floats) for _ in range(n_itl)], dtype=np.float64),
                   "weight": np.array([draw(st.integers(0, 5)) for _ in range(n_itl)], dtype=np.int64)})
    return Columns(steps, {"kind": KINDS}), rows_to_columns(rows, REQUEST_COLUMNS), itl


def _same(a, b) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # NaN and -0.0 spelled out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables())
def test_summary_of_columns_is_the_summary_of_the_frames(t):
    import warnings

    steps, requests, itl = t
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # means of empty or infinite values: NaN, as before
        got = summarize(steps, requests, itl)
        want = summarize(steps.to_frame(), requests.to_frame(), itl.to_frame())
    assert list(got) == SUMMARY_KEYS + GROWTH_KEYS and _same(got, want)


def test_a_mean_over_infinities_is_numpys():
    """Means are exact sums (``math.fsum``), which raises where numpy gives an answer: a sum past
    the largest double is +-inf, infinities of both signs NaN (a corrupt trace's values)."""
    from sim.trace.metrics import _stats_ms

    cases = {(math.inf, -math.inf): math.nan, (1e308, 1e308): math.inf, (math.inf, 1.0): math.inf,
             (0.001, 0.003): 2.0}  # the last: the plain mean, in ms
    import warnings

    for values, mean_ms in cases.items():
        out = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the quantiles of inf and -inf: NaN, as before
            _stats_ms(np.array(values), "x", out)
        assert _same(out["mean_x_ms"], mean_ms), (values, out)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(floats, floats), max_size=10))
def test_forward_gaps_are_pandas_shift_and_clip(pairs):
    fs = np.array([p[0] for p in pairs], dtype=np.float64)
    fe = np.array([p[1] for p in pairs], dtype=np.float64)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # inf - inf
        got = forward_gaps(fs, fe)
        frame = pd.DataFrame({"forward_start": fs, "forward_end": fe})
        want = (frame["forward_start"] - frame["forward_end"].shift(1)).clip(lower=0.0).to_numpy()
        assert step_gaps(frame).to_numpy().tobytes() == got.tobytes()
    assert got.tobytes() == want.tobytes()  # NaN and -0.0 included, bit for bit


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tables(), st.sampled_from([1, 3, 65536]))
def test_parquet_of_columns_reads_back_as_pandas_writes_it(tmp_path, monkeypatch, t, row_group_rows):
    """Also in row groups of 1 and 3 rows (each with its own dictionary for ``kind``)."""
    import sim.output.run_files

    monkeypatch.setattr(sim.output.run_files, "ROW_GROUP_ROWS", row_group_rows)
    for i, table in enumerate(t):
        ours, theirs = tmp_path / f"ours{i}.parquet", tmp_path / f"theirs{i}.parquet"
        atomic_write_frame(table, ours)
        table.to_frame().to_parquet(theirs, index=False)
        pd.testing.assert_frame_equal(pd.read_parquet(ours), pd.read_parquet(theirs), check_exact=True)


def test_a_runs_steps_are_views_of_the_rows_typed_when_asked(tmp_path):
    """The recorder's steps columns are views of its buffer of doubles; the summary read from them
    is the summary of the typed DataFrame, and the DataFrame has the table's types."""
    from sim.scenario import load_scenario
    from sim.simulate import simulate
    from sim.trace.recorder import STEP_TYPES

    scenario = load_scenario(ROOT / "scenarios" / "quickstart.yaml", ["workload.num_requests=12"])
    result = simulate(scenario, "overlap")
    columns = result.columns("steps")
    assert all(columns[name].base is not None for name in STEP_COLUMNS)  # views, not copies
    assert columns["num_reqs"].dtype == np.float64 and columns.typed("num_reqs").dtype == np.int64
    got = result.summary()
    frame = result.steps
    assert str(frame["kind"].dtype) == "category" and frame["after_idle"].dtype == bool
    assert {c: str(frame[c].dtype) for c in STEP_COLUMNS if STEP_TYPES[c] != "kind"} == {
        c: STEP_TYPES[c] for c in STEP_COLUMNS if STEP_TYPES[c] != "kind"}
    assert _same(got, {**summarize(frame, result.requests, result.itl), **{k: got[k] for k in got
                                                                           if k not in SUMMARY_KEYS}})


def test_a_default_run_imports_neither_pandas_nor_matplotlib(tmp_path):
    """The default mode's summary and Parquet tables need neither (issue 31: pandas' import is
    0.19 s of CPU and 45 MiB); --format csv and --plots do."""
    code = ("import sys; from sim.cli import main; "
            f"code = main(['run', 'scenarios/quickstart.yaml', '--no-range', '--out', {str(tmp_path / 'r')!r}, "
            "'--set', 'workload.num_requests=12']); "
            "print(code, 'pandas' in sys.modules, 'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "0 False False"
    assert len(pd.read_parquet(tmp_path / "r" / "steps_overlap.parquet")) > 0
