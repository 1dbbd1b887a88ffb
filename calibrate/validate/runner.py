"""Validate one configuration: calibrate (or reuse a profile), run the harness under each
setting, simulate the same configuration from the isolated timings only, and keep both.

A finished configuration is written atomically to ``<out>/cases/<name>.json`` as soon as it
completes; a rerun skips the configurations already there (full grids are long). Profiles go
to ``<out>/profiles/`` (a calibration interrupted midway resumes from its sidecar).

What the simulation is given, per setting (nothing measured by the harness run itself):
``normal``/``overlap`` on torch CPU: the device-process profile
(:class:`calibrate.harness.process_backend.ProcessTorchBackend`); ``thread_overlap``: the
in-process profile (:class:`calibrate.torch_backend.TorchBackend`, the forward on the calling
thread as the forward thread runs it) and the GIL parameters of
:mod:`calibrate.validate.gil_params`; MLX: the MLX profile (:class:`calibrate.mlx_backend.MlxBackend`).
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Callable

from calibrate.harness.config import HarnessConfig
from calibrate.validate.grid import calibration_config

METRICS = ("output_throughput", "mean_gap_ms", "p99_gap_ms", "median_tpot_ms", "median_itl_ms", "median_ttft_ms")


def _cpu_busy_s() -> float | None:
    """Busy CPU seconds of the whole machine so far (Linux /proc/stat), or None."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    vals = [int(v) for v in fields]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return (sum(vals[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class LoadMeter:
    """CPU time that other processes used during a block (cores busy on average): a run taken
    while the shared machine was busy is flagged, not hidden."""

    def __enter__(self):
        self.t0, self.busy0, self.own0 = time.perf_counter(), _cpu_busy_s(), _own_cpu_s()
        return self

    def __exit__(self, *exc):
        wall = time.perf_counter() - self.t0
        busy1 = _cpu_busy_s()
        self.other_cores = (None if self.busy0 is None or wall <= 0 else
                            max(0.0, (busy1 - self.busy0) - (_own_cpu_s() - self.own0)) / wall)
        self.wall_s = wall
        return False


QUIET_CORES = 0.15  # other processes' CPU use (cores) under which the machine counts as quiet
BUSY_CORES = 0.25  # a harness run during which others used more than this is taken again
ATTEMPTS = 3


def wait_quiet(report, timeout_s: float = 300.0, window_s: float = 0.5) -> float | None:
    """Wait (up to ``timeout_s``) until other processes use less than :data:`QUIET_CORES` cores
    over ``window_s``; returns their last measured use (None where /proc/stat is missing)."""
    deadline = time.monotonic() + timeout_s
    said = False
    while True:
        with LoadMeter() as load:
            time.sleep(window_s)
        if load.other_cores is None or load.other_cores < QUIET_CORES or time.monotonic() > deadline:
            return load.other_cores
        if not said:
            report(f"waiting for the machine to be quiet (other processes use {load.other_cores:.2f} cores)")
            said = True


def _profiles(cfg: HarnessConfig, out: Path, report) -> dict[str, Path]:
    """Calibrate ``cfg`` (each kind of profile its settings need); returns setting -> profile."""
    from calibrate.measure import calibrate

    ccfg = calibration_config(cfg)
    folder = out / "profiles"
    paths: dict[str, Path] = {}
    if cfg.backend == "torch" and cfg.device == "cpu":
        from calibrate.harness.process_backend import ProcessTorchBackend
        from calibrate.harness.run import _cores
        from calibrate.requests import EOS, build_tokenizer

        proc = folder / f"{cfg.name}.process.json"
        if not proc.exists():
            wait_quiet(report)
            report(f"{cfg.name}: calibrating the device process")
            backend = ProcessTorchBackend(ccfg, _cores(), build_tokenizer(cfg.tokenizer_vocab).token_to_id(EOS))
            try:
                calibrate(ccfg, proc, backend=backend)
            finally:
                backend.close()
        thread = folder / f"{cfg.name}.thread.json"
        if not thread.exists():
            wait_quiet(report)
            report(f"{cfg.name}: calibrating in-process (forward thread)")
            calibrate(ccfg, thread)
        return {"normal": proc, "overlap": proc, "thread_overlap": thread}
    path = folder / f"{cfg.name}.json"
    if not path.exists():
        wait_quiet(report)
        report(f"{cfg.name}: calibrating")
        calibrate(ccfg, path)
    return {s: path for s in cfg.settings}


