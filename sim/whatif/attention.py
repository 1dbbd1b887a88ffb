"""The caveat a run's verdict carries where its answer rests on the profile's attention:
calibrate's torch harness prices decode attention with plain ``scaled_dot_product_attention``
over keys gathered through ``req_to_token`` (docs/calibration.md), slower than the engines'
production backends on a card; where that part of a decode forward is large at the run's load,
the verdict says so."""

from __future__ import annotations

from sim.model.costs import DECODE
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
    return (f"; at {len(over)} of {points} points {PLAIN_WORDS}, over {ATTENTION_SHARE_CAVEAT:.0%} of a decode "
            f"forward (up to {share:.0%}, at {where}): there {overstated_words()} (docs/calibration.md)")


PLAIN_WORDS = ("the profile's decode attention is calibrate's plain torch (the keys gathered through req_to_token, "
               "as SGLang's torch_native backend: about 6 passes over them at half the card's peak, where a production "
               "kernel makes one)")


def overstated_words(where: str = "") -> str:
    """What a production attention backend would change, in words (``where``: "here " or "")."""
    return ("a production backend (FlashInfer, FA3: the engines' defaults on CUDA) reads the KV cache faster, "
            f"so the device's time and TPOT are overstated {where}and throughput and the host's share understated "
            "(and with them, where the device is the slower side, what overlapping the host is worth)")
