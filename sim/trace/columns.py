"""A table as named numpy columns: a finished run's steps, requests and ITL tables as its
recorder hands them over, summarised and written as Parquet without pandas.

``overlap-sim run`` reads a run's tables twice, for the summary (:func:`sim.trace.metrics.summarize`)
and to write them (:func:`sim.output.run_files.write_tables`); neither needs a DataFrame, and
importing pandas costs about 0.19 s of CPU and 45 MiB of memory (measured 5 December 2026, issue
31: the default mode's cost over the streamed one). :class:`Columns` is what both read; a
:class:`sim.simulate.Result`'s ``steps``, ``requests`` and ``itl`` still give DataFrames, built
from the same arrays (no copy) on first use.

A column is a one-dimensional numpy array, every column of a table the same length. A
categorical column (the steps' ``kind``) holds codes into its categories, as
``pandas.Categorical`` does: :meth:`Columns.matches` compares it by category name,
:meth:`Columns.to_frame` gives a categorical column, :meth:`Columns.arrow_batches` a dictionary
column (which ``pandas.read_parquet`` reads back as the same categorical). A column may be kept
in another type than the table's (``types``): the steps table's columns are views of the
recorder's buffer of rows of doubles (no copy: at 100,000 requests a copy was 60 MiB a setting at
its peak), its counts and flags exact doubles, typed when a DataFrame or Parquet is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa


class Columns:
    """Named columns of equal length, in table order.

    Args:
        data: column name -> 1-d array, in the table's column order.
        categories: for each categorical column, its categories (the column holds its codes, as
            int8 or as exact doubles).
        types: for a column kept in another type than the table's (an int64 count or a bool
            kept as exact doubles), the table's type (:meth:`typed`).

    Raises:
        ValueError: columns of different lengths, or codes of a categorical column outside its
            categories.
    """

    def __init__(self, data: dict[str, np.ndarray], categories: dict[str, tuple[str, ...]] | None = None,
                 types: dict[str, str] | None = None):
        lengths = {len(values) for values in data.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns of different lengths: {sorted(lengths)}")
        self.data = data
        self.categories = dict(categories or {})
        self.types = dict(types or {})
        for name, names in self.categories.items():
            codes = data[name]
            if len(codes) and (codes.min() < 0 or codes.max() >= len(names)):
                raise ValueError(f"column {name}: codes outside its {len(names)} categories")

    @property
    def names(self) -> list[str]:
        return list(self.data)

    def __len__(self) -> int:
        return len(next(iter(self.data.values()))) if self.data else 0

    def __getitem__(self, name: str) -> np.ndarray:
        """The column ``name`` as kept (codes for a categorical one; see ``types``); KeyError if
        there is none."""
        return self.data[name]

    def typed(self, name: str, rows: slice = slice(None)) -> np.ndarray:
        """The column ``name`` (its ``rows``) in the table's type, contiguous (int8 codes for a
        categorical column): a copy where it is kept otherwise."""
        values = self.data[name][rows]
        dtype = np.int8 if name in self.categories else self.types.get(name, values.dtype)
        return np.ascontiguousarray(values, dtype=dtype)

    def matches(self, name: str, value) -> np.ndarray:
        """A bool array: where column ``name`` equals ``value`` (a categorical column: where its
        category is ``value``; none where ``value`` is not one of its categories)."""
        column = self.data[name]
        if name in self.categories:
            names = self.categories[name]
            if value not in names:
                return np.zeros(len(column), dtype=bool)
            return column == names.index(value)
        return np.asarray(column == value, dtype=bool)

    def sorted_by(self, name: str) -> "Columns":
        """The rows in the order of column ``name`` (a stable sort, as ``DataFrame.sort_values(name,
        kind="stable")``); ``self`` when they already are in strictly increasing order."""
        keys = self.data[name]
        if len(keys) < 2 or (keys[1:] > keys[:-1]).all():
            return self
        order = np.argsort(keys, kind="stable")
        return Columns({k: v[order] for k, v in self.data.items()}, self.categories, self.types)

    def to_frame(self) -> pd.DataFrame:
        """A DataFrame of these columns in the table's types (the arrays themselves where they are
        kept so, else typed copies; categorical columns as ``pandas.Categorical``), with a 0..n-1
        index."""
        import pandas as pd

        columns = {name: (pd.Categorical.from_codes(self.typed(name), categories=list(self.categories[name]))
                          if name in self.categories else self.typed(name)) for name in self.data}
        return pd.DataFrame(columns, columns=self.names, copy=False)

    def arrow_batches(self, rows: int) -> Iterator[pa.Table]:
        """Arrow tables of ``rows`` rows at a time (the last shorter; one empty table for an empty
        table), for Parquet, each holding what ``pyarrow.Table.from_pandas`` makes of those rows
        of :meth:`to_frame`: numbers and bools as they are (a NaN float as null, pandas' missing
        value), strings as large strings (an empty object column: nulls), a categorical column as
        a dictionary column (int8 indices into its categories). A batch's typed copies are made
        when it is asked for, so writing them one by one holds one batch's copies at a time.

        Built from the arrays' buffers (``pyarrow.Array.from_buffers``): ``pyarrow.array``
        imports pandas (pyarrow 26 checks every input for a pandas object), which this path
        exists to avoid.

        Raises:
            TypeError: an object column holding something other than strings.
        """
        import pyarrow as pa

        dictionaries = {name: _arrow_array(pa, np.array(names, dtype=object))
                        for name, names in self.categories.items()}
        n = len(self)
        for start in range(0, max(n, 1), rows):
            part = slice(start, start + rows)
            arrays = [pa.DictionaryArray.from_arrays(_arrow_array(pa, self.typed(name, part)), dictionaries[name])
                      if name in self.categories else _arrow_array(pa, self.typed(name, part)) for name in self.data]
            yield pa.Table.from_arrays(arrays, names=self.names)


def _arrow_array(pa, values: np.ndarray):
    """One Arrow array of a 1-d numpy array (see :meth:`Columns.arrow_batches`), from its buffers."""
    n = len(values)
    if values.dtype == object:
        if n == 0:
            return pa.nulls(0)
        if not all(isinstance(v, str) for v in values):
            raise TypeError("an object column holds something other than strings")
        encoded = [v.encode("utf-8") for v in values]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=n), out=offsets[1:])
        return pa.Array.from_buffers(pa.large_string(), n, [None, pa.py_buffer(offsets),
                                                            pa.py_buffer(b"".join(encoded))])
    if values.dtype == np.bool_:
        return pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(np.packbits(values, bitorder="little"))])
    values = np.ascontiguousarray(values)
    validity = None
    if values.dtype.kind == "f":
        missing = np.isnan(values)
        if missing.any():
            validity = pa.py_buffer(np.packbits(~missing, bitorder="little"))
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), n, [validity, pa.py_buffer(values)])


def values_of(table, name: str) -> np.ndarray:
    """Column ``name`` of ``table`` (a :class:`Columns` or a DataFrame) as a numpy array."""
    column = table[name]
    return column if isinstance(column, np.ndarray) else column.to_numpy()


def matches(table, name: str, value) -> np.ndarray:
    """Where column ``name`` of ``table`` (a :class:`Columns` or a DataFrame) equals ``value``, as a
    bool array."""
    if isinstance(table, Columns):
        return table.matches(name, value)
    return (table[name] == value).to_numpy(dtype=bool)
