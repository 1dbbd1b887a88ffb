"""The harness's requests: real-text prompts with the configured lengths, stop strings, the
closed-loop clients that send them, and the model's EOS script.

Lengths come from :func:`sim.model.workload.make_requests` on the configuration's scenario, so the
simulation sees the same requests. Each prompt is ``cached_len`` tokens of a shared system
prompt (put into the radix cache before the run, as the simulator assumes), one token that is
unique to the request (so the radix match is exactly ``cached_len``: no two prompts share more),
then real text. The model has random weights, so what it samples is arbitrary: the
:class:`EosScript` makes it sample EOS exactly at ``output_len`` for ``finish: eos`` and never
before (with ``finish: length`` never at all), the way a trained model ends an answer.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from calibrate.bookkeeping.requests import EOS, TextSource
from calibrate.harness.config import EOS_SLACK, HarnessConfig


def stop_strings(n: int) -> list[str]:
    """``n`` stop strings that random model output does not produce (a check that never fires,
    as in most real requests, but costs what the check costs)."""
    return [f"\u00a7stop-{i}\u00a7" for i in range(n)]


@dataclass
class Workload:
    """The requests of one run. Arrays have one entry per request id (the order they are sent).

    Attributes:
        messages: pickled ``recv_pyobj`` messages. input_len, cached_len, output_len: tokens.
        system_prompt: the shared prefix (its first ``cached_len`` tokens start each prompt).
        eos_at: for each request, the output token index (1-based) at which the model samples
            EOS (0: never).
    """

    messages: list[bytes]
    input_len: np.ndarray
    cached_len: np.ndarray
    output_len: np.ndarray
    system_prompt: list[int]
    eos_at: np.ndarray
    eos_id: int

    def __len__(self) -> int:
        return len(self.messages)


def build_workload(cfg: HarnessConfig, tokenizer: Tokenizer) -> Workload:
    """The configuration's requests as ``recv`` messages (real text from :class:`TextSource`).

    Raises:
        ValueError: more requests than the vocabulary can give unique first tokens.
    """
    import sim
    from sim.model.workload import make_requests

    specs = make_requests(sim.load_scenario(cfg.scenario()))
    n = len(specs)
    vocab = tokenizer.get_vocab_size()
    eos_id = tokenizer.token_to_id(EOS)
    text = TextSource(tokenizer)
    system = text.take(int(specs.cached_len.max()))
    used: set[tuple[int, int]] = set()
    stops = stop_strings(cfg.stop_strings)
    messages, eos_at = [], np.zeros(n, dtype=np.int64)
    candidates = [t for t in range(vocab) if t != eos_id]
    for rid in range(n):
        c, length, out = int(specs.cached_len[rid]), int(specs.input_len[rid]), int(specs.output_len[rid])
        after = system[c] if c < len(system) else -1
        unique = next((t for t in candidates if t != after and (c, t) not in used), None)
        if unique is None:
            raise ValueError(f"{n} requests need more unique first tokens than the vocabulary ({vocab}) has")
        used.add((c, unique))
        prompt = system[:c] + [unique] + text.take(length - c - 1)
        max_new = out if cfg.finish == "length" else out + EOS_SLACK
        eos_at[rid] = out if cfg.finish == "eos" else 0
        messages.append(pickle.dumps({"rid": rid, "input_ids": prompt,
                                      "sampling_params": {"max_new_tokens": max_new, "stop": stops}}))
    return Workload(messages, specs.input_len, specs.cached_len, specs.output_len, system, eos_at, eos_id)


class EosScript:
    """What the random-weight model samples at the end of an answer: EOS at the request's
    ``eos_at``-th output token, never earlier (a sampled EOS becomes the next token id).
    Lives with the device (it is the model's behaviour, not the scheduler's knowledge); the
    device learns a request's id when its prefill starts (``admit``)."""

    def __init__(self, eos_at: np.ndarray, eos_id: int, max_slots: int):
        self.eos_at = eos_at.tolist()
        self.eos_id = eos_id
        self.slot_eos = [0] * max_slots  # the EOS position of the request in each slot
        self.produced = [0] * max_slots

    def admit(self, slot: int, rid: int) -> None:
        self.slot_eos[slot] = self.eos_at[rid]
        self.produced[slot] = 0

    def apply(self, slots, tokens: list[int]) -> list[int]:
        """Count one output token for each slot and fix ``tokens`` in place; returns them."""
        eos, produced, at = self.eos_id, self.produced, self.slot_eos
        for i, s in enumerate(slots):
            k = produced[s] + 1
            produced[s] = k
            if k == at[s]:
                tokens[i] = eos
            elif tokens[i] == eos:
                tokens[i] = eos + 1
        return tokens


class ClosedLoopClients:
    """``concurrency`` clients, each sending its next request the moment its previous one
    finished (the simulator's :class:`sim.model.workload.ClosedLoopClients`); request ids in order."""

    def __init__(self, workload: Workload, concurrency: int):
        self.workload = workload
        self.next = 0
        self.arrival = np.full(len(workload), np.nan)
        self.inbox: list[bytes] = []
        self.concurrency = concurrency

    def start(self, t: float) -> None:
        for _ in range(min(self.concurrency, len(self.workload))):
            self.send(t)

    def send(self, t: float) -> None:
        if self.next < len(self.workload):
            self.arrival[self.next] = t
            self.inbox.append(self.workload.messages[self.next])
            self.next += 1

    def drain(self) -> list[bytes]:
        """``recv_requests``: everything that has arrived."""
        out, self.inbox = self.inbox, []
        return out
