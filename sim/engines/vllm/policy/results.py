"""Applying a step's output: ``Scheduler.update_from_output`` and ``check_stop`` (vLLM 0.32.0,
``vllm/v1/core/sched/scheduler.py:2026``, ``utils.py:98``, ``async_scheduler.py:58``), mixed
into :class:`sim.engines.vllm.policy.scheduler.Scheduler`.

For each request of the step: its in-flight tokens (and stale share) go down; a request already
finished (async scheduling: a step scheduled before its stop token was seen) gets nothing: that
token is discarded (counted as the step's ``overshoot``); a prefill chunk gets no token; else one
token is appended, with speculative decoding ``1 + a`` (a drafts accepted, drawn:
:class:`sim.engines.vllm.speculative.AcceptanceDraws`; the rejected ones roll
``num_computed_tokens`` and the placeholders back), one at a time with ``check_stop`` after each
(tokens past a stop are dropped; async: a placeholder consumed per token, unless the output is
stale); ``check_stop``: the stop token (the ``output_len``-th token of a request that does not stop by length), or
``num_output_tokens >= max_tokens`` / ``num_tokens >= max_model_len`` (FINISHED_LENGTH_CAPPED).
A stopped request frees its blocks at once (``_free_request``), leaves ``running`` (or
``waiting``, if it was preempted), and its id is sent to the worker with the next step.

Tokens reach the client at ``deliver_s``: after ``update_from_output``, the trip through the
engine core's output thread and the API server (:mod:`sim.engines.vllm.frontend`).
"""

from __future__ import annotations

from sim.engines.vllm.policy.request import FAILED, FINISHED, PREEMPTED, Request
from sim.model.batch import Batch


class ResultsMixin:
    """``update_from_output`` over the state of :class:`sim.engines.vllm.policy.scheduler.Scheduler`."""

    def update_from_output(self, step: Batch, deliver_s: float) -> int:
        """Apply ``step``'s sampled tokens, delivered at ``deliver_s`` (s). Returns how many
        requests finished."""
        stopped: list[Request] = []
        itl: dict[float, int] = {}
        accept, async_scheduling, max_len = self.accept, self.async_scheduling, self.max_model_len
        t = deliver_s
        for req, num_new, _computed, samples, spec in step.chunks:
            req.num_in_flight_tokens -= num_new
            stale = req.num_stale_output_tokens > 0
            if stale:
                req.num_stale_output_tokens -= num_new
            if req.status == FINISHED or req.status == FAILED:  # is_finished
                step.overshoot.append(req)
                continue
            if not samples:
                continue
            if spec:  # 1 + a tokens; the rejected drafts roll the counters back (l.2110)
                accepted = accept(spec)
                if not stale:
                    if req.num_computed_tokens > 0:
                        req.num_computed_tokens -= spec - accepted
                    if req.num_output_placeholders > 0:
                        req.num_output_placeholders -= spec - accepted
                appended = 0
                stops = False
                while appended <= accepted and not stops:  # _update_request_with_output: stop checked per token
                    req.num_output_tokens += 1
                    appended += 1
                    stops = self._check_stop(req)
            else:  # one token; _check_stop inline
                out = req.num_output_tokens = req.num_output_tokens + 1
                appended = 1
                if out >= req.output_len and req.output_len < req.max_tokens:
                    stops = True  # FINISHED_STOPPED
                else:
                    stops = out >= req.max_tokens or req.num_prompt_tokens + out >= max_len
            if async_scheduling and not stale:
                req.num_output_placeholders -= appended
            if req.first_token_s != req.first_token_s:  # _deliver inline; NaN: its first token
                req.first_token_s = t
            elif not req.warmup:
                gap = t - req.last_token_s
                itl[gap] = itl.get(gap, 0) + 1
            req.last_token_s = t
            if stops:
                stopped.append(req)
        for value, weight in itl.items():
            self.recorder.itl(value, weight)
        self.finish_stopped(stopped, deliver_s)
        step.finished = len(stopped)
        return len(stopped)

    def take_draft_token_ids(self, step: Batch) -> None:
        """Synchronous speculative decoding's ``post_step``: the drafts proposed for ``step``'s
        sampling requests reach the scheduler (``update_draft_token_ids``, scheduler.py:2550): k
        each, except for finished requests and prefill chunks."""
        k = self.num_spec_tokens
        for req, _num_new, _computed, samples, _spec in step.chunks:
            if samples and not req.is_finished and not req.is_prefill_chunk:
                req.num_spec_tokens = k

    def _check_stop(self, req: Request) -> bool:
        """``check_stop``: the stop token, then the length caps."""
        if req.num_output_tokens >= req.output_len and not req.stops_by_length:
            return True  # FINISHED_STOPPED (EOS / a stop token)
        return req.num_output_tokens >= req.max_tokens or req.num_tokens >= self.max_model_len

    def finish_stopped(self, stopped: list[Request], deliver_s: float) -> None:
        """The requests ``update_from_output`` found stopped (in the step's order), their last
        token delivered at ``deliver_s`` (s): each freed, recorded and its client told."""
        for req in stopped:
            self._finish(req, deliver_s)

    def _finish(self, req: Request, t: float) -> None:
        """``_free_request``: free its blocks now, drop it from its queue, notify the worker."""
        if req.status == PREEMPTED:
            self.waiting.remove(req)
        else:
            self.running.remove(req)
        self.kv.free(req)
        self.finished_req_ids.add(req.rid)
        self._settle(req, t, FINISHED)

    def fail(self, req: Request, t: float, failure: str) -> None:
        """A request that never reaches the scheduler (rejected by the API server)."""
        req.failure = failure
        self._settle(req, t, FAILED)

    def _settle(self, req: Request, t: float, status) -> None:
        """The request leaves the server at ``t`` with ``status``: recorded, its client told."""
        req.status = status
        req.finish_s = t
        self.num_done += 1
        self.recorder.request(req)
        self.on_finish(req.rid, t)
