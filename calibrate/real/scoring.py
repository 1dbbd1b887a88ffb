"""How a validation against a real server is scored from its repeats: each metric's median
error, the a/b speedup per configuration with its 95% interval over the paired repeats (and
whether the prediction's side of 1 is right where that interval excludes 1), the speedup error
pooled over every configuration and repeat, and the noise floor a perfect model would still show.

A *case* is one configuration's comparison as :func:`calibrate.real.validate.compare` builds it:
``{"name", "settings": {setting: {"measured", "predicted", "error", "runs"}}, "speedup"?}``.
"""

from __future__ import annotations

import math
import statistics

METRICS = ("output_throughput", "median_tpot_ms", "median_ttft_ms", "median_itl_ms")


def _ci95(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high) of a t-interval at 95% (NaN bounds with fewer than 2 values)."""
    from scipy import stats

    m = statistics.fmean(values)
    if len(values) < 2:
        return m, math.nan, math.nan
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return m, m - half, m + half


def speedup(a_runs: list[float], b_runs: list[float], predicted: float, of: str) -> dict:
    """The measured a/b throughput ratio (paired by repeat) with its 95% interval, against ``predicted``."""
    mean, lo, hi = _ci95([x / y for x, y in zip(a_runs, b_runs)])
    decided = lo == lo and (lo > 1.0 or hi < 1.0)  # the interval excludes 1: the measured sign is known
    return {"of": of, "measured_mean": mean, "ci95": [lo, hi], "predicted": predicted,
            "inside_ci": bool(lo <= predicted <= hi) if lo == lo else None, "error_pp": (predicted - mean) * 100,
            "sign_right": bool((predicted > 1.0) == (lo > 1.0)) if decided else None}


def pooled_speedup(cases: list[dict], settings: tuple[str, ...]) -> dict | None:
    """The speedup's error over every configuration and repeat together: per pair (configuration
    c, repeat r) the predicted a/b ratio of c minus the measured a_r / b_r, in points; their mean
    with its 95% t-interval (``error_pp``, ``ci95_pp``), the mean measured ratio and the mean
    prediction. Each configuration's own interval is as wide as the host's run-to-run spread
    makes it (0.14 to 0.59 on this project's VM); pooled, a systematic error of the model shows
    through that spread. None without two settings or with fewer than two pairs."""
    if len(settings) != 2:
        return None
    a, b = settings
    errors, ratios, predicted = [], [], []
    for c in cases:
        if "speedup" not in c or not all("runs" in c["settings"][s] for s in settings):
            continue  # (the drift-corrected cases keep no runs of their own)
        pred = c["speedup"]["predicted"]
        predicted.append(pred)
        for x, y in zip(c["settings"][a]["runs"], c["settings"][b]["runs"]):
            ratio = x["output_throughput"] / y["output_throughput"]
            ratios.append(ratio)
            errors.append((pred - ratio) * 100)
    if len(errors) < 2:
        return None
    mean, lo, hi = _ci95(errors)
    return {"of": f"{a}/{b}", "pairs": len(errors), "measured_mean": statistics.fmean(ratios),
            "predicted_mean": statistics.fmean(predicted), "error_pp": mean, "ci95_pp": [lo, hi]}


def pooled_line(pooled: dict, signs: dict | None = None) -> str:
    """One line for a :func:`pooled_speedup` result (and, given ``signs``, how many loads whose
    measured interval excludes 1 the prediction puts on the same side)."""
    lo, hi = pooled["ci95_pp"]
    line = (f"speedup over all {pooled['pairs']} pairs: measured {pooled['measured_mean']:.3f}, predicted "
            f"{pooled['predicted_mean']:.3f}; error {pooled['error_pp']:+.1f} pp [{lo:+.1f}, {hi:+.1f}]")
    if signs is not None:
        line += (f"; sign right in {signs['right']} of the {signs['decided']} loads whose measured interval "
                 "excludes 1")
    return line


NOISE_FLOOR_DRAWS = 20_000  # Monte Carlo draws of :func:`noise_floor` (fixed seed: the same result every time)


def noise_floor(cases: list[dict], settings: tuple[str, ...], metric: str, bar: float = 0.05) -> dict | None:
    """How large the median |error| over configurations and settings would be for a model that
    knew every configuration's true value, given only how the measured repeats spread.

    Each (configuration, setting) is measured as the median of its n repeats; its relative
    standard error is taken as ``sqrt(pi / 2) * stdev / (sqrt(n) * median)`` (the large-sample
    standard error of a median of normal values). A perfect model's error there is drawn as
    normal with that standard error, and the median of the absolute errors over all K pairs is
    taken as :func:`summary` takes it; over :data:`NOISE_FLOOR_DRAWS` draws (numpy, seed 0)
    that gives ``expected`` (the median), ``p90`` and ``p_within`` (the share of draws at most
    ``bar``). A lower bound: the calibration's own noise, which moves every prediction, is not
    counted. Returns ``{"metric", "pairs", "se_median", "expected", "p90", "bar", "p_within"}``
    (``se_median``: the median of the K relative standard errors), or None when a pair has fewer
    than two repeats."""
    import numpy as np

    ses = []
    for c in cases:
        for s in settings:
            values = [run[metric] for run in c["settings"][s].get("runs", [])]
            if len(values) < 2:
                return None
            ses.append(math.sqrt(math.pi / 2) * statistics.stdev(values)
                       / (math.sqrt(len(values)) * abs(statistics.median(values))))
    draws = np.random.default_rng(0).normal(0.0, ses, (NOISE_FLOOR_DRAWS, len(ses)))
    medians = np.median(np.abs(draws), axis=1)
    return {"metric": metric, "pairs": len(ses), "se_median": statistics.median(ses),
            "expected": float(np.median(medians)), "p90": float(np.quantile(medians, 0.9)), "bar": bar,
            "p_within": float(np.mean(medians <= bar))}


def noise_floor_line(floors: dict) -> str:
    """One line for the :func:`noise_floor` results of several metrics (``{metric: result}``)."""
    cells = ", ".join(f"{m} {f['expected'] * 100:.1f}% (90%: {f['p90'] * 100:.1f}%; "
                      f"<= {f['bar'] * 100:g}% in {f['p_within']:.0%} of draws)" for m, f in floors.items())
    return ("noise floor, median |error| of a model that knew the true values (the repeats' spread only; "
            f"the calibration's noise not counted): {cells}")


def summary(cases: list[dict], settings: tuple[str, ...]) -> dict:
    out = {"median_abs_error": {m: statistics.median(abs(c["settings"][s]["error"][m]) for c in cases
                                                      for s in settings) for m in METRICS},
           "speedup_max_abs_error_pp": max((abs(c["speedup"]["error_pp"]) for c in cases if "speedup" in c),
                                           default=math.nan)}
    if pooled := pooled_speedup(cases, settings):
        out["speedup_pooled"] = pooled
    signs = [c["speedup"].get("sign_right") for c in cases if "speedup" in c]
    out["speedup_signs"] = {"decided": sum(x is not None for x in signs), "right": sum(x is True for x in signs)}
    floors = {m: noise_floor(cases, settings, m) for m in ("output_throughput", "median_tpot_ms")}
    if all(floors.values()):
        out["noise_floor"] = floors
    return out


__all__ = ["METRICS", "speedup", "pooled_speedup", "pooled_line", "noise_floor", "noise_floor_line", "summary"]
