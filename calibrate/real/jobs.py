"""Request lists for the real engines: token-id prompts of given lengths, shared prefixes,
length and stop-token finishes (engine-neutral JSON, read by ``realengines``).

A request is ``{"rid", "input_ids", "max_new_tokens", "ignore_eos", "stop_token_ids"?,
"temperature"?, "sampling_seed"?}``. Prompt tokens are drawn from ``[FIRST_ID, vocab)`` (the
tiny model's special tokens are 0-2), seeded; every request of a list starts with a different
first token unless it is meant to share a prefix, so the radix cache matches only what a
workload shares on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FIRST_ID = 3  # <s>, </s>, <unk> are 0, 1, 2
VOCAB = 1024


def prompt(rng: np.random.Generator, length: int, first: int | None = None, vocab: int = VOCAB) -> list[int]:
    """``length`` random token ids (``first`` as the first one when given)."""
    ids = rng.integers(FIRST_ID, vocab, size=length).tolist()
    if first is not None and length:
        ids[0] = first
    return ids


def request(rid: str, input_ids: list[int], max_new_tokens: int, stop_tokens: list[int] | None = None,
            seed: int | None = None) -> dict:
    """A request that stops at ``max_new_tokens`` (``ignore_eos``), or, with ``stop_tokens``, also
    when it samples one of them (temperature 1, seeded: reproducible on any batch). The tiny
    random-weight model samples nearly uniformly over its vocabulary, so ``s`` stop tokens end a
    request after a geometric number of tokens with mean about vocab/s: an EOS-like finish the
    scheduler cannot foresee."""
    req = {"rid": rid, "input_ids": [int(x) for x in input_ids], "max_new_tokens": int(max_new_tokens),
           "ignore_eos": not stop_tokens}
    if stop_tokens:
        req.update({"stop_token_ids": [int(t) for t in stop_tokens], "temperature": 1.0,
                    "sampling_seed": int(seed or 0)})
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


@dataclass(frozen=True)
class Workload:
    """A workload for a real engine: ``num_requests`` requests (the first ``warmup_requests`` of
    them a warm-up), ``concurrency`` in flight, prompt and output lengths uniform on [lo, hi]
    (tokens), extra launch flags; ``shared_prefix``: tokens every prompt starts with (a system
    prompt: radix-cache hits); ``stop``: requests may also stop at one of ``stop_tokens`` sampled
    stop tokens (EOS-like, seeded temperature sampling) before ``max_new_tokens``."""

    name: str
    num_requests: int = 40
    concurrency: int = 8
    input_len: tuple[int, int] = (64, 256)
    output_len: tuple[int, int] = (16, 96)
    shared_prefix: int = 0
    stop: bool = False
    stop_tokens: int = 8
    server_args: tuple[str, ...] = ()
    seed: int = 0
    warmup_requests: int = 0

    def requests(self, prefix: str = "q") -> list[dict]:
        """The request list (ids ``<prefix>0``, ``<prefix>1``, ...), the same for a given seed."""
        rng = np.random.default_rng([self.seed, 7])
        prompts = Prompts(self.seed)
        shared = prompts.new(self.shared_prefix) if self.shared_prefix else []
        out = []
        for i in range(self.num_requests):
            n_in = int(rng.integers(self.input_len[0], self.input_len[1] + 1))
            n_out = int(rng.integers(self.output_len[0], self.output_len[1] + 1))
            ids = shared + prompts.new(n_in)
            if self.stop:  # s stop tokens: about s in 1021 sampled tokens end the request
                stops = rng.integers(3, 1024, size=self.stop_tokens).tolist()
                out.append(request(f"{prefix}{i}", ids, n_out, stop_tokens=stops, seed=i))
            else:
                out.append(request(f"{prefix}{i}", ids, n_out))
        return out
