"""Plots of a run, drawn from its saved tables (so they can be regenerated without simulating).

- gaps.png: the GPU gaps the summary's gap metrics are computed from (measured window, warm-up
  excluded), zero gaps (back-to-back forwards) apart from the others, one series per setting;
- metrics.png: throughput and latency per setting, each bar labelled with its value, unit and
  its ratio to ``normal``;
- timeline.png: a strip of a few hundred ms per setting: CPU phases and device forwards.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from sim.atomic import atomic_path  # noqa: E402
from sim.output.report import baseline_of, device_word  # noqa: E402
from sim.trace.metrics import measured_window, step_gaps  # noqa: E402

PHASE_COLORS = {"recv": "#9e9e9e", "schedule": "#1f77b4", "launch": "#ff7f0e", "sync wait": "#d62728",
                "process": "#2ca02c"}
KIND_COLORS = {"extend": "#9467bd", "decode": "#17becf"}
LAUNCHED_COLOR = "#7f7f7f"  # the hatch of a launched step's wait for host work (timeline)
# one colour per setting in every plot (sweeps, runs, validation)
SETTING_COLORS = {"overlap": "C0", "normal": "C1", "thread_overlap": "C2", "overlap_mlx": "C3",
                  "async": "C0", "sync": "C1"}  # vLLM's settings in the colours of SGLang's overlap / normal
MEASURED_COLOR = "#222222"
ZERO_GAP_MS = 1e-6  # a gap under 1 ns is a forward queued behind the previous one: zero


def died_words(summaries: Optional[dict[str, dict]]) -> dict[str, str]:
    """Setting -> "server died at t=0.803 s" for each setting whose server died (its summary's
    ``outcome`` not "ok"): the run's table says "server died" for its idle share and gaps, which
    describe no serving after it, and the plots say so too."""
    out = {}
    for name, s in (summaries or {}).items():
        if s.get("outcome", "ok") != "ok":
            t = s.get("outcome_time_s")
            at = f" at t={t:.3f} s" if isinstance(t, (int, float)) and math.isfinite(t) else ""
            out[name] = f"server died{at}"
    return out


def setting_color(name: str, index: int = 0) -> str:
    """The colour of a setting (the same in every plot); unknown names take the next free colour."""
    if name in SETTING_COLORS:
        return SETTING_COLORS[name]
    return f"C{(len(SETTING_COLORS) + index) % 10}"


def fmt_value(v: Optional[float]) -> str:
    """A number for a label: thousands separated, 3-4 significant digits, never e-notation."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    if a >= 0.001:
        return f"{v:.3f}"
    return "<0.001" if v > 0 else ">-0.001"


def plain_log_ticks(axis, span: float = 1e9) -> None:
    """Log-axis tick labels as plain numbers (1, 10, 100, 0.01), not powers of ten, and none on
    the minor ticks; ticks at 1, 2 and 5 times the powers of ten when the axis spans (``span``:
    its high over its low end) less than two decades."""
    if span < 100:
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.10g}"))
    axis.set_minor_formatter(NullFormatter())


def _save(fig, path: Path) -> Path:
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110, bbox_inches="tight", format=Path(path).suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)
    return Path(path)


def measured_gaps(steps: pd.DataFrame, requests: Optional[pd.DataFrame] = None) -> dict:
    """The GPU gaps (ms) that the summary's gap metrics are computed from
    (:func:`sim.trace.metrics.summarize`): the gap before each forward that starts in the measured
    window (warm-up excluded), less those after an idle scheduler. Without ``requests`` the whole
    run is used. Returns ``{"gaps_ms", "forwards" (in the window: the summary's num_steps),
    "after_idle" (left out), "windowed" (bool)}``."""
    gaps = step_gaps(steps).to_numpy(dtype=float) * 1e3
    fs = steps["forward_start"].to_numpy(dtype=float)
    in_window = np.ones(len(steps), dtype=bool)
    windowed = requests is not None and len(requests) > 0
    if windowed:
        start, end = measured_window(requests)
        in_window = (fs >= start) & (fs < end)
    idle = steps["after_idle"].to_numpy(dtype=bool)
    keep = in_window & ~idle & ~np.isnan(gaps)
    return {"gaps_ms": gaps[keep], "forwards": int(in_window.sum()), "after_idle": int((in_window & idle).sum()),
            "windowed": windowed}


