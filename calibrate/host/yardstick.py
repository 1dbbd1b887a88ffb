"""The host yardstick: the project's own bookkeeping (:mod:`calibrate.bookkeeping`) timed on a
host, so that host costs measured on one host can be moved to another.

The re-implementation is no source of costs (SGLang's real scheduler costs 4-10x more), but it
is a fixed piece of pure-Python scheduler-like work (request objects, a radix cache, a BPE
tokenizer, stop-string checks) that every CUDA and MLX calibration of this project timed on its
own host (the ``recv``, ``schedule.*`` and ``process.*`` samples of a profile with ``backend``
torch or mlx). Timed again beside a host calibration of the real engine
(:mod:`calibrate.host.sglang`), the ratio of the two readings, point by point, is how much
faster one host runs the same Python than the other: :func:`host_speed`.

The yardstick must be the same code on both hosts: :func:`calibrate.bookkeeping.version` names the code (a hash of
:mod:`calibrate.bookkeeping`'s sources), every torch/MLX calibration records it
(``metadata.yardstick_version``) and every host calibration measures it beside its runs.
Readings of two versions are not compared (:func:`calibrate.host.compose.compose` refuses);
profiles from before the version was recorded (such as the H200 device profiles shipped until
5 December 2026, revision ``f505e66``) are moved with readings of their revision's code taken on
the host file's host (``benchmarks/yardstick_at.py``, ``compose --host-yardstick``).

Stated limits: the ratio assumes SGLang's scheduler and the re-implementation speed up alike
from one CPU to another (both are single-threaded CPython over small objects; neither is
vectorised); the two hosts may run different CPython releases (3.12 on the lent H200 host, 3.11
here: about 5-10% apart on such code); the spread of the point ratios is the stated uncertainty,
never below :data:`FLOOR_REL`.
"""

from __future__ import annotations

import math
import statistics

from calibrate.config import YARDSTICK_BATCH_SIZES

CURVES = ("recv", "schedule.extend", "schedule.decode", "process.extend", "process.decode")
FLOOR_REL = 0.15  # the uncertainty of moving by a yardstick is at least this (the assumption above)


def measure(batch_sizes=YARDSTICK_BATCH_SIZES, warmup: int = 3, repeats: int = 15, seed: int = 0,
            rounds: int = 3) -> list[dict]:
    """Time the re-implementation here: ``[{"curve", "point": {"num_reqs"}, "median_s", "n"}]``
    for every curve of :data:`CURVES` at each batch size (``recv`` also at 0), in ``rounds``
    passes over the grid (a point's reading: the median of its passes' medians, so a transient
    slowdown of a shared VM moves one pass only). About 15 s a pass on a 2-vCPU VM."""
    from calibrate.bookkeeping.bench import BookkeepingBench

    bench = BookkeepingBench(max(batch_sizes), seed=seed)
    acc: dict[tuple, list[float]] = {}
    for _ in range(rounds):
        for n in (0, *batch_sizes):
            for curve, times in bench.measure(n, warmup, repeats).items():
                acc.setdefault((curve, n), []).append(statistics.median(times))
    return [{"curve": c, "point": {"num_reqs": n}, "median_s": statistics.median(v), "n": rounds * repeats}
            for (c, n), v in acc.items()]


def profile_readings(profile: dict) -> list[dict]:
    """The yardstick readings a torch or MLX calibration profile holds: the median of its
    re-implementation samples per (curve, batch size); ``[]`` for a profile of a real engine or
    one moved by ``transfer`` (whose host is not the one it was measured on)."""
    meta = profile.get("metadata", {})
    if meta.get("backend") not in ("torch", "mlx") or meta.get("transfer") or meta.get("composed"):
        return []
    out = []
    for s in profile.get("samples", []):
        if s["curve"] in CURVES and not s.get("setting") and s["times_s"]:
            out.append({"curve": s["curve"], "point": {"num_reqs": s["point"]["num_reqs"]},
                        "median_s": statistics.median(s["times_s"]), "n": len(s["times_s"])})
    return out


def host_speed(source: list[dict], target: list[dict]) -> dict:
    """How much faster the target host runs the yardstick than the source host.

    Args:
        source, target: readings (:func:`measure`, :func:`profile_readings`) on the two hosts.

    Returns:
        ``{"host_speed", "uncertainty_rel", "points", "ratio_range"}``: ``host_speed`` the geometric
        mean over the shared points of source time / target time (2: the target runs it in half
        the time), ``uncertainty_rel`` the geometric standard deviation of the point ratios less
        one (at least :data:`FLOOR_REL`).

    Raises:
        ValueError: fewer than 3 shared points with positive times.
    """
    src = {(r["curve"], r["point"]["num_reqs"]): r["median_s"] for r in source}
    ratios = [src[k] / r["median_s"] for r in target
              if (k := (r["curve"], r["point"]["num_reqs"])) in src and src[k] > 0 and r["median_s"] > 0]
    if len(ratios) < 3:
        raise ValueError(f"the two hosts' yardsticks share {len(ratios)} points; at least 3 are needed")
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    sd = statistics.pstdev(logs)
    return {"host_speed": math.exp(mean), "uncertainty_rel": max(FLOOR_REL, math.exp(sd) - 1.0),
            "points": len(ratios), "ratio_range": [min(ratios), max(ratios)]}


def reading_beside(path, report) -> dict:
    """The yardstick timed here, beside a host calibration's runs (``{"what", "version", "python",
    "readings"}``), written to ``path`` atomically; a reading already in ``path`` is reused (an
    interrupted calibration resumes). ``report(line)`` says what it times."""
    import json
    import platform
    from pathlib import Path

    from calibrate.bookkeeping import version as bookkeeping_version
    from sim.atomic import atomic_path

    path = Path(path)
    if path.exists():
        return json.loads(path.read_text())
    report("yardstick: timing the project's own bookkeeping on this host (to move these costs to another host)")
    reading = {"what": "calibrate.bookkeeping timed on this host beside the runs (calibrate.host.yardstick)",
               "version": bookkeeping_version(), "python": platform.python_version(), "readings": measure()}
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(reading) + "\n")
    return reading
