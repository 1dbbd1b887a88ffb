"""Fitting cost curves: hand-computable cases, known coefficients, invariants."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibrate.fit import fit_curve
from sim.model.curve import Curve


def test_one_axis_interpolates_extrapolates_and_clamps():
    c = Curve(["n"], [[1, 3]], [1.0, 3.0])
    assert c(2) == 2.0 and c(1) == 1.0 and c(3) == 3.0
    assert c(5) == 5.0  # linear extension of the last segment
    assert c(-10) == 0.0  # clamped at zero
    assert c.inside(2) and not c.inside(5) and not c.inside(0.5)


def test_known_linear_coefficients_are_recovered():
    base, per_req = 1e-3, 2e-5
    samples = [([n], [base + per_req * n]) for n in (1, 2, 4, 16, 64)]
    fit = fit_curve(["num_reqs"], samples)
    c = Curve(fit["axes"], fit["grid"], fit["values_s"])
    for n in (1, 3, 10, 50, 64, 100):  # exact inside, and outside (linear extension)
        assert c(n) == pytest.approx(base + per_req * n, rel=1e-12)
    assert fit["r2"] == 1.0 and fit["max_rel_residual"] == pytest.approx(0.0, abs=1e-12)
    assert fit["linear"]["base"] == pytest.approx(base) and fit["linear"]["per_num_reqs"] == pytest.approx(per_req)
    assert fit["loo_max_rel_error"] == pytest.approx(0.0, abs=1e-12)


def test_bilinear_function_is_reproduced_off_grid():
    a, b, c0, d = 2e-3, 3e-5, 1e-7, 1e-9
    f = lambda n, x: a + b * n + c0 * x + d * n * x  # noqa: E731  bilinear: exact under bilinear interpolation
    samples = [([n, x], [f(n, x)]) for n in (1, 4, 32) for x in (128, 512, 4096)]
    fit = fit_curve(["num_reqs", "ctx"], samples)
    c = Curve(fit["axes"], fit["grid"], fit["values_s"])
    for n, x in [(2, 300), (17, 1000), (32, 4096), (1, 128), (64, 8192)]:
        assert c(n, x) == pytest.approx(f(n, x), rel=1e-12)
    lin = fit["linear"]
    assert lin["base"] == pytest.approx(a) and lin["per_num_reqs"] == pytest.approx(b)
    assert lin["per_ctx"] == pytest.approx(c0) and lin["per_num_reqs_x_ctx"] == pytest.approx(d)
    assert not c.inside(64, 8192) and c.inside(32, 4096)


def test_median_spread_and_residuals_by_hand():
    fit = fit_curve(["n"], [([1], [1.0, 2.0, 3.0]), ([2], [4.0, 4.0, 4.0])])
    assert fit["values_s"] == [2.0, 4.0]
    assert fit["spread_rel"][0] == pytest.approx((2.5 - 1.5) / 2.0)  # IQR / median
    assert fit["max_rel_residual"] == pytest.approx(0.5)  # |1 - 2| / 2
    ys = [1, 2, 3, 4, 4, 4]
    mean = sum(ys) / 6
    r2 = 1 - 2.0 / sum((y - mean) ** 2 for y in ys)  # residuals: -1, 0, 1, 0, 0, 0
    assert fit["r2"] == pytest.approx(r2)


def test_leave_one_out_error():
    fit = fit_curve(["n"], [([1], [1.0]), ([2], [5.0]), ([3], [3.0])])
    assert fit["loo_max_rel_error"] == pytest.approx(abs(2.0 - 5.0) / 5.0)


def test_two_axis_samples_must_cover_the_grid():
    with pytest.raises(ValueError, match="missing"):
        fit_curve(["n", "ctx"], [([1, 1], [1.0]), ([2, 2], [1.0])])
    with pytest.raises(ValueError):
        fit_curve(["n"], [])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 10_000), st.floats(0, 1.0)), min_size=2, max_size=8,
                unique_by=lambda t: t[0]), st.floats(0, 1))
def test_curve_passes_through_medians_and_stays_between_neighbours(points, frac):
    points.sort()
    fit = fit_curve(["n"], [([x], [y]) for x, y in points])
    c = Curve(fit["axes"], fit["grid"], fit["values_s"])
    for x, y in points:
        assert c(x) == pytest.approx(y, abs=1e-12)
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        v = c(x0 + frac * (x1 - x0))
        assert min(y0, y1) - 1e-12 <= v <= max(y0, y1) + 1e-12
    assert math.isfinite(fit["r2"])


def _fresh(c: Curve, x: float) -> float:
    """The one-axis curve's value at ``x`` computed anew (a copy of the curve: an empty memo)."""
    return Curve(c.axes, c.grid, c.values)(x)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=6, unique=True),
       st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=6, max_size=6),
       st.lists(st.one_of(st.integers(-5, 300), st.floats(allow_nan=True, allow_infinity=True),
                          st.sampled_from([0.0, -0.0])), min_size=1, max_size=30))
def test_a_one_axis_curve_remembers_the_values_it_computes(nodes, values, xs):
    """The memo of a one-axis curve gives, for every point asked again (ints, floats, -0.0, NaN,
    infinities), the float the computation gives (compared as bits: NaN with NaN)."""
    nodes.sort()
    c = Curve(["num_reqs"], [nodes], values[:len(nodes)])
    for x in xs + xs:  # each point twice: the second from the memo
        got, want = c(x), _fresh(c, x)
        assert got == want or (math.isnan(got) and math.isnan(want))
        assert math.copysign(1.0, got) == math.copysign(1.0, want)
