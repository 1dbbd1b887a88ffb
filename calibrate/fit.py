"""Fitting cost curves to timing samples: a :class:`sim.model.curve.Curve` through the median of
the samples at every measured grid point, and how well it describes them.
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

import numpy as np

from sim.model.curve import Curve


def fit_curve(axes: Sequence[str], samples: Sequence[tuple[Sequence[float], Sequence[float]]]) -> dict:
    """Fit an interpolating curve to timing samples and measure how well it describes them.

    Args:
        axes: the curve's input names (1 or 2).
        samples: ``(point, times_s)`` pairs; ``point`` has one coordinate per axis. Two-axis
            samples must cover the full grid (every combination of the coordinates seen).

    Returns:
        The curve's :meth:`Curve.to_dict` plus
        ``spread_rel`` (per node: interquartile range / median of its samples),
        ``r2`` (coefficient of determination of all raw samples against the curve; 1 when the
        samples do not vary), ``max_rel_residual`` (max |sample - curve| / curve over samples),
        ``loo_max_rel_error`` (leave-one-out: each interior node predicted by interpolating its
        two neighbours along each axis; how much the grid's resolution can miss; null with
        fewer than three nodes on every axis) and ``linear`` (least-squares coefficients of
        ``c0 + c1*x`` or ``c0 + c1*x + c2*y + c3*x*y`` over the node medians, for reading).

    Raises:
        ValueError: no samples, a wrong number of coordinates, or a two-axis grid with holes.
    """
    if not samples:
        raise ValueError("no samples to fit")
    nd = len(axes)
    by_point: dict[tuple, list[float]] = {}
    for point, times in samples:
        if len(point) != nd:
            raise ValueError(f"sample point {point} has {len(point)} coordinates, expected {nd}")
        by_point.setdefault(tuple(float(p) for p in point), []).extend(float(t) for t in times)
    grid = [sorted({p[d] for p in by_point}) for d in range(nd)]
    med = {p: statistics.median(ts) for p, ts in by_point.items()}
    spread = {p: _iqr(ts) / med[p] if med[p] > 0 else 0.0 for p, ts in by_point.items()}
    if nd == 1:
        values = [med[(x,)] for x in grid[0]]
        spread_rel = [spread[(x,)] for x in grid[0]]
    else:
        missing = [(x, y) for x in grid[0] for y in grid[1] if (x, y) not in med]
        if missing:
            raise ValueError(f"two-axis samples do not cover the grid: missing {missing[:3]}")
        values = [[med[(x, y)] for y in grid[1]] for x in grid[0]]
        spread_rel = [[spread[(x, y)] for y in grid[1]] for x in grid[0]]
    curve = Curve(axes, grid, values)
    out = curve.to_dict()
    out["spread_rel"] = spread_rel
    out.update(_quality(curve, by_point))
    out["loo_max_rel_error"] = _loo(grid, values)
    out["linear"] = _linear_summary(axes, med)
    return out


def _iqr(ts: list[float]) -> float:
    if len(ts) < 2:
        return 0.0
    q = statistics.quantiles(ts, n=4, method="inclusive")
    return q[2] - q[0]


def _quality(curve: Curve, by_point: dict[tuple, list[float]]) -> dict:
    ys, fs = [], []
    for p, ts in by_point.items():
        f = curve(*p)
        ys.extend(ts)
        fs.extend([f] * len(ts))
    y, f = np.asarray(ys), np.asarray(fs)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    ss_res = float(((y - f) ** 2).sum())
    r2 = 1.0 if ss_tot == 0.0 else 1.0 - ss_res / ss_tot
    pos = f > 0
    max_rel = float((np.abs(y[pos] - f[pos]) / f[pos]).max()) if pos.any() else 0.0
    return {"r2": r2, "max_rel_residual": max_rel}


def _loo(grid: list[list[float]], values) -> float | None:
    errs = []

    def check(nodes, vals):
        for k in range(1, len(nodes) - 1):
            x0, x1, x2 = nodes[k - 1], nodes[k], nodes[k + 1]
            pred = vals[k - 1] + (x1 - x0) / (x2 - x0) * (vals[k + 1] - vals[k - 1])
            if vals[k] > 0:
                errs.append(abs(pred - vals[k]) / vals[k])

    if len(grid) == 1:
        check(grid[0], values)
    else:
        for j in range(len(grid[1])):
            check(grid[0], [row[j] for row in values])
        for row in values:
            check(grid[1], row)
    return max(errs) if errs else None


def _linear_summary(axes: Sequence[str], med: dict[tuple, float]) -> dict:
    pts = np.asarray(list(med.keys()), dtype=np.float64)
    y = np.asarray(list(med.values()), dtype=np.float64)
    names = ["base", f"per_{axes[0]}"]
    cols = [np.ones(len(y)), pts[:, 0]]
    if len(axes) == 2:
        names += [f"per_{axes[1]}", f"per_{axes[0]}_x_{axes[1]}"]
        cols += [pts[:, 1], pts[:, 0] * pts[:, 1]]
    a = np.stack(cols, axis=1)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    pred = a @ coef
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 if ss_tot == 0.0 else 1.0 - float(((y - pred) ** 2).sum()) / ss_tot
    out = {n: float(c) for n, c in zip(names, coef)}
    out["r2"] = r2
    return {k: (0.0 if math.isclose(v, 0.0, abs_tol=1e-300) else v) for k, v in out.items()}