def draw_gap_panels(fig, series: dict[str, np.ndarray], colors: dict[str, str], labels: dict[str, str],
                    share: bool = False, word: str = "GPU"):
    """Two panels side by side, sharing a log count axis: the zero gaps (forwards back to back) as
    one bar per series, and a histogram of the non-zero gaps on a log ms axis, the series' bars
    side by side within each bin (none hides another). ``share``: fractions of each series' gaps
    instead of counts (series of different lengths); ``word``: what the forwards run on (the
    axis label). Returns the two axes."""
    ax0, ax1 = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [1, 5], "wspace": 0.05})
    names = list(series)
    nonzero = {n: g[g > ZERO_GAP_MS] for n, g in series.items()}
    weight = {n: (1.0 / len(g) if share and len(g) else 1.0) for n, g in series.items()}
    zeros = [float((g <= ZERO_GAP_MS).sum()) * weight[n] for n, g in series.items()]
    floor = 0.5 / max([len(g) for g in series.values()] + [1]) if share else 0.7
    top = max([z for z in zeros if z] + [float(np.histogram(g, bins=1)[0].max()) * weight[n]
                                         for n, g in nonzero.items() if len(g)] + [floor * 2])
    x = np.arange(len(names))
    ax0.bar(x, zeros, color=[colors[n] for n in names], width=0.8)
    for xi, z in zip(x, zeros):
        label = (f"{100 * z:.3g}%" if z else "0%") if share else f"{int(z):,}"
        ax0.text(xi, max(z, floor), label, ha="center", va="bottom", fontsize=7)
    ax0.set_xticks(x, [n.split(": ")[-1] for n in names], rotation=60, ha="right", fontsize=7)
    ax0.set_xlim(-0.6, len(names) - 0.4)
    ax0.set_xlabel("zero gaps\n(back to back)", fontsize=8)
    positive = np.concatenate([g for g in nonzero.values() if len(g)] or [np.array([])])
    if len(positive):
        lo, hi = float(positive.min()), float(positive.max())
        edges = np.geomspace(lo / 1.15, hi * 1.15, 31)
        k = len(names)
        for j, n in enumerate(names):
            counts = np.histogram(nonzero[n], bins=edges)[0] * weight[n]
            # bin i split into k slices (equal on the log axis); series j draws in slice j
            left = edges[:-1] * (edges[1:] / edges[:-1]) ** (j / k)
            right = edges[:-1] * (edges[1:] / edges[:-1]) ** ((j + 1) / k)
            m = counts > 0
            ax1.bar(left[m], counts[m], width=(right - left)[m], align="edge", color=colors[n],
                    edgecolor=colors[n], linewidth=0.6)
        ax1.set_xscale("log")
        ax1.set_xlim(edges[0] / 1.08, edges[-1] * 1.08)  # (a margin: the edge bins' bars stand clear of the frame)
        plain_log_ticks(ax1.xaxis, edges[-1] / edges[0])
    else:
        ax1.text(0.5, 0.5, "every gap is zero" if any(len(g) for g in series.values()) else "no gaps",
                 transform=ax1.transAxes, ha="center", va="center")
        ax1.set_xticks([])  # (no axis to read on an empty panel)
    scale = ", log scale" if len(positive) else ""
    ax1.set_xlabel(f"{word} gap between consecutive forwards (ms{scale})")
    ax1.grid(axis="y", alpha=0.3)
    ax0.set_ylim(bottom=floor, top=top * 3)  # before the log scale: no autoscale over an empty panel
    ax0.set_yscale("log")
    plain_log_ticks(ax0.yaxis)
    ax0.set_ylabel("share of gaps (log scale)" if share else "gaps (log scale)")
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=colors[n]) for n in names]
    longest = max((len(n.split(": ")[-1]) for n in names), default=0)  # the rotated tick names' depth, and the
    fig.subplots_adjust(bottom=0.22 + 0.045 * len(names) + 0.012 * max(0, longest - 6))  # panel's label under them
    fig.legend(handles, [labels[n] for n in names], loc="lower center", bbox_to_anchor=(0.5, 0.0), fontsize=8,
               ncol=1, frameon=False)
    return ax0, ax1


