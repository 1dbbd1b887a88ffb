"""A run's results folder, written atomically: ``summary.json`` and each setting's tables (CSV or
Parquet), and which files of an earlier run a new one replaces. :mod:`sim.output.run_tables`
reads such a folder back.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from sim.atomic import atomic_path

if TYPE_CHECKING:  # tables arrive as DataFrames or a run's Columns; a run need not import pandas
    import pandas as pd

    from sim.trace.columns import Columns


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (see :func:`sim.atomic.atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


# rows per Parquet row group of a run's table: the writer holds a row group's encoded columns until
# it is complete (a whole 100,000-request steps table in one held about 40 MiB more), and a group's
# typed copies are made as it is written (65,536 rows: 14 MiB more than 16,384 at the peak of a
# 20,000-request run; the file's size and the CPU the same)
ROW_GROUP_ROWS = 16384


def atomic_write_frame(df: pd.DataFrame | Columns, path: Path) -> None:
    """Write a table, a DataFrame or a run's :class:`sim.trace.columns.Columns`, as CSV or Parquet
    (by suffix), atomically. Columns go to Parquet through pyarrow alone, a row group of
    :data:`ROW_GROUP_ROWS` rows at a time (pandas is not imported: ``pandas.read_parquet`` reads
    back the DataFrame ``Columns.to_frame`` gives, ``kind`` a category); to CSV as that
    DataFrame."""
    from sim.trace.columns import Columns

    with atomic_path(path) as tmp:
        if Path(path).suffix == ".parquet":
            if isinstance(df, Columns):
                import pyarrow.parquet

                batches = df.arrow_batches(ROW_GROUP_ROWS)  # a row group's typed copies at a time
                first = next(batches)
                # dictionary encoding for the category and text columns only: on the times and
                # counts (pyarrow's default, what to_parquet did) it built hash tables for
                # nothing: 2.5x the CPU, 14 MiB more at the peak and a 17% larger steps file
                text = [name for name in df.names if name in df.categories or df[name].dtype == object]
                with pyarrow.parquet.ParquetWriter(tmp, first.schema, use_dictionary=text) as writer:
                    writer.write_table(first)
                    for batch in batches:
                        writer.write_table(batch)
            else:
                df.to_parquet(tmp, index=False)
            import pyarrow  # imported by to_parquet

            pyarrow.default_memory_pool().release_unused()  # the Arrow copy's memory back to the system
        else:
            from sim.output.csv_writer import write_csv  # to_csv's bytes, faster on long float tables

            write_csv(df.to_frame() if isinstance(df, Columns) else df, tmp)


RUN_FILES = re.compile(r"^(?:(?:steps|requests|itl)_[a-z0-9_]+\.(?:csv|parquet)|gaps\.png|metrics\.png|timeline\.png"
                       r"|trace\.json(?:\.gz)?)$")


def stale_run_files(out_dir: Path) -> list[Path]:
    """What an earlier ``run`` wrote into ``out_dir`` (its tables, plots and default Chrome
    trace, all derived from that run), which a new run replaces so that no stale file sits
    beside the new summary (:func:`sim.atomic.staged_folder` moves them aside). Only a folder
    holding a run's ``summary.json`` has them, and only the file names a run writes
    (:data:`RUN_FILES`)."""
    out_dir = Path(out_dir)
    try:
        payload = json.loads((out_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(payload, dict) or "settings" not in payload:
        return []
    return [p for p in out_dir.iterdir() if p.is_file() and RUN_FILES.match(p.name)]


def write_tables(out_dir: Path, result, table_format: str = "parquet", tables: str = "steps") -> list[Path]:
    """Write one run's ``steps_/requests_/itl_<setting>.<fmt>`` into ``out_dir`` (``result``: a
    :class:`sim.simulate.Result`; ``tables``: which of its tables exist), each file atomically.
    Returns the paths written."""
    kinds = {"steps": ("steps", "requests", "itl"), "summary": ("requests",), "none": ()}[tables]
    written = []
    for kind in kinds:
        path = Path(out_dir) / f"{kind}_{result.setting}.{table_format}"
        atomic_write_frame(result.columns(kind), path)
        written.append(path)
    return written


def write_results(out_dir: Path, payload: dict, results: Iterable, table_format: str = "parquet",
                  tables: str = "steps") -> list[Path]:
    """Write ``summary.json`` and per-setting ``steps_/requests_/itl_<setting>.<fmt>`` into
    ``out_dir`` (``tables``: which tables exist, see :func:`sim.simulate`), each file
    atomically. Returns the paths written."""
    out_dir = Path(out_dir)
    written = [path for res in results for path in write_tables(out_dir, res, table_format, tables)]
    path = out_dir / "summary.json"
    atomic_write_text(path, json.dumps(payload, indent=2) + "\n")
    written.append(path)
    return written
