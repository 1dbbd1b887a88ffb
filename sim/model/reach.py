"""How far a simulated step lies from the data its price stands on.

A profile's curves pass through measured points; a step outside them is priced by extrapolation
(a curve's edge segment, or the fitted form a trace profile writes onto a grid that reaches beyond
its data: :mod:`calibrate.real.from_trace.forms`). The data's hull per curve is the profile's
``metadata.coverage`` when it states one (``{curve: {axis: [lo, hi]}}``), else the curve's own
grid (every node measured).

A step's distance is the largest, over the curves that price it and their axes, of
``(x + 1) / (hi + 1)`` above the hull and ``(lo + 1) / (x + 1)`` below it (1 inside; the ``+ 1``
keeps a token axis at 0 finite). :class:`ReachMeter` counts the steps beyond the data (distance
> 1), those beyond :data:`FAR` (a price there is the form's or the edge segment's guess, not a
measurement) and the largest distance, for the run's summary and the verdict line; the cost
model keeps the first step at the largest distance (its coordinates), and :func:`farthest_axis`
names the curve and axis that put it there (``max_extrapolation_at`` in the summary), so a
reader knows what to measure further.

Below the data's lowest context a forward's price is bounded, not a guess: a step's cost grows
with the context it reads (a decode reads its weights whatever its context, then its KV cache),
and falls no faster below the data than the edge segment the curve extends (the cost is an
affine term in the context above a floor), so the true price lies between the curve's value
there and its value at the lowest measured context. A step whose only excursion is such a
context, with the two prices within :data:`BOUNDED_MAX` of each other (:func:`below_share`),
is counted as *bounded* (``bounded_steps``, ``max_bounded_share``, ``max_bounded_at`` in the
summary) instead of extrapolated: the verdict states the share and the ratio at the bound, and
whether the answer holds there (:mod:`sim.whatif.verdict`; a bound does not turn it). Measured on the H200 profiles, a
decode of 8 requests at 17 tokens of context against 128 is bounded within 3.3%, where the
distance above called it x7.2 its range, 23% of a short-prompt run's steps beyond :data:`FAR`.
"""

from __future__ import annotations

import math

FAR = 4.0  # beyond this factor from the data a price is not a measurement (the verdict's limit)
FAR_SHARE = 0.10  # more of a run's steps than this beyond FAR: the verdict cannot stand on them
BOUNDED_MAX = 0.25  # below the data's contexts, prices this close to the edge's are bounded (module docstring)


def hulls(profile: dict, curves: dict) -> dict[str, tuple[tuple[float, ...], tuple[float, ...]]]:
    """``{curve: (lo per axis, hi per axis)}``: the profile's ``metadata.coverage`` where it states
    the curve (axes in the curve's order), else the curve's grid."""
    cov = profile.get("metadata", {}).get("coverage") or {}
    out = {}
    for name, c in curves.items():
        stated = cov.get(name) if isinstance(cov, dict) else None
        if isinstance(stated, dict) and all(a in stated for a in c.axes):
            out[name] = (tuple(float(stated[a][0]) for a in c.axes), tuple(float(stated[a][1]) for a in c.axes))
        else:
            out[name] = (c.lo, c.hi)
    return out


def distance(hull: tuple[tuple[float, ...], tuple[float, ...]], *x: float) -> float:
    """The distance of the point ``x`` from ``hull`` (module docstring); 1.0 inside."""
    d = 1.0
    for xi, lo, hi in zip(x, hull[0], hull[1]):
        if xi > hi:
            d = max(d, (xi + 1.0) / (hi + 1.0))
        elif xi < lo:
            d = max(d, (lo + 1.0) / (max(xi, 0.0) + 1.0))
    return d


def distances(lo: float, hi: float, x):
    """:func:`distance` on one axis whose data span ``lo``-``hi``, at each value of the array
    ``x``: a float64 array (the same doubles as the scalar path, elementwise)."""
    import numpy as np  # the scalar path imports no numpy

    return np.where(x > hi, (x + 1.0) / (hi + 1.0), np.where(x < lo, (lo + 1.0) / (np.maximum(x, 0.0) + 1.0), 1.0))