def gap_histogram(steps: dict[str, pd.DataFrame], title: str,
                  requests: Optional[dict[str, pd.DataFrame]] = None, device: str = "cuda",
                  summaries: Optional[dict[str, dict]] = None):
    """The gaps between forwards of each setting (a GPU's, or a CPU core's on ``cpu``), as the
    summary counts them (see :func:`measured_gaps`);
    ``device`` the scenario's ``server.device`` (:func:`device_word` names the axis);
    ``summaries`` (per setting): their ``gpu_idle_fraction`` states the finding in the title."""
    fig = plt.figure(figsize=(8, 4.2))
    data = {n: measured_gaps(df, (requests or {}).get(n)) for n, df in steps.items()}
    colors = {n: setting_color(n, i) for i, n in enumerate(data)}
    labels = {}
    died = died_words(summaries)
    for n, d in data.items():
        g = d["gaps_ms"]
        zero = int((g <= ZERO_GAP_MS).sum())
        idle = f" less {d['after_idle']} after an idle scheduler" if d["after_idle"] else ""
        mean = fmt_value(float(g.mean())) if len(g) else "n/a"
        share = (summaries or {}).get(n, {}).get("gpu_idle_fraction")
        idle_share = f"; {device_word(device)} idle {share:.1%} of the window" if isinstance(share, float) else ""
        if n in died:  # (its gaps until then: no idle share of a window it did not serve through)
            idle_share = f"; {died[n]}: its gaps until then"
        labels[n] = (f"{n}: {len(g):,} gaps, one before each of its {d['forwards']:,} forwards{idle}; {zero:,} back to "
                     f"back; mean {mean} ms{idle_share}")
    draw_gap_panels(fig, {n: d["gaps_ms"] for n, d in data.items()}, colors, labels, word=device_word(device))
    windowed = all(d["windowed"] for d in data.values())
    what = ("the measured window (warm-up excluded), gaps after an idle scheduler left out" if windowed
            else "the whole run (no requests table: warm-up included)")
    shares = {n: (summaries or {}).get(n, {}).get("gpu_idle_fraction") for n in data}
    if all(isinstance(v, float) for v in shares.values()) and shares:
        live = ", ".join(f"{v:.1%} under {n}" for n, v in shares.items() if n not in died)
        dead = ", ".join(f"{n}: {died[n]}" for n in shares if n in died)
        title = f"{title}: " + "; ".join(([f"idle {live}"] if live else []) + ([dead] if dead else []))
    fig.suptitle(f"{title}\n{what}", fontsize=9)
    return fig


SUMMARY_PANELS = (("output_throughput", "output throughput", "tok/s", "higher is better"),
                  ("median_ttft_ms", "median TTFT", "ms", "lower is better"),
                  ("median_tpot_ms", "median TPOT", "ms", "lower is better"),
                  ("p99_itl_ms", "p99 ITL", "ms", "lower is better"),
                  ("mean_gap_ms", "mean GPU gap", "ms", "lower is better"))


def metric_bars(summaries: dict[str, dict], title: str, baseline: str | None = None, device: str = "cuda"):
    """Bars per setting: output throughput, median TTFT, TPOT, p99 ITL and mean GPU gap, each
    labelled with its value and unit and, for settings other than ``baseline`` (None: ``normal``,
    or vLLM's ``sync``), its ratio to it."""
    fig, axes = plt.subplots(1, len(SUMMARY_PANELS), figsize=(3.2 * len(SUMMARY_PANELS), 3.8))
    names = list(summaries)
    baseline = baseline_of(names) if baseline is None else baseline
    colors = [setting_color(n, i) for i, n in enumerate(names)]
    died = died_words(summaries)
    for ax, (key, label, unit, better) in zip(axes, SUMMARY_PANELS):
        label = label.replace("GPU", device_word(device))
        raw = [summaries[n].get(key) for n in names]
        vals = [float(v) if v is not None and not (isinstance(v, float) and math.isnan(v)) else math.nan
                for v in raw]
        if key == "mean_gap_ms":  # a server that died idles ever after: its gaps describe no serving (as the table)
            vals = [math.nan if n in died else v for n, v in zip(names, vals)]
        bars = ax.bar(names, [0.0 if math.isnan(v) else v for v in vals], color=colors)
        for bar, n in zip(bars, names):  # a dead server's values are until it died: faded, hatched, apart
            if n in died:
                bar.set_alpha(0.35)
                bar.set_hatch("xx")
        base = math.nan if baseline in died else (vals[names.index(baseline)] if baseline in names else math.nan)
        texts = []
        for n, v in zip(names, vals):
            t = f"{fmt_value(v)} {unit}" if not math.isnan(v) else "n/a"
            if n in died:  # (nothing, or 0 of a request it never completed, is no value: the words alone)
                t = "server died" if math.isnan(v) or v == 0 else f"{t}\nuntil it died"
            elif n != baseline and not math.isnan(v) and not math.isnan(base) and base != 0:
                r = v / base
                t += f"\n{'<0.01' if 0 <= r < 0.005 else f'{r:.2f}'}× {baseline}"  # (not "0.00×" of a tiny ratio)
            texts.append(t)
        ax.bar_label(bars, texts, fontsize=8, padding=2)
        finite = [v for v in vals if not math.isnan(v)]
        ax.set_ylim(0, (max(finite) if finite and max(finite) > 0 else 1.0) * 1.3)
        ax.set_title(f"{label} ({unit})\n{better}", fontsize=9)
        ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(axis="x", labelsize=8)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.10g}"))
    ratio_note = f"; labels: value and ratio to {baseline}" if baseline in names and len(names) > 1 else ""
    fig.suptitle(f"{title}{ratio_note}", fontsize=10)
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


