"""Where a run's answer rests on calibrate's own model standing in for the engine's on a card:

- **its attention** (a caveat): calibrate's torch harness prices decode attention with plain
  ``scaled_dot_product_attention`` over keys gathered through ``req_to_token``
  (docs/calibration.md), slower than the engines' production backends on a card; where that part
  of a decode forward is large at the run's load, the verdict says so;
- **its prefill launch** (a clause, simulated): on CUDA the harness times a prefill's launch as its
  own model queued kernel by kernel (eager), in place of the engine's model, whose launch no
  calibration measures (the host calibration stubs the forward out); that part of
  ``launch.extend`` (:func:`sim.model.profile_costs.device_launch_part`) can be most of a
  prefill's host time. :func:`prefill_launch_floor` simulates the run again without it
  (``costs.cpu.extend_launch_device_scale`` 0: the engine's host part alone, a floor the truth lies
  above) and the verdict says how far the ratio and the latencies move. Like a bound below the
  profile's contexts (:mod:`sim.model.reach`), the floor does not turn the answer: it is an end no
  engine reaches, the measured launch the other; the clause says which answers lie between.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from typing import Optional

from sim.jsonio import is_number
from sim.model.costs import DECODE, EXTEND
from sim.model.workload import make_requests
from sim.simulate import cost_model

ATTENTION_SHARE_CAVEAT = 0.25  # the share of a decode forward that grows with context, beyond which it is said
PLAIN_ATTENTION = "scaled_dot_product_attention"  # calibrate's torch harness (metadata.attention)


def attention_share(scenario, meta: dict | None, summaries: dict[str, dict]) -> tuple[float, int, float] | None:
    """The part of a decode forward that grows with context, where the answer may rest on the
    profile's attention: a forward measured by calibrate's torch harness on a card
    (``metadata.attention`` plain ``scaled_dot_product_attention``, its decode gathering the keys
    through ``req_to_token`` as SGLang's ``torch_native`` backend does, docs/calibration.md):
    the forward at the run's mean decode batch (the largest over ``summaries``) and the load's
    mean context (prompt plus half the output) against the same batch at 128 tokens of context.
    Returns (that share, the batch, the context in tokens); None where the profile's attention is
    not calibrate's plain torch on a card, or where it cannot be priced."""
    if not isinstance(meta, dict) or meta.get("attention") != PLAIN_ATTENTION or meta.get("device") == "cpu":
        return None
    batches = [s.get("mean_decode_batch_size") for s in summaries.values()]
    batches = [float(b) for b in batches if isinstance(b, (int, float)) and b == b and b >= 1]
    if not batches or not scenario.costs.profile:
        return None
    try:
        specs = make_requests(scenario)
        context = float(specs.input_len.mean() + specs.output_len.mean() / 2)
        costs = cost_model(scenario, scenario.server.settings[0])
        n = max(1, round(max(batches)))
        full = costs.forward_s(DECODE, n, n, round(n * context))
        short = costs.forward_s(DECODE, n, n, round(n * min(context, 128.0)))
    except Exception:  # (a profile or cost model that cannot price it: no caveat rather than a wrong one)
        return None
    return ((full - short) / full if full > 0 else 0.0), n, context


def attention_caveat(scenario, meta: dict | None, summaries: dict[str, dict]) -> str | None:
    """A clause where the answer rests mostly on the profile's attention: more than
    :data:`ATTENTION_SHARE_CAVEAT` of a decode step's forward is the part that grows with context
    (:func:`attention_share`). A production attention backend (FlashInfer, FA3: SGLang's and
    vLLM's defaults on CUDA) reads the KV cache faster, so there the device's time is overstated.
    None otherwise (or where it cannot be priced)."""
    found = attention_share(scenario, meta, summaries)
    if found is None or not found[0] > ATTENTION_SHARE_CAVEAT:
        return None
    share, n, context = found
    return (f"{PLAIN_WORDS}, {share:.0%} of a decode forward at this load (batches of up to about {n} requests, "
            f"about {context:,.0f} tokens of context each): {overstated_words('here ')}, outside any range below "
            "(docs/calibration.md)")


def attention_sweep_clause(shares: list[tuple[float, str]], points: int) -> str:
    """A sweep's clause for the points where :func:`attention_caveat` would be said (``shares``:
    each point's share and its grid values in words, :func:`attention_share`; ``points``: how
    many points answered); '' at none."""
    over = [(share, where) for share, where in shares if share > ATTENTION_SHARE_CAVEAT]
    if not over:
        return ""
    share, where = max(over)
    return (f"at {len(over)} of {points} points {PLAIN_WORDS}, over {ATTENTION_SHARE_CAVEAT:.0%} of a decode "
            f"forward (up to {share:.0%}, at {where}): there {overstated_words()} (docs/calibration.md)")


PLAIN_WORDS = ("the profile's decode attention is calibrate's plain torch (the keys gathered through req_to_token, "
               "as SGLang's torch_native backend: about 6 passes over them at half the card's peak, where a production "
               "kernel makes one)")


def overstated_words(where: str = "") -> str:
    """What a production attention backend would change, in words (``where``: "here " or "")."""
    return ("a production backend (FlashInfer, FA3: the engines' defaults on CUDA) reads the KV cache faster, "
            f"so the device's time and TPOT are overstated {where}and throughput and the host's share understated "
            "(and with them, where the device is the slower side, what overlapping the host is worth)")


# the floor is said where it moves the throughput ratio or a median latency by at least this much
LAUNCH_FLOOR_RATIO_MOVE, LAUNCH_FLOOR_LATENCY_MOVE = 0.005, 0.05


@dataclass(frozen=True)
class LaunchFloor:
    """The run again with the prefill launch's device part nil (:func:`prefill_launch_floor`).

    Attributes:
        device_ms, launch_ms: that part, and the whole launch, of a one-request prefill of the
            load's mean new tokens (``tokens``), milliseconds.
        host_ms: the launch less that part there (the engine's host part).
        outlived: the profile's prefill sizes (tokens) whose device part lasted at least the
            harness's longest stream hold, ``hold_ms`` (``metadata.composed.device_launch_outlived_hold``,
            written by ``overlap-sim compose``: :func:`calibrate.host.compose.launches_outliving_hold`).
        summaries: (overlapping, synchronous) summaries at the floor; None where not simulated.
    """

    tokens: int
    device_ms: float
    launch_ms: float
    host_ms: float
    outlived: tuple
    hold_ms: float = math.nan
    summaries: Optional[tuple] = None


def prefill_launch_part(scenario, setting: str) -> Optional[tuple]:
    """(new tokens, device part s, whole launch s) of a one-request prefill of the load's mean
    new tokens under ``setting``, as the run prices them (``costs.cpu.scale`` and
    ``costs.cpu.extend_launch_device_scale`` applied), where the profile's prefill launch has a device part
    (:func:`sim.model.profile_costs.device_launch_part`); None otherwise (or where it cannot be
    priced)."""
    try:
        costs = cost_model(scenario, setting)
        part = getattr(costs, "device_launch", None)
        if part is None:
            return None
        specs = make_requests(scenario)
        tokens = max(1, round(float((specs.input_len - specs.cached_len).mean())))
        scale = costs.cpu_scale * scenario.costs.cpu.extend_launch_device_scale  # (as the run priced it)
        return tokens, part(tokens) * scale, costs.launch_s(EXTEND, 1, tokens, tokens)
    except Exception:  # (a profile or cost model that cannot price it: no clause rather than a wrong one)
        return None


def prefill_launch_floor(scenario, meta: dict | None, pair: tuple, simulate_it: bool = True,
                         tables: str = "steps") -> Optional[LaunchFloor]:
    """The run's settings ``pair`` (overlapping, synchronous) simulated again with the device part
    of every prefill's launch nil (``costs.cpu.extend_launch_device_scale`` 0), where the profile
    has such a part (:func:`prefill_launch_part`); None otherwise. ``tables``: as the run kept them
    (``steps``: exact medians, as the run's; ``none``: streamed). ``simulate_it`` False
    (``run --no-range``) gives the part without the runs."""
    found = prefill_launch_part(scenario, pair[0])
    if found is None:
        return None
    tokens, device_s, launch_s = found
    composed = (meta or {}).get("composed") if isinstance(meta, dict) else None
    held = composed.get("device_launch_outlived_hold") if isinstance(composed, dict) else None
    outlived, hold_s = (), math.nan
    if isinstance(held, dict) and isinstance(held.get("num_tokens"), list):
        outlived = tuple(float(x) for x in held["num_tokens"] if is_number(x, 0.0, FLOAT_MAX))
        hold_s = float(held["hold_max_s"]) if is_number(held.get("hold_max_s"), 0.0, FLOAT_MAX) else math.nan
    floor = LaunchFloor(tokens, device_s * 1e3, launch_s * 1e3, max(0.0, launch_s - device_s) * 1e3, outlived,
                        hold_s * 1e3)
    if not simulate_it:
        return floor
    from sim.simulate import simulate

    sc = scenario.with_overrides(["costs.cpu.extend_launch_device_scale=0"])
    return replace(floor, summaries=tuple(simulate(sc, name, tables=tables).summary() for name in pair[:2]))


HARNESS_WORDS = "the calibration harness's own plain-torch model (overlap-sim calibrate)"


FLOAT_MAX = sys.float_info.max  # (is_number's bound: a finite time, size or throughput)
MOSTLY = 0.5  # the harness's share of a prefill's launch from which the launch is "mostly" its


def _moved(a, b, share: float) -> bool:
    """Whether ``a`` lies ``share`` or more from ``b`` (> 0), relatively; False for a missing one."""
    return is_number(a, 0.0, FLOAT_MAX) and is_number(b, 0.0, FLOAT_MAX, above=True) and abs(a / b - 1.0) >= share


def launch_floor_clause(floor: LaunchFloor, found, summaries: dict[str, dict],
                        not_simulated_by: str = "--no-range") -> str:
    """The verdict's clause on the prefill launch (:func:`prefill_launch_floor`), '' where the floor
    moves neither the throughput ratio (by :data:`LAUNCH_FLOOR_RATIO_MOVE`) nor a median TTFT or
    TPOT (by :data:`LAUNCH_FLOOR_LATENCY_MOVE`). ``found``: the run's verdict
    (:class:`sim.whatif.verdict.Verdict`); ``summaries``: the run's, by setting; a floor not
    simulated says why (``not_simulated_by``)."""
    from sim.whatif.verdict import _ANSWER_WORDS, decide

    whole = floor.host_ms <= 0.0  # (a CUDA torch calibration used as it is: its launch is all the harness's)
    share = f"{floor.launch_ms:.3g} ms" if whole else f"{floor.device_ms:.3g} of {floor.launch_ms:.3g} ms"
    how = "" if whole else "mostly " if mostly_harness(floor.device_ms, floor.launch_ms) else "partly "
    part = (f"the profile's prefill launch is {how}{HARNESS_WORDS} queued kernel by kernel "
            f"in place of the engine's ({share} at this load's {floor.tokens:,} new "
            f"token{'s' if floor.tokens != 1 else ''} a request; no calibration times the engine's own model launch: "
            "docs/calibration.md)")
    if floor.outlived:
        lo, hi = min(floor.outlived), max(floor.outlived)
        sizes = (f"at every prefill size the device calibration measured ({lo:,.0f} to {hi:,.0f} tokens)"
                 if len(floor.outlived) > 1 else f"at the device calibration's {lo:,.0f}-token prefill")
        hold = f" ({floor.hold_ms:.3g} ms)" if math.isfinite(floor.hold_ms) else ""
        part += (f"; {sizes} that part lasted at least the harness's longest stream hold{hold}, so it likely counts "
                 "time the CPU waited for the device too")
    if floor.summaries is None:
        return part + (f"; were {'the launch' if whole else 'that part'} nil, the TTFTs would be lower (not simulated: "
                       f"{not_simulated_by})")
    names = found.pair[:2]
    now = [summaries[n] for n in names]
    low = floor.summaries

    def medians(key: str, rows) -> str:  # (as the verdict's head gives them: TTFT to 0.01 ms, TPOT to 0.001)
        digits = 2 if key == "median_ttft_ms" else 3
        return " vs ".join(f"{r.get(key):.{digits}f}" if is_number(r.get(key), 0.0, FLOAT_MAX) else "n/a"
                           for r in rows)

    moved_latency = {key for key in ("median_ttft_ms", "median_tpot_ms")
                     if any(_moved(a.get(key), b.get(key), LAUNCH_FLOOR_LATENCY_MOVE) for a, b in zip(low, now))}
    num, den = (r.get("output_throughput") for r in low)
    ratio = num / den if is_number(num, 0.0, FLOAT_MAX) and is_number(den, 0.0, FLOAT_MAX, above=True) else math.nan
    latency_answer = found.arrivals_set_throughput()
    moved_ratio = not latency_answer and math.isfinite(ratio) and math.isfinite(found.throughput_ratio) \
        and _moved(ratio, found.throughput_ratio, LAUNCH_FLOOR_RATIO_MOVE)
    if not moved_latency and not moved_ratio:
        return ""
    out = ["were the launch nil (a floor the truth lies above)" if whole else
           f"were that part nil (the engine's host part alone, {floor.host_ms:.2g} ms, a floor the truth lies above)"]
    if latency_answer:
        out.append("the arrivals set both throughputs")
    elif math.isfinite(ratio) and ratio > 0:
        a, b = decide(ratio, found.run_cv), decide(found.throughput_ratio, found.run_cv)
        if a != b:
            there = (f" ('{_ANSWER_WORDS[a]}' there, '{_ANSWER_WORDS[b]}' at the profile's launch: which holds "
                     "depends on the engine's launch, between the two; the answer above stands on the profile's)")
        else:
            there = f" ('{_ANSWER_WORDS[a]}' there too)"
        out.append(f"the ratio would be {ratio:.3f}x{there}")
    moved = [(key, label) for key, label in (("median_ttft_ms", "median TTFT"), ("median_tpot_ms", "median TPOT"))
             if key in moved_latency or (key == "median_ttft_ms" and moved_ratio)]
    for key, label in moved:
        out.append(f"{label} {medians(key, low)} ms (from {medians(key, now)} ms)")
    tail = (f"; the engine's {' and '.join(label.split()[1] + 's' for _, label in moved)} likely lie between the two "
            "(its fused kernels are fewer than the harness's)") if moved else ""
    return part + "; " + ", ".join(out) + tail


def mostly_harness(device_ms: float, launch_ms: float) -> bool:
    """Whether a prefill's launch is mostly the harness's own model: its device part at least
    :data:`MOSTLY` of the launch."""
    return launch_ms > 0.0 and device_ms >= MOSTLY * launch_ms


def launch_floor_json(floor: LaunchFloor, names: tuple) -> dict:
    """:class:`LaunchFloor` for ``summary.json`` and ``run --json`` (``names``: the settings of
    ``floor.summaries``, in order)."""
    out = {"new_tokens": floor.tokens, "device_part_ms": floor.device_ms, "launch_ms": floor.launch_ms,
           "host_part_ms": floor.host_ms, "outlived_hold_num_tokens": list(floor.outlived), "simulated": False}
    if floor.summaries is not None:
        out["simulated"] = True
        keys = ("output_throughput", "median_ttft_ms", "median_tpot_ms")
        out["at_floor"] = {n: {k: s.get(k) for k in keys} for n, s in zip(names, floor.summaries)}
    return out


def prefill_launch_sweep_clause(parts: list[tuple[float, float, str]], points: int) -> str:
    """A sweep's clause for the points whose prefill launch is mostly the harness's own model
    (``parts``: each grounded point's device part and whole launch of a prefill, ms, and its grid
    values in words, :func:`prefill_launch_part`; ``points``: how many points answered); '' at none.
    A sweep simulates no floor: ``overlap-sim run`` at a point does."""
    mostly = [(device, launch, where) for device, launch, where in parts if mostly_harness(device, launch)]
    if not mostly:
        return ""
    device, launch, where = max(mostly)
    return (f"at {len(mostly)} of {points} points the profile's prefill launch is mostly {HARNESS_WORDS} "
            f"queued kernel by kernel in place of the engine's (up to {device:.3g} of {launch:.3g} ms a prefill, at "
            f"{where}): the TTFTs rest on it, and `overlap-sim run` at a point says how far they move without it "
            "(docs/calibration.md)")
