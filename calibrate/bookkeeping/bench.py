"""Timing the scheduler's bookkeeping (:mod:`calibrate.bookkeeping.bookkeeper`) in isolation over batch sizes.

The state is realistic: a radix cache warmed with earlier conversations (16 system prompts of
384 tokens, each with many 128-token user turns), prompts of 512 tokens that share a system
prompt, outputs of 128 to 384 tokens of real text, a real BPE tokenizer and two stop strings.
Each sample times one call with ``time.perf_counter`` (monotonic); the state is reset or
refilled between samples outside the timed region. The host part of ``launch`` is timed with
the forward (:mod:`calibrate.measure`), since it ends in the backend's launch.
"""

from __future__ import annotations

import pickle
import time

import numpy as np

from calibrate.bookkeeping.bookkeeper import Bookkeeper
from calibrate.bookkeeping.requests import TextSource, build_tokenizer
from calibrate.config import BenchWorkload

_DEFAULT = BenchWorkload()
SYSTEM_PROMPTS, SYSTEM_LEN, USER_LEN = _DEFAULT.system_prompts, _DEFAULT.system_len, _DEFAULT.user_len
STOP_STRS = _DEFAULT.stop_strs


def _check(batch, n: int) -> None:
    if batch is None or len(batch.reqs) != n:
        raise RuntimeError(f"bookkeeping bench: scheduled {0 if batch is None else len(batch.reqs)} of {n} requests")


class BookkeepingBench:
    """Builds realistic scheduler state and times each phase for a given batch size.

    Args:
        max_batch: largest batch size to be timed. seed: seed of prompt and length choices.
        workload: the requests (default: the chat workload of :class:`calibrate.config.BenchWorkload`).
    """

    def __init__(self, max_batch: int, seed: int = 0, workload: BenchWorkload = _DEFAULT):
        self.w = workload
        self.tokenizer = build_tokenizer(workload.vocab)
        self.text = TextSource(self.tokenizer)
        self.rng = np.random.default_rng(seed)
        self.systems = [self.text.take(workload.system_len) for _ in range(workload.system_prompts)]
        self.max_batch = max_batch
        self._rid = 0

    def _message(self) -> bytes:
        w = self.w
        sys_prompt = self.systems[int(self.rng.integers(w.system_prompts))]
        self._rid += 1
        return pickle.dumps({"rid": f"req-{self._rid}", "input_ids": sys_prompt + self.text.take(w.user_len),
                             "sampling_params": {"max_new_tokens": int(self.rng.integers(w.output_lo, w.output_hi + 1)),
                                                 "stop": list(w.stop_strs)}})

    def fresh(self) -> Bookkeeper:
        """A bookkeeper whose radix cache already holds 8 finished conversations per system prompt."""
        cap = 2 * self.max_batch + 64  # n running plus n being scheduled
        w = self.w
        ctx = w.system_len + w.user_len + w.output_hi + 8
        bk = Bookkeeper(self.tokenizer, kv_tokens=cap * ctx + 200_000 + 16 * w.system_prompts * ctx, max_reqs=cap,
                        max_ctx=ctx)
        for _ in range(8 * w.system_prompts):
            bk.recv([self._message()])
            batch = bk.schedule_extend()
            bk.process_extend(batch, self.text.take(1))
            req = bk.running.pop()
            for tok in self.text.take(8):
                req.output_ids.append(tok)
            bk._cache_finished(req)
        return bk

    def _fill_running(self, bk: Bookkeeper, n: int) -> None:
        """Admit requests until ``n`` are running, each advanced to a random point of its output."""
        while len(bk.running) < n:
            bk.recv([self._message()])
            batch = bk.schedule_extend()
            bk.process_extend(batch, self.text.take(1))
            if not bk.running or bk.running[-1] is not batch.reqs[0]:
                continue
            req = bk.running[-1]
            for _ in range(int(self.rng.integers(0, min(96, self.w.output_lo)))):  # earlier decode steps
                bk.req_to_token[req.req_slot, req.seqlen - 1] = bk.alloc_tokens(1)[0]
                req.append_token(self.text.take(1)[0], self.tokenizer)
                if req.finished_reason:
                    bk.running.pop()
                    bk.release(req)
                    break

    def time_recv(self, bk: Bookkeeper, n: int) -> float:
        msgs = [self._message() for _ in range(n)]
        t0 = time.perf_counter()
        bk.recv(msgs)
        t1 = time.perf_counter()
        bk.waiting.clear()
        return t1 - t0

    def time_schedule_extend(self, bk: Bookkeeper, n: int) -> float:
        bk.recv([self._message() for _ in range(n)])
        t0 = time.perf_counter()
        batch = bk.schedule_extend()
        t1 = time.perf_counter()
        _check(batch, n)
        for r in batch.reqs:
            bk.release(r)
        return t1 - t0

    def time_process_extend(self, bk: Bookkeeper, n: int) -> float:
        bk.recv([self._message() for _ in range(n)])
        batch = bk.schedule_extend()
        _check(batch, n)
        ids = self.text.take(n)
        t0 = time.perf_counter()
        bk.process_extend(batch, ids)
        t1 = time.perf_counter()
        for r in bk.running:
            bk.release(r)
        bk.running.clear()
        return t1 - t0

    def time_decode_step(self, bk: Bookkeeper, n: int) -> tuple[float, float]:
        """(schedule_decode, process_decode) seconds of one decode step of ``n`` running requests;
        finished requests are replaced afterwards, untimed."""
        self._fill_running(bk, n)
        t0 = time.perf_counter()
        batch = bk.schedule_decode()
        t1 = time.perf_counter()
        ids = self.text.take(n)
        t2 = time.perf_counter()
        bk.process_decode(batch, ids)
        t3 = time.perf_counter()
        return t1 - t0, t3 - t2

    def measure(self, n: int, warmup: int, repeats: int) -> dict[str, list[float]]:
        """Samples (seconds) of every bookkeeping curve at batch size ``n`` (only ``recv`` for 0):
        ``recv`` (n new requests), ``schedule.extend``, ``process.extend`` (n requests of 512
        prompt tokens), ``schedule.decode``, ``process.decode`` (n running requests)."""
        bk = self.fresh()
        names = ("recv", "schedule.extend", "process.extend", "schedule.decode", "process.decode") if n else ("recv",)
        out: dict[str, list[float]] = {k: [] for k in names}
        for k in range(warmup + repeats):
            vals = {"recv": self.time_recv(bk, n)}
            if n:
                vals["schedule.extend"] = self.time_schedule_extend(bk, n)
                vals["process.extend"] = self.time_process_extend(bk, n)
            if k >= warmup:
                for key, v in vals.items():
                    out[key].append(v)
        # decode steps back to back, as a running batch decodes: timed right after a prefill's
        # recv and process, a decode step of 64 requests with 512 stop strings each ran 1.4x
        # slower (its requests' state out of the caches) than in the harness's decode runs
        for k in range(warmup + repeats if n else 0):
            sched, proc = self.time_decode_step(bk, n)
            if k >= warmup:
                out["schedule.decode"].append(sched)
                out["process.decode"].append(proc)
        for r in bk.running:
            bk.release(r)
        return out
