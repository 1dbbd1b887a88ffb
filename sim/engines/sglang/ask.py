"""SGLang's own defaults for a server of a model on a card, for ``overlap-sim ask``.

What SGLang 0.5.23 sizes by itself at start-up (``srt/model_executor/pool_configurator.py``),
approximated from the card's memory and the model's shape:

- the KV pool: ``mem_fraction_static`` of the card's memory less the weights, in tokens of K and V
  over all layers (``MEM_FRACTION_STATIC``: SGLang picks it from the GPU's memory, 0.83-0.88 on
  24-141 GB cards; 0.88 here, stated);
- ``max_running_requests`` (``_resolve_max_running_requests_per_worker``): the pool's tokens over
  the context length times 512, clamped to [2048, 4096], and at most half the pool's tokens;
- ``chunked_prefill_size`` 8192 and the rest of the scenario's defaults (v0.5.22's retraction and
  admission).

On an Apple card the loop is ``event_loop_overlap_mlx`` (settings ``overlap_mlx``/``normal``).
"""

from __future__ import annotations

from sim.commands import asker

MEM_FRACTION_STATIC = 0.88
CONTEXT_LEN = 131072  # Llama 3.x's max_position_embeddings: SGLang's default context length


@asker("sglang")
def server_defaults(card, terms: dict, load: dict) -> tuple[dict, list[str]]:
    """``(server section, assumptions in words)`` of an SGLang server of a model (``terms``:
    :func:`sim.model.transfer.model_terms` of its profile) on ``card`` (:class:`sim.model.cards.Card`).

    Raises:
        ValueError: the weights do not fit the card's memory at that fraction."""
    free = MEM_FRACTION_STATIC * card.memory_gb * 1e9 - terms["P"] * terms["w"]
    if free <= 0:
        raise ValueError(f"the weights ({terms['P'] * terms['w'] / 1e9:.1f} GB) do not fit {card.name}'s "
                         f"{card.memory_gb:g} GB at mem_fraction_static {MEM_FRACTION_STATIC}")
    pool = int(free // terms["kv"])
    max_running = min(max(min(int(pool / CONTEXT_LEN * 512), 4096), 2048), max(pool // 2, 1))
    apple = card.key.startswith("m")
    server = {"engine": "sglang", "device": "mlx" if apple else "cuda",
              "settings": ["overlap_mlx", "normal"] if apple else ["overlap", "normal"],
              "max_running_requests": max_running, "chunked_prefill_size": 8192, "kv_pool_tokens": pool}
    notes = [f"KV pool {pool:,} tokens ({MEM_FRACTION_STATIC} of {card.memory_gb:g} GB less "
             f"{terms['P'] * terms['w'] / 1e9:.1f} GB of weights)", f"max_running_requests {max_running} "
             "(SGLang's own sizing from the pool)"]
    return server, notes
