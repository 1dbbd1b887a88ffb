"""Predicted against measured: rows, error summary, table, CSV, plot and the JSON object.

Relative error = (predicted - measured) / measured. The overlap/normal speedup is each non-normal
setting's output throughput over the ``normal`` run's (the same configuration); its error is
in percentage points: 100 x (predicted speedup - measured speedup).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

ROW_METRICS = ("output_throughput", "mean_gap_ms", "p99_gap_ms", "median_tpot_ms", "median_itl_ms", "median_ttft_ms")
SUMMARY_METRICS = ("output_throughput", "median_tpot_ms", "median_ttft_ms", "mean_gap_ms")
LABELS = {"output_throughput": "throughput (tok/s)", "mean_gap_ms": "mean gap (ms)", "p99_gap_ms": "p99 gap (ms)",
          "median_tpot_ms": "median TPOT (ms)", "median_itl_ms": "median ITL (ms)", "median_ttft_ms": "median TTFT (ms)",
          "speedup": "speedup vs normal"}


def _rel(pred: float, meas: float) -> float | None:
    if pred is None or meas is None or not math.isfinite(pred) or not math.isfinite(meas) or meas == 0:
        return None
    return (pred - meas) / meas


def cpu_per_forward(case: dict) -> float | None:
    """How CPU-bound a case really is: a decode step's CPU phases (recv, schedule, launch,
    process) over its forward, measured in the ``normal`` runs (median over runs; None without
    phase records). Under 1 the forward is longer (overlap hides the CPU); over 1 the CPU is."""
    ratios = []
    for run in case.get("runs", {}).get("normal", []):
        ph = run.get("phases_ms") or {}
        fwd = ph.get("forward.decode")
        cpu = [ph.get(f"{k}.decode") for k in ("recv", "schedule", "launch", "process")]
        if fwd and all(v is not None and math.isfinite(v) for v in cpu) and math.isfinite(fwd):
            ratios.append(sum(cpu) / fwd)
    return statistics.median(ratios) if ratios else None


def run_disturbed(run: dict) -> bool:
    """Whether a kept harness run was disturbed (other processes busy, or a core slow right after
    it): the run validate takes again, kept when every attempt was (see
    :func:`calibrate.validate.runner._quiet_run`)."""
    from calibrate.validate.runner import BUSY_CORES, SLOW_FACTOR

    return (run.get("other_cores") or 0) > BUSY_CORES or (run.get("slow_after") or 0) > SLOW_FACTOR


def case_rows(case: dict) -> list[dict]:
    """One row per setting of a case record (:func:`calibrate.validate.runner.validate_case`)."""
    rows = []
    ratio = cpu_per_forward(case)
    meas, pred = case["measured"], case["predicted"]
    base_m = meas.get("normal", {}).get("output_throughput")
    base_p = pred.get("normal", {}).get("output_throughput")
    cfg = case["config"]
    for setting in meas:
        m, p = meas[setting], pred[setting]
        row = {"config": case["name"], "regime": case["regime"], "finish": cfg["finish"], "setting": setting,
               "concurrency": cfg["concurrency"], "stop_strings": cfg["stop_strings"],
               "measured_cpu_per_forward": ratio}
        for key in ROW_METRICS:
            row[f"predicted_{key}"] = p.get(key)
            row[f"measured_{key}"] = m.get(key)
            row[f"rel_error_{key}"] = _rel(p.get(key), m.get(key))
        if setting != "normal" and base_m and base_p:
            row["predicted_speedup"] = p["output_throughput"] / base_p
            row["measured_speedup"] = m["output_throughput"] / base_m
            row["speedup_error_pp"] = 100.0 * (row["predicted_speedup"] - row["measured_speedup"])
        else:
            row["predicted_speedup"] = row["measured_speedup"] = row["speedup_error_pp"] = None
        kept = case.get("runs", {}).get(setting, [])
        loads = [r.get("other_cores") for r in kept if r.get("other_cores") is not None]
        row["other_cores"] = max(loads) if loads else None
        row["disturbed"] = any(run_disturbed(r) for r in kept) if kept else None
        rows.append(row)
    return rows


def summarize_errors(rows: list[dict]) -> dict:
    """``{metric: {"median_abs_rel_error", "max_abs_rel_error"}, "speedup": {"median_abs_error_pp",
    "max_abs_error_pp"}}`` over ``rows`` (None where no row has the value)."""
    out = {}
    for key in SUMMARY_METRICS:
        errs = [abs(r[f"rel_error_{key}"]) for r in rows if r.get(f"rel_error_{key}") is not None]
        out[key] = {"median_abs_rel_error": statistics.median(errs) if errs else None,
                    "max_abs_rel_error": max(errs) if errs else None}
    pp = [abs(r["speedup_error_pp"]) for r in rows if r.get("speedup_error_pp") is not None]
    out["speedup"] = {"median_abs_error_pp": statistics.median(pp) if pp else None,
                      "max_abs_error_pp": max(pp) if pp else None}
    return out


def worst(rows: list[dict], key: str) -> dict | None:
    """The row with the largest |error| of ``key`` (a metric, or ``speedup``)."""
    col = "speedup_error_pp" if key == "speedup" else f"rel_error_{key}"
    scored = [r for r in rows if r.get(col) is not None]
    return max(scored, key=lambda r: abs(r[col])) if scored else None


def overall_line(rows: list[dict]) -> str:
    """One line: median and worst |relative error| per metric, speedup error in points."""
    s = summarize_errors(rows)
    parts = []
    for key in SUMMARY_METRICS:
        e = s[key]
        if e["median_abs_rel_error"] is None:
            continue
        w = worst(rows, key)
        parts.append(f"{LABELS[key].split(' (')[0]} {100 * e['median_abs_rel_error']:.1f}% "
                     f"(worst {100 * e['max_abs_rel_error']:.1f}%, {w['config']} {w['setting']})")
    sp = s["speedup"]
    if sp["median_abs_error_pp"] is not None:
        w = worst(rows, "speedup")
        parts.append(f"speedup {sp['median_abs_error_pp']:.1f} pp (worst {sp['max_abs_error_pp']:.1f} pp, "
                     f"{w['config']} {w['setting']})")
    return "median |error|: " + "; ".join(parts)


def _fmt(p, m, err, digits: int) -> str:
    if p is None or m is None:
        return "-"
    e = "" if err is None else f" {100 * err:+.0f}%"
    return f"{p:.{digits}f} / {m:.{digits}f}{e}"


def print_table(rows: list[dict], title: str, console=None) -> None:
    """A rich table (predicted / measured and the relative error) and the overall line."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=title)
    for col in ("configuration", "regime", "setting", "throughput (tok/s)", "median TPOT (ms)", "median ITL (ms)",
                "median TTFT (ms)", "mean gap (ms)", "p99 gap (ms)", "speedup"):
        # names and regimes never wrap: an -eos and a -length configuration must stay apart
        table.add_column(col, justify="left" if col in ("configuration", "regime", "setting") else "right",
                         no_wrap=col in ("configuration", "regime", "setting"))
    for r in rows:
        cells = [_fmt(r[f"predicted_{k}"], r[f"measured_{k}"], r[f"rel_error_{k}"], d)
                 for k, d in (("output_throughput", 0), ("median_tpot_ms", 3), ("median_itl_ms", 3),
                              ("median_ttft_ms", 2), ("mean_gap_ms", 3), ("p99_gap_ms", 3))]
        sp = "-" if r["speedup_error_pp"] is None else \
            f"{r['predicted_speedup']:.3f} / {r['measured_speedup']:.3f} {r['speedup_error_pp']:+.1f}pp"
        load = "" if not r.get("other_cores") or r["other_cores"] < 0.2 else " (busy host)"
        ratio = r.get("measured_cpu_per_forward")
        regime = r["regime"] + ("" if ratio is None else f" ({ratio:.2f})")
        table.add_row(r["config"], regime, r["setting"] + load, *cells, sp)
    console.print(table)
    console.print("cells: predicted / measured, relative error; regime (a decode step's CPU time over its forward, "
                  "measured in the normal loop)")
    console.print(overall_line(rows), highlight=False)