def _launched_idle(df: pd.DataFrame) -> list[tuple[float, float]]:
    """(start, duration) seconds where the device sits idle after a step's launch ended and
    before its forward starts: the host work the forward waits for beyond the scheduler's own
    phases (vLLM's worker preparing the inputs and the call that reaches it; none where a
    launch enqueues the forward at once, as SGLang's)."""
    launched, start = df["launch_end"].to_numpy(dtype=float), df["forward_start"].to_numpy(dtype=float)
    before = np.concatenate(([-np.inf], df["forward_end"].to_numpy(dtype=float)[:-1]))  # the device's previous end
    idle_from = np.maximum(launched, before)
    keep = start - idle_from > 1e-9
    return list(zip(idle_from[keep].tolist(), (start - idle_from)[keep].tolist()))


def _decode_window_start(df: pd.DataFrame) -> float:
    """Where the strip starts: just before the longest run of consecutive decode steps (the
    steady state overlap is about), so a run of long prefills with few decodes between them still
    shows decode steps; the middle of the run when it has no decode step."""
    decode = (df["kind"] == "decode").to_numpy(dtype=bool) if "kind" in df else np.zeros(len(df), dtype=bool)
    starts = df["forward_start"].to_numpy(dtype=float)
    # runs of consecutive decode steps: where the flag turns on and off (numpy, not a loop over
    # every step: a long run's steps table has hundreds of thousands of rows)
    edges = np.diff(np.concatenate(([0], decode.view(np.int8), [0])))
    run_starts, run_ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    if not len(run_starts):
        return float(np.median(starts)) if len(starts) else 0.0
    longest = int(np.argmax(run_ends - run_starts))  # the first of the longest runs
    best, best_len = int(run_starts[longest]), int(run_ends[longest] - run_starts[longest])
    first = best + min(best_len // 2, max(best_len - 6, 0))  # about 6 decode steps into view
    step = float(df["forward_end"].iloc[first] - starts[first])
    return float(starts[first] - step)


def timeline(steps: dict[str, pd.DataFrame], title: str, window_s: float = 0.03, start_s: float | None = None):
    """Timeline strip per setting: a CPU lane (phases) and a device lane (forwards), ms axis,
    over ``window_s`` seconds starting at ``start_s`` (default: the middle of the run)."""
    fig, axes = plt.subplots(len(steps), 1, figsize=(11, 1.6 + 1.3 * len(steps)), squeeze=False)
    for ax, (name, df) in zip(axes[:, 0], steps.items()):
        t0 = start_s if start_s is not None else _decode_window_start(df)
        t1 = t0 + window_s
        sel = df[(df["process_end"] >= t0) & (df["recv_start"] <= t1)]
        for phase, spans in _phase_spans(sel).items():
            spans = [((s - t0) * 1e3, d * 1e3) for s, d in spans if d > 0]
            ax.broken_barh(spans, (10, 8), facecolors=PHASE_COLORS[phase], label=f"CPU: {phase}")
        for kind, color in KIND_COLORS.items():
            k = sel[sel["kind"] == kind]
            spans = [((s - t0) * 1e3, (e - s) * 1e3) for s, e in zip(k["forward_start"], k["forward_end"])]
            ax.broken_barh(spans, (0, 8), facecolors=color, edgecolor="white", linewidth=0.5, label=f"device: {kind}")
        waits = [(s, d) for s, d in _launched_idle(df) if s <= t1 and s + d >= t0]  # (over the whole table: a
        # step's wait starts at its previous forward's end, which may lie before the strip)
        if waits:  # (drawn, and in the legend, only where a forward waits so)
            ax.broken_barh([((s - t0) * 1e3, d * 1e3) for s, d in waits], (0, 8), facecolors="none",
                           edgecolor=LAUNCHED_COLOR, hatch="////", linewidth=0.0,
                           label="device idle, step launched: host work before its forward starts")
        ax.set_xlim(0, window_s * 1e3)
        ax.set_yticks([4, 14], ["device", "CPU"])
        ax.set_title(f"{name}", fontsize=10, loc="left")
    axes[-1, 0].set_xlabel(f"time (ms) from t = {t0:.3f} s")
    legend: dict = {}  # label -> handle, over every strip (a wait drawn in one strip only is still named)
    for ax in axes[:, 0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=4, fontsize=8, bbox_to_anchor=(0.5, -0.02))
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def _finding(summaries: dict[str, dict]) -> str:
    """': overlap/normal throughput 1.20x, TPOT 0.83x' for the pair the run compares (or '')."""
    from sim.output.report import ratio_pair

    pair = ratio_pair(set(summaries))
    if not pair:
        return ""
    died = died_words(summaries)
    if any(n in died for n in pair):  # no ratio of a setting that stopped serving
        return ": " + ", ".join(f"{n}: {died[n]}" for n in pair if n in died)
    a, b = (summaries[n] for n in pair)
    parts = []
    for key, name in (("output_throughput", "throughput"), ("median_tpot_ms", "TPOT")):
        x, y = a.get(key), b.get(key)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y and math.isfinite(x / y):
            parts.append(f"{name} {x / y:.2f}x")
    return f": {pair[0]}/{pair[1]} {', '.join(parts)}" if parts else ""


def _gap_finding(summaries: dict[str, dict], device: str) -> str:
    """': mean GPU gap 0.057 ms under overlap, 0.724 ms under normal' (or '')."""
    died = died_words(summaries)
    gaps = {n: s.get("mean_gap_ms") for n, s in summaries.items() if n not in died}
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in gaps.values()):
        return ""
    parts = [f"{fmt_value(v)} ms under {n}" for n, v in gaps.items()] + [f"{n}: {w}" for n, w in died.items()]
    if not gaps:
        return ": " + ", ".join(parts) if parts else ""
    return f": mean {device_word(device)} gap " + ", ".join(parts)


