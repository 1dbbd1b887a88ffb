"""Cost curves: piecewise-linear over one axis, bilinear over two, through measured grid points.

A curve passes through a value at every measured grid point and is linear between neighbouring
points (bilinear inside a cell of a two-axis grid), so it follows whatever shape the
measurements have (CUDA-graph buckets, cache effects) without assuming a formula. Outside the
grid it extends the edge segment linearly (clamped at 0) and :meth:`Curve.inside` says so, which
the simulator reports as extrapolated steps. Fitting curves to samples is calibration's
(:mod:`calibrate.fit`).

Evaluation is pure Python (bisect on short lists): the simulator calls a curve several times
per simulated step, where numpy's per-call overhead would dominate. A one-axis curve keeps the
values it has computed (up to :data:`MEMO_SIZE` points): the loops ask for the same batch sizes
step after step, and a value looked up is the float the computation gives. A two-axis curve keeps
itself at each first-axis value asked for (:meth:`Curve.at`), its second axis evaluated anew.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

MEMO_SIZE = 4096  # one-axis values a curve keeps (batch sizes: a few hundred distinct at most)


def _segment(nodes: Sequence[float], x: float) -> tuple[int, float]:
    """Index i of the segment [nodes[i], nodes[i+1]] used for x and the (unclamped) fraction t."""
    n = len(nodes)
    if n == 1:
        return 0, 0.0
    i = min(max(bisect_right(nodes, x) - 1, 0), n - 2)
    x0, x1 = nodes[i], nodes[i + 1]
    return i, (x - x0) / (x1 - x0)


class Curve:
    """A piecewise-linear (1 axis) or bilinear (2 axes) interpolating curve, in seconds.

    Args:
        axes: names of the inputs, e.g. ``("num_reqs",)`` or ``("num_reqs", "ctx")``.
        grid: strictly increasing node coordinates, one list per axis.
        values_s: node values in seconds: a list (1 axis) or a list of rows, one per node of
            the first axis (2 axes).
    """

    def __init__(self, axes: Sequence[str], grid: Sequence[Sequence[float]], values_s):
        self.axes = tuple(axes)
        self.grid = tuple(tuple(float(v) for v in g) for g in grid)
        if len(self.axes) == 1:
            self.values = tuple(float(v) for v in values_s)
        else:
            self.values = tuple(tuple(float(v) for v in row) for row in values_s)
        self.lo = tuple(g[0] for g in self.grid)
        self.hi = tuple(g[-1] for g in self.grid)
        self._memo: dict[float, float] | None = {} if len(self.axes) == 1 else None  # x -> value
        self._at: dict = {}  # two axes: x0 -> the curve at x0 (:meth:`at`)
        self._arrays = None  # :meth:`along`'s numpy copies of the second axis and the rows, made once

    def __call__(self, *x: float) -> float:
        """The curve at ``x`` (one value per axis), in seconds, >= 0."""
        memo = self._memo
        if memo is not None:
            y = memo.get(x[0])
            if y is not None:
                return y
            i, t = _segment(self.grid[0], x[0])
            v = self.values
            y = v[i] if len(v) == 1 else v[i] + t * (v[i + 1] - v[i])
            y = y if y > 0.0 else 0.0
            if len(memo) < MEMO_SIZE:
                memo[x[0]] = y
            return y
        at = self._at.get(x[0])
        return (at if at is not None else self.at(x[0]))(x[1])

    def at(self, x0: float):
        """A two-axis curve at ``x0``, as a function of ``x1`` (seconds, >= 0): the bilinear
        interpolation with the first axis's segment found once. :meth:`__call__` goes through it,
        and the curve keeps it per ``x0`` (up to :data:`MEMO_SIZE`, then starts afresh): the loops
        ask for the same batch sizes step after step, at new contexts."""
        kept = self._at.get(x0)
        if kept is not None:
            return kept
        i, t = _segment(self.grid[0], x0)
        v = self.values
        r, r1 = v[i], v[i + 1 if len(v) > 1 else i]
        g1, step = self.grid[1], 1 if len(v[0]) > 1 else 0
        cell = [1.0, 0.0, 0]  # the last interior segment used: its nodes and index (none yet: empty)

        def curve_at(x1: float) -> float:
            lo, hi, j = cell
            if lo <= x1 < hi:  # the segment of the last call (contexts grow step by step): _segment's
                u = (x1 - lo) / (hi - lo)  # index and fraction, without the search
            else:
                j, u = _segment(g1, x1)
                if step and g1[j] <= x1 < g1[j + 1]:
                    cell[:] = g1[j], g1[j + 1], j
            j1 = j + step
            a = r[j] + u * (r[j1] - r[j])
            b = r1[j] + u * (r1[j1] - r1[j])
            y = a + t * (b - a)
            return y if y > 0.0 else 0.0

        if len(self._at) >= MEMO_SIZE:
            self._at.clear()
        self._at[x0] = curve_at
        return curve_at

    def along(self, x0: float, x1):
        """The curve at (``x0``, each of ``x1``): a float64 array, each value the float
        ``self(x0, x1[i])`` gives (the same operations elementwise); a one-axis curve at ``x0``,
        repeated."""
        import numpy as np  # the scalar path imports no numpy

        x1 = np.asarray(x1, dtype=np.float64)
        if len(self.axes) == 1:
            return np.full(len(x1), self(x0))
        i, t = _segment(self.grid[0], x0)
        v = self.values
        i1 = i + 1 if len(v) > 1 else i
        if self._arrays is None:
            self._arrays = (np.asarray(self.grid[1]), [np.asarray(r) for r in v])
        g, rows = self._arrays
        if len(g) > 1 and len(x1):
            lo, hi = float(x1.min()), float(x1.max())
            j0 = _segment(self.grid[1], lo)[0]
            if lo == lo and hi == hi and j0 == _segment(self.grid[1], hi)[0]:
                # every x1 in one cell (a run's contexts, as a rule): the cell's corners as scalars,
                # the same doubles the gathers below would give
                g0, g1, r = self.grid[1][j0], self.grid[1][j0 + 1], v[i]
                u = (x1 - g0) / (g1 - g0)
                a = r[j0] + u * (r[j0 + 1] - r[j0])
                b = v[i1][j0] + u * (v[i1][j0 + 1] - v[i1][j0])
                y = a + t * (b - a)
                return np.where(y > 0.0, y, 0.0)
        if len(g) == 1:
            j = np.zeros(len(x1), dtype=np.int64)
            u = np.zeros(len(x1))
        else:
            j = np.clip(np.searchsorted(g, x1, side="right") - 1, 0, len(g) - 2)
            u = (x1 - g[j]) / (g[j + 1] - g[j])
        j1 = j + 1 if len(v[0]) > 1 else j
        row, row1 = rows[i], rows[i1]
        a = row[j] + u * (row[j1] - row[j])
        b = row1[j] + u * (row1[j1] - row1[j])
        y = a + t * (b - a)
        return np.where(y > 0.0, y, 0.0)

    def inside(self, *x: float) -> bool:
        """True when ``x`` lies within the measured grid on every axis (no extrapolation)."""
        return all(lo <= xi <= hi for xi, lo, hi in zip(x, self.lo, self.hi))

    def to_dict(self) -> dict:
        vals = list(self.values) if len(self.axes) == 1 else [list(r) for r in self.values]
        return {"axes": list(self.axes), "grid": [list(g) for g in self.grid], "values_s": vals}
