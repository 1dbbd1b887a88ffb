"""Plots of sweeps, server logs, measured gaps and Chrome traces, drawn from saved tables/files.

- sweep_<key>.png: metrics against one grid key, a line per setting and per value of the other keys
  (with repeats: their mean, and a band from their min to max);
- ratio_heatmap.png: overlap/normal ratio over two grid keys with the break-even (ratio 1) line;
- ratio_ci.png: the ratio per grid point with its confidence interval (sweeps with repeats);
- the server log over time; measured gaps beside the predicted ones; a preview of a Chrome trace.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
from matplotlib import patheffects
from matplotlib.lines import Line2D

from sim.output.plots import (KIND_COLORS, MEASURED_COLOR, PHASE_COLORS, ZERO_GAP_MS, _save, draw_gap_panels,
                              fmt_value, plain_log_ticks, plt, setting_color)
from sim.output.report import ratio_pair
from sim.whatif.variance import failed_settings, grid_keys, paired_ratios, ratio_ci

LINE_METRICS = (("output_throughput", "output throughput (tok/s)"), ("median_ttft_ms", "median TTFT (ms)"),
                ("median_itl_ms", "median ITL (ms)"), ("mean_gap_ms", "mean GPU gap (ms)"))
STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _style(i: int) -> str:
    """Line style of the i-th combination of other grid keys: with its marker (``MARKERS[i % 8]``)
    unique for 32 combinations."""
    return STYLES[(i + i // len(MARKERS)) % len(STYLES)]


def _numeric(values: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)


def _label(v) -> str:
    return f"{v:g}" if isinstance(v, (float, np.floating)) else str(v)


def _short(key: str) -> str:
    return ".".join(key.split(".")[-2:])


def _select(df: pd.DataFrame, keys: list, values: tuple) -> pd.DataFrame:
    """The rows of ``df`` whose ``keys`` hold ``values`` (a NaN value matches NaN)."""
    for k, v in zip(keys, values):
        df = df[df[k].isna()] if pd.isna(v) else df[df[k] == v]
    return df


def _format_x(ax, table: pd.DataFrame, key: str, numeric: bool, xs_all: list) -> None:
    """The grid key's axis: its own values as ticks, base-2 log over a wide numeric span."""
    if not numeric:
        ax.set_xticks(range(len(xs_all)), [_label(v) for v in xs_all], rotation=30, fontsize=7)
    ax.set_xlabel(key)
    if numeric and table[key].min() > 0 and table[key].max() / table[key].min() >= 16:
        ax.set_xscale("log", base=2)
    if numeric and len(xs_all) <= 12:  # ticks at the grid's own values
        ax.set_xticks(xs_all, [_label(v) for v in xs_all], fontsize=8, rotation=30 if len(xs_all) > 6 else 0)
        ax.minorticks_off()


def num_repeats(table: pd.DataFrame) -> int:
    """Runs per grid point and setting (the most of any point)."""
    by = grid_keys(table) + ["setting"]
    return int(table.groupby(by, dropna=False).size().max()) if len(table) else 0


