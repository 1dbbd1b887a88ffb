"""The plots answer their question: checked on the Figure objects (Agg), not on pixels.

metrics.png labels values with units and the ratio to normal; gaps.png draws the gaps the summary
counts (warm-up excluded), both settings, no impossible tick; `gaps --against --plot` draws the
prediction; sweep plots never average over another grid key and draw spread only with repeats;
log.png labels its axes; validation.png numbers its points, rings disturbed runs, draws the target
band and keeps one outlier from squashing the rest; legends and labels cover no data."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from sim.cli import main  # noqa: E402
from sim.output.plots import fmt_value, gap_histogram, measured_gaps, metric_bars  # noqa: E402
from sim.scenario import load_scenario  # noqa: E402
from sim.simulate import simulate  # noqa: E402
from sim.whatif.plots import (log_timeline, measured_gap_histogram, ratio_ci_plot, ratio_heatmap,  # noqa: E402
                              sweep_lines)

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def quick_runs():
    """The quickstart, 32 requests (8 of them warm-up), under both settings."""
    scenario = load_scenario(QUICKSTART, ["workload.num_requests=32"])
    return {s: simulate(scenario, s) for s in scenario.server.settings}


def _texts(fig) -> list[str]:
    out = [t.get_text() for t in fig.texts]
    for ax in fig.axes:
        out += [t.get_text() for t in ax.texts] + [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
    for leg in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]:
        out += [t.get_text() for t in leg.get_texts()] + [leg.get_title().get_text()]
    if fig._suptitle is not None:
        out.append(fig._suptitle.get_text())
    return out


def _tick_labels(ax) -> list[str]:
    ax.figure.canvas.draw()
    return [t.get_text() for t in ax.get_yticklabels() + ax.get_xticklabels() if t.get_text()]


def test_fmt_value_is_never_e_notation():
    assert fmt_value(2532.4) == "2,532" and fmt_value(15.27) == "15.3" and fmt_value(3.114) == "3.11"
    assert fmt_value(0.0467) == "0.047" and fmt_value(0.0) == "0" and fmt_value(math.nan) == "n/a"
    for v in (1e-7, 3e-4, 0.02, 7.0, 123.0, 4.5e6):
        assert "e" not in fmt_value(v)


def test_metric_bars_label_values_with_units_and_the_ratio_to_normal():
    summaries = {"overlap": {"output_throughput": 2532.4, "median_ttft_ms": 15.3, "median_tpot_ms": 3.11,
                             "p99_itl_ms": 3.21, "mean_gap_ms": 0.0467},
                 "normal": {"output_throughput": 2305.1, "median_ttft_ms": 15.2, "median_tpot_ms": 3.42,
                            "p99_itl_ms": 3.52, "mean_gap_ms": 0.379}}
    fig = metric_bars(summaries, "t")
    texts = _texts(fig)
    assert "2,532 tok/s\n1.10× normal" in texts and "2,305 tok/s" in texts
    assert "0.047 ms\n0.12× normal" in texts and "0.379 ms" in texts
    assert not any("e+" in t or "e-0" in t for t in texts)
    for ax in fig.axes:
        assert not any("e+" in t for t in _tick_labels(ax))
    # a ratio under 0.005 is not "0.00×": back-to-back forwards against a synchronous loop's gaps
    summaries["overlap"]["mean_gap_ms"] = 0.001  # 0.0026x
    assert any(t.endswith(" ms\n<0.01× normal") for t in _texts(metric_bars(summaries, "t")))


def test_the_timeline_hatches_where_a_launched_forward_waits_for_host_work():
    from sim.output.plots import _launched_idle, timeline

    # step 0: launched at 1, starts at 3 (2 s of host work); step 1: launched at 4 while the device
    # runs step 0 until 5, starts at 5 (no wait); step 2: launched at 9, device free since 7, starts at 9.5
    steps = pd.DataFrame({"launch_end": [1.0, 4.0, 9.0], "forward_start": [3.0, 5.0, 9.5],
                          "forward_end": [5.0, 7.0, 10.0]})
    assert _launched_idle(steps) == [(1.0, 2.0), (9.0, 0.5)]
    run = simulate(load_scenario(ROOT / "scenarios" / "vllm-h200.yaml",
                                 ["workload.num_requests=24", "workload.warmup_requests=0"]), "sync")
    fig = timeline({"sync": run.steps}, "t")
    assert "device idle, step launched: host work before its forward starts" in \
        [t.get_text() for t in fig.legends[0].get_texts()]
    quick = simulate(load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                                   ["workload.num_requests=24", "workload.warmup_requests=0"]), "overlap")
    assert _launched_idle(quick.steps) == []  # SGLang's launch enqueues the forward: no such wait
    assert not any("host work" in t.get_text() for t in timeline({"overlap": quick.steps}, "t").legends[0].get_texts())


def test_a_server_that_died_is_said_in_every_plot_not_drawn_as_zero_gaps(tmp_path):
    """The kv-pressure scenario's overlap server dies (the seed document's OOM): the table says
    "server died" for its idle share and gaps, and so do the plots (no 0 ms gap bar, no ratio
    of a setting that stopped serving, no idle share of a window it did not serve through)."""
    out = tmp_path / "r"
    assert main(["run", str(ROOT / "scenarios" / "kv-pressure.yaml"), "--out", str(out), "--plots"]) == 3
    from sim.output.plots import _finding, _gap_finding, died_words

    summaries = json.loads((out / "summary.json").read_text())["settings"]
    died = died_words(summaries)
    assert list(died) == ["overlap"] and died["overlap"].startswith("server died at t=0.")
    texts = _texts(metric_bars(summaries, "t"))
    assert "server died" in texts  # the gap panel: no bar, the words
    assert any(t.endswith("ms\nuntil it died") for t in texts)  # its p99 ITL: the samples until then, faded
    assert not any("0 ms\n0.00× normal" in t for t in texts)
    assert _finding(summaries) == f": overlap: {died['overlap']}"
    assert _gap_finding(summaries, "cuda").endswith(f"under normal, overlap: {died['overlap']}")
    steps = {s: pd.read_parquet(out / f"steps_{s}.parquet") for s in summaries}
    title = gap_histogram(steps, "t", summaries=summaries)._suptitle.get_text()
    assert title.startswith("t: idle ") and f"under normal; overlap: {died['overlap']}" in title
    assert "under overlap" not in title


def test_gap_data_is_the_summarys_measured_window(quick_runs):
    for setting, res in quick_runs.items():
        s = res.summary()
        d = measured_gaps(res.steps, res.requests)
        assert d["forwards"] == s["num_steps"] < len(res.steps)  # warm-up forwards are left out
        assert len(d["gaps_ms"]) == d["forwards"] - d["after_idle"]
        assert float(d["gaps_ms"].mean()) == pytest.approx(s["mean_gap_ms"], rel=1e-9)
        assert float(np.percentile(d["gaps_ms"], 99)) == pytest.approx(s["p99_gap_ms"], rel=1e-9)
        assert len(measured_gaps(res.steps)["gaps_ms"]) > len(d["gaps_ms"])  # the whole run has more


def test_gap_histogram_shows_both_settings_explains_the_count_and_has_no_zero_tick(quick_runs):
    steps = {s: r.steps for s, r in quick_runs.items()}
    summaries = {s: r.summary() for s, r in quick_runs.items()}
    fig = gap_histogram(steps, "t", {s: r.requests for s, r in quick_runs.items()}, summaries=summaries)
    zero_ax, hist_ax = fig.axes
    texts = _texts(fig)
    assert any("warm-up excluded" in t for t in texts)
    # the title states the finding: each setting's idle share of the window, as the table's row
    title = next(t for t in texts if t.startswith("t: idle"))
    for setting, res in quick_runs.items():
        assert f"{summaries[setting]['gpu_idle_fraction']:.1%} under {setting}" in title
        label = next(t for t in texts if t.startswith(f"{setting}: "))
        assert f"{res.summary()['num_steps']:,} forwards" in label and "back to back" in label
        assert "num_steps" not in label and "summary" not in label  # no internal words
    # every setting draws something: overlap's gaps are nearly all zero, normal's none are
    colors = {matplotlib.colors.to_hex(p.get_facecolor()) for ax in fig.axes for p in ax.patches
              if isinstance(p, Rectangle) and p.get_height() > 0}
    assert {matplotlib.colors.to_hex(f"C{i}") for i in (0, 1)} <= colors
    assert zero_ax.get_yscale() == "log" and hist_ax.get_xscale() == "log"
    for ax in fig.axes:
        assert "0" not in _tick_labels(ax)
    assert zero_ax.get_ylim()[0] > 0


def test_measured_gap_histogram_draws_the_prediction_beside_the_measurement():
    measured = [1.1, 1.2, 1.05, 1.3, 2.0]
    predicted = {"overlap": np.array([0.0, 0.0, 0.0, 12.0]), "normal": np.array([0.33, 0.33, 0.75, 12.0])}
    fig = measured_gap_histogram(measured, "t", predicted)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert [lb.split(":")[0] for lb in labels] == ["measured", "predicted", "predicted"]
    assert any(lb.startswith("predicted: overlap") for lb in labels)
    assert "share of gaps" in fig.axes[0].get_ylabel()  # series of different lengths: shares
    alone = measured_gap_histogram(measured, "t")
    assert len(alone.legends[0].get_texts()) == 1


def _trace(path: Path, gaps_us=(1000, 1100, 900, 1200, 1000)) -> Path:
    events, t = [], 0.0
    for g in (0,) + tuple(gaps_us):
        t += g
        events.append({"ph": "X", "name": "decode_forward", "cat": "user_annotation", "pid": 1, "tid": 1,
                       "ts": t, "dur": 300.0})
        t += 300.0
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_cli_gaps_against_plot_draws_the_prediction(tmp_path, monkeypatch, capsys):
    import sim.whatif.plots as wp

    run = tmp_path / "run"
    assert main(["run", str(QUICKSTART), "--set", "workload.num_requests=16", "--no-plots", "--out", str(run)]) == 0
    seen = {}
    real = wp.measured_gap_histogram

    def spy(gaps, title, predicted=None):
        seen["predicted"] = predicted
        return real(gaps, title, predicted)

    monkeypatch.setattr(wp, "measured_gap_histogram", spy)
    png = tmp_path / "g.png"
    assert main(["gaps", str(_trace(tmp_path / "t.json")), "--step-name", "decode_forward", "--against", str(run),
                 "--plot", str(png)]) == 0
    capsys.readouterr()
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert set(seen["predicted"]) == {"overlap", "normal"}
    summary = json.loads((run / "summary.json").read_text())["settings"]
    for s, g in seen["predicted"].items():
        assert float(np.mean(g)) == pytest.approx(summary[s]["mean_gap_ms"], rel=1e-9)


def _sweep_table(repeats: int) -> pd.DataFrame:
    rows, point = [], 0
    rng = np.random.default_rng(0)
    for a in (1, 2, 4, 8):
        for b in (0.5, 1.0, 2.0):
            for setting in ("overlap", "normal"):
                for r in range(repeats):
                    base = 1000 * a / b * (1.1 if setting == "overlap" else 1.0)
                    rows.append({"point": point, "workload.concurrency": a, "costs.gpu.scale": b, "setting": setting,
                                 "repeat": r, "seed": r, "output_throughput": base * (1 + 0.05 * rng.standard_normal()),
                                 "median_ttft_ms": 2 * b * (1 + 0.3 * rng.random()),
                                 "median_itl_ms": b + 0.1 * a, "mean_gap_ms": 0.01 * rng.random()})
            point += 1
    return pd.DataFrame(rows)


def test_sweep_lines_one_line_per_other_key_value_no_spread_with_one_repeat():
    fig = sweep_lines(_sweep_table(1), "workload.concurrency", "t")
    panels = fig.axes
    *metric_panels, ratio = panels
    # the last panel: the overlap/normal ratio, a line per value of costs.gpu.scale, with
    # break-even and the single A/B run's thresholds drawn across it
    ratio_lines = [ln for ln in ratio.get_lines() if len(ln.get_xdata()) > 2]
    assert len(ratio_lines) == 3 and "overlap/normal" in ratio.get_title()
    assert {round(ln.get_ydata()[0], 3) for ln in ratio.get_lines() if len(ln.get_xdata()) == 2} >= {1.0, 1.057}
    for ax in metric_panels:
        lines = [ln for ln in ax.get_lines() if len(ln.get_xdata())]
        assert len(lines) == 2 * 3  # settings x values of costs.gpu.scale, none averaged
        assert {matplotlib.colors.to_hex(ln.get_color()) for ln in lines} == \
            {matplotlib.colors.to_hex("C0"), matplotlib.colors.to_hex("C1")}  # colour = setting
        assert not any(isinstance(c, ErrorbarContainer) for c in ax.containers)
        assert not any(isinstance(c, PolyCollection) for c in ax.collections)
    title = fig._suptitle.get_text()
    assert "one run per point" in title and "std" not in title and "averaged" not in title
    legends = {lg.get_title().get_text(): [t.get_text() for t in lg.get_texts()] for lg in fig.legends}
    assert legends["setting (colour)"] == ["overlap", "normal"]
    assert legends["gpu.scale (line style)"] == ["0.5", "1", "2"]
    fig.canvas.draw()  # the legends sit below the panels
    bottom = min(ax.get_window_extent().y0 for ax in panels)
    assert all(lg.get_window_extent().y1 <= bottom for lg in fig.legends)


def test_sweep_line_styles_stay_distinct_for_many_combinations():
    from sim.whatif.plots import MARKERS, _style

    assert len({(_style(i), MARKERS[i % len(MARKERS)]) for i in range(32)}) == 32


def test_sweep_lines_with_repeats_draw_a_band_that_never_goes_below_the_data():
    table = _sweep_table(3)
    fig = sweep_lines(table, "costs.gpu.scale", "t")
    assert "mean of 3 repeats" in fig._suptitle.get_text()
    for ax, metric in zip(fig.axes, ("output_throughput", "median_ttft_ms", "median_itl_ms", "mean_gap_ms")):
        bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
        assert len(bands) == 2 * 4  # settings x values of workload.concurrency
        low = min(p.vertices[:, 1].min() for c in bands for p in c.get_paths())
        assert low >= table[metric].min() - 1e-12 >= 0


def test_sweep_lines_draw_the_verdicts_noise_and_title_the_points_ratios():
    import re

    table = _sweep_table(3)
    fig = sweep_lines(table, "costs.gpu.scale", "t", run_cv=0.05)
    ratio = fig.axes[-1]
    assert "noise at 5.0% CV" in ratio.get_title()
    # the verdict's threshold at 5%: exp(1.645 x sqrt(2) x 5%)
    from sim.whatif.verdict import threshold_ratio

    levels = {round(ln.get_ydata()[0], 4) for ln in ratio.get_lines() if len(ln.get_xdata()) == 2}
    assert round(threshold_ratio(0.05), 4) in levels and round(1 / threshold_ratio(0.05), 4) in levels
    # the title's range is over the points (each the geometric mean of its repeats), as the table's
    from sim.whatif.variance import paired_ratios

    pr = paired_ratios(table, "output_throughput")
    means = np.exp(np.log(pr["ratio"]).groupby(pr["point"]).mean())
    low, high = re.search(r"output throughput ([\d.]+)x to ([\d.]+)x", fig._suptitle.get_text()).groups()
    assert (low, high) == (f"{means.min():.2f}", f"{means.max():.2f}")
    assert "noise at 2.0% CV" in sweep_lines(table, "costs.gpu.scale", "t").axes[-1].get_title()  # the default


def test_heatmap_break_even_in_the_title_not_over_a_value():
    table = _sweep_table(1)
    table.loc[(table["setting"] == "overlap") & (table["costs.gpu.scale"] == 2.0), "output_throughput"] *= 0.8
    fig = ratio_heatmap(table, "workload.concurrency", "costs.gpu.scale", "t")
    ax = fig.axes[0]
    assert ax.collections  # the contour is drawn
    assert "break-even" in ax.get_title()
    assert not any("break-even" in t.get_text() for t in ax.texts)
    assert all(t.get_zorder() > max(c.get_zorder() for c in ax.collections) for t in ax.texts)


def test_ratio_ci_names_break_even_in_the_margin():
    fig = ratio_ci_plot(_sweep_table(3), "t")
    ax = fig.axes[0]
    assert ax.get_legend() is None
    label = next(t for t in ax.texts if t.get_text() == "break-even")
    fig.canvas.draw()
    assert label.get_window_extent().x0 >= ax.get_window_extent().x1


def test_log_timeline_labels_every_axis_and_keeps_legends_off_the_data():
    df = pd.DataFrame({"t_s": [0.0, 1.0, 2.0, 3.0], "kind": ["prefill", "decode", "decode", "prefill"],
                       "running_req": [1, 2, 2, 3], "queue_req": [0, 1, 0, 0], "token_usage": [0.01, 0.02, 0.02, 0.03],
                       "gen_throughput_tok_s": [np.nan, 100.0, 120.0, np.nan],
                       "new_token": [64, np.nan, np.nan, 32], "cached_token": [0, np.nan, np.nan, 16]})
    fig = log_timeline(df, "t")
    fig.canvas.draw()
    for ax in fig.axes:
        assert ax.get_ylabel()
        leg = ax.get_legend()
        assert leg is not None and leg.get_window_extent().x0 >= ax.get_window_extent().x1


def _validation_rows(disturbed_config: str = "b-eos") -> list[dict]:
    from calibrate.validate import report

    rows = []
    for name, (tm, to) in {"a-length": (7000, 7800), "b-eos": (29000, 46000), "c-length": (21000, 29000),
                           "d-eos": (7100, 7600), "e-length": (30000, 50000)}.items():
        case = {"name": name, "regime": "balanced", "config": {"finish": "eos", "concurrency": 8, "stop_strings": 0},
                "measured": {"normal": {"output_throughput": tm, "median_tpot_ms": 1.0, "median_ttft_ms": 5.0,
                                        "mean_gap_ms": 0.1, "p99_gap_ms": 0.3},
                             "overlap": {"output_throughput": to, "median_tpot_ms": 0.8, "median_ttft_ms": 5.5,
                                         "mean_gap_ms": 0.001, "p99_gap_ms": 0.01}},
                "predicted": {"normal": {"output_throughput": tm * 1.05, "median_tpot_ms": 1.1,
                                         "median_ttft_ms": 5.1, "mean_gap_ms": 0.12, "p99_gap_ms": 0.25},
                              "overlap": {"output_throughput": to * 0.9, "median_tpot_ms": 0.85,
                                          "median_ttft_ms": 5.2, "mean_gap_ms": 0.0, "p99_gap_ms": 0.02}},
                "runs": {s: [{"other_cores": 0.6 if name == disturbed_config and s == "overlap" else 0.01,
                              "slow_after": 1.0}] for s in ("normal", "overlap")}}
        rows += report.case_rows(case)
    return rows


def test_case_rows_say_which_runs_were_disturbed():
    rows = _validation_rows()
    assert [r["disturbed"] for r in rows if r["config"] == "b-eos"] == [False, True]
    assert not any(r["disturbed"] for r in rows if r["config"] != "b-eos")


def test_validation_plot_numbers_points_rings_disturbed_runs_and_draws_the_target_band():
    from calibrate.validate import report

    rows = _validation_rows()
    rows[-1]["measured_speedup"] = 9.0  # one far outlier
    fig = report.plot_figure(rows, "t")
    panels = fig.axes
    key = "\n".join(t.get_text() for t in fig.texts)
    for i, name in enumerate(["a-length", "b-eos", "c-length", "d-eos", "e-length"], start=1):
        assert f"{i}  {name}" in key
    ring = matplotlib.colors.to_rgba(report.RING_COLOR)
    for ax, k in zip(panels, report.PLOT_KEYS):
        assert any(isinstance(c, PolyCollection) for c in ax.collections), k  # the target band
        numbers = {t.get_text().split(" ")[0] for t in ax.texts}
        assert {"1", "2", "3", "4", "5"} <= numbers, k
        rings = [c for c in ax.collections if len(c.get_edgecolor()) and tuple(c.get_edgecolor()[0]) == ring]
        assert len(rings) == 1, k  # b-eos overlap (its speedup too)
    gap_ax = panels[report.PLOT_KEYS.index("mean_gap_ms")]
    assert gap_ax.get_xscale() == "log"  # 0.001 to 0.12 ms: log-log, the zero on the floor
    for ax in panels:  # plain numbers, no 2x10^0 on minor ticks
        minor = ax.get_xticklabels(minor=True) + ax.get_yticklabels(minor=True)
        labels = _tick_labels(ax) + [t.get_text() for t in minor]
        assert not any("$" in t or "times" in t for t in labels)
    sp_ax = panels[report.PLOT_KEYS.index("speedup")]
    assert sp_ax.get_xlim()[1] < 3  # the 9.0 sits on the edge instead of squashing the rest
    assert any("9.00" in t.get_text() for t in sp_ax.texts)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("target band" in t for t in legend) and any("disturbed" in t for t in legend)


def test_the_timeline_of_long_prefills_shows_decode_steps():
    """A run of long prefills with few decode steps between them: the strip starts before the
    longest run of decodes, not in the middle of a prefill."""
    from sim.output.plots import KIND_COLORS, timeline

    sc = load_scenario(ROOT / "scenarios/quickstart.yaml",
                       ["workload.input_len=8000", "workload.cached_len=0", "workload.output_len=12",
                        "workload.num_requests=16"])
    steps = {s: simulate(sc, s).steps for s in sc.server.settings}
    step_s = float((steps["normal"].query("kind == 'decode'")["forward_end"]
                    - steps["normal"].query("kind == 'decode'")["forward_start"]).median())
    fig = timeline(steps, "t", window_s=8 * step_s)
    decode_color = matplotlib.colors.to_hex(KIND_COLORS["decode"])
    for ax in fig.axes:
        drawn = [c for c in ax.collections if len(c.get_paths())
                 and matplotlib.colors.to_hex(c.get_facecolor()[0]) == decode_color]
        assert drawn and sum(len(c.get_paths()) for c in drawn) >= 3
    plt.close(fig)


def _window_start_by_loop(kinds: list[str], starts: list[float], ends: list[float]) -> float:
    """The strip's start as a loop over every step computes it (the definition)."""
    best, best_len, i = None, 0, 0
    while i < len(kinds):
        if kinds[i] == "decode":
            j = i
            while j < len(kinds) and kinds[j] == "decode":
                j += 1
            if j - i > best_len:
                best, best_len = i, j - i
            i = j
        else:
            i += 1
    if best is None:
        return float(np.median(starts)) if starts else 0.0
    first = best + min(best_len // 2, max(best_len - 6, 0))
    return float(starts[first] - (ends[first] - starts[first]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["decode", "prefill", "extend"]), max_size=60))
def test_the_timelines_window_starts_before_the_first_longest_decode_run(kinds):
    from sim.output.plots import _decode_window_start

    starts = [0.01 * i for i in range(len(kinds))]
    ends = [s + 0.004 + 0.001 * (i % 3) for i, s in enumerate(starts)]
    df = pd.DataFrame({"kind": pd.Categorical(kinds, categories=["prefill", "decode", "extend"]),
                       "forward_start": starts, "forward_end": ends})
    assert _decode_window_start(df) == _window_start_by_loop(kinds, starts, ends)
