"""Parameter sweeps: every grid point x setting x repeat, resumable, on local processes or Dask.

A grid maps scenario field paths (the ``--set`` syntax, e.g. ``workload.concurrency``) to the
values to try; the sweep runs the cartesian product. Repeat ``r`` of a point runs it with
``seed = point seed + r`` (the point's seed is ``scenario.seed`` unless ``seed`` itself is a
grid key). One unit of work ("point task") is one grid point at one repeat and runs every
setting of ``server.settings`` with that seed, so settings share request lengths, arrivals and
per-step jitter (common random numbers) and the overlap/normal ratio is a paired comparison.

With an output folder, each finished point task is saved atomically as
``points/<id>.json`` the moment it completes, where ``<id>`` is a hash of the point's full
scenario (seed included): a restarted sweep, even with a grown grid, reruns nothing it already
has and never deletes a saved point.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Union

import pandas as pd
import yaml

from sim.errors import UserInputError, shown_override
from sim.output.report import jsonable
from sim.output.run_files import atomic_write_frame, atomic_write_text
from sim.model.schema import MAX_SEED
from sim.scenario import Scenario, load_scenario
from sim.simulate import check
from sim.whatif.executors import execute_dask, execute_local

SEED_RULE = "seed of repeat r = point seed + r (point seed: scenario.seed, or the grid's seed value)"
POINTS_DIR = "points"
TABLE_NAME = "sweep"
MANIFEST = "sweep.json"
MAX_POINT_TASKS = 1_000_000  # grid points x repeats of one sweep
MAX_REPEATS = 100_000
# a grid key whose name is taken by a column of the table: its column's name ("seed" is the
# run's seed, point seed + repeat)
GRID_COLUMNS = {"seed": "point_seed"}


def grid_column(key: str) -> str:
    """The sweep table's column for grid key ``key``."""
    return GRID_COLUMNS.get(key, key)


@dataclass(frozen=True)
class PointTask:
    """One grid point at one repeat: ``scenario`` has the point's overrides and seed applied.

    Attributes:
        point_id: hex digest of the scenario (with seed) and its settings; names the saved file.
        index: the grid point's position in the grid's product order.
        values: grid key -> value of this point. repeat: 0-based repeat number.
    """

    point_id: str
    index: int
    values: dict
    repeat: int
    scenario: Scenario


def parse_grid(items: Iterable[str]) -> dict[str, list]:
    """Parse ``--grid KEY=v1,v2,...`` strings into ``{key: [values]}`` (insertion order kept).

    Values are read as a YAML flow sequence, so ``1,2,4`` gives ints, ``0.5,1`` floats,
    ``[overlap],[normal]`` lists. Raises UserInputError on a missing ``=``, no values, a value
    given twice, or a key given twice."""
    grid: dict[str, list] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        named = shown_override("--grid", item)  # (a long value cut short)
        if not sep or not key:
            raise UserInputError(named, "", "expected KEY.PATH=v1,v2,... (e.g. workload.concurrency=1,2,4)")
        try:
            values = yaml.safe_load(f"[{text}]")
        except (yaml.YAMLError, RecursionError):  # (lists nested deeper than PyYAML's parser recurses: text)
            values = [v.strip() for v in text.split(",")]
        if None in values and text.strip():  # `null`, `~`: YAML's null, which no field takes as a point
            raise UserInputError(named, key, "null is not a value a grid can take (leave the key out "
                                 "of the grid for its default)")
        values = [v for v in values if v is not None]
        if not values:
            raise UserInputError(named, key, "expected at least one value after '='")
        if key in grid:
            raise UserInputError(named, key, "key given twice; put all its values in one --grid")
        if any(v == "" for v in values):
            raise UserInputError(named, key, "a value between every two commas (an empty one is given: "
                                 "two commas in a row, or one at an end)")
        _refuse_repeats(named, key, values)
        grid[key] = values
    return grid


def _grid_values(values: list) -> str:
    """A grid key's values as ``--grid`` takes them (``1,8``; a list or mapping in YAML's flow
    form): how an error about the key names the flag."""
    return ",".join(yaml.safe_dump(v, default_flow_style=True, width=10**6).strip().removesuffix("\n...")
                    if isinstance(v, (list, dict)) else str(v) for v in values)


