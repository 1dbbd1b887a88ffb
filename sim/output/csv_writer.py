"""Writing a table as CSV, byte for byte as ``DataFrame.to_csv(path, index=False)`` writes it,
at a fraction of its time.

The run's tables are long (a row per step: about 3.7 per request at concurrency 64) and mostly
floats (seconds); ``to_csv`` spends most of its time converting them to text. Here each column
is converted once (the float columns together, each distinct value once), with Python's own
shortest round-trip ``repr`` for floats (what pandas
writes for a float64 column without ``float_format``), the empty string for NaN (pandas'
default ``na_rep``), ``str`` for integers, bools and strings, and the rows go through
:mod:`csv`'s writer with pandas' defaults (comma, ``"`` quoting when needed, ``\\n`` line ends),
or, when no cell needs quoting (numbers, and strings without ``,``, ``"``, ``\\r``, ``\\n``), are
joined with commas directly (what that writer would write, at a third of its time).
A column of any other type is left to pandas: the whole table is then written by ``to_csv``.
"""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd


def write_csv(frame: pd.DataFrame, path: str | Path) -> None:
    """Write ``frame`` (its columns, no index) to ``path`` as ``frame.to_csv(path, index=False)``."""
    import pandas as pd

    columns = [_column_text(frame.iloc[:, i], pd) for i in range(frame.shape[1])]
    if not columns or any(c is None for c in columns) or os.linesep != "\n":
        frame.to_csv(path, index=False)
        return
    _float_texts(frame, columns)
    header = [str(name) for name in frame.columns]
    with open(path, "w", newline="", encoding="utf-8") as f:
        texts = [c for c, kind in zip(columns, frame.dtypes) if getattr(kind, "kind", "O") not in "fiub"]
        if len(columns) > 1 and not _needs_quotes(header) and not any(map(_needs_quotes, texts)):
            # (with one column an empty cell would be quoted: that case goes to csv's writer)
            f.write(",".join(header) + "\n")
            f.writelines(map("{}\n".format, map(",".join, zip(*columns))))
            return
        writer = csv.writer(f, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
        writer.writerow(header)
        writer.writerows(zip(*columns))


def _float_texts(frame: pd.DataFrame, columns: list) -> None:
    """Fill in ``columns`` (:data:`_FLOAT` where :func:`_column_text` left a float64 column) with
    the text of every float64 column, converted together: a run's steps table holds each time about
    twice (a phase's end is the next one's start, a forward's end the next one's start when
    they run back to back), and each distinct value is converted once. NaN is the empty cell."""
    floats = [i for i, c in enumerate(columns) if c is _FLOAT]
    if not floats:
        return
    values = np.concatenate([frame.iloc[:, i].to_numpy() for i in floats])
    if (values == 0).any() and np.signbit(values[values == 0]).any():
        text = list(map(repr, values.tolist()))  # -0.0: np.unique would merge it with 0.0
    else:
        text = _by_distinct_value(values, repr)
    for i in np.isnan(values).nonzero()[0].tolist():
        text[i] = ""
    n = len(frame)
    for k, i in enumerate(floats):
        columns[i] = text[k * n:(k + 1) * n]


def _by_distinct_value(values: np.ndarray, to_text) -> list[str]:
    """``list(map(to_text, values.tolist()))``, converting each distinct value once
    (``np.unique`` and a gather)."""
    if len(values) < 1024:
        return list(map(to_text, values.tolist()))
    distinct, where = np.unique(values, return_inverse=True)
    texts = np.array(list(map(to_text, distinct.tolist())), dtype=object)
    return texts[where.reshape(-1)].tolist()


_FLOAT = object()  # :func:`_column_text`'s mark of a float64 column, converted by :func:`_float_texts`

_QUOTED = re.compile(r'[,"\r\n]')  # a cell holding one of these is quoted by csv's writer


def _needs_quotes(cells: list[str]) -> bool:
    """Whether a cell of ``cells`` (a header, or a column of text: a number's never is) needs quoting."""
    return any(map(_QUOTED.search, set(cells)))


def _column_text(series: pd.Series, pd) -> list[str] | object | None:
    """The column's cells as pandas writes them, :data:`_FLOAT` for a float64 column (converted
    with the others by :func:`_float_texts`), or None for a type left to pandas."""
    dtype = series.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        if series.isna().any():
            return None
        return list(map(str, series.astype(object).tolist()))
    kind = getattr(dtype, "kind", "")
    if kind == "f" and dtype.itemsize == 8:
        return _FLOAT
    if kind in ("i", "u"):
        return _by_distinct_value(series.to_numpy(), str)  # counters: few distinct values
    if kind == "b":
        return list(map(str, series.tolist()))
    if kind in ("O", "U", "T") or str(dtype) == "str":
        values = series.tolist()
        if all(type(v) is str for v in values):
            return values
        return None
    return None
