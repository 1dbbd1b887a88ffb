"""vLLM's own defaults for a server of a model on a card, for ``overlap-sim ask``.

vLLM 0.32 on a GPU (``engine/arg_utils.py``, ``v1/core/kv_cache_utils.py``): the OpenAI API
server's ``max_num_seqs`` and ``max_num_batched_tokens`` by the card (``EngineArgs.get_batch_defaults``,
``arg_utils.py:2894``, read in the 0.32.0 wheel: :func:`batch_defaults`), 16-token KV blocks, and
a KV cache of ``gpu_memory_utilization`` (0.9) of the card's memory less the weights (activations
and CUDA graphs not subtracted: stated), in blocks. No Apple platform is modelled.
"""

from __future__ import annotations

from sim.commands import asker, card_refusal

GPU_MEMORY_UTILIZATION = 0.9
BLOCK_SIZE = 16
GIB = 2 ** 30


def batch_defaults(card) -> tuple[int, int]:
    """``(max_num_seqs, max_num_batched_tokens)`` vLLM 0.32.0's OpenAI API server takes on
    ``card`` when the command gives neither (``EngineArgs.get_batch_defaults``): 1024 and 16384 on
    a card of 160 GiB or more (B200), 1024 and 8192 on one of 70 GiB or more whose name does not
    say A100 (H100, H200: vLLM PR #17885 found the larger budget slower on an A100), else 256 and
    2048. The card's memory is its public figure (``memory_gb``, 10^9 bytes) where vLLM reads the
    device's total memory: the thresholds fall far from every listed card's."""
    memory = card.memory_gb * 1e9
    if memory >= 160 * GIB:
        return 1024, 16384
    if memory >= 70 * GIB and "a100" not in card.name.lower():
        return 1024, 8192
    return 256, 2048


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
        ValueError: weights that do not fit the card's memory. (An Apple card, whose platform vLLM's
            model does not cover, is refused before: :func:`no_platform`, which ``ask`` and
            ``transfer`` read from :data:`sim.commands.CARD_REFUSALS`.)"""
    free = GPU_MEMORY_UTILIZATION * card.memory_gb * 1e9 - terms["P"] * terms["w"]
    if free <= 0:
        raise ValueError(f"the weights ({terms['P'] * terms['w'] / 1e9:.1f} GB) do not fit {card.name}'s "
                         f"{card.memory_gb:g} GB at gpu_memory_utilization {GPU_MEMORY_UTILIZATION}")
    blocks = int(free // (terms["kv"] * BLOCK_SIZE)) + 1
    seqs, tokens = batch_defaults(card)
    server = {"engine": "vllm", "device": "cuda", "settings": ["async", "sync"], "num_gpu_blocks": blocks,
              "max_model_len": max(8192, load["input_len"] + load["output_len"]), "max_num_seqs": seqs,
              "max_num_batched_tokens": tokens}
    notes = [f"KV cache {blocks - 1:,} blocks of {BLOCK_SIZE} tokens ({GPU_MEMORY_UTILIZATION} of "
             f"{card.memory_gb:g} GB less {terms['P'] * terms['w'] / 1e9:.1f} GB of weights)",
             f"max_num_seqs {seqs}, max_num_batched_tokens {tokens} (vLLM's API server defaults on {card.name})"]
    return server, notes
