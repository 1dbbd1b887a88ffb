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
        loads = [r.get("other_cores") for r in case.get("runs", {}).get(setting, []) if r.get("other_cores") is not None]
        row["other_cores"] = max(loads) if loads else None
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


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Predicted against measured, one panel per metric, the y = x line dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sim.atomic import atomic_path

    keys = ("output_throughput", "median_tpot_ms", "median_ttft_ms", "mean_gap_ms", "p99_gap_ms", "speedup")
    fig, axes = plt.subplots(2, 3, figsize=(13, 8))
    markers = {"normal": "o", "overlap": "s", "thread_overlap": "^", "overlap_mlx": "D"}
    colors = {"normal": "C0", "overlap": "C1", "thread_overlap": "C2", "overlap_mlx": "C3"}  # the same in every panel
    for ax, key in zip(axes.flat, keys):
        pts = [(r[f"measured_{key}"], r[f"predicted_{key}"], r["setting"]) for r in rows
               if r.get(f"measured_{key}") is not None and r.get(f"predicted_{key}") is not None]
        for setting in sorted({p[2] for p in pts}):
            xs = [p[0] for p in pts if p[2] == setting]
            ys = [p[1] for p in pts if p[2] == setting]
            ax.scatter(xs, ys, marker=markers.get(setting, "x"), color=colors.get(setting), label=setting, alpha=0.8)
        if pts:
            vals = [v for p in pts for v in p[:2]]
            lo, hi = min(vals), max(vals)
            pad = (hi - lo) * 0.05 or 0.05
            ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], "k--", lw=0.8)
        ax.set_title(LABELS[key])
        ax.set_xlabel("measured")
        ax.set_ylabel("predicted")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def json_object(rows: list[dict]) -> dict:
    """The ``--json`` object: ``{"rows": [...], "summary": {...}}``."""
    return {"rows": rows, "summary": summarize_errors(rows)}
