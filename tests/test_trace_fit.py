"""Curves from a server's own traces that extrapolate like the hardware (:mod:`calibrate.real.from_trace.forms`),
the log's lines matched to them and the profiler's slowdown (:mod:`calibrate.real.from_trace.log_match`),
and how far a run lies from the data (:mod:`sim.model.reach`).

Closed forms first (a form the data obeys exactly is recovered; a distance by hand), then
invariants with hypothesis, then the log on SGLang's CPU-engine and CUDA line formats.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibrate.real.from_trace import forms as trace_fit
from calibrate.real.from_trace.torch_trace import Span, TraceRead, TraceStep
from calibrate.real.from_trace.log_match import align, log_check, windows
from sim.model.reach import FAR, ReachMeter, distance


# ---------------------------------------------------------------------------------------------
# the fitted forms


def test_a_decode_that_obeys_the_form_is_recovered_and_extrapolates_with_it():
    law = lambda b, c: 2e-3 + 1e-4 * b + 2e-6 * b * c  # noqa: E731
    pts = [(b, c, law(b, c)) for b in (2, 12) for c in (133, 143, 152)]
    f = trace_fit.fit("forward.decode", pts)
    assert f.coef == pytest.approx((2e-3, 1e-4, 2e-6), rel=1e-6)
    assert f(64, 4000) == pytest.approx(law(64, 4000), rel=1e-9)  # far from the 2 x 3 grid: the same law
    assert f.median_rel_residual == pytest.approx(0.0, abs=1e-9)


def test_a_negative_slope_in_noise_is_zero_not_a_falling_cost():
    # the context span is 19 tokens and the costs fall with it: least squares would extrapolate a
    # negative cost at long contexts; the form's coefficients are at least 0
    pts = [(4, 133, 0.0300), (4, 143, 0.0298), (4, 152, 0.0296), (8, 133, 0.0400), (8, 152, 0.0398)]
    f = trace_fit.fit("forward.decode", pts)
    assert all(c >= 0 for c in f.coef)
    assert f(8, 8000) >= f(8, 152) > 0


def test_a_constant_axis_leaves_its_term_at_zero():
    f = trace_fit.fit("forward.decode", [(4, 140, 0.02), (4, 140, 0.022)])
    assert f.coef[1] == 0.0 and f.coef[2] == 0.0 and f.coef[0] == pytest.approx(0.021)
    line = trace_fit.fit("process.decode", [(4, 1e-3), (4, 1.2e-3)])
    assert line.coef == (pytest.approx(1.1e-3), 0.0)


def test_the_grid_keeps_measured_steps_and_reaches_beyond_the_data():
    law = lambda b, c: 1e-3 + 5e-5 * b + 1e-6 * b * c  # noqa: E731
    pts = [(b, c, law(b, c)) for b in (2, 12) for c in (130, 150)]
    f = trace_fit.fit("forward.decode", pts)
    samples = trace_fit.grid_samples("forward.decode", ("num_reqs", "ctx"), pts, f)
    xs = sorted({s["point"]["num_reqs"] for s in samples})
    ys = sorted({s["point"]["ctx"] for s in samples})
    assert xs == [1.0, 2.0, 12.0, 48.0] and ys[0] == pytest.approx(130 / trace_fit.REACH, abs=1) and ys[-1] == 600
    measured = [s for s in samples if not s.get("filled")]
    assert len(measured) == 4 and all(len(s["times_s"]) == 1 for s in measured)
    assert all(s["times_s"][0] == pytest.approx(law(s["point"]["num_reqs"], s["point"]["ctx"])) for s in samples)
    assert trace_fit.coverage(("num_reqs", "ctx"), pts) == {"num_reqs": [2, 12], "ctx": [130, 150]}


def _prefill_step(reqs: list[tuple[int, int]], forward_s: float) -> TraceStep:
    """A traced EXTEND step of requests (new tokens, cached prefix), with SGLang 0.5.23's detailed
    aggregates (``c_sq``, ``c_sk``, ``c_sqsk``: ``step_span_utils._agg``)."""
    sq = sum(q for q, _ in reqs)
    sk = sum(q + p for q, p in reqs)
    sqsk = sum(q * (q + p) for q, p in reqs)
    name = f"step[EXTEND bs={len(reqs)} toks={sq} c_sq={sq} c_sqsk={sqsk} c_sk={sk}]"
    return TraceStep(name, "extend", len(reqs), sq, sk, Span(0.0, forward_s * 1e6, name), forward_s, "test",
                     attn_pairs=sqsk)


def test_a_prefill_is_priced_by_the_keys_each_new_token_attends_not_by_the_batch_total():
    # the form a + b N + c N K, K = sum q (p + q) / N: eight requests of 224 tokens attend 224 keys
    # per token, one request of 1792 attends 1792; the same N, 8x the attention
    law = lambda n, k: 5e-3 + 1e-4 * n + 5e-8 * n * k  # noqa: E731
    shapes = [[(128, 0)], [(128, 0)] * 15, [(983, 0)], [(819, 0)] * 5, [(400, 600), (400, 0)]]
    steps = [_prefill_step(r, law(sum(q for q, _ in r), sum(q * (q + p) for q, p in r) / sum(q for q, _ in r)))
             for r in shapes]
    assert steps[1].attended == 128.0 and steps[4].attended == (400 * 1000 + 400 * 400) / 800
    f = trace_fit.fit("forward.extend", [(s.num_tokens, s.attended, s.forward_s) for s in steps])
    assert f.coef == pytest.approx((5e-3, 1e-4, 5e-8), rel=1e-6)
    one, eight = f(1792, 1792), f(1792, 224)
    assert one - eight == pytest.approx(5e-8 * 1792 * (1792 - 224))
    # without c_sqsk the requests are equal shares: K = mean prefix + N / n
    bare = TraceStep("s", "extend", 4, 800, 800 + 4 * 100, Span(0.0, 1.0), 1.0, "test")
    assert bare.attended == 100 + 200


def test_a_profile_keyed_by_attended_tokens_prices_each_batch_at_its_own():
    from calibrate.profile import build_profile
    from sim.model.costs import EXTEND
    from sim.model.profile_costs import ProfileCostModel

    law = lambda n, k: 5e-3 + 1e-4 * n + 5e-8 * n * k  # noqa: E731
    samples = [{"curve": "forward.extend", "point": {"num_tokens": n, "prefix": k}, "times_s": [law(n, k)]}
               for n in (64.0, 4096.0) for k in (32.0, 4096.0)]
    samples += [{"curve": "forward.decode", "point": {"num_reqs": b, "ctx": c}, "times_s": [1e-3]}
                for b in (1.0, 8.0) for c in (64.0, 512.0)]
    samples += [{"curve": c, "point": {a: x * (512 if a == "num_tokens" else 1)}, "times_s": [1e-4]} for c, a in
                (("recv", "num_reqs"), ("schedule.extend", "num_reqs"), ("schedule.decode", "num_reqs"),
                 ("launch.extend", "num_tokens"), ("launch.decode", "num_reqs"), ("process.extend", "num_reqs"),
                 ("process.decode", "num_reqs")) for x in (1.0, 8.0)]
    meta = {"backend": "sglang", "device": "cpu", "device_name": "t", "host_cpu": "t", "libraries": {},
            "model": {"name": "t"}, "date": "2026-12-03", "grid": {}, "repeats": 1, "extend_axis": "attended"}
    model = ProfileCostModel(build_profile(meta, samples))
    # 8 requests of 224 new tokens, no prefix; one of 1792; 2 of 512 after 1024 cached
    assert model.forward_s(EXTEND, 8, 1792, 1792, 8 * 224 * 224) == pytest.approx(law(1792, 224))
    assert model.forward_s(EXTEND, 1, 1792, 1792, 1792 * 1792) == pytest.approx(law(1792, 1792))
    assert model.forward_s(EXTEND, 2, 1024, 2 * 1536, 2 * 512 * 1536) == pytest.approx(law(1024, 1536))
    assert model.forward_s(EXTEND, 2, 1024, 2 * 1536) == pytest.approx(law(1024, 1536))  # equal shares
    assert model.extrapolated_steps == 0


def test_nnls_on_an_empty_system_is_an_error():
    with pytest.raises(ValueError):
        trace_fit.nnls([], [])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 256), st.floats(1, 8192), st.floats(1e-6, 1.0)), min_size=1, max_size=30))
def test_any_fit_is_non_negative_and_finite(points):
    f = trace_fit.fit("forward.decode", points)
    assert all(c >= 0 and math.isfinite(c) for c in f.coef)
    for b, c, _ in points:
        assert f(b, c) >= 0 and math.isfinite(f(b, c))
    # never worse than the best constant (the base alone is one of the candidates)
    mean = sum(p[2] for p in points) / len(points)
    sse = sum((p[2] - f(p[0], p[1])) ** 2 for p in points)
    assert sse <= sum((p[2] - mean) ** 2 for p in points) * (1 + 1e-9) + 1e-18


# ---------------------------------------------------------------------------------------------
# distance from the data


def test_distance_by_hand():
    hull = ((2.0, 100.0), (12.0, 200.0))
    assert distance(hull, 4, 150) == 1.0
    assert distance(hull, 25, 150) == pytest.approx(26 / 13)
    assert distance(hull, 4, 401) == pytest.approx(402 / 201)
    assert distance(hull, 1, 150) == pytest.approx(3 / 2)  # below: (lo + 1) / (x + 1)
    assert distance(hull, 0, -5) == pytest.approx(101.0)  # a token axis at or below 0 stays finite


def test_the_meter_counts_steps_beyond_the_data_and_beyond_far():
    m = ReachMeter()
    assert [m.step(d) for d in (1.0, 1.5, FAR + 1, 1.0, FAR + 1)] == [False, True, True, False, False]  # new farthest
    assert m.outcome() == {"extrapolated_steps": 3, "far_steps": 2, "max_extrapolation": FAR + 1, "bounded_steps": 0,
                           "max_bounded_share": 0.0}
    assert m.same_steps(FAR + 1, 3) is False and m.same_steps(FAR + 2, 2) is True and m.same_steps(9.0, 0) is False


def test_the_meter_names_the_first_step_at_a_new_farthest_distance():
    import numpy as np

    m = ReachMeter()
    assert m.steps(np.array([1.0, 2.0, 3.0, 3.0, 1.0])) == 2  # (the first of the two at 3)
    assert m.steps(np.array([2.5, 3.0])) == -1  # not farther than 3
    assert m.steps(np.array([1.0, 1.0])) == -1
    assert m.steps(np.array([4.0])) == 0
    assert m.outcome() == {"extrapolated_steps": 6, "far_steps": 0, "max_extrapolation": 4.0, "bounded_steps": 0,
                           "max_bounded_share": 0.0}


def test_the_farthest_axis_by_hand():
    from sim.model.reach import farthest_axis

    fwd = ((1.0, 128.0), (256.0, 4096.0))  # forward.decode: num_reqs 1-256 x ctx 128-4096
    launch = ((1.0,), (256.0,))
    # ctx 6000: (6001 / 4097) = 1.46; 300 requests: 301 / 257 = 1.17 on both curves
    points = [("forward.decode", ("num_reqs", "ctx"), fwd, (300, 6000.0)),
              ("launch.decode", ("num_reqs",), launch, (300,))]
    assert farthest_axis(points) == "forward.decode at ctx 6000, measured 128-4096"
    points[0] = ("forward.decode", ("num_reqs", "ctx"), fwd, (300, 200.0))
    assert farthest_axis(points) == "forward.decode at num_reqs 300, measured 1-256"  # the first of equals
    assert farthest_axis([("recv", ("num_reqs",), ((0.0,), (256.0,)), (0,))]) == ""  # inside: nothing to name
    assert farthest_axis([("recv", ("num_reqs",), ((4.0,), (256.0,)), (1,))]) == "recv at num_reqs 1, measured 4-256"


@given(st.floats(allow_nan=True, allow_infinity=True), st.floats(0, 1e6), st.floats(0, 1e6))
def test_distance_is_at_least_one_for_any_input(x, lo, span):
    d = distance(((lo,), (lo + span,)), x)
    assert d >= 1.0 or math.isnan(x)


# ---------------------------------------------------------------------------------------------
# the log beside the traces


def _read(steps: list[tuple[int, int]], source: str = "/p/w0-TP-0.trace.json.gz", period_us: float = 40_000,
          device: str = "cpu") -> TraceRead:
    """A read of decode steps (bs, g_sk), one every ``period_us``, with the process ends."""
    out = []
    for i, (bs, sk) in enumerate(steps):
        s = TraceStep(f"step[DECODE bs={bs}]", "decode", bs, bs, sk, Span(i * period_us, 1000.0), 0.01, "cpu")
        s.process_end_us = i * period_us + 5000.0
        out.append(s)
    return TraceRead(source, out, loop="normal", device=device, with_stack=True)


def _line(bs: int, tokens: int, period_s: float, graph: str = "cpu graph") -> str:
    return (f"[2026-12-02 10:00:00] Decode batch, #running-req: {bs}, #token: {tokens}, token usage: 0.01, "
            f"{graph}: False, gen throughput (token/s): {bs / period_s:.2f}, #queue-req: 0")


@pytest.mark.parametrize("graph", ["cpu graph", "cuda graph"])
@pytest.mark.parametrize("shift", [0, 1])
def test_the_lines_match_the_steps_by_order_batch_and_kv_offset(tmp_path, graph, shift):
    steps = [(12, 12 * (140 + k)) for k in range(10)] + [(11, 11 * 150), (12, 12 * 151)]
    # the log states K with a constant offset (K counts slots the batch does not attend over), a line
    # ahead under the overlap loop (shift 1): matched by order, batch size and offset
    lines = ["Profiling starts. Traces will be saved to: /p (with profile id: w0)"]
    lines += [_line(bs, sk + 7, 0.05, graph) for bs, sk in steps[shift:]]
    lines += ["Stop profiling..."]
    lines += [_line(12, 12 * (200 + k), 0.02, graph) for k in range(20)]  # unprofiled: 2.5x faster
    lines += [_line(4, 4 * (300 + k), 0.012, graph) for k in range(20)]
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n")
    read = _read(steps)
    check = log_check([read], log)
    assert check["matched"] == len(steps) - shift
    assert check["traces"][0]["profile_id"] == "w0" and check["traces"][0]["shift"] == shift
    assert check["unprofiled_lines"] == 39  # the window's first line after is left out
    assert check["profiler_slowdown"] == pytest.approx(2.5, rel=0.1)
    assert check["host_slowdown"] == check["profiler_slowdown"]  # the CPU engine: one factor


def test_align_without_token_counts_uses_batch_sizes():
    read = _read([(4, 0)] * 3 + [(5, 0)] * 3)
    for s in read.steps:
        s.sum_ctx = None
    recs = [{"running_req": b, "kv_tokens": 999} for b in (4, 4, 5, 5, 5)]
    pairs, shift, _ = align(read.steps, recs)
    assert shift == 1 and len(pairs) == 5


def test_windows_are_found_with_their_ids():
    lines = ["x", "Profiling starts. Traces will be saved to: /p (with profile id: w1)", "y", "Stop profiling...",
             "Profiling starts. Traces will be saved to: /p", "z"]
    assert windows(lines) == [(1, 3, "w1"), (4, 6, None)]


def test_the_verdict_says_how_far_and_cannot_tell_beyond_far():
    from sim.whatif.verdict import KEEP, PAIRS, UNSURE, Verdict

    v = Verdict(KEEP, PAIRS[0], 1.3, (10.0, 13.0), 0.02, "test")
    near = v.with_reach(0.4, 0.0, 2.5)
    assert near.answer == KEEP
    assert "40% of the two settings' steps (warm-up included) priced beyond the profile's measured data" in near.line()
    assert "up to x2.5 its range" in near.line() and near.as_json()["max_extrapolation"] == 2.5
    far = v.with_reach(0.5, 0.2, 9.0)
    assert far.answer == UNSURE and f"20% beyond x{FAR:g}" in far.line()
    assert v.with_reach(0.5, 0.05, 9.0).answer == KEEP  # a few far steps: said, not decisive


def test_a_range_that_agrees_reads_as_agreeing_when_far_steps_make_it_unsure():
    """The stated range's ends both give 'keep on' while far steps make the answer 'cannot tell':
    the line says both ends agree and why it cannot tell, not "it spans 'keep on' to 'keep on'";
    a range whose ends differ still spans them, one that agrees on a sure answer holds."""
    from sim.whatif.verdict import KEEP, PAIRS, Verdict

    v = Verdict(KEEP, PAIRS[0], 1.3, (10.0, 13.0), 0.02, "test")
    far = v.with_range(1.2, 1.4, ["host phases ±30%"]).with_reach(0.9, 0.6, 20.0)
    assert "'keep on' at both ends" in far.line() and "spans" not in far.line()
    assert "60% beyond x" in far.line()
    assert "the answer holds across it" in v.with_range(1.2, 1.4, ["host phases ±30%"]).line()
    assert "it spans 'no difference one A/B run could see' to 'keep on'" in v.with_range(1.0, 1.4, ["x"]).line()


def test_an_unseen_throughput_difference_with_a_visible_tpot_difference_says_so():
    """An open loop below capacity: both settings carry the offered load (throughput ratio 1.003)
    while the median TPOT is 3.8 against 6.9 ms. At a CV of 2% one A/B run's threshold is
    exp(1.96 sqrt(2) sqrt(ln 1.0004)) = 1.057, so the TPOT ratio 6.877 / 3.832 = 1.79 is visible:
    the head says TPOT 44% lower (3.832 / 6.877 - 1 = -0.443); a TPOT ratio inside the
    threshold, or a visible throughput answer, keeps the plain head."""
    from sim.whatif.verdict import KEEP, PAIRS, UNSEEN, Verdict

    v = Verdict(UNSEEN, PAIRS[0], 1.003, (3.832, 6.877), 0.02, "test")
    assert v.latency_change() == pytest.approx(3.832 / 6.877 - 1)
    assert v.line().startswith("verdict: no throughput difference a single A/B run could see, but TPOT 44% "
                               "lower with overlap on")
    assert v.as_json()["tpot_change"] == pytest.approx(-0.4428, abs=1e-4) and v.as_json()["answer"] == UNSEEN
    slower = Verdict(UNSEEN, PAIRS[0], 0.999, (7.0, 5.0), 0.02, "test")
    assert "TPOT 40% higher with overlap on (keep the default, overlap on, or turn it off" in slower.line()
    assert v.line().startswith("verdict: no throughput difference a single A/B run could see, but TPOT 44% lower "
                               "with overlap on (keep the default: overlap on)")
    same = Verdict(UNSEEN, PAIRS[0], 1.003, (5.0, 5.2), 0.02, "test")  # 1.04 < 1.057
    assert same.latency_change() is None and "no difference a single A/B run could see" in same.line()
    assert Verdict(KEEP, PAIRS[0], 1.3, (3.0, 6.0), 0.02, "test").latency_change() is None


def test_an_unseen_throughput_difference_with_a_visible_ttft_difference_says_so():
    """The same rule on the median TTFT: 103.83 against 76.15 ms is a ratio of 1.363, beyond
    1.057 at a CV of 2%: "median TTFT 36% higher" (103.83 / 76.15 - 1 = 0.3635); with TPOT
    visible too, both are said; a throughput ratio whose visible CV rounds to 0.0% says no A/B run
    shows it, with no run count."""
    from sim.whatif.verdict import PAIRS, UNSEEN, Verdict

    v = Verdict(UNSEEN, PAIRS[0], 1.0, (29.158, 30.046), 0.02, "test", ttft_ms=(103.83, 76.15))
    assert v.latency_change() is None and v.latency_change("ttft") == pytest.approx(103.83 / 76.15 - 1)
    line = v.line()
    assert line.startswith("verdict: no throughput difference a single A/B run could see, but median TTFT 36% higher "
                           "with overlap on (keep the default, overlap on, or turn it off (--disable-overlap-schedule) "
                           "where median TTFT matters more)")
    assert "a difference this small no A/B run shows (assumed 2.0%, test: beyond 1.057x)" in line
    assert "runs of each setting" not in line and "under 0.0%" not in line
    assert v.as_json()["ttft_change"] == pytest.approx(0.3635, abs=1e-4) and "tpot_change" not in v.as_json()
    both = Verdict(UNSEEN, PAIRS[0], 1.003, (3.832, 6.877), 0.02, "test", ttft_ms=(103.83, 76.15))
    assert "but TPOT 44% lower and median TTFT 36% higher with overlap on" in both.line()


@settings(max_examples=100, deadline=None)
@given(st.floats(0.5, 50.0, allow_nan=False), st.integers(0, 1000))
def test_same_steps_counts_as_step_does_k_times(d, k):
    from sim.model.reach import ReachMeter

    one, many = ReachMeter(), ReachMeter()
    for _ in range(k):
        one.step(d)
    many.same_steps(d, k)
    assert one.outcome() == many.outcome()


def test_a_latency_answer_names_the_latency_gives_no_run_count_and_a_p99_that_goes_the_other_way():
    """The open loop of ``ask --card h200 --model llama-3.2-1b --rate 4 --input-len 512
    --output-len 128``: throughputs 1.006x apart (the arrivals set them), TPOT 22% lower and median
    TTFT 6% higher with overlap on (19.37 / 18.30 = 1.058, beyond 1.057), p99 TTFT 14% lower
    (28.62 / 33.32). The advice names the latency overlap costs, the line gives no count of runs
    to detect the throughput's 0.6%, and it gives the p99s (below the 1.5x tail rule, but the
    other way than the medians)."""
    from sim.whatif.verdict import PAIRS, UNSEEN, Verdict

    v = Verdict(UNSEEN, PAIRS[0], 1.006, (2.905, 3.712), 0.02, "test", ttft_ms=(19.37, 18.30),
                ttft_p99_ms=(28.62, 33.32), open_loop=True)
    line = v.line()
    assert ("turn it off (--disable-overlap-schedule) where median TTFT matters more, though the p99 TTFT is lower "
            "with overlap on)") in line
    assert ", median TTFT 19.37 vs 18.30 ms, p99 TTFT 28.62 vs 33.32 ms;" in line
    assert "runs of each setting" not in line
    closed = Verdict(UNSEEN, PAIRS[0], 1.006, (2.905, 3.712), 0.02, "test", ttft_ms=(19.37, 18.30))
    assert "runs of each setting detect it" in closed.line()  # a closed loop's throughputs are its own
    same_way = Verdict(UNSEEN, PAIRS[0], 1.006, (2.905, 3.712), 0.02, "test", ttft_ms=(19.37, 18.30),
                       ttft_p99_ms=(34.0, 33.32))
    assert "p99 TTFT" not in same_way.line()  # (the same way as the medians, and under 1.5x apart)
    plain = Verdict(UNSEEN, PAIRS[0], 1.02, (3.0, 3.01), 0.02, "test", ttft_ms=(18.3, 18.30))
    assert "runs of each setting detect it (80% power)" in plain.line()  # no latency answer: the count stays


def test_reach_words_do_not_round_a_step_beyond_the_data_to_x1_0():
    from sim.model.reach import reach_words

    assert reach_words((4255 + 1) / (4096 + 1)).startswith("up to x1.04 its range")
    assert reach_words(2.5).startswith("up to x2.5 its range") and reach_words(1.05).startswith("up to x1.1 ")
