"""Validate one configuration: calibrate (or reuse a profile), run the harness under each
setting, simulate the same configuration from the isolated timings only, and keep both.

A finished configuration is written atomically to ``<out>/cases/<name>.json`` as soon as it
completes; a rerun skips the configurations already there (full grids are long). Profiles go
to ``<out>/profiles/``, named by a hash of what they measure: configurations with the same
ranges (a grid's ``length`` and ``eos`` variants) share one calibration, and a calibration
interrupted midway resumes from its sidecar.

What the simulation is given, per setting (nothing measured by the harness run itself):
``normal``/``overlap`` on torch CPU: the device-process profile
(:class:`calibrate.harness.process_backend.ProcessTorchBackend`; its measured device gap as
``costs.gpu.overlap_residue``); ``thread_overlap``: the forward-thread profile
(:class:`calibrate.harness.thread_backend.ThreadTorchBackend`) and the GIL parameters of
:mod:`calibrate.validate.gil_params`; MLX: the MLX profile (:class:`calibrate.forward.mlx_backend.MlxBackend`).
Profiles are priced at each point's mean (``costs.profile_statistic: mean``).
"""

from __future__ import annotations

import hashlib
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
    """CPU seconds of this process, its finished children and its live descendants (the
    harness's device process spins while it waits: it is not another user)."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    procs: dict[int, tuple[int, int]] = {}  # pid -> (parent, utime + stime ticks)
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        procs[int(entry)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    mine, frontier = set(), [os.getpid()]
    while frontier:
        parent = frontier.pop()
        kids = [pid for pid, (ppid, _) in procs.items() if ppid == parent and pid not in mine]
        mine.update(kids)
        frontier += kids
    return total + sum(procs[pid][1] for pid in mine) / os.sysconf("SC_CLK_TCK")


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


def _busy_wait(seconds: float) -> None:
    # spin rather than sleep: a core left idle drops its clock, and the timing that follows
    # would start slow (in-process calibration points measured right after a 0.2 s sleep came
    # out up to 2x slower at random)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


SLOW_FACTOR = 1.20  # a speed probe this much slower than the fastest seen: the host is busy elsewhere
_best_probe: dict = {}  # core -> fastest probe seen in this process


def speed_probe() -> float:
    """Seconds a fixed piece of Python and numpy work takes now (the median of 5). A virtual
    machine's host can slow it down for seconds at a time without any process of this machine
    showing it (other guests): runs taken then are slow for a reason the simulator knows nothing of."""
    import numpy as np

    a = np.ones(4096)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        x = 0
        for i in range(3000):
            x += i
        for _ in range(40):  # elementwise only: a matrix product would wake BLAS threads that then spin
            a = np.sqrt(a * 1.0001 + 1e-3)
        times.append(time.perf_counter() - t0)
    return sorted(times)[2]


def _probe_cores() -> float:
    """The :func:`speed_probe` on each core this process may use (the harness pins one process
    or thread to each); returns the worst ratio to that core's fastest probe so far."""
    if not hasattr(os, "sched_getaffinity"):
        probe = speed_probe()
        best = _best_probe[None] = min(_best_probe.get(None, probe), probe)
        return probe / best
    old = os.sched_getaffinity(0)
    worst = 0.0
    try:
        for core in sorted(old):
            os.sched_setaffinity(0, {core})
            probe = speed_probe()
            best = _best_probe[core] = min(_best_probe.get(core, probe), probe)
            worst = max(worst, probe / best)
    finally:
        os.sched_setaffinity(0, old)
    return worst


QUIET_TIMEOUT_S = 60.0


def _why(other_cores: float | None, busy_cores: float, slow_ratio: float) -> str:
    """Why the machine counts as disturbed: other processes' load, else a slow core."""
    if other_cores is not None and other_cores >= busy_cores:
        return f"other processes use {other_cores:.2f} cores"
    return f"a core runs {slow_ratio:.2f}x slower than its fastest probe"


