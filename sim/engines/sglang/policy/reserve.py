"""The KV that the running batch is expected to still need: the prefill admission's running
offset, kept as aggregates so that an admission check costs O(1) in the batch size.

SGLang 0.5.23 (``PrefillAdder.__init__`` and ``_get_running_request_total_token_offset``,
``managers/schedule_policy.py``) subtracts from the free KV, for every running request r,

    w_r * min(max_new_tokens_r - len(output_ids_r), CLIP_MAX_NEW_TOKENS)

where ``len(output_ids)`` counts the tokens whose results were *processed* (under overlap one
fewer than the in-flight batch will commit), CLIP_MAX_NEW_TOKENS is 4096
(``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``), and w_r is the current ``new_token_ratio``, or 1.0
for ``ignore_eos`` requests (from 0.5.22 on; 0.5.4 and 0.5.10 apply the ratio to every request).

A running request that joined the running batch before decode batch ``join`` with ``delivered``
processed output tokens has, once decode batches up to ``L`` were processed,
``delivered + max(0, L - join + 1)`` of them. So with ``base = max_new - delivered + join - 1``
its remaining output is ``base - L`` for ``join <= L + 1`` and ``base - join + 1`` otherwise,
and only the requests that joined after the last processed decode (at most the last two join
groups) need a correction. Requests whose remaining output may exceed the clip are kept in a
short list and clipped one by one.
"""

from __future__ import annotations

from sim.model.batch import Req

CLIP_MAX_NEW_TOKENS = 4096


class RunningReserve:
    """Sums over the running batch for the admission offset, split into requests weighted 1.0
    (``ignore_eos`` under the 0.5.22 rule) and requests weighted by the ratio."""

    def __init__(self, ignore_eos_at_full_ratio: bool):
        self.full_ratio_for_ignore_eos = ignore_eos_at_full_ratio
        self.n = [0, 0]  # [weight 1.0, weight ratio]
        self.base = [0, 0]
        self.joined: list[dict[int, int]] = [{}, {}]  # join seq -> count
        self.long: list[Req] = []  # remaining output may exceed the clip

    def _cls(self, req: Req) -> int:
        return 0 if req.ignore_eos and self.full_ratio_for_ignore_eos else 1

    def add(self, req: Req) -> None:
        """``req`` joined the running batch (its ``join_seq`` and ``delivered`` are set)."""
        self.add_all((req,))

    def add_all(self, reqs) -> None:
        """Each of ``reqs`` joined the running batch (a group merged together; :meth:`add`)."""
        n, base, joined = self.n, self.base, self.joined
        full = self.full_ratio_for_ignore_eos
        for req in reqs:
            c = 0 if req.ignore_eos and full else 1  # (_cls)
            n[c] += 1
            base[c] += req.max_new_tokens - req.delivered + req.join_seq - 1
            joined[c][req.join_seq] = joined[c].get(req.join_seq, 0) + 1
            if req.max_new_tokens - req.delivered > CLIP_MAX_NEW_TOKENS:
                self.long.append(req)

    def remove(self, req: Req) -> None:
        """``req`` left the running batch (finished, retracted, aborted), before its fields change."""
        self.remove_all((req,))

    def remove_all(self, reqs) -> None:
        """Each of ``reqs`` left the running batch (a group finishing together; :meth:`remove`)."""
        n, base, joined = self.n, self.base, self.joined
        full = self.full_ratio_for_ignore_eos
        for req in reqs:
            c = 0 if req.ignore_eos and full else 1  # (_cls)
            n[c] -= 1
            base[c] -= req.max_new_tokens - req.delivered + req.join_seq - 1
            left = joined[c][req.join_seq] - 1
            if left:
                joined[c][req.join_seq] = left
            else:
                del joined[c][req.join_seq]
        if self.long:
            for req in reqs:
                if req in self.long:
                    self.long.remove(req)

    def delivered_all(self, reqs) -> None:
        """Running requests' prefill results were processed after they joined (overlap): each
        one's ``delivered`` is about to grow by one."""
        full = self.full_ratio_for_ignore_eos
        base = self.base
        for req in reqs:
            base[0 if req.ignore_eos and full else 1] -= 1  # (_cls)

    def total(self, ratio: float, last_processed: int, next_decode: int) -> float:
        """The offset (tokens): sum of w_r * min(remaining_r, CLIP) over the running batch."""
        out = 0.0
        late = next_decode > last_processed + 1  # requests may have joined after the last processed decode
        for c, w in ((0, 1.0), (1, ratio)):
            n = self.n[c]
            if not n:
                continue
            s = self.base[c] - n * last_processed
            if late:
                joined = self.joined[c]
                for j in range(last_processed + 2, next_decode + 1):
                    k = joined.get(j)
                    if k:
                        s -= k * (j - 1 - last_processed)
            out += w * s
        for r in self.long:
            over = r.max_new_tokens - (r.delivered + max(0, last_processed - r.join_seq + 1)) - CLIP_MAX_NEW_TOKENS
            if over > 0:
                out -= (1.0 if self._cls(r) == 0 else ratio) * over
        return out