def validate_case(regime: str, cfg: HarnessConfig, out: Path, profile: Path | None = None,
                  repeats: int = 1, report: Callable[[str], None] = print) -> dict:
    """Calibrate (or use ``profile`` for every setting), run the harness ``repeats`` times per
    setting, simulate; returns the case record (also written to ``<out>/cases/<name>.json``).

    Raises:
        CalibrationInputError / ProfileError / ScenarioError: bad input (one line, exit 2).
    """
    import sim
    from calibrate.requests import build_tokenizer
    from sim.atomic import atomic_path
    from sim.report import jsonable

    out = Path(out)
    profiles = {s: Path(profile) for s in cfg.settings} if profile else _profiles(cfg, out, report)
    gil = None
    if "thread_overlap" in cfg.settings:
        from calibrate.validate.gil_params import measure_gil_params

        wait_quiet(report)
        gil = measure_gil_params(cfg)
    tokenizer = build_tokenizer(cfg.tokenizer_vocab)
    measured, predicted = {}, {}
    runs = {s: [] for s in cfg.settings}
    for r in range(repeats):  # settings interleaved: a slow drift of the machine hits all of them
        for setting in cfg.settings:
            report(f"{cfg.name}: harness {setting} (run {r + 1}/{repeats})")
            runs[setting].append(_quiet_run(cfg, setting, tokenizer, report))
    for setting in cfg.settings:
        reps = runs[setting]
        measured[setting] = _median_summary([r["summary"] for r in reps])
        scenario = sim.load_scenario(cfg.scenario(str(profiles[setting].resolve()), settings=(setting,),
                                                  gil=_gil_costs(gil) if setting == "thread_overlap" else None))
        predicted[setting] = sim.simulate(scenario, setting).summary()
    record = {"name": cfg.name, "regime": regime, "config": cfg.to_dict(),
              "profiles": {s: str(p) for s, p in profiles.items()}, "gil": gil,
              "measured": measured, "predicted": predicted, "runs": runs, "machine": machine()}
    path = out / "cases" / f"{cfg.name}.json"
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(jsonable(record), indent=1) + "\n")
    return record


def _quiet_run(cfg: HarnessConfig, setting: str, tokenizer, report) -> dict:
    """One harness run on a quiet machine: waits for quiet, and takes the run again (up to
    :data:`ATTEMPTS` times, keeping the quietest) when other processes were busy during it."""
    from calibrate.harness.run import run_harness

    best = None
    for attempt in range(ATTEMPTS):
        wait_quiet(report)
        with LoadMeter() as load:
            res = run_harness(cfg, setting, tokenizer)
        rec = {"summary": res.summary(), "phases_ms": res.phase_means_ms(), "other_cores": load.other_cores,
               "wall_s": load.wall_s, "info": res.info, "attempts": attempt + 1}
        if best is None or (rec["other_cores"] or 0) < (best["other_cores"] or 0):
            best = rec
        if load.other_cores is None or load.other_cores <= BUSY_CORES:
            break
        report(f"other processes used {load.other_cores:.2f} cores during the run: running it again")
    return best


def _gil_costs(gil: dict) -> dict:
    """The ``costs.gil`` keys of a measurement (:func:`calibrate.validate.gil_params.measure_gil_params`)."""
    return {k: gil[k] for k in ("switch_interval", "ops_per_forward", "sample_launch", "wait_launch_done")}


def _median_summary(summaries: list[dict]) -> dict:
    """Per key, the median over repeated runs (numeric keys); the first run's value otherwise."""
    import statistics

    out = dict(summaries[0])
    for key, v in out.items():
        vals = [s[key] for s in summaries if isinstance(s.get(key), (int, float)) and s[key] == s[key]]
        if isinstance(v, (int, float)) and not isinstance(v, bool) and vals:
            out[key] = statistics.median(vals)
    return out


def machine() -> dict:
    """Where the validation ran."""
    from calibrate.measure import host_cpu

    return {"host_cpu": host_cpu(), "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version()}


def load_cases(out: Path) -> dict[str, dict]:
    """Finished case records in ``<out>/cases/`` by name (a corrupt file is skipped: rerun it)."""
    cases = {}
    for p in sorted((Path(out) / "cases").glob("*.json")):
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        cases[rec.get("name", p.stem)] = rec
    return cases
