"""One streamed metric: its count, its sum and a DDSketch quantile sketch, fed value by value
or in blocks, the same numbers either way (:class:`Stat`); and a running sum computed with numpy
as a loop of ``+=`` computes it (:func:`running_sum`). :mod:`sim.trace.streaming` keeps one per
metric.
"""

from __future__ import annotations

import math
from array import array

import numpy as np
from ddsketch.mapping import LogarithmicMapping

RELATIVE_ACCURACY = 0.005
FOLD = 65536  # values a metric buffers before counting them (memory: 16 bytes each)
_LN2 = math.log(2)
BIN_SPAN = 1 << 20  # bucket keys a fold counts with one bincount (memory: 8 MiB at most); wider: sorted
_UNIT = array("q", [1])  # a unit weight (times k: k of them)


class Stat:
    """Count, sum and a DDSketch quantile sketch of one metric (seconds in, ms out).

    Values are buffered (two flat arrays) and folded into the sketch in blocks of up to
    :data:`FOLD` with numpy: the count, the total (a running sum in the order the values came,
    ``np.add.accumulate``: the same additions a loop of ``+=`` makes) and the buckets: the same
    keys as DDSketch's logarithmic mapping (relative accuracy :data:`RELATIVE_ACCURACY`), read
    with DDSketch's own rank walk when the run ends, so the quantiles equal those of
    ``DDSketch.add`` value by value (``tests/test_streaming.py`` checks it). A key is computed with
    numpy's log; where its unrounded value lies within 1e-6 of an integer (where a last-digit
    difference between numpy's and the math module's log could move it) it is taken from
    ``math.log``, as DDSketch takes it.
    """

    __slots__ = ("count", "total", "zero", "bins", "_multiplier", "_min_possible", "_values", "_weights")

    _mapping = LogarithmicMapping(RELATIVE_ACCURACY)  # DDSketch(relative_accuracy=...)'s mapping

    def __init__(self):
        self.count = 0
        self.total = 0.0
        self.zero = 0  # weight of values at or below the smallest the mapping tells from 0
        self.bins: dict[int, int] = {}  # bucket key -> weight
        m = self._mapping
        assert m._offset == 0.0  # DDSketch's mapping: keys are not shifted
        self._multiplier, self._min_possible = m._multiplier, m.min_possible
        self._values, self._weights = array("d"), array("q")

    def add(self, value: float, weight: int = 1) -> None:
        """Add ``value`` (seconds; a negative value counts as 0 in the quantiles) ``weight`` times."""
        values = self._values
        values.append(value)
        self._weights.append(weight)
        if len(values) >= FOLD:
            self.fold()

    def add_once_each(self, values: list[float] | np.ndarray) -> None:
        """:meth:`add` of each value (seconds; a list of floats, or a float64 array) once, in order."""
        if isinstance(values, list):
            self._values.fromlist(values)
        else:
            self._values.frombytes(np.ascontiguousarray(values, dtype=np.float64).tobytes())
        self._weights.extend(_UNIT * len(values))
        if len(self._values) >= FOLD:
            self.fold()

    def add_many(self, values: np.ndarray, weights: np.ndarray) -> None:
        """:meth:`add` of each value (an array, seconds) with its weight (an int array), in order."""
        self._values.frombytes(np.ascontiguousarray(values, dtype=np.float64).tobytes())
        self._weights.frombytes(np.ascontiguousarray(weights, dtype=np.int64).tobytes())
        if len(self._values) >= FOLD:
            self.fold()

    def fold(self) -> None:
        """Count the buffered values into the count, total, zero weight and buckets."""
        if not self._values:
            return
        values = np.frombuffer(self._values, dtype=np.float64)
        weights = np.frombuffer(self._weights, dtype=np.int64)
        self.count += int(weights.sum())
        self.total = running_sum(self.total, values * weights)
        inside = values > self._min_possible  # LogarithmicMapping.key: ceil(log(value, 2) * multiplier) + 0
        if not inside.all():
            self.zero += int(weights[~inside].sum())
            values, weights = values[inside], weights[inside]
        if len(values):
            # math.log(value, 2) is log(value) / log(2): the same double
            x = np.log(values) / _LN2 * self._multiplier
            keys = np.ceil(x)
            for i in np.flatnonzero(np.abs(x - np.rint(x)) < 1e-6):
                keys[i] = math.ceil(math.log(float(values[i])) / _LN2 * self._multiplier)
            ints = keys.astype(np.int64)
            low = int(ints.min())
            if int(ints.max()) - low < BIN_SPAN:  # weights by key over the keys' span (no sort)
                span = ints - low
                unique = np.flatnonzero(np.bincount(span))  # the keys present (a weight of 0 included)
                sums = np.bincount(span, weights=weights)[unique]
                unique += low
            else:  # values over very many orders of magnitude
                unique, where = np.unique(ints, return_inverse=True)
                sums = np.bincount(where, weights=weights)
            bins = self.bins
            for key, weight in zip(unique.tolist(), sums.astype(np.int64).tolist()):
                bins[key] = bins.get(key, 0) + weight
        self._values, self._weights = array("d"), array("q")

    def quantile(self, q: float) -> float:
        """The q-quantile (0..1) in seconds, as ``DDSketch.get_quantile_value`` (NaN when empty)."""
        self.fold()
        if self.count == 0:
            return math.nan
        rank = q * (self.count - 1)
        if rank < self.zero:
            return 0.0
        rank -= self.zero
        running = 0.0
        keys = sorted(self.bins)
        for key in keys:
            running += self.bins[key]
            if running > rank:
                return self._mapping.value(key)
        return self._mapping.value(keys[-1])

    def into(self, prefix: str, out: dict) -> None:
        self.fold()
        if self.count == 0:
            out[f"mean_{prefix}_ms"] = out[f"median_{prefix}_ms"] = out[f"p99_{prefix}_ms"] = math.nan
            return
        out[f"mean_{prefix}_ms"] = self.total / self.count * 1e3
        out[f"median_{prefix}_ms"] = self.quantile(0.5) * 1e3
        out[f"p99_{prefix}_ms"] = self.quantile(0.99) * 1e3


def running_sum(total: float, values: np.ndarray) -> float:
    """``total`` plus each of ``values`` in order, as a loop of ``+=`` computes it."""
    run = np.empty(len(values) + 1)
    run[0] = total
    run[1:] = values
    np.add.accumulate(run, out=run)
    return float(run[-1])
