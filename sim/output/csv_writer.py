"""Writing a table as CSV, byte for byte as ``DataFrame.to_csv(path, index=False)`` writes it,
at a fraction of its time.

The run's tables are long (a row per step: about 3.7 per request at concurrency 64) and mostly
floats (seconds); ``to_csv`` spends most of its time converting them to text. Here each column
is converted once, with Python's own shortest round-trip ``repr`` for floats (what pandas
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

if TYPE_CHECKING:
    import pandas as pd


def write_csv(frame: pd.DataFrame, path: str | Path) -> None:
    """Write ``frame`` (its columns, no index) to ``path`` as ``frame.to_csv(path, index=False)``."""
    import pandas as pd

    columns = [_column_text(frame.iloc[:, i], pd) for i in range(frame.shape[1])]
    if not columns or any(c is None for c in columns) or os.linesep != "\n":
        frame.to_csv(path, index=False)
        return
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


_QUOTED = re.compile(r'[,"\r\n]')  # a cell holding one of these is quoted by csv's writer


def _needs_quotes(cells: list[str]) -> bool:
    """Whether a cell of ``cells`` (a header, or a column of text: a number's never is) needs quoting."""
    return any(map(_QUOTED.search, set(cells)))


def _column_text(series: pd.Series, pd) -> list[str] | None:
    """The column's cells as pandas writes them, or None for a type left to pandas."""
    dtype = series.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        if series.isna().any():
            return None
        return list(map(str, series.astype(object).tolist()))
    kind = getattr(dtype, "kind", "")
    if kind == "f" and dtype.itemsize == 8:
        text = list(map(repr, series.tolist()))
        for i in series.isna().to_numpy().nonzero()[0].tolist():
            text[i] = ""
        return text
    if kind in ("i", "u", "b"):
        return list(map(str, series.tolist()))
    if kind in ("O", "U", "T") or str(dtype) == "str":
        values = series.tolist()
        if all(type(v) is str for v in values):
            return values
        return None
    return None