def below_share(price: float, edge_price: float) -> float:
    """How far a price below the data's lowest context may be off, as a share of the measured
    edge's price ``edge_price`` (module docstring): ``|price - edge_price| / edge_price``; inf where
    the edge's price is not positive."""
    return abs(price - edge_price) / edge_price if edge_price > 0.0 else math.inf


def bound_below(meter: "ReachMeter", curve, x0: float, x, lo: float, d, size: float) -> float | None:
    """A numpy run's steps below the data's lowest context ``lo`` (the run's contexts ``x``, a
    float64 array, at ``x0`` on the curve's first axis; ``d`` their distances, ``size`` the
    distance of everything else they are priced at): where the price is within
    :data:`BOUNDED_MAX` of the price at ``lo`` (:func:`below_share`), the context's distance is
    dropped from ``d`` and the context set to ``lo`` in ``x`` (both in place), and where nothing
    else lies beyond the data (``size`` 1) the steps are counted as bounded in ``meter``. Returns
    the context of the first step at a new largest share, else None (the cost models' scalar path
    counts the same, one step at a time)."""
    import numpy as np  # the scalar path imports no numpy

    below = np.flatnonzero(x < lo)
    if not len(below):
        return None
    edge = curve(x0, lo)
    shares = np.abs(curve.along(x0, x[below]) - edge) / edge if edge > 0.0 else np.full(len(below), math.inf)
    kept = shares <= BOUNDED_MAX
    near = below[kept]
    d[near] = size
    i = meter.bounded_many(shares[kept]) if size == 1.0 else -1
    widest = float(x[near[i]]) if i >= 0 else None
    x[near] = lo  # (where such a step is the farthest, it lies beyond on its batch size only)
    return widest


def bounded_words(share: float, at: str = "") -> str:
    """A bounded price in the words the report and the verdict use (``at``: where the bounded
    step of the largest share lay, the cost model's ``bounded_at``): ``"by the curve's edge
    segment (forward.decode at ctx 17, measured from 128): the true price lies between that and
    the price at the lowest measured context (...), at most 3.3% apart"``."""
    return ("by the curve's edge segment" + (f" ({at})" if at else "") + ": the true price lies between that and "
            "the price at the lowest measured context (a step's cost grows with its context from a floor its "
            f"weights set), at most {share:.1%} apart")


def farthest_axis(points) -> str:
    """The curve axis farthest from its data among ``points`` (``(curve name, axis names, hull,
    coordinates)`` each, as the cost model priced one step), in words: ``"vllm.frontend_out at
    num_reqs 32, measured 1-4"``; the first of equals in the order given; "" when every axis lies
    inside its data."""
    best, where = 1.0, ""
    for name, axes, hull, x in points:
        for axis, xi, lo, hi in zip(axes, x, hull[0], hull[1]):
            d = distance(((lo,), (hi,)), xi)
            if d > best:
                best, where = d, f"{name} at {axis} {xi:.6g}, measured {lo:.6g}-{hi:.6g}"
    return where


def reach_words(max_extrapolation: float, at: str = "") -> str:
    """How far a run's steps lie beyond the data, in the words its warning and verdict use: ``"up
    to x6.6 its range, as the ratio of x + 1 and the measured edge + 1; the farthest on
    vllm.frontend_out at num_reqs 32, measured 1-4"`` (``at``: :func:`farthest_axis`'s words, ""
    for none)."""
    far = f"{max_extrapolation:.2f}" if max_extrapolation < 1.05 else f"{max_extrapolation:.1f}"  # (not "x1.0")
    return (f"up to x{far} its range, as the ratio of x + 1 and the measured edge + 1"
            + (f"; the farthest on {at}" if at else ""))


