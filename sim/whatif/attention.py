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


def attention_caveat(scenario, meta: dict | None, summaries: dict[str, dict]) -> str | None:
    """A clause where the answer rests mostly on the profile's attention: a forward measured by
    calibrate's torch harness on a card (``metadata.attention`` plain ``scaled_dot_product_attention``,
    its decode gathering the keys through ``req_to_token`` as SGLang's ``torch_native`` backend
    does, docs/calibration.md), at a load where more than :data:`ATTENTION_SHARE_CAVEAT` of a
    decode step's forward is the part that grows with context: the forward at the run's mean
    decode batch (the largest over ``summaries``) and the load's mean context (prompt plus half
    the output) against the same batch at 128 tokens of context. A production attention backend
    (FlashInfer, FA3: SGLang's and vLLM's defaults on CUDA) reads the KV cache faster, so there
    the device's time is overstated. None otherwise (or where it cannot be priced)."""
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
    share = (full - short) / full if full > 0 else 0.0
    if not share > ATTENTION_SHARE_CAVEAT:
        return None
    return (f"the profile's decode attention is calibrate's plain torch (the keys gathered through req_to_token, "
            "as SGLang's torch_native backend: about 6 passes over them at half the card's peak, where a production "
            f"kernel makes one), {share:.0%} of a decode forward at this load (batches of up to about {n} requests, "
            f"about {context:,.0f} tokens of context each): a production backend (FlashInfer, FA3: the engines' "
            "defaults on CUDA) reads the KV cache faster, so the device's time, TPOT and throughput are overstated "
            "here and the host's share understated, outside any range below (docs/calibration.md)")