def sweep_lines(table: pd.DataFrame, key: str, scenario: str, run_cv: float | None = None):
    """Metrics (:data:`LINE_METRICS`) against grid ``key``: a line per setting (its colour) and per
    value of the other grid keys (line style and marker; never averaged over them). With repeats,
    the line is their mean and a band spans their min to max (no band with one run per point).
    The ratio panel's dotted lines are one A/B run's noise at ``run_cv`` (the verdict's run-to-run
    CV; None: :data:`sim.whatif.verdict.DEFAULT_RUN_CV`); the title's range is over the points'
    ratios, each the geometric mean of its repeats' (as the sweep's table gives them)."""
    others = [k for k in grid_keys(table) if k != key]
    combos = list(table[others].drop_duplicates().sort_values(others).itertuples(index=False, name=None)) \
        if others else [()]
    reps = num_repeats(table)
    numeric = _numeric(table[key])
    xs_all = sorted(table[key].unique()) if numeric else list(dict.fromkeys(table[key]))
    settings = list(dict.fromkeys(table["setting"]))
    pair = ratio_pair(set(settings))
    panels = len(LINE_METRICS) + (1 if pair else 0)
    fig, axes = plt.subplots(1, panels, figsize=(3.7 * panels, 3.6))
    if pair:
        _ratio_panel(axes[-1], table, key, others, combos, numeric, xs_all, pair, run_cv)
    # a setting that failed at a point (its server died, or it served nothing, in some repeat) has no
    # values there: a gap in its lines, and an x at the foot of each panel
    failed = failed_settings(table, settings)
    dead = pd.Series([s in failed.get(p, ()) for p, s in zip(table["point"], table["setting"])], index=table.index)
    for ax, (metric, label) in zip(axes, LINE_METRICS):
        for si, setting in enumerate(settings):
            color = setting_color(setting, si)
            sub = table[table["setting"] == setting]
            for ci, combo in enumerate(combos):
                g = _select(sub, others, combo)
                if g.empty:
                    continue
                values = g[metric].where(~dead[g.index])
                stats = values.groupby(g[key], sort=numeric).agg(["mean", "min", "max"])
                if not numeric:
                    stats = stats.reindex([v for v in xs_all if v in stats.index])
                x = stats.index.to_numpy() if numeric else np.array([xs_all.index(v) for v in stats.index])
                # a later setting's markers hollow and on top: equal lines stay both visible
                ax.plot(x, stats["mean"], color=color, linestyle=_style(ci), marker=MARKERS[ci % len(MARKERS)],
                        ms=3.5 + 2 * si, linewidth=1.3, markerfacecolor=color if si == 0 else "none",
                        zorder=2 + si)
                if reps > 1:
                    ax.fill_between(x, stats["min"], stats["max"], color=color, alpha=0.12, linewidth=0)
                lost = g.loc[dead[g.index], key].unique()
                if len(lost):
                    xs = lost if numeric else [xs_all.index(v) for v in lost]
                    ax.plot(xs, [0.02] * len(xs), linestyle="none", marker="x", color=color, ms=7, mew=1.8,
                            transform=ax.get_xaxis_transform(), zorder=4, clip_on=False)
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes:
        _format_x(ax, table, key, numeric, xs_all)
    fig.tight_layout(rect=(0, 0, 1, 0.90))
    # legends below the panels, covering no data: colour = setting, style = the other keys' values
    handles = [Line2D([], [], color=setting_color(s, i), linewidth=2.5) for i, s in enumerate(settings)]
    band = ", band: min to max" if reps > 1 else ""
    leg = fig.legend(handles, settings, title=f"setting (colour{band})", loc="upper right",
                     bbox_to_anchor=(0.45 if others else 0.5, 0.0), ncol=len(settings), fontsize=8, title_fontsize=8,
                     frameon=False)
    if others:
        style_handles = [Line2D([], [], color="#555555", linestyle=_style(i),
                                marker=MARKERS[i % len(MARKERS)], ms=4) for i in range(len(combos))]
        style_labels = [", ".join(_label(v) for v in combo) for combo in combos]
        fig.legend(style_handles, style_labels, title=f"{', '.join(_short(k) for k in others)} (line style)",
                   loc="upper left", bbox_to_anchor=(0.55, 0.0), ncol=min(len(combos), 4), fontsize=8,
                   title_fontsize=8, frameon=False)
        fig.add_artist(leg)
    runs = f"mean of {reps} repeats, band: min to max across them" if reps > 1 else "one run per point"
    per = f"; a line per setting and per {', '.join(_short(k) for k in others)}" if others else ""
    finding = ""
    if pair:
        pr = paired_ratios(table, "output_throughput", *pair)
        lost = int((~(pr["ratio"] > 0)).sum())  # runs with no ratio: a setting's server died or served nothing
        # each point's ratio: the geometric mean of its repeats' (NaN where a setting failed in one)
        r = np.exp(_log_ratio(pr["ratio"]).groupby(pr["point"]).agg(lambda s: s.mean(skipna=False)))
        r = r[r > 0]
        if len(r):
            low, high = f"{r.min():.2f}x", f"{r.max():.2f}x"
            finding = f": {pair[0]}/{pair[1]} output throughput {low if low == high else f'{low} to {high}'}"
        if lost:
            finding += (f"{',' if finding else ':'} no ratio in {lost} of {len(pr)} paired runs (a setting "
                        "failed: an x at the foot of the metrics' panels)")
    title = f"{scenario}: sweep over {key}{finding}{per} ({runs})"
    if len(title) > 160:  # (two lines where one would run wider than the panels)
        title = f"{scenario}: sweep over {key}{finding}\n{per.removeprefix('; ')} ({runs})".replace("\n (", "\n(")
    fig.suptitle(title, fontsize=10)
    return fig


