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
    stop tokens (EOS-like, seeded temperature sampling) before ``max_new_tokens``.

    ``rate_per_s`` > 0 makes the measured requests an open loop: request i (after the warm-up)
    carries ``arrival_s``, the seconds after the measured window starts at which the client
    sends it; the gaps are gamma-distributed with mean ``1 / rate_per_s`` and shape
    ``burstiness`` (1: Poisson; below 1: burstier), as ``vllm bench serve --request-rate R
    --burstiness B`` draws them (``vllm/benchmarks/serve.py``, ``get_request``); ``concurrency``
    then caps the requests in flight (0: no cap).

    ``client``: ``own`` sends this list through :mod:`realengines.client` (token-id prompts);
    ``engine`` has the engine's own benchmark client draw and send the load
    (:func:`Workload.engine_load`: vLLM's ``vllm bench serve``, SGLang's
    ``sglang.benchmark.serving``; random text prompts): the lengths
    are then the benchmark's ``--random-input-len`` / ``--random-output-len`` with one
    ``--random-range-ratio`` for both, so the two ranges must have the same relative half-width;
    ``shared_prefix`` and ``stop`` are not available to it.

    ``grammar``: ``"json_schema"`` constrains every request to :data:`JSON_SCHEMA` (vLLM's
    ``structured_outputs.json``; the engine's client gets it through ``--extra-body``); ``""``:
    none."""

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
    rate_per_s: float = 0.0
    burstiness: float = 1.0
    client: str = "own"
    grammar: str = ""

    def __post_init__(self):
        if self.client not in ("own", "engine"):
            raise ValueError(f"client: 'own' or 'engine', not {self.client!r}")
        if self.grammar not in GRAMMARS:
            raise ValueError(f"grammar: one of {sorted(GRAMMARS)}, not {self.grammar!r}")
        if self.client == "engine":
            if self.shared_prefix or self.stop:
                raise ValueError(f"{self.name}: the engine's client draws random prompts that finish by length "
                                 "(no shared_prefix, no stop)")
            if abs(_ratio(self.input_len) - _ratio(self.output_len)) > 1e-9:
                raise ValueError(f"{self.name}: the engine's client has one range ratio for input and output "
                                 f"lengths (input {self.input_len}, output {self.output_len})")

    @property
    def open_loop(self) -> bool:
        return self.rate_per_s > 0

    def arrivals_s(self) -> list[float]:
        """The measured requests' send instants (seconds after the measured window starts), one
        per request after the warm-up; empty for a closed loop. The first is sent at 0."""
        if not self.open_loop:
            return []
        n = self.num_requests - self.warmup_requests
        rng = np.random.default_rng([self.seed, 11])
        gaps = rng.gamma(self.burstiness, 1.0 / (self.rate_per_s * self.burstiness), size=n)
        gaps[0] = 0.0
        return np.cumsum(gaps).tolist()

    def engine_load(self) -> dict:
        """The load for the engine's own client (:mod:`realengines.vllm.bench`,
        :mod:`realengines.sglang.bench`): mean lengths and vLLM's range ratio, the ranges
        themselves (SGLang's benchmark reads its ratio as ``lo / hi``), the arrival knobs."""
        return {"name": self.name, "client": "engine", "num_requests": self.num_requests - self.warmup_requests,
                "warmup_requests": self.warmup_requests, "concurrency": self.concurrency,
                "rate_per_s": self.rate_per_s, "burstiness": self.burstiness,
                "input_len": round(sum(self.input_len) / 2), "output_len": round(sum(self.output_len) / 2),
                "range_ratio": _ratio(self.input_len), "input_range": list(self.input_len),
                "output_range": list(self.output_len), "seed": self.seed,
                **({"extra_body": {"structured_outputs": GRAMMARS[self.grammar]}} if self.grammar else {})}

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
        for req, at in zip(out[self.warmup_requests:], self.arrivals_s()):
            req["arrival_s"] = at
        if self.grammar:
            for req in out:
                req["structured_outputs"] = GRAMMARS[self.grammar]
        return out


def decode_waves(prefix: str, contexts: tuple[int, ...], batch_sizes: tuple[int, ...], decode_steps: int,
                 waves: int, seed: int, client: str = "own", fields: dict | None = None) -> list[dict]:
    """Decode waves of a feature's calibration session (``realengines.server``'s ``loads``): for
    each context C and batch size B, B requests in flight, ``B x waves`` in all, prompts of
    ``C - decode_steps / 2`` tokens and ``decode_steps`` output tokens each (equal lengths: each
    wave starts and finishes together), named ``<prefix>d<B>x<C>``; ``fields`` are added to every
    request (a grammar: ``structured_outputs``).

    ``client`` ``own``: token-id prompts (:class:`Prompts` of ``seed``) sent by
    :mod:`realengines.client`; ``engine``: the same waves drawn and sent by the engine's own
    benchmark client (random text prompts of those lengths, which the server's tokenizer may
    make a few tokens longer or shorter; ``fields`` through ``--extra-body``)."""
    prompts = Prompts(seed)
    loads = []
    for c in contexts:
        for b in batch_sizes:
            name, prompt_len = f"{prefix}d{b}x{c}", c - decode_steps // 2
            if client == "engine":
                loads.append({"name": name, "client": "engine", "num_requests": b * waves, "warmup_requests": 0,
                              "concurrency": b, "rate_per_s": 0.0, "input_len": prompt_len,
                              "output_len": decode_steps, "range_ratio": 0.0, "seed": seed,
                              **({"extra_body": fields} if fields else {})})
                continue
            reqs = [{**request(f"{name}-{i}", prompts.new(prompt_len), decode_steps), **(fields or {})}
                    for i in range(b * waves)]
            loads.append({"name": name, "concurrency": b, "warmup_requests": 0, "requests": reqs})
    return loads


# One free string: a random-weight model stays inside it for most of its tokens (a request whose
# grammar ended runs unconstrained in vLLM)
JSON_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
               "additionalProperties": False}
GRAMMARS = {"": None, "json_schema": {"json": JSON_SCHEMA}}  # Workload.grammar -> structured_outputs


def _ratio(span: tuple[int, int]) -> float:
    """The relative half-width of a uniform length range (vLLM's ``--random-range-ratio``)."""
    lo, hi = span
    return (hi - lo) / (hi + lo) if hi + lo else 0.0