def write_csv(rows: list[dict], path: Path) -> None:
    import pandas as pd

    from sim.atomic import atomic_path

    with atomic_path(path) as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False)


REL_TOLERANCE = 0.05  # the targets: median |error| of throughput and TPOT within 5%,
SPEEDUP_TOLERANCE_PP = 3.0  # the speedup within 3 points
PLOT_KEYS = ("output_throughput", "median_tpot_ms", "median_ttft_ms", "mean_gap_ms", "p99_gap_ms", "speedup")
MARKERS = {"normal": "o", "overlap": "s", "thread_overlap": "^", "overlap_mlx": "D"}
RING_COLOR = "black"  # around a disturbed run's point (red is overlap_mlx's colour)


def _robust_limits(t: list[float]) -> tuple[float, float, float]:
    """(low, high, pad) in the plotted scale: the range of the values less far outliers, those that
    alone would take more than half of the axis (at most two at each end), and the padding."""
    a = sorted(t)
    lo, hi = 0, len(a) - 1
    for _ in range(2):
        if hi - lo >= 3 and a[hi] - a[hi - 1] > a[hi - 1] - a[lo]:
            hi -= 1
        if hi - lo >= 3 and a[lo + 1] - a[lo] > a[hi] - a[lo + 1]:
            lo += 1
    pad = (a[hi] - a[lo]) * 0.08 or 0.05 * max(abs(a[hi]), 1e-12)
    return a[lo], a[hi], pad


