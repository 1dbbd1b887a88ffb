"""Reading a results folder written by ``overlap-sim run`` back into tables (no simulation)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from sim.errors import UserInputError


@dataclass
class RunTables:
    """A saved run: ``payload`` is summary.json (scenario, seed, settings, ratios, scenario_config);
    ``steps``/``requests`` map each setting to its table (schema in :mod:`sim.trace.recorder`)."""

    folder: Path
    payload: dict
    steps: dict[str, pd.DataFrame] = field(default_factory=dict)
    requests: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def scenario_name(self) -> str:
        return str(self.payload.get("scenario", self.folder.name))

    @property
    def summaries(self) -> dict[str, dict]:
        return {k: v for k, v in self.payload.get("settings", {}).items() if k in self.steps}

    @property
    def device(self) -> str:
        """The run's ``server.device`` (what its forwards ran on: the gaps' name), ``cuda`` when
        summary.json does not say."""
        device = self.payload.get("scenario_config", {}).get("server", {}).get("device")
        return device if isinstance(device, str) else "cuda"

    @property
    def kv_pool_tokens(self) -> Optional[int]:
        return self.payload.get("scenario_config", {}).get("server", {}).get("kv_pool_tokens")


def _read_table(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except Exception as err:  # pyarrow and the CSV parser raise many kinds
        raise UserInputError(str(path), "", f"cannot read the table ({type(err).__name__}: {err})") from None


def is_run_folder(folder: Path) -> bool:
    folder = Path(folder)
    return (folder / "summary.json").is_file() and any(folder.glob("steps_*.*"))


def check_run_folder(folder: Path) -> None:
    """Raise :class:`UserInputError` naming ``folder`` unless it is a folder (a file, or nothing,
    said as such: where a run's results were expected)."""
    if not folder.is_dir():
        what = "a file, not a folder" if folder.exists() else "no such folder"
        raise UserInputError(str(folder), "", f"{what}; expected a results folder written by 'overlap-sim run'")


def load_run_tables(folder: Path, settings: Optional[list[str]] = None) -> RunTables:
    """Load ``summary.json`` and the ``steps_/requests_<setting>.{csv,parquet}`` tables of a run.

    Raises:
        UserInputError: no summary.json, an unreadable table, a step table without the columns
            this needs, or a requested setting the folder does not have.
    """
    folder = Path(folder)
    check_run_folder(folder)
    try:
        payload = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError) as err:
        raise UserInputError(str(folder / "summary.json"), "",
                             f"cannot read a run's summary ({err}); expected a folder written by 'overlap-sim run'") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("settings"), dict) or not payload["settings"]:
        raise UserInputError(str(folder / "summary.json"), "settings",
                             "expected a run's summary: a JSON object with a settings object (written by 'overlap-sim run')")
    for name, summ in payload["settings"].items():
        if not isinstance(summ, dict):
            raise UserInputError(str(folder / "summary.json"), f"settings.{name}", "expected an object of metrics")
    out = RunTables(folder, payload)
    # the run's settings are its summary's; a table is a regular file (a folder or a broken link
    # named like one is not); one setting's table in both formats is two runs' tables mixed
    found = {p.stem.split("_", 1)[1] for p in folder.glob("steps_*.*")
             if p.suffix in (".csv", ".parquet") and p.is_file()}
    available = [s for s in payload["settings"] if s in found]
    if not available:
        raise UserInputError(str(folder), "", "the run kept no steps table (it ran with --tables summary or none); "
                                              "run it again with --tables steps")
    absent = [s for s in payload["settings"] if s not in found]
    if absent and not settings:
        raise UserInputError(str(folder), f"steps_{absent[0]}", f"no steps table for {absent}, which summary.json "
                                                                "lists; run it again")
    wanted = settings or available
    missing = [s for s in wanted if s not in available]
    if missing:
        raise UserInputError(str(folder), "--setting", f"no steps table for {missing}; the run has {available}")
    for s in wanted:
        for kind, target in (("steps", out.steps), ("requests", out.requests)):
            paths = [p for p in (folder / f"{kind}_{s}.parquet", folder / f"{kind}_{s}.csv") if p.is_file()]
            if len(paths) > 1:
                raise UserInputError(str(folder), f"{kind}_{s}", "the table is there as both CSV and Parquet: tables "
                                                                "of two runs; remove the stale one or run again")
            if paths:
                target[s] = _read_table(paths[0])
        needed = {"seq", "kind", "forward_start", "forward_end", "recv_start", "process_end"}
        lacking = needed - set(out.steps[s].columns)
        if lacking:
            raise UserInputError(str(folder / f"steps_{s}"), ",".join(sorted(lacking)), "missing column(s) in the steps table")
        _check_times(out.steps[s], str(folder / f"steps_{s}"))
        out.steps[s] = out.steps[s].sort_values("seq", kind="stable").reset_index(drop=True)
    return out


STEP_TIME_COLUMNS = ("seq", "num_reqs", "num_tokens", "sum_ctx", "recv_start", "forward_start", "forward_end",
                     "process_end")


def _check_times(df: pd.DataFrame, source: str) -> None:
    """A steps table's times (and counts) are finite numbers: a table edited or cut by hand would
    otherwise give NaN slices and invalid JSON."""
    for col in STEP_TIME_COLUMNS:
        if col not in df:
            continue
        values = pd.to_numeric(df[col], errors="coerce")
        bad = ~np.isfinite(values.to_numpy(dtype=np.float64))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise UserInputError(source, col, f"expected finite numbers (row {row} holds {str(df[col].iloc[row])!r})")
