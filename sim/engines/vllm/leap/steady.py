"""The running requests that decode steadily, summed once and kept across the leap's own iterations.

At an engine-core loop top the leap needs, over the running requests, each checked to decode one
token a step (:mod:`sim.engines.vllm.leap.loop`'s module docstring): their common last delivery,
the iterations before the first that stops one and which stop there, the block allocations each
iteration makes, the summed context, the warm-up members and the prefix-cache hits. Walking 64
requests for that at every loop top was 10-20% of a 64-client run (docs/speed.md). While a request
decodes steadily its counters move in lockstep with the step numbers (``num_computed_tokens`` and
``num_output_tokens`` one a step, as ``_update_after_schedule`` and ``update_from_output`` leave
them), so each request is summed by quantities that do not move while it does:

- ``z = num_computed_tokens - step``: the summed context of the step numbered ``S`` is
  ``sum(z) + n * (S + 1)``;
- ``(-z) % block_size``: the step numbered ``S`` allocates a block for each request whose key is
  ``S % block_size`` (its computed tokens fill a block);
- the step number of the iteration that stops it (``check_stop``'s ``max_tokens``,
  ``max_model_len`` or stop token, or the RUNNING pass leaving it out), and whether the leap carries
  that finish.

:class:`SteadyRunning` keeps these for a prefix of the running list (its members) at a step
number. Only the leap moves members without scheduling a step through the processes (its runs and
carried arrivals advance them in lockstep and move :attr:`SteadyRunning.seq` with them; a carried
finish removes its requests), so the sums hold while the scheduler's next step number is the one
kept and the members still head the running list; anything else schedules a step (the processes'
iterations, preemption), which drops them. Requests appended behind the members (admitted since)
are checked and summed when first asked for. ``CHECK`` (tests) walks every request as well and
compares.
"""

from __future__ import annotations

CHECK = False  # tests: every summary compared with a walk over every request