class ReachMeter:
    """Counts a run's steps by their distance from the data (:func:`distance`)."""

    __slots__ = ("extrapolated_steps", "far_steps", "max_distance", "bounded_steps", "max_bounded_share")

    def __init__(self) -> None:
        self.extrapolated_steps = 0  # beyond the data
        self.far_steps = 0  # beyond FAR
        self.max_distance = 1.0
        self.bounded_steps = 0  # below the data's contexts only, the price bounded (module docstring)
        self.max_bounded_share = 0.0  # their largest below_share

    def bounded(self, share: float) -> bool:
        """Count a step whose only excursion is a context below the data, its price within
        ``share`` of the edge's (:func:`below_share`). Returns whether its share is the largest so
        far (the cost model then keeps its coordinates)."""
        self.bounded_steps += 1
        if share > self.max_bounded_share:
            self.max_bounded_share = share
            return True
        return False

    def bounded_many(self, shares) -> int:
        """:meth:`bounded` of each share of the array ``shares``. Returns the index of the first at
        a new largest share, else -1."""
        if not len(shares):
            return -1
        self.bounded_steps += len(shares)
        top = float(shares.max())
        if top > self.max_bounded_share:
            self.max_bounded_share = top
            return int((shares == top).argmax())
        return -1

    def step(self, d: float) -> bool:
        """Count a step at distance ``d``. Returns whether it is the farthest so far (the cost
        model then keeps its coordinates)."""
        if d > 1.0:
            self.extrapolated_steps += 1
            if d > FAR:
                self.far_steps += 1
            if d > self.max_distance:
                self.max_distance = d
                return True
        return False

    def same_steps(self, d: float, k: int) -> bool:
        """:meth:`step` of ``k`` steps at the one distance ``d`` (a run of one batch size whose
        contexts all lie inside the data: only the size is beyond it); True where the first of
        them is the farthest so far."""
        if d > 1.0 and k > 0:
            self.extrapolated_steps += k
            if d > FAR:
                self.far_steps += k
            if d > self.max_distance:
                self.max_distance = d
                return True
        return False

    def steps(self, d) -> int:
        """:meth:`step` for each distance of the array ``d``. Returns the index of the first step
        at a new largest distance (the cost model keeps its coordinates), else -1."""
        beyond = d[d > 1.0]
        if len(beyond):
            self.extrapolated_steps += len(beyond)
            self.far_steps += int((beyond > FAR).sum())
            top = float(beyond.max())
            if top > self.max_distance:
                self.max_distance = top
                return int((d == top).argmax())
        return -1

    def outcome(self) -> dict:
        """The summary's keys: ``extrapolated_steps``, ``far_steps``, ``max_extrapolation``,
        ``bounded_steps``, ``max_bounded_share``."""
        return {"extrapolated_steps": self.extrapolated_steps, "far_steps": self.far_steps,
                "max_extrapolation": self.max_distance, "bounded_steps": self.bounded_steps,
                "max_bounded_share": self.max_bounded_share}


def reach_outcome(costs) -> dict:
    """A cost model's reach keys for a run's outcome (inline cost terms: nothing extrapolated), with
    ``max_extrapolation_at``: where the farthest step lies (the cost model's ``farthest_at()``,
    :func:`farthest_axis`; "" inside the data), and ``max_bounded_at``: where the bounded step of
    the largest share lies (its ``bounded_at()``; "" for none)."""
    meter = getattr(costs, "reach", None)
    if isinstance(meter, ReachMeter):
        out = meter.outcome()
        out["max_extrapolation_at"] = costs.farthest_at() if hasattr(costs, "farthest_at") else ""
        out["max_bounded_at"] = costs.bounded_at() if hasattr(costs, "bounded_at") else ""
        return out
    return {"extrapolated_steps": int(getattr(costs, "extrapolated_steps", 0)), "far_steps": 0,
            "max_extrapolation": 1.0, "max_extrapolation_at": "", "bounded_steps": 0, "max_bounded_share": 0.0,
            "max_bounded_at": ""}