def _ratio_panel(ax, table: pd.DataFrame, key: str, others: list, combos: list, numeric: bool, xs_all: list,
                 pair: tuple, run_cv: float | None = None) -> None:
    """The pair's output-throughput ratio against ``key`` (geometric mean over repeats), with the
    verdict's thresholds: the ratio one A/B run shows beyond noise at run-to-run CV ``run_cv``
    (None: the default; :func:`sim.whatif.verdict.threshold_ratio`), above and below break-even."""
    from sim.whatif.verdict import DEFAULT_RUN_CV, threshold_ratio

    run_cv = DEFAULT_RUN_CV if run_cv is None else run_cv
    pr = paired_ratios(table, "output_throughput", *pair)
    pr["log"] = _log_ratio(pr["ratio"])
    for ci, combo in enumerate(combos):
        g = _select(pr, others, combo)
        if g.empty:
            continue
        stats = np.exp(g.groupby(key, sort=numeric)["log"].agg(lambda s: s.mean(skipna=False)))
        if not numeric:
            stats = stats.reindex([v for v in xs_all if v in stats.index])
        x = stats.index.to_numpy() if numeric else np.array([xs_all.index(v) for v in stats.index])
        ax.plot(x, stats.to_numpy(), color="#333333", linestyle=_style(ci), marker=MARKERS[ci % len(MARKERS)],
                ms=3.5, linewidth=1.3)
    t = threshold_ratio(run_cv)
    ax.axhline(1.0, color="black", linewidth=0.8)
    for level in (t, 1 / t):
        ax.axhline(level, color="#888888", linewidth=0.8, linestyle=":")
    ax.set_title(f"{pair[0]}/{pair[1]} output throughput\n(dotted: one A/B run's noise at {run_cv:.1%} CV)",
                 fontsize=9)
    ax.grid(alpha=0.3)


def _log_ratio(ratio: pd.Series) -> pd.Series:
    """The log of each paired ratio; NaN where there is none (a setting failed: ``paired_ratios``)
    or it is not positive (a metric at 0), which a point's mean carries (no ratio there)."""
    return np.log(ratio.where(ratio > 0))


def _pretty(metric: str) -> str:
    return metric.replace("_ms", " (ms)").replace("_", " ")


