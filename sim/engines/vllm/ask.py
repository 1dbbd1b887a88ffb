"""vLLM's own defaults for a server of a model on a card, for ``overlap-sim ask``.

vLLM 0.32 on a GPU (``engine/arg_utils.py``, ``v1/core/kv_cache_utils.py``): ``max_num_seqs`` 256
and ``max_num_batched_tokens`` 2048 (the scenario's defaults for ``device: cuda``), 16-token KV
blocks, and a KV cache of ``gpu_memory_utilization`` (0.9) of the card's memory less the weights
(activations and CUDA graphs not subtracted: stated), in blocks. No Apple platform is modelled.
"""

from __future__ import annotations

from sim.commands import asker, card_refusal

GPU_MEMORY_UTILIZATION = 0.9
BLOCK_SIZE = 16


@card_refusal("vllm")
def no_platform(card) -> str | None:
    """Why vLLM has no modelled platform on ``card`` (Apple's: vLLM's Metal back end is not
    modelled, only CUDA and its CPU build), or None."""
    if card.name.startswith("Apple"):
        return f"vLLM on {card.name}: no Apple platform is modelled (vLLM's CUDA and CPU platforms are)"
    return None


@asker("vllm")
def server_defaults(card, terms: dict, load: dict) -> tuple[dict, list[str]]:
    """``(server section, assumptions in words)`` of a vLLM server of a model on ``card``.

    Raises:
        ValueError: an Apple card (vLLM's Metal platform is not modelled), or weights that do
            not fit the card's memory."""
    if (why := no_platform(card)) is not None:
        raise ValueError(why)
    free = GPU_MEMORY_UTILIZATION * card.memory_gb * 1e9 - terms["P"] * terms["w"]
    if free <= 0:
        raise ValueError(f"the weights ({terms['P'] * terms['w'] / 1e9:.1f} GB) do not fit {card.name}'s "
                         f"{card.memory_gb:g} GB at gpu_memory_utilization {GPU_MEMORY_UTILIZATION}")
    blocks = int(free // (terms["kv"] * BLOCK_SIZE)) + 1
    server = {"engine": "vllm", "device": "cuda", "settings": ["async", "sync"], "num_gpu_blocks": blocks,
              "max_model_len": max(8192, load["input_len"] + load["output_len"])}
    notes = [f"KV cache {blocks - 1:,} blocks of {BLOCK_SIZE} tokens ({GPU_MEMORY_UTILIZATION} of "
             f"{card.memory_gb:g} GB less {terms['P'] * terms['w'] / 1e9:.1f} GB of weights)",
             "max_num_seqs 256, max_num_batched_tokens 2048 (vLLM's GPU defaults)"]
    return server, notes
