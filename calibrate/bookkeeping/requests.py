"""Requests as the scheduler holds them, with a real tokenizer built offline.

:func:`build_tokenizer` trains a byte-level BPE tokenizer (the kind Llama 3 and Qwen use) in
memory with the ``tokenizers`` package, on English text taken from the Python standard
library's docstrings: no download, same tokenizer on every machine with the same Python.
:class:`Req` carries what SGLang's ``Req`` needs per step: output ids, incremental
detokenization (``tokenizers.decoders.DecodeStream``), and the EOS / stop-string / length
checks of ``Req.check_finished``.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from dataclasses import dataclass, field

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tokenizers.decoders import DecodeStream

EOS = "<|eot|>"
_CORPUS_MODULES = ("argparse", "collections", "json", "re", "string", "textwrap", "statistics", "datetime",
                   "pathlib", "functools", "itertools", "heapq", "random", "logging", "subprocess", "threading",
                   "csv", "decimal", "fractions", "unittest", "inspect", "typing", "os", "shutil", "tarfile",
                   "zipfile", "email.message", "http.client", "urllib.parse", "asyncio", "dataclasses", "enum")


def corpus_text(max_chars: int = 600_000) -> list[str]:
    """Paragraphs of English prose from standard-library docstrings (deterministic per Python version)."""
    with warnings.catch_warnings():  # getattr on deprecated aliases (typing.io) warns
        warnings.simplefilter("ignore")
        return _corpus(max_chars)


def _corpus(max_chars: int) -> list[str]:
    out, total = [], 0
    for name in _CORPUS_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        for obj in [mod] + [getattr(mod, a) for a in sorted(dir(mod)) if not a.startswith("_")]:
            doc = inspect.getdoc(obj) if (inspect.ismodule(obj) or inspect.isclass(obj) or callable(obj)) else None
            if doc:
                for para in doc.split("\n\n"):
                    para = " ".join(para.split())
                    if len(para) > 40:
                        out.append(para)
                        total += len(para)
            if total >= max_chars:
                return out
    return out


def build_tokenizer(vocab_size: int = 8192) -> Tokenizer:
    """A byte-level BPE tokenizer trained in memory (about a second), with ``EOS`` as a special token."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus_text(), trainer)
    return tok


class TextSource:
    """Token ids of real text, served in slices (prompts, and output tokens to feed the
    detokenizer); wraps around."""

    def __init__(self, tokenizer: Tokenizer):
        self.ids = np.asarray(tokenizer.encode(" ".join(corpus_text(200_000))).ids, dtype=np.int64)
        self.pos = 0

    def take(self, n: int) -> list[int]:
        if self.pos + n > len(self.ids):
            self.pos = 0
        out = self.ids[self.pos:self.pos + n].tolist()
        self.pos += n
        return out


@dataclass(eq=False)
class Req:
    """One request (SGLang ``Req``, reduced to what the scheduler touches per step).

    Attributes:
        rid: request id. input_ids: prompt token ids. max_new_tokens: length limit.
        stop_strs: stop strings; eos_ids: token ids that end the request.
        output_ids: sampled tokens so far. text: detokenized output so far.
        req_slot: request slot (row of the model's KV cache), -1 before admission.
        prefix_indices: KV indices of the cached prefix (radix hit), then of all computed tokens.
        last_node: radix node the request holds a lock on. finished_reason: None while running.
        inflight: tokens sampled by launched batches whose results are not processed yet (0 or
            1 in a synchronous loop, up to 2 under overlap). extend_done: prompt tokens already
            scheduled for prefill (chunked prefill continues from there). in_running: joined the
            running batch.
    """

    rid: str
    input_ids: list[int]
    max_new_tokens: int
    stop_strs: tuple[str, ...] = ()
    eos_ids: frozenset = frozenset()
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    req_slot: int = -1
    prefix_indices: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    out_cache_loc: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    last_node: object = None
    finished_reason: str | None = None
    inflight: int = 0  # sampled tokens scheduled (a prefill's last chunk, decodes) whose results are not processed
    extend_done: int = 0  # prompt tokens whose KV is in the pool or being computed (chunked prefill)
    in_running: bool = False  # joined the running batch
    _stream: DecodeStream | None = None
    _stop_len: int = 0

    def __post_init__(self):
        self._stream = DecodeStream(skip_special_tokens=True)
        self._stop_len = max((len(s) for s in self.stop_strs), default=0)

    @property
    def seqlen(self) -> int:
        """Tokens of the request so far (prompt + output)."""
        return len(self.input_ids) + len(self.output_ids)

    def append_token(self, token_id: int, tokenizer: Tokenizer) -> None:
        """Append a sampled token, extend the text incrementally and check whether it finished
        (SGLang ``Req.check_finished``: length, then EOS, then stop strings on the text tail)."""
        self.output_ids.append(token_id)
        piece = self._stream.step(tokenizer, token_id)
        if piece:
            self.text += piece
        if len(self.output_ids) >= self.max_new_tokens:
            self.finished_reason = "length"
        elif token_id in self.eos_ids:
            self.finished_reason = "stop"
        elif self._stop_len and piece:
            tail = self.text[-(self._stop_len + len(piece)):]
            if any(s in tail for s in self.stop_strs):
                self.finished_reason = "stop"
