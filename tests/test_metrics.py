"""Metric definitions against direct computations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.trace.metrics import weighted_quantile


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(-1e3, 1e3, allow_nan=False), st.integers(0, 20)), min_size=1, max_size=30),
       st.floats(0, 1))
def test_weighted_quantile_matches_repeated_percentile(pairs, q):
    values = np.array([p[0] for p in pairs])
    weights = np.array([p[1] for p in pairs])
    got = weighted_quantile(values, weights, q)
    if weights.sum() == 0:
        assert np.isnan(got)
    else:
        assert got == pytest.approx(np.percentile(np.repeat(values, weights), 100 * q), rel=1e-9, abs=1e-9)
