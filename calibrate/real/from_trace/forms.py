"""Curves from a trace's scattered steps that extrapolate like the hardware: a stated physical form
fitted by non-negative least squares over every step, written onto a grid that reaches a stated
distance beyond the data.

A server's trace holds the batches its load made, not a designed grid: a window at the start of a
load sees a few batch sizes over a few tokens of context. Interpolating between those points and
extending the edge segments (what :class:`sim.model.curve.Curve` does beyond a grid) turns a
20-token context span's noise into a slope. Instead each curve gets a form whose terms are what a
step costs on any device, each coefficient at least 0:

- ``forward.decode`` at (B requests, C tokens of KV per request): ``a + b B + c B C`` (a launch
  floor, per-request work such as the weights' share and sampling, attention over the KV read);
- ``forward.extend`` at (N new tokens, K KV tokens each new token attends on average): ``a + b N
  + c N K`` (a floor, per-token work, attention), where ``N K = sum_i q_i k_i`` over the batch's
  requests (``q_i`` new tokens attending ``k_i`` = prefix + new tokens) is the trace's ``c_sqsk``
  (SGLang 0.5.23 ``srt/model_executor/step_span_utils.py``, ``_agg`` and
  ``build_detailed_annotation_suffix``). A prefill's attention grows with each request's own
  length squared: eight requests of 224 tokens attend 224 keys per token, one of 1,792 attends
  1,792. On the recorded CPU-engine traces ``a + b N`` over the mean prefix put a 983-token
  request 5% under its measured time and a 15 x 128-token batch 29% over; ``a + b N + c N K``
  +3% and 0%. The profile's ``forward.extend`` is then keyed by (N, K) (``metadata.extend_axis:
  attended``), which the simulator reads at each batch's own K (:mod:`sim.model.profile_costs`);
- a host phase at x (requests, new requests, or new tokens for ``launch.extend``): ``a + b x``.

The measured steps are kept where they fall (each moved to its grid node along the form, as
a plane fitted over every step did before), the cells no step
fell in are the form's (``"filled": true``), and the grid gains nodes at :data:`REACH` times the
data's largest batch, context and token count (and the data's smallest divided by it): inside that
reach the simulator prices from the form, beyond it from the edge segment (the form's own slope).
:func:`coverage` is the data's hull, which the profile's ``metadata.coverage`` carries so that
``run`` can say how many steps were priced from the form beyond the data, and how far.

Simplifications (stated in ``metadata.timing``): the forms are linear in their terms, so they do
not see CUDA-graph buckets or cache steps between measured points; a term the data cannot tell
from 0 (a constant axis) is 0; the form's coefficients' uncertainty is not propagated (the
residual spread is reported per curve in ``metadata.fits``).
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

REACH = 4.0  # the grid reaches this factor beyond the data on each axis (stated in metadata.coverage)
MAX_BINS = 3  # measured nodes of a curve's second axis (context or prefix)

# curve -> the form's term names (the first is the constant); terms() gives their values
FORMS = {"forward.decode": ("base", "per_request", "per_kv_token"),
         "forward.extend": ("base", "per_new_token", "per_attention_pair")}
LINE = ("base", "per_unit")


def terms(curve: str, x: float, y: float | None = None) -> tuple[float, ...]:
    """The form's term values at a point (``y``: the second axis of a forward curve: a decode's KV
    tokens per request, a prefill's KV tokens attended per new token)."""
    if curve in FORMS:
        return 1.0, x, x * y
    return 1.0, x


def value(form: dict, curve: str, x: float, y: float | None = None) -> float:
    """A stored form (:meth:`Fit.as_json`) evaluated at a point, in seconds."""
    return sum(c * t for c, t in zip(form["coef_s"].values(), terms(curve, x, y)))


def nnls(rows: list[tuple[float, ...]], t: list[float]) -> tuple[float, ...]:
    """Non-negative least squares for a handful of terms: the best of the unconstrained solutions
    over every subset of the terms whose coefficients come out >= 0 (exact for <= 4 terms).
    Shapes: ``rows`` n x k, ``t`` n; returns k coefficients (0 for terms left out). Raises
    ValueError on an empty system."""
    import numpy as np

    if not rows:
        raise ValueError("no points to fit")
    a, b = np.asarray(rows, dtype=float), np.asarray(t, dtype=float)
    k = a.shape[1]
    best, best_err = np.zeros(k), float(np.sum(b ** 2))
    for size in range(1, k + 1):
        for keep in itertools.combinations(range(k), size):
            sub = a[:, keep]
            coef, *_ = np.linalg.lstsq(sub, b, rcond=None)
            if np.any(coef < 0) or not np.all(np.isfinite(coef)):
                continue
            err = float(np.sum((sub @ coef - b) ** 2))
            if err < best_err - 1e-18:
                best, best_err = np.zeros(k), err
                best[list(keep)] = coef
    return tuple(float(c) for c in best)


