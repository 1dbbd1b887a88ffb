"""Run-to-run variance: spread of metrics across repeats, confidence intervals of the
overlap/normal ratio, and how many runs separate a given gain from noise.

Ratios are analysed on the log scale (a ratio's noise is multiplicative): the interval of a
ratio is the interval of the mean log ratio, exponentiated, i.e. an interval for the geometric
mean ratio.

- :func:`ratio_ci` pairs the two settings' runs that share a seed (the sweep's repeats use
  common random numbers) and gives a Student t-interval over the paired log ratios (default) or a
  percentile bootstrap of their mean.
- :func:`runs_needed` and :func:`single_run_tail` model real servers, where each run of each
  setting is a separately started server: runs are independent and the run-to-run coefficient of
  variation ``cv`` of a metric (e.g. output throughput) is the noise.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

if TYPE_CHECKING:  # pandas and scipy are imported where used: a run's verdict needs neither at start-up
    import pandas as pd

DEFAULT_METRICS = ("output_throughput", "median_ttft_ms", "median_itl_ms", "mean_gap_ms", "gpu_idle_fraction")


def grid_keys(table: pd.DataFrame) -> list[str]:
    """The grid columns of a sweep table: those between ``point`` and ``setting``."""
    cols = list(table.columns)
    if "point" in cols and "setting" in cols:
        return cols[cols.index("point") + 1: cols.index("setting")]
    return []


def spread(table: pd.DataFrame, metrics: Sequence[str] = DEFAULT_METRICS,
           by: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """Each metric's spread across repeats, per grid point and setting.

    Args:
        table: a sweep table (:func:`sim.whatif.sweeps.sweep`).
        metrics: summary keys to describe.
        by: grouping columns (default: ``point``, the grid keys and ``setting``).

    Returns:
        One row per group; columns ``<metric>_mean``, ``_std`` (sample, ddof=1), ``_cv``
        (std/mean), ``_min``, ``_max``, ``n`` (repeats) and ``failed_runs`` (of them, the runs that did
        not serve their load, :func:`served_runs`: a failed run's metrics are a dead server's,
        e.g. a throughput of 0, not a result).
    """
    by = list(by) if by is not None else ["point", *grid_keys(table), "setting"]
    grouped = table.groupby(by, sort=False, dropna=False)
    out = grouped[list(metrics)].agg(["mean", "std", "min", "max"])
    out.columns = [f"{m}_{s}" for m, s in out.columns]
    for m in metrics:
        mean = out[f"{m}_mean"]
        out[f"{m}_cv"] = out[f"{m}_std"] / mean.where(mean != 0)
    out["n"] = grouped.size()
    failed = table.assign(_failed=[not ok for ok in served_runs(table)])
    out["failed_runs"] = failed.groupby(by, sort=False, dropna=False)["_failed"].sum().astype(int)
    return out.reset_index()


def served_runs(table: pd.DataFrame) -> list[bool]:
    """Whether each run (row) of a sweep table served its load (:func:`sim.trace.metrics.served`:
    the server did not die, column ``outcome``, and a measured request completed; a table from
    before either column counts as served)."""
    from sim.trace.metrics import served

    n = len(table)
    outcome = table["outcome"] if "outcome" in table else ["ok"] * n
    completed = table["completed"] if "completed" in table else [1] * n
    return [served({"outcome": o, "completed": c}) for o, c in zip(outcome, completed)]


def paired_ratios(table: pd.DataFrame, metric: str = "output_throughput", num: str = "overlap",
                  den: str = "normal") -> pd.DataFrame:
    """``num``/``den`` of ``metric`` for every grid point and repeat (runs sharing a seed); NaN at
    a point where either setting failed in some repeat (:func:`failed_settings`: no ratio of any
    metric there).

    Returns columns ``point``, the grid keys, ``repeat``, ``seed`` and ``ratio``."""
    keys = ["point", *grid_keys(table), "repeat", "seed"]
    a = table[table["setting"] == num].set_index(keys)[metric]
    b = table[table["setting"] == den].set_index(keys)[metric]
    if a.empty or b.empty:
        raise ValueError(f"the table needs both settings {num!r} and {den!r}")
    pr = (a / b).rename("ratio").reset_index()
    pr["ratio"] = pr["ratio"].where(~pr["point"].isin(failed_settings(table, (num, den))))
    return pr


def failed_settings(table: pd.DataFrame, settings: Sequence[str]) -> dict[int, list[str]]:
    """Grid point -> which of ``settings`` were not served in some repeat there
    (:func:`sim.trace.metrics.served` of each run's row: the server died, column ``outcome``, or
    no request completed; a table from before either column counts as served): no ratio is shown
    for such a point."""
    out: dict[int, list[str]] = {}
    for point, setting, ok in zip(table["point"], table["setting"], served_runs(table)):
        if setting in settings and not ok and setting not in out.get(point, ()):
            out.setdefault(point, []).append(setting)
    return {p: sorted(v, key=list(settings).index) for p, v in out.items()}


def log_ratio_interval(ratios: Sequence[float], level: float = 0.95, method: str = "t",
                       n_boot: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """(geometric mean, low, high) of positive ratios; NaN bounds with fewer than 2 ratios.

    ``method``: ``"t"`` (Student t-interval on the log ratios) or ``"bootstrap"`` (percentile
    bootstrap of the mean log ratio, ``n_boot`` resamples, seeded)."""
    from scipy import stats  # deferred: SciPy takes a while to import

    r = np.asarray(ratios, dtype=np.float64)
    r = r[(r > 0) & np.isfinite(r)]  # a ratio of 0 (a metric at 0 under one setting, e.g. no gap) has no log
    logs = np.log(r)
    n = len(logs)
    if n == 0:
        return (math.nan, math.nan, math.nan)
    centre = float(np.exp(logs.mean()))
    if n < 2:
        return (centre, math.nan, math.nan)
    if method == "t":
        half = stats.t.ppf(0.5 + level / 2, n - 1) * logs.std(ddof=1) / math.sqrt(n)
        return (centre, float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half)))
    if method == "bootstrap":
        rng = np.random.default_rng(seed)
        means = logs[rng.integers(0, n, size=(n_boot, n))].mean(axis=1)
        lo, hi = np.quantile(means, [0.5 - level / 2, 0.5 + level / 2])
        return (centre, float(np.exp(lo)), float(np.exp(hi)))
    raise ValueError(f"unknown method {method!r}; expected 't' or 'bootstrap'")


def ratio_ci(table: pd.DataFrame, metric: str = "output_throughput", num: str = "overlap", den: str = "normal",
             level: float = 0.95, method: str = "t") -> pd.DataFrame:
    """Confidence interval of the ``num``/``den`` ratio of ``metric`` per grid point, over the
    paired repeats (see :func:`log_ratio_interval`).

    Returns one row per grid point: ``point``, the grid keys, ``n`` (repeats), ``ratio``
    (geometric mean), ``ci_low``, ``ci_high``, ``level``, ``method`` and ``failed_settings``: the settings
    that failed in a repeat there, space-separated (:func:`failed_settings`), where the three are
    NaN (:func:`paired_ratios` gives no ratio there); empty where both served, so a NaN ratio with
    ``failed_settings`` empty is a metric without a ratio (0 or undefined under a setting: no gap)."""
    pr = paired_ratios(table, metric, num, den)  # (NaN where a setting failed: no interval there)
    failed = failed_settings(table, (num, den))
    keys = ["point", *grid_keys(table)]
    rows = []
    for values, group in pr.groupby(keys, sort=False, dropna=False):
        centre, lo, hi = log_ratio_interval(group["ratio"].to_numpy(), level, method)
        values = values if isinstance(values, tuple) else (values,)
        row = dict(zip(keys, values))
        rows.append({**row, "n": len(group), "ratio": centre, "ci_low": lo, "ci_high": hi, "level": level,
                     "method": method, "failed_settings": " ".join(failed.get(row["point"], ()))})
    import pandas as pd

    return pd.DataFrame(rows)


def log_sigma(cv: float) -> float:
    """Standard deviation of log(X) for a lognormal X with coefficient of variation ``cv``."""
    return math.sqrt(math.log1p(cv * cv))


def single_run_tail(cv: float, true_ratio: float, observed_ratio: float) -> float:
    """Probability that one A/B pair (one run per setting, independent servers with run-to-run
    CV ``cv`` each) shows a ratio at least as far from ``true_ratio`` as ``observed_ratio`` is,
    on the log scale, in either direction (a two-sided tail probability)."""
    from scipy import stats  # deferred: SciPy takes a while to import

    if cv <= 0:
        return 1.0 if observed_ratio == true_ratio else 0.0
    sd = math.sqrt(2) * log_sigma(cv)  # log of a ratio of two independent runs
    d = abs(math.log(observed_ratio) - math.log(true_ratio))
    return float(2 * stats.norm.sf(d / sd))


def runs_needed(cv: float, effect: float = 1.1, alpha: float = 0.05, power: float = 0.8,
                max_runs: int = 100_000) -> int:
    """Runs of each setting needed so that a two-sided two-sample t-test on log throughput at
    level ``alpha`` detects a true ratio ``effect`` with probability ``power`` (exact power from
    the noncentral t distribution). Runs are independent server starts with run-to-run CV ``cv``.

    Raises:
        ValueError: ``effect == 1`` (nothing to detect) or not reachable within ``max_runs``."""
    from scipy import stats  # deferred: SciPy takes a while to import

    delta = abs(math.log(effect))
    if delta == 0:
        raise ValueError("effect must differ from 1")
    sigma = log_sigma(cv)
    if sigma == 0:
        return 1
    # the normal approximation is a lower bound for the t-test: start just below it
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    n = max(2, int(2 * (z * sigma / delta) ** 2) - 1)
    while n <= max_runs:
        df = 2 * n - 2
        nc = delta / (sigma * math.sqrt(2 / n))
        crit = stats.t.ppf(1 - alpha / 2, df)
        lower = stats.nct.cdf(-crit, df, nc)  # can come back NaN when negligible
        if stats.nct.sf(crit, df, nc) + (0.0 if math.isnan(lower) else lower) >= power:
            return n
        n += 1
    raise ValueError(f"more than {max_runs} runs needed")