def plot_figure(rows: list[dict], title: str):
    """Predicted against measured, one panel per metric: points numbered by configuration (key
    below), runs kept though disturbed ringed in black, the y = x line dashed in a band of the targets
    (±5%; ±3 points for the speedup). Panels whose values span more than 20x are log-log (values
    at or under the floor drawn on it, hollow); far outliers sit on the axis edge, hollow, with
    their values written beside them. Returns the Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    from sim.output.plots import fmt_value, plain_log_ticks, setting_color

    configs = list(dict.fromkeys(r["config"] for r in rows))
    number = {c: i + 1 for i, c in enumerate(configs)}
    regime = {r["config"]: r["regime"] for r in rows}
    base_disturbed = {r["config"]: bool(r.get("disturbed")) for r in rows if r["setting"] == "normal"}
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    fig, axes = plt.subplots(2, 3, figsize=(13, 8.6))
    clipped_any = floored_any = False
    for ax, key in zip(axes.flat, PLOT_KEYS):
        pts = []
        for r in rows:
            m, p = r.get(f"measured_{key}"), r.get(f"predicted_{key}")
            if m is None or p is None or not (math.isfinite(m) and math.isfinite(p)):
                continue
            dist = bool(r.get("disturbed")) or (key == "speedup" and base_disturbed.get(r["config"], False))
            pts.append((m, p, r["setting"], number[r["config"]], dist))
        ax.set_title(LABELS[key])
        ax.set_xlabel("measured")
        ax.set_ylabel("predicted")
        if not pts:
            ax.axis("off")
            ax.text(0.5, 0.5, "no values in these rows", transform=ax.transAxes, ha="center", va="center",
                    color="0.4")
            continue
        vals = [v for q in pts for v in q[:2]]
        positive = [v for v in vals if v > 0]
        log = key != "speedup" and len(positive) > 1 and max(positive) / min(positive) > 20
        if log:
            floor = max(min(positive), max(positive) * 1e-3) / 1.5
            fwd, inv = (lambda v: math.log10(max(v, floor))), (lambda t: 10 ** t)
        else:
            fwd, inv = (lambda v: v), (lambda t: t)
        keep_lo, keep_hi, pad = _robust_limits([fwd(v) for v in vals])
        lo, hi = keep_lo - 0.5 * pad, keep_hi + 0.5 * pad  # outliers are drawn on these lines
        lo_v, hi_v = inv(keep_lo - pad), inv(keep_hi + pad)
        # the target band around y = x, and the line
        xs = np.geomspace(lo_v, hi_v, 50) if log else np.linspace(lo_v, hi_v, 50)
        if key == "speedup":
            tol = SPEEDUP_TOLERANCE_PP / 100
            ax.fill_between(xs, xs - tol, xs + tol, color="0.85", linewidth=0, zorder=0)
        else:
            ax.fill_between(xs, xs * (1 - REL_TOLERANCE), xs * (1 + REL_TOLERANCE), color="0.85", linewidth=0,
                            zorder=0)
        ax.plot(xs, xs, "k--", lw=0.8, zorder=1)
        for m, p, setting, n, dist in pts:
            tx, ty = fwd(m), fwd(p)
            cx, cy = min(max(tx, lo), hi), min(max(ty, lo), hi)
            outlier = (cx, cy) != (tx, ty)  # beyond the robust limits: on the edge
            on_floor = log and (m < floor or p < floor)  # 0 (or tiny) on a log axis: on the floor
            out = outlier or on_floor
            x, y = inv(cx), inv(cy)
            color = setting_color(setting, settings.index(setting))
            ax.scatter([x], [y], marker=MARKERS.get(setting, "x"), s=36, zorder=3, alpha=0.85,
                       facecolors="none" if out else color, edgecolors=color, linewidths=1.2)
            if dist:
                ax.scatter([x], [y], marker="o", s=190, facecolors="none", edgecolors=RING_COLOR, linewidths=1.3,
                           zorder=4)
            floored_any |= on_floor
            if not outlier:
                ax.annotate(str(n), (x, y), xytext=(7, 5) if dist else (4, 3), textcoords="offset points",
                            fontsize=7.5, color="0.15", zorder=5)  # clear of the ring
            else:  # its number and its values, inside the axes
                clipped_any = True
                right, top = cx >= hi, cy >= hi
                ax.annotate(f"{n} ({fmt_value(m)}, {fmt_value(p)})", (x, y),
                            xytext=(-5 if right else 5, -5 if top else 5), textcoords="offset points", fontsize=7,
                            color="0.25", zorder=5, ha="right" if right else "left", va="top" if top else "bottom")
        if log:
            ax.set_xscale("log")
            ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            if log:
                plain_log_ticks(axis, hi_v / lo_v)
            elif hi_v >= 1e4:  # 10k, 20k: wide labels ran together on the throughput panel
                axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:,.10g}k" if v else "0"))
            else:
                axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.10g}"))
        ax.set_xlim(lo_v, hi_v)
        ax.set_ylim(lo_v, hi_v)
        ax.set_aspect("equal", adjustable="box")
        ax.grid(alpha=0.25)
    handles = [Line2D([], [], linestyle="none", marker=MARKERS.get(s, "x"), color=setting_color(s, i), label=s)
               for i, s in enumerate(settings)]
    handles += [Line2D([], [], color="k", linestyle="--", lw=0.8, label="predicted = measured"),
                Patch(facecolor="0.85",
                      label=f"target band: ±{REL_TOLERANCE:.0%} (speedup ±{SPEEDUP_TOLERANCE_PP:g} points)")]
    if any(r.get("disturbed") for r in rows):
        handles.append(Line2D([], [], linestyle="none", marker="o", ms=11, markerfacecolor="none",
                              markeredgecolor=RING_COLOR,
                              label="disturbed run kept (busy host or slow core, after retries)"))
    if clipped_any:
        handles.append(Line2D([], [], linestyle="none", marker="o", markerfacecolor="none", markeredgecolor="0.3",
                              label="hollow on an edge: a far outlier; (measured, predicted) beside it"))
    if floored_any:
        handles.append(Line2D([], [], linestyle="none", marker="o", markerfacecolor="none", markeredgecolor="0.3",
                              label="hollow on a log panel's low end: 0, or under 1/1000 of the largest value"))
    key_lines = [f"{number[c]}  {c} ({regime[c]})" for c in configs]
    per_col = math.ceil(len(key_lines) / 3)
    key_top = 0.015 + 0.02 * per_col  # the configuration key at the bottom, the legend above it
    fig.tight_layout(rect=(0, key_top + 0.085, 1, 0.975 - 0.025 * (title.count("\n") + 1)))
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, key_top + 0.08), ncol=3, fontsize=8,
               frameon=False)
    for j in range(3):
        fig.text(0.06 + 0.32 * j, key_top, "\n".join(key_lines[j * per_col:(j + 1) * per_col]),
                 fontsize=8, va="top", family="monospace")
    fig.suptitle(title)
    return fig


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Write :func:`plot_figure` to ``path`` (PNG)."""
    import matplotlib.pyplot as plt

    from sim.atomic import atomic_path

    fig = plot_figure(rows, title)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight")
    finally:
        plt.close(fig)


def json_object(rows: list[dict]) -> dict:
    """The ``--json`` object: ``{"rows": [...], "summary": {...}}``."""
    return {"rows": rows, "summary": summarize_errors(rows)}
