"""The verdict line of ``run``: keep the overlapping loop on, turn it off, or no difference a
single A/B run could see, with the predicted gain, the noise that would hide it and what the
answer stands on (a sweep's line, over its points: :mod:`sim.whatif.sweep_verdict`).

The rule (docs/what-if.md#the-verdict-line). One A/B run is one run of each setting on separately
started servers. Each run's output throughput carries a multiplicative run-to-run noise: lognormal
with coefficient of variation ``cv`` (the noise model of :mod:`sim.whatif.variance`), so the log
of a single A/B ratio is normal around the log of the true ratio with standard deviation
``sqrt(2) * sigma``, ``sigma = sqrt(log(1 + cv**2))``. If the two settings were equal, one A/B run
would show a ratio inside ``[1/T, T]`` 95% of the time, with the threshold

    T(cv) = exp(z * sqrt(2) * sigma(cv)),  z = 1.95996 (the two-sided 5% normal quantile).

With ``r`` the predicted throughput ratio (overlapping setting / synchronous setting):

- ``r >= T``: keep the overlapping loop on (SGLang: do not pass ``--disable-overlap-schedule``;
  vLLM: keep ``--async-scheduling``, its default);
- ``r <= 1/T``: turn it off (``--disable-overlap-schedule``; vLLM ``--no-async-scheduling``);
- otherwise: no difference a single A/B run could see; the default stays.

The line also gives the largest run-to-run CV at which one A/B run shows the predicted ratio
(:func:`visible_cv`, the inverse of ``T``) and, when unseen, how many runs of each setting a
two-sample t-test needs to detect it with 80% power (:func:`sim.whatif.variance.runs_needed`).
A setting whose server died or whose measured requests all failed loses outright.

``cv``: ``--run-cv`` when given; else the scenario's run-level noise, ``sqrt(run_gpu_cv**2 +
run_cpu_cv**2)`` (an upper bound of the throughput's CV: each factor scales only its share of a
step); else :data:`DEFAULT_RUN_CV`, the spread of a clock-locked card on a quiet host
(docs/what-if.md: 3 runs each detect a 1.1x gain at 2%).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from sim.output.text import VerdictText
from sim.trace.metrics import served


DEFAULT_RUN_CV = 0.02
Z_TWO_SIDED_95 = 1.959963984540054
MAX_RUN_CV = 1.0  # --run-cv is a fraction: above 1 (100%) it is a percentage given by mistake

# (overlapping setting, synchronous setting, engine's name of the loop, flag to turn it off, note on
# how to keep it on), first match wins
PAIRS = (
    ("overlap", "normal", "overlap", "--disable-overlap-schedule", "do not pass --disable-overlap-schedule"),
    ("overlap_mlx", "normal", "overlap", "--disable-overlap-schedule", "do not pass --disable-overlap-schedule"),
    ("async", "sync", "async scheduling", "--no-async-scheduling", "--async-scheduling, vLLM's default"),
)
KEEP, OFF, UNSEEN, UNSURE = "keep", "off", "unseen", "unsure"


def threshold_ratio(cv: float) -> float:
    """``T(cv)``: one A/B run of two equal settings shows a throughput ratio inside ``[1/T, T]``
    95% of the time (``cv``: run-to-run CV of one run's throughput, >= 0; ``T(0) = 1``)."""
    return math.exp(Z_TWO_SIDED_95 * math.sqrt(2.0) * math.sqrt(math.log1p(cv * cv)))  # variance.log_sigma


def visible_cv(ratio: float) -> float:
    """The largest run-to-run CV at which one A/B run shows ``ratio`` (> 0) beyond noise: the ``cv``
    with ``T(cv) = max(ratio, 1/ratio)``; 0 for a ratio of 1."""
    sigma = abs(math.log(ratio)) / (Z_TWO_SIDED_95 * math.sqrt(2.0))
    return math.sqrt(math.expm1(sigma * sigma))


def decide(ratio: float, cv: float) -> str:
    """:data:`KEEP`, :data:`OFF` or :data:`UNSEEN` for a predicted throughput ``ratio`` (> 0) of the
    overlapping setting over the synchronous one at run-to-run CV ``cv``."""
    t = threshold_ratio(cv)
    if ratio >= t and ratio > 1.0:
        return KEEP
    if ratio <= 1.0 / t and ratio < 1.0:
        return OFF
    return UNSEEN


def pair_of(settings) -> Optional[tuple]:
    """The entry of :data:`PAIRS` whose two settings are among ``settings`` (None: no pair)."""
    names = set(settings)
    return next((p for p in PAIRS if p[0] in names and p[1] in names), None)


def scenario_run_cv(noise) -> Optional[float]:
    """The run-to-run CV of throughput a scenario's ``costs.noise`` states (``sqrt(run_gpu_cv**2 +
    run_cpu_cv**2)``), None when it states none."""
    g, c = float(noise.run_gpu_cv), float(noise.run_cpu_cv)
    return math.hypot(g, c) if g > 0 or c > 0 else None


@dataclass(frozen=True)
class Verdict:
    """One comparison's answer.

    Attributes:
        answer: :data:`KEEP`, :data:`OFF` or :data:`UNSEEN`.
        pair: the :data:`PAIRS` entry compared.
        throughput_ratio: output throughput, overlapping / synchronous (NaN when a setting failed).
        tpot_ms: (overlapping, synchronous) median TPOT in milliseconds (NaN when unknown).
        run_cv: the run-to-run CV assumed; cv_source: where it came from, in words.
        failed: the setting that failed outright ('' when both served).
    """

    answer: str
    pair: tuple
    throughput_ratio: float
    tpot_ms: tuple
    run_cv: float
    cv_source: str
    failed: str = ""
    ttft_p99_ms: tuple = (math.nan, math.nan)  # (overlapping, synchronous) p99 TTFT, said apart (TAIL_RATIO)
    failed_reason: str = ""  # why it failed, as its summary's outcome_reason gives it (e.g. a release rule's fault)
    # (lowest ratio, highest ratio, [what each stated uncertainty is]): sim.whatif.stated_range
    stated_range: Optional[tuple] = None
    ttft_ms: tuple = (math.nan, math.nan)  # (overlapping, synchronous) median TTFT in milliseconds
    range_skipped: tuple = ()  # the stated uncertainties not simulated (run --no-range, a sweep)
    range_skipped_by: str = "--no-range"  # why they were not: the flag, or "a sweep runs no corners"
    extrapolated_share: float = 0.0  # of the steps (both settings), priced beyond the profile's data
    far_share: float = 0.0  # of the steps, beyond sim.model.reach.FAR of the data (no measurement there)
    max_extrapolation: float = 1.0  # the farthest step's distance from the data (sim.model.reach.distance)
    max_extrapolation_at: str = ""  # the curve and axis that put it there (sim.model.reach.farthest_axis)
    bounded_share: float = 0.0  # of the steps, priced below the data's contexts within a bound (sim.model.reach)
    max_bounded_share: float = 0.0  # the largest such bound, a share of the price
    max_bounded_at: str = ""  # where it lay, in words (the cost model's bounded_at)
    placeholder: bool = False  # the scenario's inline cost terms, no measured profile
    # speculative decoding: (overlapping, synchronous) tokens per verify step per request, as
    # drawn from the scenario's given acceptance law; None without speculation
    accept_length: Optional[tuple] = None
    # what the engine's server section says the answer rests on beyond the profile (its
    # ``verdict_caveats``: e.g. vLLM at a tensor-parallel size held against the real server only
    # on a host too small for it)
    caveats: tuple = ()
    # an open loop whose backlog grew through the run: (setting, what showed it, its numbers) each,
    # as sim.trace.metrics.queue_growth gives them; the answer is then this run length's
    queue_growth: tuple = ()
    # the run again with the prefill launch's device part nil (sim.whatif.harness.launch_floor_json)
    launch_floor: Optional[dict] = None
    # the load is an open loop (arrivals at a rate: below capacity they set both throughputs), as
    # grounded() is told; a closed loop's throughputs are the settings' own
    open_loop: bool = False

    def with_range(self, lo: float, hi: float, what: list) -> "Verdict":
        """This verdict over the stated range: the answer becomes :data:`UNSURE` ("cannot tell")
        when the ends of the range do not give the central answer. The range spans the central
        ratio too: the ratio need not be monotone in a cost scale (the corners of a host move can
        both lie below the centre)."""
        from dataclasses import replace

        if math.isfinite(lo) and math.isfinite(hi) and math.isfinite(self.throughput_ratio):
            lo, hi = min(lo, self.throughput_ratio), max(hi, self.throughput_ratio)
        new = replace(self, stated_range=(lo, hi, list(what)))
        if self.failed or self.answer == UNSURE:
            return new
        ends = {decide(lo, self.run_cv), decide(hi, self.run_cv)} if math.isfinite(lo) and math.isfinite(hi) else {None}
        return replace(new, answer=UNSURE) if ends != {self.answer} else new

    @property
    def threshold(self) -> float:
        return threshold_ratio(self.run_cv)

    def as_json(self) -> dict:
        """The verdict for ``summary.json`` and ``run --json``: answer, settings compared, ratio
        (None when a setting failed), TPOT ms (the two settings), run-to-run CV and its source, threshold, the line."""
        from sim.trace.metrics import GROWN_TTFT

        def finite(x: float):
            return float(x) if math.isfinite(x) else None
        out = {"answer": self.answer, "settings": list(self.pair[:2]), "throughput_ratio": finite(self.throughput_ratio),
               "tpot_ms": [finite(t) for t in self.tpot_ms], "ttft_ms": [finite(t) for t in self.ttft_ms],
               "ttft_p99_ms": [finite(t) for t in self.ttft_p99_ms], "run_cv": self.run_cv,
               "cv_source": self.cv_source,
               "threshold_ratio": finite(self.threshold), "failed": self.failed, "line": self.line()}
        if (change := self.latency_change()) is not None:
            out["tpot_change"] = change
        if (change := self.latency_change("ttft")) is not None:
            out["ttft_change"] = change
        if self.stated_range is not None:
            lo, hi, what = self.stated_range
            out["stated_range"] = {"ratio_low": finite(lo), "ratio_high": finite(hi), "sources": what,
                                   "answer_low": decide(lo, self.run_cv) if math.isfinite(lo) else None,
                                   "answer_high": decide(hi, self.run_cv) if math.isfinite(hi) else None,
                                   "answer_central": decide(self.throughput_ratio, self.run_cv)
                                   if math.isfinite(self.throughput_ratio) else None}
        if self.launch_floor is not None:
            out["prefill_launch_floor"] = self.launch_floor
        if self.range_skipped:
            out["range_not_simulated"] = list(self.range_skipped)
        out["extrapolated_share"] = self.extrapolated_share
        out["far_share"] = self.far_share
        out["max_extrapolation"] = self.max_extrapolation
        out["max_extrapolation_at"] = self.max_extrapolation_at
        out["bounded_share"] = self.bounded_share
        out["max_bounded_share"] = self.max_bounded_share
        out["max_bounded_at"] = self.max_bounded_at
        out["placeholder"] = self.placeholder
        if self.accept_length is not None:
            out["spec_accept_length"] = [finite(x) for x in self.accept_length]
        if self.caveats:
            out["caveats"] = list(self.caveats)
        if self.queue_growth:
            out["queue_growth"] = {name: ({"ttft_growth": values[0]} if label == GROWN_TTFT else
                                          {"in_server_mid": values[0], "in_server_last": values[1]})
                                   for name, label, values in self.queue_growth}
        return out

    def latency_change(self, metric: str = "tpot") -> Optional[float]:
        """Where the throughputs show no difference (:data:`UNSEEN`: as in an open loop below the
        server's capacity, whose arrivals set the throughput of both settings) but the medians of
        ``metric`` (``tpot`` or ``ttft``) differ by more than one A/B run's noise (their ratio
        beyond :attr:`threshold`, the same test as the throughput's): the overlapping setting's
        median over the synchronous one's, less 1 (negative: lower with it on); else None."""
        tn, td = self.tpot_ms if metric == "tpot" else self.ttft_ms
        if self.answer != UNSEEN or not (math.isfinite(tn) and math.isfinite(td) and tn > 0 and td > 0):
            return None
        t = self.threshold
        return tn / td - 1.0 if (tn / td >= t or td / tn >= t) else None

    def head(self) -> str:
        """The answer in words (the verdict line's first clause); an unseen throughput difference
        with a visible TPOT or TTFT difference says so (:meth:`latency_change`)."""
        _num, _den, loop, flag, keep_note = self.pair
        changes = [(label, c) for label, c in (("TPOT", self.latency_change()), ("median TTFT", self.latency_change("ttft")))
                   if c is not None]
        if changes:
            words = " and ".join(f"{label} {abs(c):.0%} {'lower' if c < 0 else 'higher'}" for label, c in changes)
            higher = " and ".join(label for label, c in changes if c > 0)  # the latencies overlapping costs
            pn, pd_ = self.ttft_p99_ms  # a TTFT tail the other way than the median (line() gives both)
            tail = f", though the p99 TTFT is lower with {loop} on" if "TTFT" in higher and 0 < pn < pd_ else ""
            advice = (f"keep the default: {loop} on" if not higher else
                      f"keep the default, {loop} on, or turn it off ({flag}) where {higher} matters more{tail}")
            return f"no throughput difference a single A/B run could see, but {words} with {loop} on ({advice})"
        return {KEEP: f"keep {loop} on ({keep_note})", OFF: f"turn {loop} off ({flag})",
                UNSEEN: f"no difference a single A/B run could see (keep the default: {loop} on)",
                UNSURE: f"cannot tell from what the profile knows (keep the default: {loop} on)"}[self.answer]

    def line(self) -> str:
        """The verdict as one line of text (``summary.json``'s and ``--json``'s ``line``)."""
        return self.text().line()

    def text(self) -> "VerdictText":
        """The verdict said: its head (the answer) and the clauses after it: the predicted gain,
        the noise that would hide it, then what it stands on (:meth:`_standing_clauses`)."""
        num, den, loop, flag, keep_note = self.pair
        head = f"verdict: {self.head()}"
        if self.failed:
            which = f"{flag} ({den})" if self.failed == den else num
            why = f" ({self.failed_reason})" if self.failed_reason else ""
            return VerdictText(head, (f"with {which} the server died or all its measured requests failed in this "
                                      f"prediction{why}", *self._standing_clauses()))
        r = self.throughput_ratio
        tn, td = self.tpot_ms
        tpot = f", TPOT {tn:.3f} vs {td:.3f} ms" if math.isfinite(tn) and math.isfinite(td) else ""
        fn, fd = self.ttft_ms
        if math.isfinite(fn) and math.isfinite(fd):  # the first token's wait: where overlap can lose
            tpot += f", median TTFT {fn:.2f} vs {fd:.2f} ms"
        pn, pd_ = self.ttft_p99_ms
        median_ttft = self.latency_change("ttft")  # (a visible difference the head weighs)
        if pn > 0 and pd_ > 0 and (max(pn / pd_, pd_ / pn) > TAIL_RATIO  # a tail the medians hide,
                                   or (median_ttft is not None and (pn / pd_ - 1.0) * median_ttft < 0)):
            tpot += f", p99 TTFT {pn:.2f} vs {pd_:.2f} ms"  # or one that goes the other way than the median
        gain = f"output throughput {num}/{den} {r:.3f}x ({(r - 1) * 100:+.1f}%){tpot}"
        assumed = f"assumed {self.run_cv:.1%}, {self.cv_source}: beyond {self.threshold:.3f}x"
        if visible_cv(r) < 0.0005:  # (under 0.05%: no run count worth saying detects it)
            return VerdictText(head, (gain, f"a difference this small no A/B run shows ({assumed})",
                                      *self._standing_clauses()))
        see = f"one A/B run shows it when the run-to-run CV is under {visible_cv(r):.1%} ({assumed})"
        if self.answer in (UNSEEN, UNSURE) and r != 1.0 and not self.arrivals_set_throughput():  # (an open loop
            from sim.whatif.variance import runs_needed  # answered by a latency: no run count for its throughputs)

            try:
                n = runs_needed(self.run_cv, r)
                see += f"; {n} runs of each setting detect it (80% power)"
            except ValueError:
                pass
        return VerdictText(head, (gain, see, *self._standing_clauses()))

    def _standing_clauses(self) -> list[str]:
        """What the answer stands on, a clause each: the stated range, the share of extrapolated
        steps, or placeholder costs (none for a measured profile used inside its grid)."""
        from sim.model.reach import reach_words
        from sim.trace.metrics import GROWN_TTFT, growth_words, queue_growth_words

        out = []
        if self.accept_length is not None:
            an, ad = self.accept_length
            num, den = self.pair[:2]
            out.append(f"speculative decoding: {an:.2f} ({num}) and {ad:.2f} ({den}) tokens per verify step per "
                       "request as drawn from the given acceptance (server.speculative, not measured)")
        if self.placeholder:
            out.append(PLACEHOLDER_CLAUSE)
        out += self.caveats
        if self.queue_growth:
            ttft = [(name, values[0]) for name, label, values in self.queue_growth if label == GROWN_TTFT]
            grown = []  # "overlap and normal (TTFT +55 and +78 ms per second of arrivals)"
            if ttft:
                rates = " and ".join(f"+{growth_words(g)}" for _, g in ttft)
                grown.append(f"{' and '.join(name for name, _ in ttft)} (TTFT {rates} per second of arrivals)")
            grown += [f"{name} ({queue_growth_words((label, values))})"
                      for name, label, values in self.queue_growth if label != GROWN_TTFT]
            out.append(f"the queue grew through the run with {'; '.join(grown)}: near or above capacity this open "
                       "loop answers for its length, not for a steady state")
        if self.stated_range is not None:
            lo, hi, what = self.stated_range
            if not (math.isfinite(lo) and math.isfinite(hi)):
                out.append(f"over {'; '.join(what)}: a setting served nothing at a corner of that range")
            else:
                low, high = decide(lo, self.run_cv), decide(hi, self.run_cv)
                if low != high:
                    holds = f"it spans '{_ANSWER_WORDS[low]}' to '{_ANSWER_WORDS[high]}'"
                elif self.answer != UNSURE:
                    holds = "the answer holds across it"
                else:  # (the range agrees; what is not known is said after it: steps beyond the data)
                    holds = f"'{_ANSWER_WORDS[low]}' at both ends"
                out.append(f"over {'; '.join(what)}: ratio {lo:.3f}-{hi:.3f}x, {holds}")
        if self.range_skipped:
            out.append(not_simulated(self.range_skipped, self.range_skipped_by, "answer's"))
        if self.extrapolated_share > 0:
            from sim.model.reach import FAR

            share = f"{self.extrapolated_share:.0%}" if self.extrapolated_share >= 0.005 else "under 1%"
            clause = (f"{share} of the two settings' steps (warm-up included) priced beyond the profile's measured "
                      f"data (extrapolated, {reach_words(self.max_extrapolation, self.max_extrapolation_at)}")
            if self.far_share > 0:
                clause += f"; {self.far_share:.0%} beyond x{FAR:g}, where no measurement stands behind the price"
            out.append(clause + ")")
        if self.bounded_share > 0:
            from sim.model.reach import bounded_words

            share = f"{self.bounded_share:.0%}" if self.bounded_share >= 0.005 else "under 1%"
            out.append(f"{share} of the two settings' steps (warm-up included) priced below the profile's measured "
                       f"contexts {bounded_words(self.max_bounded_share, self.max_bounded_at)}, counted apart from "
                       f"the steps beyond the data (whose price has no such bound); {self._bounded_holds()}")
        return out

    def bounded_ends(self) -> tuple[float, float]:
        """The throughput ratio's ends where every step priced below the data's contexts is off by
        its bound in the direction that moves the ratio most: each setting's throughput by the
        bounded steps' share of the steps times the largest bound, one up, the other down."""
        e = min(self.bounded_share * self.max_bounded_share, 0.5)
        r = self.throughput_ratio
        return r * (1.0 - e) / (1.0 + e), r * (1.0 + e) / (1.0 - e)

    def arrivals_set_throughput(self) -> bool:
        """An open loop whose answer is a latency's (:meth:`latency_change`): below the server's
        capacity its arrivals set both settings' throughputs, which no price moves."""
        return self.open_loop and (self.latency_change() is not None or self.latency_change("ttft") is not None)

    def _bounded_holds(self) -> str:
        """Whether the answer holds across :meth:`bounded_ends`, in words; in an open loop whose
        answer is a latency's (:meth:`arrivals_set_throughput`), that the bound leaves the
        throughputs as they are."""
        if self.arrivals_set_throughput():
            return "the arrivals set both throughputs, so the bound moves the latencies only"
        lo, hi = self.bounded_ends()
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return "a setting served nothing"
        low, high = decide(lo, self.run_cv), decide(hi, self.run_cv)
        return (f"were each such step off by that much, one setting up and the other down (a loose bound: both "
                f"settings price their forwards on the same curve), the ratio would be {lo:.3f}-{hi:.3f}x: "
                + ("the answer holds" if low == high else
                   f"it spans '{_ANSWER_WORDS[low]}' to '{_ANSWER_WORDS[high]}' (the answer above stands on the "
                   "curve's prices)"))

    def with_reach(self, extrapolated_share: float, far_share: float, max_extrapolation: float,
                   max_extrapolation_at: str = "", bounded: tuple = (0.0, 0.0, "")) -> "Verdict":
        """This verdict with the run's distance from the profile's data (:mod:`sim.model.reach`;
        ``max_extrapolation_at``: the curve and axis of the farthest step; ``bounded``: the share
        of the steps priced below the data's contexts within a bound, the largest bound and where
        it lay): the answer becomes :data:`UNSURE` when more than
        :data:`sim.model.reach.FAR_SHARE` of the steps lie beyond :data:`sim.model.reach.FAR` of
        the data. Bounded steps do not turn it, as extrapolated ones within ``FAR`` do not: their
        clause gives the ratio at the bound (:meth:`bounded_ends`, loose: both settings price their
        forwards on the same curve) and whether the answer holds there."""
        from dataclasses import replace

        from sim.model.reach import FAR_SHARE

        new = replace(self, extrapolated_share=extrapolated_share, far_share=far_share,
                      max_extrapolation=max_extrapolation, max_extrapolation_at=max_extrapolation_at,
                      bounded_share=bounded[0], max_bounded_share=bounded[1], max_bounded_at=bounded[2])
        if far_share > FAR_SHARE and not self.failed:
            return replace(new, answer=UNSURE)
        return new


def verdict(summaries: dict[str, dict], run_cv: float, cv_source: str) -> Optional[Verdict]:
    """The verdict of a run's summaries (setting -> summary keys of :mod:`sim.trace.metrics`) at
    run-to-run CV ``run_cv``; None when the settings hold no pair of :data:`PAIRS` or both failed."""
    pair = pair_of(summaries)
    if pair is None:
        return None
    a, b = summaries[pair[0]], summaries[pair[1]]
    tpot = (float(a.get("median_tpot_ms") or math.nan), float(b.get("median_tpot_ms") or math.nan))
    ok_a, ok_b = served(a), served(b)
    if not (ok_a and ok_b):
        if not (ok_a or ok_b):
            return None
        failed = pair[1] if ok_a else pair[0]
        return Verdict(KEEP if ok_a else OFF, pair, math.nan, tpot, run_cv, cv_source, failed=failed,
                       failed_reason=str(summaries[failed].get("outcome_reason") or ""))
    ta, tb = float(a["output_throughput"]), float(b["output_throughput"])
    if not (ta > 0 and tb > 0):
        return None
    ratio = ta / tb
    ttft = (float(a.get("median_ttft_ms") or math.nan), float(b.get("median_ttft_ms") or math.nan))
    tail = (float(a.get("p99_ttft_ms") or math.nan), float(b.get("p99_ttft_ms") or math.nan))
    accept = (float(a.get("spec_accept_length", math.nan)), float(b.get("spec_accept_length", math.nan)))
    return Verdict(decide(ratio, run_cv), pair, ratio, tpot, run_cv, cv_source, ttft_ms=ttft, ttft_p99_ms=tail,
                   accept_length=accept if "spec_accept_length" in a or "spec_accept_length" in b else None)


PLACEHOLDER_CLAUSE = "on the scenario's inline cost terms (placeholders: no device was measured)"
_ANSWER_WORDS = {KEEP: "keep on", OFF: "turn off", UNSEEN: "no difference one A/B run could see"}  # a range's ends
TAIL_RATIO = 1.5  # p99 TTFTs further apart than this are said beside the medians (a tail they hide)


def not_simulated(what, why: str, whose: str) -> str:
    """The clause on the stated uncertainties ``what`` that were not simulated, and ``why`` (the
    flag, or a sweep's reason): ``whose`` range ("answer's", or a sweep's "answers'") is unknown."""
    return f"not simulated over {'; '.join(what)} ({why}): the {whose} range is unknown"


def grounded(found: Verdict, server, meta: Optional[dict], placeholder: bool, pair: list[dict],
             open_loop: bool = False) -> Verdict:
    """``found`` with what it stands on besides the profile's stated range (which
    :func:`sim.whatif.stated_range.stated_range` simulates): the scenario's placeholder costs
    (``placeholder``: no profile), the engine's caveats (``server.verdict_caveats(meta)``), the
    share of the steps priced beyond the profile's data and how far (:meth:`Verdict.with_reach`,
    from the two settings' summaries ``pair``: ``run_steps`` or ``num_steps``,
    ``extrapolated_steps``, ``far_steps``, ``max_extrapolation``), and "cannot tell"
    (:data:`UNSURE`) where the launch command serves another model than the profile measured
    (``server.rests_on_another_model(meta)``; its caveat says on whose costs); in an open loop
    (``open_loop``), which settings' queue grew through the run
    (:func:`sim.trace.metrics.queue_growth`: the answer is that run length's). ``run`` and ``sweep``
    both ground their verdicts here, so a point of a sweep is as sure as its run."""
    from dataclasses import replace

    from sim.trace.metrics import queue_growth

    # the share's base is every step of the runs (extrapolated_steps counts warm-up and tail too)
    steps = sum(int(s.get("run_steps") or s.get("num_steps") or 0) for s in pair)
    extrapolated = sum(int(s.get("extrapolated_steps") or 0) for s in pair)
    far = sum(int(s.get("far_steps") or 0) for s in pair)
    farthest = max(pair, key=lambda s: _number_or(s.get("max_extrapolation"), 1.0))  # (the first of equals)
    at = farthest.get("max_extrapolation_at")
    bounded = sum(int(s.get("bounded_steps") or 0) for s in pair)  # priced below the data's contexts
    widest = max(pair, key=lambda s: _number_or(s.get("max_bounded_share"), 0.0))
    bounded_at = widest.get("max_bounded_at")
    found = replace(found, placeholder=placeholder, caveats=tuple(server.verdict_caveats(meta)),
                    open_loop=open_loop).with_reach(
        extrapolated / steps if steps else 0.0, far / steps if steps else 0.0,
        _number_or(farthest.get("max_extrapolation"), 1.0), at if isinstance(at, str) else "",
        (bounded / steps if steps else 0.0, _number_or(widest.get("max_bounded_share"), 0.0),
         bounded_at if isinstance(bounded_at, str) else ""))
    if server.rests_on_another_model(meta) and not found.failed:
        found = replace(found, answer=UNSURE)
    if open_loop:
        grew = tuple((name, *grown) for name, s in zip(found.pair[:2], pair) if (grown := queue_growth(s)))
        found = replace(found, queue_growth=grew)
    return found


def _number_or(value, default: float) -> float:
    """``value`` as a float, or ``default`` where it is missing, 0 or NaN (a sweep table's empty cell)."""
    try:
        x = float(value or default)
    except (TypeError, ValueError):
        return default
    return x if x == x else default


def verdict_platform_note(server) -> Optional[str]:
    """A line to print under the verdict when the engine on ``server.device`` ignores the flag the
    verdict names (vLLM 0.32 on CPU turns async scheduling off whatever the command says:
    :func:`sim.engines.vllm.rules.async_rules.platform_note`); None otherwise."""
    if server.engine != "vllm":
        return None
    from sim.engines.vllm.rules.async_rules import platform_note  # vLLM's rules: for a vLLM scenario only

    return platform_note(server.device, server.version)


def resolve_run_cv(flag: Optional[float], noise, device: str = "cuda") -> tuple[float, str]:
    """(cv, its source in words): ``--run-cv`` if given, else the scenario's run-level noise, else
    :data:`DEFAULT_RUN_CV` (said of a card, or of a CPU host when ``device`` is ``cpu``)."""
    if flag is not None:
        return float(flag), "--run-cv"
    stated = scenario_run_cv(noise)
    if stated is not None:
        return stated, "the scenario's costs.noise"
    if device == "cpu":
        return DEFAULT_RUN_CV, "a dedicated CPU host with nothing else running"
    if device in ("mlx", "mps"):  # (an Apple SoC: no clocks to lock; not measured either)
        return DEFAULT_RUN_CV, "as for a clock-locked card on a quiet host (not measured on an Apple SoC)"
    return DEFAULT_RUN_CV, "a clock-locked card on a quiet host"


def add_run_cv_argument(p) -> None:
    """``--run-cv`` for ``run`` and ``sweep``."""
    p.add_argument("--run-cv", type=float, default=None, metavar="CV",
                   help="run-to-run CV of one run's throughput that the verdict assumes, a fraction (0.1 for 10%%; default: the "
                        f"scenario's costs.noise.run_gpu_cv/run_cpu_cv, else {DEFAULT_RUN_CV})")


def check_run_cv(value: Optional[float]) -> None:
    """Raises :class:`sim.errors.UserInputError` naming ``--run-cv`` unless None or 0..MAX_RUN_CV."""
    from sim.errors import UserInputError

    if value is not None and not (math.isfinite(value) and 0 <= value <= MAX_RUN_CV):
        hint = f": a fraction, {value / 100:g} for {value:g}%" if math.isfinite(value) and 1 < value <= 100 else ""
        raise UserInputError("--run-cv", "", f"a coefficient of variation as a fraction from 0 to {MAX_RUN_CV:g} "
                             f"(got {value!r}{hint})")