def _refuse_repeats(source: str, key: str, values) -> None:
    """Refuse a grid key's values when one is given twice (compared by ==: values need not hash).

    Raises:
        UserInputError: naming ``source`` and ``key``."""
    seen: list = []
    for v in values:
        if v in seen:
            raise UserInputError(source, key, f"value {v!r} given twice")
        seen.append(v)


def _point_id(scenario: Scenario, digests: Optional[dict] = None) -> str:
    """The key a point's saved result is found by on resume: the point's scenario and the
    contents of the files it reads (the profile, the trace: ``digests`` caches them by path), so
    a profile recalibrated or a trace edited in place is run again, not taken from the store."""
    blob = json.dumps(scenario.model_dump(mode="json"), sort_keys=True)
    files = _file_digests(scenario, {} if digests is None else digests)
    if files:  # a scenario that reads no file keeps the key it had before files were counted
        blob += json.dumps(files, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _file_digests(scenario: Scenario, cache: dict) -> dict[str, str]:
    """SHA-256 of each file the scenario reads (``costs.profile``, ``workload.trace``), by key."""
    out = {}
    for key, relative in (("costs.profile", scenario.costs.profile), ("workload.trace", scenario.workload.trace)):
        if relative:
            path = scenario.resolve_path(relative)
            if path not in cache:
                cache[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            out[key] = cache[path]
    return out


def plan_sweep(scenario: Scenario, grid: dict[str, list], repeats: int = 1) -> list[PointTask]:
    """Every (grid point, repeat) as a :class:`PointTask`, in grid product order then repeat.

    Every point's scenario is validated up front, with the checks its runs make before their first
    step (:func:`sim.simulate.check`: the profile's TP size, structured output's costs), so a bad
    key, value or combination fails before anything runs.

    Raises:
        ScenarioError: an unknown grid key, or a value the schema or a run's checks reject (message
            names the key). ProfileError: a profile a point cannot use (names the point).
        UserInputError: ``repeats < 1``.
    """
    if not 1 <= repeats <= MAX_REPEATS:
        raise UserInputError("--repeats", "", f"expected 1 to {MAX_REPEATS} repeats (got {repeats})")
    keys = list(grid)
    points = math.prod(len(v) for v in grid.values())
    if points * repeats > MAX_POINT_TASKS:
        raise UserInputError("--grid", "", f"{points} grid points x {repeats} repeats = {points * repeats} runs; "
                             f"expected at most {MAX_POINT_TASKS} (split the sweep)")
    tasks: list[PointTask] = []
    digests: dict = {}  # file path -> content digest, read once for the whole plan
    for index, combo in enumerate(itertools.product(*(grid[k] for k in keys))):
        values = dict(zip(keys, combo))
        overrides = [f"{k}={json.dumps(v)}" for k, v in values.items()]
        try:
            point = scenario.with_overrides(overrides, flag="--grid")
            for setting in point.server.settings:  # what its runs check before their first step
                check(point, setting)
        except UserInputError as err:
            key = next((k for k in keys if err.field == k or err.field.startswith(k + ".")
                        or k.startswith(err.field + ".")), None)
            if key is not None:  # the flag as given; a value refused at one point named after it
                shown = shown_override("--grid", f"{key}={_grid_values(grid[key])}")
                if not err.expected.startswith("unknown key") and len(grid[key]) > 1:  # (the key: every point)
                    shown += f" (at {_grid_values([values[key]])})"
                raise type(err)(shown, err.field, err.expected) from None
            if not values:  # the scenario itself: its own error
                raise
            point_text = ", ".join(f"{k}={v}" for k, v in values.items())
            raise type(err)(err.source, err.field, f"{err.expected} (at the grid point {point_text})") from None
        if point.seed + repeats - 1 > MAX_SEED:
            raise UserInputError("--repeats", "", f"seed {point.seed} + {repeats - 1} repeats exceeds {MAX_SEED}")
        for r in range(repeats):
            run = point.model_copy(update={"seed": point.seed + r})
            tasks.append(PointTask(_point_id(run, digests), index, values, r, run))
    return tasks


def run_point(task: PointTask) -> dict:
    """Simulate every setting of ``task.scenario``; returns ``{setting: summary dict}`` (JSON-able).

    A top-level function so process pools and Dask workers can import it."""
    from sim.simulate import simulate

    return jsonable({s: simulate(task.scenario, s).summary() for s in task.scenario.server.settings})


class PointStore:
    """Saved point results under ``out_dir/points/``, one JSON file per point task."""

    def __init__(self, out_dir: Path):
        self.dir = Path(out_dir) / POINTS_DIR  # made by the first save (a sweep that runs nothing leaves nothing)

    def path(self, point_id: str) -> Path:
        """The file of a point's saved results."""
        return self.dir / f"{point_id}.json"

    def load(self, point_id: str) -> Optional[dict]:
        """The saved ``{setting: summary}`` of a point, or None if absent or unreadable (a file
        cut short by a crash is rerun, not trusted)."""
        path = self.path(point_id)
        try:
            summaries = json.loads(path.read_text())["summaries"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return summaries if _saved_summaries(summaries) else None  # (one edited by hand is rerun too)

    def save(self, task: PointTask, summaries: dict) -> None:
        payload = {"point_id": task.point_id, "scenario": task.scenario.name, "seed": task.scenario.seed,
                   "values": jsonable(task.values), "summaries": summaries}
        atomic_write_text(self.path(task.point_id), json.dumps(payload) + "\n")


def _saved_summaries(summaries) -> bool:
    """Whether a point file's ``summaries`` are as :meth:`PointStore.save` writes them: setting ->
    summary, each summary's values JSON scalars, its metrics (:data:`sim.trace.metrics.SUMMARY_KEYS`)
    numbers or null."""
    from sim.trace.metrics import SUMMARY_KEYS

    if not isinstance(summaries, dict) or not summaries:
        return False
    for summary in summaries.values():
        if not isinstance(summary, dict):
            return False
        for key, value in summary.items():
            if not (value is None or isinstance(value, (str, int, float))):
                return False
            if key in SUMMARY_KEYS and isinstance(value, (str, bool)):
                return False
    return True


def _cell(value: Any) -> Any:
    # lists/dicts (e.g. server.settings) become JSON text so the column stays Parquet-friendly
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def sweep_table(tasks: list[PointTask], results: dict[str, dict], grid_keys: list[str]) -> pd.DataFrame:
    """The tidy table: one row per point x setting x repeat, in plan order.

    Columns: ``point`` (grid point index), the grid keys (a grid over ``seed`` is the column
    ``point_seed``: ``seed`` is each run's), ``setting``, ``repeat``, ``seed``, then
    every summary key (:data:`sim.trace.metrics.SUMMARY_KEYS`, ``peak_token_usage``, ``outcome``...)."""
    rows = []
    for t in tasks:
        for setting, summ in results[t.point_id].items():
            row = {"point": t.index}
            row.update({grid_column(k): _cell(t.values[k]) for k in grid_keys})
            row.update(setting=setting, repeat=t.repeat, seed=t.scenario.seed)
            # (no value, or an empty text such as max_extrapolation_at inside the data: a missing
            # cell, read back as such from Parquet and CSV alike)
            row.update({k: (math.nan if v is None or v == "" else v) for k, v in summ.items()})
            rows.append(row)
    return pd.DataFrame(rows)


def _check_arguments(grid, repeats, workers, on_progress) -> None:
    """The types :func:`sweep`'s callers from Python can get wrong (the command line's parser
    gives these already typed).

    Raises:
        UserInputError: naming the argument.
    """
    if not isinstance(grid, dict) or not all(isinstance(k, str) and isinstance(v, (list, tuple, range)) and len(v)
                                             for k, v in grid.items()):
        raise UserInputError("grid", "", f"a dict of field path -> non-empty list of values (got {grid!r:.80})")
    for key, values in grid.items():  # as parse_grid refuses on the command line
        _refuse_repeats(f"grid {key}", key, values)
    if isinstance(repeats, bool) or not isinstance(repeats, int):
        raise UserInputError("--repeats", "", f"an integer (got {repeats!r})")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise UserInputError("--workers", "", f"a positive integer or None (got {workers!r})")
    if on_progress is not None and not callable(on_progress):
        raise UserInputError("on_progress", "", f"a function (done, total) or None (got {on_progress!r})")


def sweep(scenario: Union[Scenario, str, Path, dict], grid: dict[str, list], repeats: int = 1,
          out: Optional[Union[str, Path]] = None, executor: str = "local", workers: Optional[int] = None,
          scheduler: Optional[str] = None, client=None, overrides: Optional[list[str]] = None,
          on_progress: Optional[Callable[[int, int], None]] = None, run_cv: Optional[float] = None) -> pd.DataFrame:
    """Run a sweep and return its tidy table (see :func:`sweep_table`).

    Args:
        scenario: a Scenario, a YAML path or a dict; ``overrides`` (``--set``) apply first.
        grid: ``{field path: [values]}`` (an empty grid is one point: the scenario itself).
        repeats: runs per point; repeat r uses seed + r (see :data:`SEED_RULE`).
        out: results folder; when given, points are saved as they finish and reused on restart,
            and ``sweep.parquet``, ``sweep.csv`` and ``sweep.json`` (the manifest) are written.
        executor: ``"local"`` (a process pool of ``workers`` processes, default one per core;
            ``workers=1`` runs in this process; a script that calls this with more workers needs
            the usual ``if __name__ == "__main__":`` guard of Python multiprocessing) or ``"dask"`` (``dask.distributed``: ``client``, or
            a Client for ``scheduler`` such as ``tcp://host:8786``, or a LocalCluster of ``workers``).
        on_progress: called as ``on_progress(done, total)`` after each point task (resumed ones first).
        run_cv: the ``--run-cv`` its verdict assumes (None: the scenario's or the default), kept
            in the manifest for the plots drawn again from the folder (:func:`manifest_run_cv`).

    Raises:
        ScenarioError / UserInputError: bad scenario, grid key or value, executor or scheduler.
    """
    if executor not in ("local", "dask"):
        raise UserInputError("--executor", "", f"expected 'local' or 'dask' (got {executor!r})")
    _check_arguments(grid, repeats, workers, on_progress)
    if (scheduler is not None or client is not None) and executor != "dask":
        raise UserInputError("--scheduler", "", "needs --executor dask (executor='dask')")
    if out is not None and not isinstance(out, (str, Path)):
        raise UserInputError("--out", "", f"a folder path or None (got {out!r})")
    scenario = load_scenario(scenario, overrides)
    tasks = plan_sweep(scenario, grid, repeats)
    manifest = {"scenario": scenario.name, "scenario_config": scenario.model_dump(mode="json"), "grid": grid,
                "repeats": repeats, "settings": list(scenario.server.settings), "seed_rule": SEED_RULE,
                "point_tasks": len(tasks), "run_cv": run_cv}
    store = PointStore(Path(out)) if out is not None else None
    results: dict[str, dict] = {}
    for t in tasks:
        if t.point_id not in results and store is not None:
            saved = store.load(t.point_id)
            if saved is not None:
                results[t.point_id] = saved
    unique: dict[str, PointTask] = {}
    for t in tasks:
        if t.point_id not in results:
            unique.setdefault(t.point_id, t)
    total = len(tasks)
    done = sum(t.point_id in results for t in tasks)
    resumed = done
    pending = list(unique.values())
    if store is not None:
        _check_outputs(Path(out), store, pending)
    if executor == "dask":
        stream = execute_dask(run_point, pending, workers, scheduler, client)  # connected before any progress
    else:
        stream = execute_local(run_point, pending, workers)
    if on_progress:
        on_progress(done, total)
    copies = {pid: sum(t.point_id == pid for t in tasks) for pid in unique}
    for task, summaries in stream:
        results[task.point_id] = summaries
        if store is not None:
            store.save(task, summaries)
        done += copies[task.point_id]
        if on_progress:
            on_progress(done, total)
    table = sweep_table(tasks, results, list(grid))
    if out is not None:
        atomic_write_frame(table, Path(out) / f"{TABLE_NAME}.parquet")
        atomic_write_frame(table, Path(out) / f"{TABLE_NAME}.csv")
        # the manifest last: a sweep stopped before its table (an interrupt, an unreachable Dask
        # scheduler) leaves the folder's manifest and table as they were, describing each other
        atomic_write_text(Path(out) / MANIFEST, json.dumps(jsonable({**manifest, "resumed": resumed}), indent=2) + "\n")
    return table


def manifest_run_cv(manifest: dict) -> float:
    """The run-to-run CV a sweep's verdict assumed, from its manifest (``sweep.json``): its
    ``--run-cv``, else its scenario's ``costs.noise``, else the default
    (:func:`sim.whatif.verdict.resolve_run_cv`; a manifest from before 6 December 2026 kept no
    ``--run-cv``)."""
    from types import SimpleNamespace

    from sim.whatif.verdict import DEFAULT_RUN_CV, resolve_run_cv

    config = manifest.get("scenario_config") if isinstance(manifest.get("scenario_config"), dict) else {}
    noise = (config.get("costs") or {}).get("noise") or {}
    try:
        stated = SimpleNamespace(run_gpu_cv=float(noise.get("run_gpu_cv") or 0.0),
                                 run_cpu_cv=float(noise.get("run_cpu_cv") or 0.0))
        flag = manifest.get("run_cv")
        return resolve_run_cv(None if flag is None else float(flag), stated,
                              str((config.get("server") or {}).get("device", "cuda")))[0]
    except (TypeError, ValueError, AttributeError):  # (a hand-edited manifest: the default)
        return DEFAULT_RUN_CV


def _check_outputs(out: Path, store: PointStore, pending: list[PointTask]) -> None:
    """Before any point runs: the files the sweep will write can be written (its points' files,
    table and manifest are not folders; the points' folder takes files), so a sweep does not fail
    after its work.

    Raises:
        UserInputError: naming ``--out`` and the path."""
    from sim.atomic import probe_writable

    paths = [out / MANIFEST, out / f"{TABLE_NAME}.parquet", out / f"{TABLE_NAME}.csv",
             *(store.path(t.point_id) for t in pending)]
    for path in [store.dir, *paths]:
        if path.exists() and (path.is_dir() != (path == store.dir)):
            what = "a file where the sweep keeps its points' folder" if path == store.dir else \
                "a folder where the sweep writes a file"
            raise UserInputError("--out", "", f"{path}: {what}; remove it or write elsewhere")
    if pending and store.dir.is_dir():
        probe_writable(store.dir, "--out", store.dir)


# the manifest's fields that say which sweep a folder holds
SAME_SWEEP_KEYS = ("scenario_config", "grid", "repeats")


def other_sweep_note(out: Path, scenario: Scenario, grid: dict, repeats: int) -> Optional[str]:
    """A line saying that ``out`` holds a finished sweep of another scenario, grid or number of
    repeats, whose table and plots this sweep will replace (its points stay and are reused where
    they match); None when the folder holds none or the same sweep (a resume)."""
    try:
        old = json.loads((Path(out) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None  # no finished sweep there: points are keyed by their own content
    if not isinstance(old, dict):
        return None
    new = jsonable({"scenario_config": scenario.model_dump(mode="json"), "grid": grid, "repeats": repeats})
    differ = [k for k in SAME_SWEEP_KEYS if old.get(k) != new.get(k)]
    if not differ:
        return None
    return (f"note: {out} holds a finished sweep of another {' and '.join(k.replace('_config', '') for k in differ)}: "
            "this sweep replaces its sweep.json, table and plots when it finishes (its points stay, and those "
            "this grid shares are reused)")


def load_sweep(out_dir: Union[str, Path]) -> tuple[pd.DataFrame, dict]:
    """(table, manifest) of a finished sweep folder (Parquet preferred, CSV otherwise).

    Raises:
        UserInputError: no sweep table or manifest in the folder, an unreadable one, or a table
            without the columns of a sweep."""
    out_dir = Path(out_dir)
    try:
        manifest = json.loads((out_dir / MANIFEST).read_text())
    except (OSError, ValueError) as err:
        raise UserInputError(str(out_dir / MANIFEST), "", f"cannot read the sweep manifest ({err})") from None
    if not isinstance(manifest, dict):
        raise UserInputError(str(out_dir / MANIFEST), "", "expected a JSON object (the manifest 'overlap-sim sweep' "
                                                          "writes)")
    for suffix, reader in ((".parquet", pd.read_parquet), (".csv", pd.read_csv)):
        path = out_dir / f"{TABLE_NAME}{suffix}"
        if path.is_file():
            try:
                table = reader(path)
            except Exception as err:  # pyarrow and the CSV parser raise many kinds
                raise UserInputError(str(path), "", f"cannot read the table ({type(err).__name__}: {err})") from None
            lacking = [c for c in ("point", "setting", "repeat", "seed", "output_throughput") if c not in table]
            if lacking:
                raise UserInputError(str(path), ",".join(lacking), "missing column(s) of a sweep table")
            if not pd.api.types.is_numeric_dtype(table["output_throughput"]):
                raise UserInputError(str(path), "output_throughput", "expected numbers")
            return table, manifest
    raise UserInputError(str(out_dir), "", "no sweep.parquet or sweep.csv (did the sweep finish? rerun it to resume)")
