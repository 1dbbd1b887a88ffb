"""Plots of a run, drawn from its saved tables (so they can be regenerated without simulating).

- gaps.png: GPU gap histogram per setting (ms);
- metrics.png: throughput and latency side by side per setting;
- timeline.png: a strip of a few hundred ms per setting: CPU phases and device forwards.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from sim.atomic import atomic_path  # noqa: E402
from sim.trace.metrics import step_gaps  # noqa: E402

PHASE_COLORS = {"recv": "#9e9e9e", "schedule": "#1f77b4", "launch": "#ff7f0e", "sync wait": "#d62728",
                "process": "#2ca02c"}
KIND_COLORS = {"extend": "#9467bd", "decode": "#17becf"}


def _save(fig, path: Path) -> Path:
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110, bbox_inches="tight", format=Path(path).suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)
    return Path(path)


def gap_histogram(steps: dict[str, pd.DataFrame], title: str):
    """Histogram of device idle gaps between consecutive forwards (ms), one series per setting."""
    fig, ax = plt.subplots(figsize=(7, 4))
    all_gaps = {}
    for name, df in steps.items():
        g = step_gaps(df)[~df["after_idle"].astype(bool)].dropna().to_numpy() * 1e3
        all_gaps[name] = g
    hi = max((g.max() for g in all_gaps.values() if len(g)), default=1.0)
    bins = np.linspace(0, max(hi, 1e-3) * 1.05, 50)
    for name, g in all_gaps.items():
        ax.hist(g, bins=bins, histtype="step", linewidth=1.8, label=f"{name} (n={len(g)})")
    ax.set_xlabel("GPU gap between consecutive forwards (ms)")
    ax.set_ylabel("steps")
    ax.set_yscale("symlog")
    ax.set_title(title)
    ax.legend()
    return fig


def metric_bars(summaries: dict[str, dict], title: str):
    """Bars per setting: output throughput (tok/s), median TTFT, TPOT, ITL and mean gap (ms)."""
    panels = [("output_throughput", "output throughput (tok/s)"), ("median_ttft_ms", "median TTFT (ms)"),
              ("median_tpot_ms", "median TPOT (ms)"), ("p99_itl_ms", "p99 ITL (ms)"), ("mean_gap_ms", "mean GPU gap (ms)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.1 * len(panels), 3.6))
    names = list(summaries)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, label) in zip(axes, panels):
        vals = [summaries[n].get(key) or 0.0 for n in names]
        bars = ax.bar(names, vals, color=colors[: len(names)])
        ax.bar_label(bars, fmt="%.3g", fontsize=8)
        ax.set_title(label, fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _phase_spans(df: pd.DataFrame) -> dict[str, list[tuple[float, float]]]:
    spans = {k: [] for k in PHASE_COLORS}
    for r in df.itertuples(index=False):
        spans["recv"].append((r.recv_start, r.schedule_start - r.recv_start))
        spans["schedule"].append((r.schedule_start, r.schedule_end - r.schedule_start))
        spans["launch"].append((r.launch_start, r.launch_end - r.launch_start))
        spans["sync wait"].append((r.sync_start, r.process_start - r.sync_start))
        spans["process"].append((r.process_start, r.process_end - r.process_start))
    return spans


def timeline(steps: dict[str, pd.DataFrame], title: str, window_s: float = 0.03, start_s: float | None = None):
    """Timeline strip per setting: a CPU lane (phases) and a device lane (forwards), ms axis,
    over ``window_s`` seconds starting at ``start_s`` (default: the middle of the run)."""
    fig, axes = plt.subplots(len(steps), 1, figsize=(11, 1.6 + 1.3 * len(steps)), squeeze=False)
    for ax, (name, df) in zip(axes[:, 0], steps.items()):
        t0 = start_s if start_s is not None else float(df["forward_start"].median())
        t1 = t0 + window_s
        sel = df[(df["process_end"] >= t0) & (df["recv_start"] <= t1)]
        for phase, spans in _phase_spans(sel).items():
            spans = [((s - t0) * 1e3, d * 1e3) for s, d in spans if d > 0]
            ax.broken_barh(spans, (10, 8), facecolors=PHASE_COLORS[phase], label=f"CPU: {phase}")
        for kind, color in KIND_COLORS.items():
            k = sel[sel["kind"] == kind]
            spans = [((s - t0) * 1e3, (e - s) * 1e3) for s, e in zip(k["forward_start"], k["forward_end"])]
            ax.broken_barh(spans, (0, 8), facecolors=color, edgecolor="white", linewidth=0.5, label=f"device: {kind}")
        ax.set_xlim(0, window_s * 1e3)
        ax.set_yticks([4, 14], ["device", "CPU"])
        ax.set_title(f"{name}", fontsize=10, loc="left")
    axes[-1, 0].set_xlabel(f"time (ms) from t = {t0:.3f} s")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, bbox_to_anchor=(0.5, -0.02))
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def save_run_plots(out_dir: Path, scenario_name: str, steps: dict[str, pd.DataFrame],
                   summaries: dict[str, dict]) -> list[Path]:
    """Write gaps.png, metrics.png and timeline.png into ``out_dir``. Returns the paths."""
    out_dir = Path(out_dir)
    # a strip of about 6 decode steps of the slowest setting, capped at a few hundred ms
    step_s = max((float((df["forward_end"] - df["forward_start"]).median()) for df in steps.values() if len(df)),
                 default=0.01)
    window = float(min(0.3, max(0.005, 6 * step_s * 1.5)))
    return [
        _save(gap_histogram(steps, f"{scenario_name}: GPU gaps"), out_dir / "gaps.png"),
        _save(metric_bars(summaries, f"{scenario_name}: throughput and latency"), out_dir / "metrics.png"),
        _save(timeline(steps, f"{scenario_name}: timeline (CPU phases above, device forwards below)", window),
              out_dir / "timeline.png"),
    ]