@dataclass(frozen=True)
class Fit:
    """A fitted form: ``curve``, its term names and coefficients (seconds per unit of each term),
    the steps it was fitted over and the median relative residual (|t - form| / form)."""

    curve: str
    names: tuple[str, ...]
    coef: tuple[float, ...]
    steps: int
    median_rel_residual: float

    def __call__(self, x: float, y: float | None = None) -> float:
        return sum(c * v for c, v in zip(self.coef, terms(self.curve, x, y)))

    def as_json(self) -> dict:
        return {"form": " + ".join(self.names), "coef_s": dict(zip(self.names, self.coef)), "steps": self.steps,
                "median_rel_residual": self.median_rel_residual}


def fit(curve: str, points: list[tuple]) -> Fit:
    """The form of ``curve`` fitted over ``points`` ((x, y, seconds) for a forward curve, (x,
    seconds) for a host phase). Raises ValueError without points."""
    two = curve in FORMS
    rows = [terms(curve, p[0], p[1] if two else None) for p in points]
    ts = [p[-1] for p in points]
    # a term the data cannot tell apart from the others is 0: x constant (the per-x term is the
    # base's), y constant (B C is then a multiple of B)
    drop = set()
    if len({p[0] for p in points}) == 1:
        drop.add(1)
    if two and len({p[1] for p in points}) == 1:
        drop.add(2)
    keep = [i for i in range(len(rows[0])) if i not in drop] if rows else []
    sub = nnls([tuple(r[i] for i in keep) for r in rows], ts)
    coef = [0.0] * (len(rows[0]) if rows else 0)
    for i, c in zip(keep, sub):
        coef[i] = c
    coef = tuple(coef)
    f = Fit(curve, FORMS.get(curve, LINE), coef, len(points), math.nan)
    res = [abs(t - f(*p[:-1])) / f(*p[:-1]) for p, t in zip(points, ts) if f(*p[:-1]) > 0]
    return Fit(f.curve, f.names, f.coef, f.steps, statistics.median(res) if res else math.nan)


def _bins(values: list[float]) -> list[float]:
    """At most MAX_BINS nodes for the second axis: the distinct values when few, else the medians
    of equal-count bins (rounded to whole tokens)."""
    distinct = sorted(set(values))
    if len(distinct) <= MAX_BINS:
        return distinct
    ordered = sorted(values)
    n = len(ordered)
    nodes = [float(round(statistics.median(ordered[b * n // MAX_BINS:(b + 1) * n // MAX_BINS])))
             for b in range(MAX_BINS) if ordered[b * n // MAX_BINS:(b + 1) * n // MAX_BINS]]
    return sorted(set(nodes))


def _reach(nodes: list[float], floor: float, whole: bool = True) -> list[float]:
    """``nodes`` with one node :data:`REACH` times beyond each end (not below ``floor``); a single
    node stays alone (the form is flat along that axis: :func:`fit`)."""
    if len(set(nodes)) == 1:
        return sorted(set(nodes))
    lo, hi = min(nodes), max(nodes)
    ends = [max(floor, lo / REACH), hi * REACH if hi > 0 else REACH]
    if whole:
        ends = [float(math.floor(ends[0])) if ends[0] >= 1 else ends[0], float(math.ceil(ends[1]))]
    return sorted(set(nodes) | {e for e in ends if e >= floor})


def grid_samples(curve: str, axes: tuple[str, ...], points: list[tuple], form: Fit) -> list[dict]:
    """The curve's samples: measured steps at their nodes (moved along ``form`` to the node of the
    second axis), the form at every other node of the grid that reaches :data:`REACH` beyond the
    data (``"filled": true``). Shapes: ``points`` (x, y, s) for two axes, (x, s) for one."""
    from sim.model.profile import MIN_FORWARD_S

    floor = MIN_FORWARD_S if curve.startswith("forward") else 0.0
    xs = _reach(sorted({p[0] for p in points}), 1.0 if axes[0] != "ctx" else 0.0)
    cells: dict[tuple, list[float]] = {}
    if len(axes) == 1:
        for x, t in points:
            cells.setdefault((x,), []).append(max(floor, t))
        grid = [(x,) for x in xs]
    else:
        ys_data = _bins([p[1] for p in points])
        ys = _reach(ys_data, 0.0)
        for x, y, t in points:
            node = min(ys_data, key=lambda n: abs(n - y))
            cells.setdefault((x, node), []).append(max(floor, t + form(x, node) - form(x, y)))
        grid = [(x, y) for x in xs for y in ys]
    out = []
    for node in grid:
        point = dict(zip(axes, node))
        if node in cells:
            out.append({"curve": curve, "point": point, "times_s": cells[node]})
        else:
            out.append({"curve": curve, "point": point, "times_s": [max(floor, form(*node))], "filled": True})
    return out


def coverage(axes: tuple[str, ...], points: list[tuple]) -> dict[str, list[float]]:
    """The data's hull per axis: ``{axis: [lowest, highest]}``."""
    return {a: [min(p[i] for p in points), max(p[i] for p in points)] for i, a in enumerate(axes)}