class SteadyRunning:
    """The summed steady members of one run's running list (module docstring).

    Args:
        block_size: the KV cache's block size (tokens).
        max_model_len: vLLM's ``max_model_len`` (tokens).
        async_scheduling: the async loop (one output placeholder a request; a request whose
            step in flight reaches ``max_tokens`` is left out of the next step: ``Scheduler.schedule``,
            ``vllm/v1/core/sched/scheduler.py`` l.668, vLLM 0.32.0).
    """

    def __init__(self, block_size: int, max_model_len: int, async_scheduling: bool):
        self.bs, self.max_len, self.async_scheduling = block_size, max_model_len, async_scheduling
        self.seq = -1  # the scheduler's next step number at which the sums hold (-1: none kept)
        self._clear()

    def _clear(self) -> None:
        self.count = 0  # members: the running list's first `count` requests
        self.tail = None  # (the last member: a check that they still head the list)
        self.sum_z = self.warm = 0
        self.hist_abs = [0] * self.bs  # members by (-z) % block_size
        self.hits: list[int] = []  # members' prefix-cache hit blocks (those with any)
        self.stops: dict[int, list] = {}  # step number -> [members stopping at its update, in order,
        # their z, whether the leap carries every one of those finishes]

    def summary(self, running: list, upto: int, seq: int):
        """The walk of ``running[:upto]`` at the loop top whose next step is numbered ``seq``:
        (common last delivery, iterations before the first that stops one (k_max), those it
        stops in order or None where the leap does not carry each, block allocations by
        iteration modulo the block size, the next step's summed context, warm-up members, the
        members' prefix-cache hit blocks, sorted); None where one does not decode steadily (the
        kept members as they were)."""
        if (seq != self.seq or self.count > upto or not self.count or running[self.count - 1] is not self.tail):
            self._clear()
            self.seq = seq
        if self.count < upto and not self._extend(running, upto, seq):
            return None
        out = self._read(running, seq)
        if CHECK:
            assert out == _walk(running[:upto], self.bs, self.max_len, self.async_scheduling), (out, seq)
        return out

    def _read(self, running: list, seq: int):
        k_key = min(self.stops)
        members, _zs, carried = self.stops[k_key]
        s = seq % self.bs
        hist = self.hist_abs[s:] + self.hist_abs[:s]
        return (running[0].last_token_s, k_key - seq, list(members) if carried else None, hist,
                self.sum_z + self.count * (seq + 1), self.warm, sorted(self.hits))

    def _extend(self, running: list, upto: int, seq: int) -> bool:
        """Check and sum ``running[count:upto]`` (all or none of them); False where one does not
        decode steadily."""
        bs, max_len, async_scheduling = self.bs, self.max_len, self.async_scheduling
        placeholders = 1 if async_scheduling else 0
        last = running[0].last_token_s
        if last != last:  # NaN: no token delivered yet
            return False
        new = []
        for r in running[self.count:upto]:
            c = r.num_computed_tokens
            if (r.num_output_placeholders != placeholders or r.num_in_flight_tokens != placeholders
                    or r.num_stale_output_tokens or r.num_spec_tokens or r.grammar or r.is_prefill_chunk
                    or r.num_prompt_tokens + r.num_output_tokens + placeholders - c != 1
                    or r.last_token_s != last or r.first_token_s != r.first_token_s or r.num_blocks != -(-c // bs)):
                return False
            stop, carried = _stop(r, c, max_len, async_scheduling)
            new.append((r, c - seq, seq + stop, carried))
        stops, hist_abs, hits = self.stops, self.hist_abs, self.hits
        for r, z, key, carried in new:
            self.sum_z += z
            hist_abs[(-z) % bs] += 1
            self.warm += r.warmup
            if r.num_hit_blocks:
                hits.append(r.num_hit_blocks)
            group = stops.get(key)
            if group is None:
                stops[key] = [[r], [z], carried]
            else:
                group[0].append(r)
                group[1].append(z)
                group[2] = group[2] and carried
        self.count = upto
        self.tail = running[upto - 1]
        return True

    def finish(self, running: list, k_max: int, seq: int) -> None:
        """The members stopping ``k_max`` iterations after the loop top numbered ``seq`` leave
        (a carried finish; ``running`` still holds them, as before ``finish_stopped``)."""
        members, zs, _carried = self.stops.pop(seq + k_max)
        bs = self.bs
        for r, z in zip(members, zs):
            self.sum_z -= z
            self.hist_abs[(-z) % bs] -= 1
            self.warm -= r.warmup
            if r.num_hit_blocks:
                self.hits.remove(r.num_hit_blocks)
        gone = {id(r) for r in members}
        i = self.count - 1
        while i >= 0 and id(running[i]) in gone:
            i -= 1
        self.count -= len(members)
        self.tail = running[i] if i >= 0 else None
        if not self.count:
            self.seq = -1


def _stop(r, c: int, max_len: int, async_scheduling: bool) -> tuple[int, bool]:
    """The iterations from now before the one whose update stops ``r`` (computed tokens ``c``) or
    whose RUNNING pass gives it no token, and whether the leap carries that finish (a finish, and
    under async scheduling one its next step leaves out: ``max_tokens``, ``max_model_len``, not
    a stop token's, whose step still holds the request)."""
    out, max_tokens = r.num_output_tokens, r.max_tokens
    fin = max_tokens - out - 1  # check_stop: max_tokens, max_model_len, a stop token (the least)
    x = max_len - r.num_prompt_tokens - out - 1
    if x < fin:
        fin = x
    if r.output_len < max_tokens:
        x = r.output_len - out - 1
        if x < fin:
            fin = x
    left_out = max_len - c - 1  # (after this many iterations the RUNNING pass gives it no token)
    if async_scheduling:  # or the in-flight step reaches max_tokens (l.668)
        x = r.num_prompt_tokens + max_tokens - c - 1
        if x < left_out:
            left_out = x
    stop = fin if fin < left_out else left_out
    return stop, fin == stop and (not async_scheduling or left_out == stop)


def _walk(running: list, bs: int, max_len: int, async_scheduling: bool):
    """:meth:`SteadyRunning.summary` by a walk over every request (``CHECK``'s reference)."""
    steady = SteadyRunning(bs, max_len, async_scheduling)
    steady.seq = 0
    if not running or not steady._extend(running, len(running), 0):
        return None
    return steady._read(running, 0)