def ratio_heatmap(table: pd.DataFrame, x_key: str, y_key: str, scenario: str, metric: str = "output_throughput",
                  num: str = "overlap", den: str = "normal", run_cv: float | None = None):
    """Heatmap of the ``num``/``den`` ratio of ``metric`` (geometric mean over repeats and other
    grid keys) over two grid keys, with the break-even contour (ratio = 1) explained in the title
    (no label on the map, which would cover a value), and dotted where one A/B run's noise at
    ``run_cv`` ends (None: the default CV)."""
    pr = paired_ratios(table, metric, num, den)
    pr["log_ratio"] = _log_ratio(pr["ratio"])
    grid = (pr.groupby([y_key, x_key])["log_ratio"].agg(lambda s: s.mean(skipna=False)).unstack(x_key)
            .sort_index().sort_index(axis=1))
    z = np.exp(grid.to_numpy(dtype=float))
    fig, ax = plt.subplots(figsize=(1.6 + 0.9 * z.shape[1], 1.6 + 0.6 * z.shape[0]))
    logs = np.ma.masked_invalid(np.log(z))  # (a cell where a setting failed: masked, left blank)
    low, high = (float(logs.min()), float(logs.max())) if logs.count() else (0.0, 0.0)
    span = max(abs(low), abs(high), 1e-3)
    im = ax.imshow(logs, origin="lower", cmap="RdBu", vmin=-span, vmax=span, aspect="auto")
    contour = z.shape[0] > 1 and z.shape[1] > 1 and low < 0 < high
    if contour:
        ax.contour(logs, levels=[0.0], colors="black", linewidths=1.5, zorder=2)
    from sim.whatif.verdict import DEFAULT_RUN_CV, threshold_ratio

    run_cv = DEFAULT_RUN_CV if run_cv is None else run_cv
    lt = math.log(threshold_ratio(run_cv))
    levels = [v for v in (-lt, lt) if z.shape[0] > 1 and z.shape[1] > 1 and low < v < high]
    if levels:
        ax.contour(logs, levels=levels, colors="black", linewidths=1.0, linestyles=":", zorder=2)
    for (i, j), v in np.ndenumerate(z):
        if not v > 0:  # (NaN: a setting failed there)
            ax.text(j, i, "failed", ha="center", va="center", fontsize=8, color="black", zorder=3)
            continue
        dark = abs(math.log(v)) > 0.6 * span
        # a white halo keeps a value readable where the break-even line passes under it
        effects = [] if dark else [patheffects.withStroke(linewidth=2.5, foreground="white")]
        ax.text(j, i, f"{v:.3f}" if abs(v - 1) < 0.01 else f"{v:.2f}", ha="center", va="center", fontsize=8,
                color="white" if dark else "black", zorder=3, path_effects=effects)
    ax.set_xticks(range(z.shape[1]), [_label(v) for v in grid.columns])
    ax.set_yticks(range(z.shape[0]), [_label(v) for v in grid.index])
    ax.set_xlabel(x_key)
    ax.set_ylabel(y_key)
    cbar = fig.colorbar(im, ax=ax)
    ticks = np.linspace(-span, span, 5)
    cbar.set_ticks(ticks, labels=[f"{math.exp(t):.2f}" for t in ticks])
    cbar.set_label(f"{num}/{den} {_pretty(metric)}")
    better = ">1" if "throughput" in metric else "<1"
    line = "; black line: break-even (ratio 1)" if contour else ""
    if levels:
        line += f"; dotted: beyond one A/B run's noise at {run_cv:.1%} CV ({math.exp(lt):.3f}x)"
    ax.set_title(f"{scenario}: {num}/{den} {_pretty(metric)}\n({better}: {num} better{line})", fontsize=9)
    fig.tight_layout()
    return fig


def ratio_ci_plot(table: pd.DataFrame, scenario: str, metric: str = "output_throughput", level: float = 0.95,
                  num: str = "overlap", den: str = "normal"):
    """The paired ``num``/``den`` ratio per grid point with its t-interval
    (:func:`sim.whatif.variance.ratio_ci`)."""
    ci = ratio_ci(table, metric, num, den, level=level)  # (no ratio at a point where a setting failed)
    failed = failed_settings(table, (num, den))
    keys = grid_keys(table)
    labels = [", ".join(f"{k.split('.')[-1]}={_label(r[k])}" for k in keys) or "scenario" for _, r in ci.iterrows()]
    fig, ax = plt.subplots(figsize=(max(7, 0.5 * len(ci) + 2), 3.8))
    x = np.arange(len(ci))
    for xi, point in zip(x, ci["point"]):
        if point in failed:
            ax.annotate(f"{' and '.join(failed[point])}\nfailed", xy=(xi, 0.5), xycoords=("data", "axes fraction"),
                        ha="center", va="center", fontsize=7, color="#b00000")
    ax.set_xlim(-0.5, len(ci) - 0.5)  # (every point's slot, one without a ratio included)
    lo = (ci["ratio"] - ci["ci_low"]).fillna(0)
    hi = (ci["ci_high"] - ci["ratio"]).fillna(0)
    ax.errorbar(x, ci["ratio"], yerr=[lo, hi], fmt="o", capsize=3, color=setting_color(num))
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
    # the line's name in the right margin, where it covers no point
    ax.annotate("break-even", xy=(1.0, 1.0), xycoords=("axes fraction", "data"), xytext=(4, 0),
                textcoords="offset points", va="center", fontsize=8)
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(f"{num}/{den} {_pretty(metric)}")
    ax.grid(axis="y", alpha=0.3)
    n = int(ci["n"].max()) if len(ci) else 0
    flat = len(ci) and bool(((ci["ci_high"] - ci["ci_low"]).fillna(0).abs() < 1e-9).all())
    why = ("\nno interval: the repeats are identical (the scenario has no run-to-run noise: set costs.noise)"
           if flat else "")
    ax.set_title(f"{scenario}: paired ratio (point) and its {level:.0%} t-interval over {n} repeats{why}", fontsize=9)
    fig.tight_layout()
    return fig