def save_run_plots(out_dir: Path, scenario_name: str, steps: dict[str, pd.DataFrame],
                   summaries: dict[str, dict], requests: Optional[dict[str, pd.DataFrame]] = None,
                   device: str = "cuda") -> list[Path]:
    """Write gaps.png, metrics.png and timeline.png into ``out_dir``. Returns the paths.
    ``requests`` (per setting) gives the measured window of gaps.png; without it the whole run.
    ``device``: the scenario's ``server.device`` (the gaps' name, :func:`device_word`)."""
    out_dir = Path(out_dir)
    # a strip of about 6 decode steps of the slowest setting (a decode step's length, not a long
    # prefill's), capped at a few hundred ms
    def step_of(df):
        d = df[df["kind"] == "decode"] if "kind" in df and (df["kind"] == "decode").any() else df
        return float((d["forward_end"] - d["forward_start"]).median())
    step_s = max((step_of(df) for df in steps.values() if len(df)), default=0.01)
    window = float(min(0.3, max(0.005, 6 * step_s * 1.5)))
    return [
        _save(gap_histogram(steps, f"{scenario_name}: the {device_word(device)}", requests, device, summaries),
              out_dir / "gaps.png"),
        _save(metric_bars(summaries, f"{scenario_name}: throughput and latency{_finding(summaries)}", device=device),
              out_dir / "metrics.png"),
        _save(timeline(steps, f"{scenario_name}: timeline{_gap_finding(summaries, device)} (CPU phases above, device "
                              "forwards below)", window), out_dir / "timeline.png"),
    ]