def wait_quiet(report, timeout_s: float = QUIET_TIMEOUT_S, window_s: float = 0.5) -> float | None:
    """Wait (up to ``timeout_s``, then go on and say so) until other processes use less than
    :data:`QUIET_CORES` cores over ``window_s`` (spinning meanwhile) and the :func:`speed_probe`
    is within :data:`SLOW_FACTOR` of the fastest seen in this process; returns the others' last
    measured use (None where /proc/stat is missing)."""
    deadline = time.monotonic() + timeout_s
    said = False
    while True:
        with LoadMeter() as load:
            _busy_wait(window_s)
        ratio = _probe_cores()
        busy = load.other_cores is not None and load.other_cores >= QUIET_CORES
        slow = ratio > SLOW_FACTOR
        why = _why(load.other_cores, QUIET_CORES, ratio)
        if not (busy or slow):
            return load.other_cores
        if time.monotonic() > deadline:
            report(f"the machine did not get quiet in {timeout_s:.0f} s ({why}): going on")
            return load.other_cores
        if not said:
            report(f"waiting for the machine to be quiet ({why})")
            said = True


class Quiet:
    """How a validation treats a busy machine: wait up to ``max_wait_s`` for it to be quiet before
    each calibration, calibration point and harness run, and take a disturbed run or point again
    (:data:`ATTEMPTS`). ``max_wait_s`` 0: never wait, never retake (the results then depend on
    how busy the machine is; the smoke grid's default)."""

    def __init__(self, max_wait_s: float = QUIET_TIMEOUT_S):
        self.max_wait_s = max_wait_s

    @property
    def waits(self) -> bool:
        return self.max_wait_s > 0

    def wait(self, report, window_s: float = 0.5) -> float | None:
        return wait_quiet(report, self.max_wait_s, window_s) if self.waits else None

    @property
    def attempts(self) -> int:
        return ATTEMPTS if self.waits else 1

    def steady(self):
        """The calibration's ``steady`` check (None: keep every point as measured)."""
        return _steady if self.waits else None

    def points(self, report):
        """A calibration progress callback that waits for a quiet machine before each point."""
        def gate(done: int, total: int, label: str) -> None:
            if label:
                self.wait(report, window_s=0.2)
        return gate


def _steady() -> bool:
    """After a calibration point: were the cores still at speed (else the point is measured
    again, as a disturbed harness run is; see :func:`calibrate.measure.calibrate`)."""
    return _probe_cores() <= SLOW_FACTOR


def _profiles(cfg: HarnessConfig, out: Path, report, quiet: Quiet, repeats: int) -> dict[str, Path]:
    """Calibrate ``cfg`` (each kind of profile its settings need, ``repeats`` samples a point);
    returns setting -> profile."""
    from calibrate.measure import calibrate

    ccfg = calibration_config(cfg, repeats=repeats)
    folder = out / "profiles"
    key = hashlib.sha256(json.dumps(ccfg.identity(), sort_keys=True).encode()).hexdigest()[:12]

    def calibrated(path: Path, what: str, make_backend=None) -> Path:
        # each profile is calibrated once (a rerun, or a configuration of the same ranges, finds it),
        # on a quiet machine
        if path.exists():
            report(f"{cfg.name}: using the calibration{what} in {path}")
        else:
            quiet.wait(report)
            report(f"{cfg.name}: calibrating{what.replace(' of ', ' ', 1)}")
            backend = make_backend() if make_backend else None
            try:
                calibrate(ccfg, path, backend=backend, report=quiet.points(report), steady=quiet.steady())
            finally:
                if backend is not None:
                    backend.close()
        return path

    if cfg.backend == "torch" and cfg.device == "cpu":
        from calibrate.bookkeeping.requests import EOS, build_tokenizer
        from calibrate.harness.process_backend import ProcessTorchBackend
        from calibrate.harness.run import _cores
        from calibrate.harness.thread_backend import ThreadTorchBackend

        eos_id = build_tokenizer(cfg.tokenizer_vocab).token_to_id(EOS)
        proc = calibrated(folder / f"{key}.process.json", " of the device process",
                          lambda: ProcessTorchBackend(ccfg, _cores(), eos_id))
        thread = calibrated(folder / f"{key}.thread.json", " of the forward thread",
                            lambda: ThreadTorchBackend(ccfg, _cores(), eos_id))
        return {"normal": proc, "overlap": proc, "thread_overlap": thread}
    path = calibrated(folder / f"{key}.{cfg.backend}.json", "")
    return {s: path for s in cfg.settings}


CALIBRATION_REPEATS = 30  # samples per calibration point (the smoke grid takes fewer)