def save_sweep_plots(out_dir: Path, table: pd.DataFrame, scenario: str, run_cv: float | None = None) -> list[Path]:
    """Write every sweep plot that applies into ``out_dir``; returns the paths. ``run_cv``: the
    run-to-run CV the sweep's verdict assumed (None: the default), where the plots draw one A/B
    run's noise."""
    out_dir = Path(out_dir)
    keys = grid_keys(table)
    paths = [_save(sweep_lines(table, k, scenario, run_cv), out_dir / f"sweep_{k}.png") for k in keys]
    pair = ratio_pair(set(table["setting"]))  # overlap/normal (SGLang) or async/sync (vLLM)
    if pair:
        if len(keys) >= 2:
            heatmap = ratio_heatmap(table, keys[0], keys[1], scenario, num=pair[0], den=pair[1], run_cv=run_cv)
            paths.append(_save(heatmap, out_dir / "ratio_heatmap.png"))
        if table["repeat"].max() >= 1:
            paths.append(_save(ratio_ci_plot(table, scenario, num=pair[0], den=pair[1]), out_dir / "ratio_ci.png"))
    return paths


def log_timeline(df: pd.DataFrame, title: str):
    """A server log over time: running requests and queue, KV token usage, generation throughput,
    prefill tokens; one series per rank if several ranks log. Each panel names its unit on the
    y axis; legends sit to the right of the panels, off the data."""
    panels = [((("running_req", "running requests"), ("queue_req", "waiting queue")), "requests"),
              ((("token_usage", "KV token usage"),), "KV token usage\n(fraction of the pool)"),
              ((("gen_throughput_tok_s", "gen throughput"),), "generation\nthroughput (tok/s)"),
              ((("new_token", "prefill new tokens"), ("cached_token", "prefill cached tokens")),
               "prefill tokens\nper batch")]
    rank_cols = [c for c in df.columns if c.endswith("_rank")]
    groups = list(df.groupby(rank_cols, sort=True)) if rank_cols else [((), df)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 7.5), sharex=True)
    for ax, (series, ylabel) in zip(axes, panels):
        for col, label in series:
            if col not in df:
                continue
            for rank, g in groups:
                g = g[g[col].notna()]
                rank = rank if isinstance(rank, tuple) else (rank,)
                suffix = "".join(f" {c[:-5].upper()}{int(v)}" for c, v in zip(rank_cols, rank)) if len(groups) > 1 else ""
                if col in ("new_token", "cached_token"):
                    ax.plot(g["t_s"], g[col], ".", ms=4, label=label + suffix)
                else:
                    ax.step(g["t_s"], g[col], where="post", linewidth=1.2, label=label + suffix)
        vals = pd.concat([df[c] for c, _ in series if c in df]).dropna() if any(c in df for c, _ in series) else []
        if ylabel.startswith("prefill") and len(vals) and vals.min() > 0 and vals.max() / vals.min() > 50:
            ax.set_yscale("log")  # new tokens (a few) and cached ones (thousands) both readable
            plain_log_ticks(ax.yaxis, vals.max() / vals.min())
            ylabel += " (log)"
        ax.set_ylabel(ylabel, fontsize=8)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("batch line (the log has no timestamps)" if df.attrs.get("t_is_line_order")
                        else "time since first batch line (s)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def measured_gap_histogram(gaps_ms: list[float], title: str, predicted: Optional[dict[str, np.ndarray]] = None):
    """Measured gaps between consecutive forward steps (ms) and, with ``predicted`` (setting ->
    the simulated gaps of an ``overlap-sim run``, :func:`sim.output.plots.measured_gaps`), the
    prediction beside them, as shares of each series' gaps (their counts differ). Zero gaps
    (back to back) have a panel of their own; the others are on a log ms axis."""
    fig = plt.figure(figsize=(8, 4.2))
    series = {"measured": np.asarray(gaps_ms, dtype=float)}
    colors = {"measured": MEASURED_COLOR}
    for i, (s, g) in enumerate((predicted or {}).items()):
        series[f"predicted: {s}"] = np.asarray(g, dtype=float)
        colors[f"predicted: {s}"] = setting_color(s, i)
    labels = {}
    for n, g in series.items():
        stats = (f"mean / median / p99 {fmt_value(float(g.mean()))} / {fmt_value(float(np.median(g)))} / "
                 f"{fmt_value(float(np.percentile(g, 99)))} ms") if len(g) else "no gaps"
        count = f"{len(g):,} gaps" + (f" (between {len(g) + 1:,} steps)" if n == "measured" and len(g) else "")
        labels[n] = f"{n}: {count}, {int((g <= ZERO_GAP_MS).sum()):,} zero; {stats}"
    draw_gap_panels(fig, series, colors, labels, share=bool(predicted))
    what = ("measured beside the prediction (its measured window, as its summary)" if predicted
            else "measured gaps between consecutive forward steps")
    fig.suptitle(f"{title}\n{what}", fontsize=9)
    return fig


def trace_preview(trace: dict, title: str, max_span_ms: Optional[float] = 40.0):
    """A static drawing of a Chrome trace written by :mod:`sim.output.chrome_trace`: per process a CPU
    lane and a device lane, flow arrows, and the counters below; the first ``max_span_ms`` ms."""
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    xs = [e for e in events if e.get("ph") == "X"]
    t0 = min(e["ts"] for e in xs if e["tid"] == 2)  # from the first forward shown
    t1 = t0 + max_span_ms * 1e3 if max_span_ms else max(e["ts"] + e["dur"] for e in xs)
    pids = sorted(names)
    fig, axes = plt.subplots(len(pids) + 1, 1, figsize=(11, 1.9 * len(pids) + 2.2), sharex=True)
    ms = lambda ts: (ts - t0) / 1e3  # noqa: E731
    for ax, pid in zip(axes, pids):
        for e in xs:
            if e["pid"] != pid or e["ts"] > t1:
                continue
            lane = 10 if e["tid"] == 1 else 0
            color = PHASE_COLORS.get(e["name"]) or KIND_COLORS.get(e["name"].split()[-1], "#888888")
            ax.broken_barh([(ms(e["ts"]), e["dur"] / 1e3)], (lane, 8), facecolors=color, edgecolor="white",
                           linewidth=0.3)
        starts = {(e["id"], e["cat"]): e for e in events if e.get("ph") == "s" and e["pid"] == pid}
        for e in events:
            if e.get("ph") != "f" or e["pid"] != pid or e["ts"] > t1:
                continue
            s = starts.get((e["id"], e["cat"]))
            if s is None:
                continue
            y0, y1 = (10 if s["tid"] == 1 else 4), (8 if e["tid"] == 2 else 10)
            color = "#444444" if e["cat"] == "launch" else "#e377c2"
            ax.annotate("", xy=(ms(e["ts"]), y1), xytext=(ms(s["ts"]), y0),
                        arrowprops=dict(arrowstyle="->", color=color, lw=0.8))
        ax.set_yticks([4, 14], ["device", "CPU"])
        ax.set_title(names[pid], fontsize=9, loc="left")
    cax = axes[-1]
    for i, pid in enumerate(pids):
        setting = names[pid].split(": ")[-1]
        for cname, style in (("running requests", "-"), ("waiting queue", "--")):
            pts = [(ms(e["ts"]), next(iter(e["args"].values()))) for e in events
                   if e.get("ph") == "C" and e["pid"] == pid and e["name"] == cname and e["ts"] <= t1]
            if pts:
                # the first setting's lines wider: where they coincide, both show
                cax.step(*zip(*pts), where="post", color=setting_color(setting, i), linestyle=style,
                         linewidth=max(2.8 - 1.2 * i, 1.0), label=f"{setting}: {cname}")
    cax.set_ylabel("requests")
    cax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    cax.set_xlabel("time (ms) from the first forward shown")
    cax.set_xlim(-0.01 * (t1 - t0) / 1e3, (t1 - t0) / 1e3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in list(PHASE_COLORS.values()) + list(KIND_COLORS.values())]
    fig.legend(handles, [f"CPU: {p}" for p in PHASE_COLORS] + [f"forward {k}" for k in KIND_COLORS],
               loc="lower center", ncol=7, fontsize=7)
    fig.suptitle(title + "\narrows: launch -> forward (grey), device-side dependency k-1 -> k (pink)", fontsize=10)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig
