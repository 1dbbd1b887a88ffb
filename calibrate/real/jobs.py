"""Request lists for the real engines: token-id prompts of given lengths, shared prefixes,
length and stop-token finishes (engine-neutral JSON, read by ``realengines``).

A request is ``{"rid", "input_ids", "max_new_tokens", "ignore_eos", "stop_token_ids"?,
"temperature"?, "sampling_seed"?}``. Prompt tokens are drawn from ``[FIRST_ID, vocab)`` (the
tiny model's special tokens are 0-2), seeded; every request of a list starts with a different
first token unless it is meant to share a prefix, so the radix cache matches only what a
workload shares on purpose.
"""

from __future__ import annotations

import numpy as np

FIRST_ID = 3  # <s>, </s>, <unk> are 0, 1, 2
VOCAB = 1024


def prompt(rng: np.random.Generator, length: int, first: int | None = None, vocab: int = VOCAB) -> list[int]:
    """``length`` random token ids (``first`` as the first one when given)."""
    ids = rng.integers(FIRST_ID, vocab, size=length).tolist()
    if first is not None and length:
        ids[0] = first
    return ids


def request(rid: str, input_ids: list[int], max_new_tokens: int, stop_token: int | None = None,
            seed: int | None = None) -> dict:
    """A request that stops at ``max_new_tokens`` (``ignore_eos``), or, with ``stop_token``, when
    it samples that token (temperature 1, seeded: reproducible on any batch)."""
    req = {"rid": rid, "input_ids": [int(x) for x in input_ids], "max_new_tokens": int(max_new_tokens),
           "ignore_eos": stop_token is None}
    if stop_token is not None:
        req.update({"stop_token_ids": [int(stop_token)], "temperature": 1.0, "sampling_seed": int(seed or 0)})
    return req


class Prompts:
    """Distinct prompts: each new one gets the next first token, so no two share a radix prefix."""

    def __init__(self, seed: int, vocab: int = VOCAB):
        self.rng = np.random.default_rng(seed)
        self.vocab = vocab
        self._first = FIRST_ID

    def new(self, length: int) -> list[int]:
        first = self._first
        self._first = FIRST_ID + (self._first - FIRST_ID + 1) % (self.vocab - FIRST_ID)
        return prompt(self.rng, length, first, self.vocab)