def validate_case(regime: str, cfg: HarnessConfig, out: Path, profile: Path | None = None,
                  repeats: int = 1, report: Callable[[str], None] = print, quiet: Quiet | None = None,
                  calibration_repeats: int = CALIBRATION_REPEATS) -> dict:
    """Calibrate (or use ``profile`` for every setting), run the harness ``repeats`` times per
    setting, simulate; returns the case record (also written to ``<out>/cases/<name>.json``).
    ``quiet``: how to treat a busy machine (default: wait up to a minute, retake disturbed runs).

    Raises:
        CalibrationInputError / ProfileError / ScenarioError: bad input (one line, exit 2).
    """
    import sim
    from calibrate.bookkeeping.requests import build_tokenizer
    from sim.atomic import atomic_path
    from sim.output.report import jsonable

    out = Path(out)
    quiet = quiet or Quiet()
    profiles = ({s: Path(profile) for s in cfg.settings} if profile
                else _profiles(cfg, out, report, quiet, calibration_repeats))
    gil = None
    if "thread_overlap" in cfg.settings:
        from calibrate.validate.gil_params import measure_gil_params

        quiet.wait(report)
        gil = measure_gil_params(cfg)
    tokenizer = build_tokenizer(cfg.tokenizer_vocab)
    measured, predicted = {}, {}
    runs = {s: [] for s in cfg.settings}
    for r in range(repeats):  # settings interleaved: a slow drift of the machine hits all of them
        for setting in cfg.settings:
            report(f"{cfg.name}: harness {setting} (run {r + 1}/{repeats})")
            runs[setting].append(_quiet_run(cfg, setting, tokenizer, report, quiet))
    for setting in cfg.settings:
        reps = runs[setting]
        measured[setting] = _median_summary([r["summary"] for r in reps])
        scenario = sim.load_scenario(cfg.scenario(str(profiles[setting].resolve()), settings=(setting,),
                                                  gil=_gil_costs(gil) if setting == "thread_overlap" else None,
                                                  gpu=_device_gap(profiles[setting])))
        predicted[setting] = sim.simulate(scenario, setting).summary()
    record = {"name": cfg.name, "regime": regime, "config": cfg.to_dict(),
              "profiles": {s: str(p) for s, p in profiles.items()}, "gil": gil,
              "measured": measured, "predicted": predicted, "runs": runs, "machine": machine()}
    path = out / "cases" / f"{cfg.name}.json"
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(jsonable(record), indent=1) + "\n")
    return record


def _quiet_run(cfg: HarnessConfig, setting: str, tokenizer, report, quiet: Quiet | None = None) -> dict:
    """One harness run on a quiet machine: waits for quiet, and takes the run again (up to
    :data:`ATTEMPTS` times) when it was disturbed (other processes busy, or a core slow right
    after it); keeps the first undisturbed run, or the first run if none was. With a ``quiet``
    that does not wait: one run, as the machine is."""
    from calibrate.harness.run import run_harness

    quiet = quiet or Quiet()
    best = None
    attempts = quiet.attempts
    for attempt in range(attempts):
        quiet.wait(report)
        with LoadMeter() as load:
            res = run_harness(cfg, setting, tokenizer)
        slow = _probe_cores() if quiet.waits else 1.0  # a core still slow right after the run: it probably was during it
        rec = {"summary": res.summary(), "phases_ms": res.phase_means_ms(), "other_cores": load.other_cores,
               "slow_after": slow, "wall_s": load.wall_s, "info": res.info, "attempts": attempt + 1}
        disturbed = (load.other_cores or 0) > BUSY_CORES or slow > SLOW_FACTOR
        if best is None or not disturbed:
            best = rec
        if not disturbed or attempt + 1 == attempts:
            break
        report(f"the run was disturbed ({_why(load.other_cores, BUSY_CORES, slow)}): running it again")
    return best


def _device_gap(profile: Path) -> dict:
    """``costs.gpu.overlap_residue``: the device process's measured idle time between
    back-to-back forwards (see :meth:`calibrate.harness.process_backend.ProcessTorchBackend.device_gap_s`);
    0 for other devices."""
    from sim.model.profile import load_profile

    return {"overlap_residue": float(load_profile(profile)["metadata"].get("device_gap_s", 0.0))}


def _gil_costs(gil: dict) -> dict:
    """The ``costs.gil`` keys of a measurement (:func:`calibrate.validate.gil_params.measure_gil_params`)."""
    return {k: gil[k] for k in ("switch_interval", "ops_per_forward", "sample_launch", "sample_compute", "wake_latency",
                                "wait_launch_done")}


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
        if p.name.startswith("."):  # an interrupted atomic write's temporary file
            continue
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        cases[rec.get("name", p.stem)] = rec
    return cases
