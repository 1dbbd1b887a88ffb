"""The API server process in front of the engine core (vLLM 0.32.0): where a request waits before
the engine sees it, and where a token waits after the engine core has produced it.

The OpenAI server (``vllm/entrypoints/openai/api_server.py``) runs one asyncio event loop with
``AsyncLLM`` (``vllm/v1/engine/async_llm.py``): a request's HTTP handling,
``OpenAIServingCompletion.create_completion``, the input processor and ``add_request`` (the
ZMQ send to the engine core's input thread) run on it; so does ``output_handler``, which takes
each step's outputs from the engine core (``get_output_async``), runs
``OutputProcessor.process_outputs`` and hands each request's tokens to its streaming response.

Modelled as one FIFO server on its own core (:class:`ApiServer`): each request costs
``vllm.frontend_in`` before it reaches the engine core's input queue, each step's outputs cost
``vllm.frontend_out(num_reqs)`` before its tokens reach the clients; a request that arrives while
a step's outputs are being handled waits behind them, and the other way round.

Simplifications, stated: the service times are latencies measured end to end from the client
(:func:`calibrate.real.vllm_profile.frontend_samples`), so they include the trips through ZMQ
and the loopback HTTP connection, counted here as the event loop's busy time; the asyncio loop
interleaves requests at ``await`` points, modelled as whole jobs in arrival order; the API
server shares a core with the engine core on the CPU build (vLLM pins the worker to one core,
the rest float), and that contention is in the engine core's measured phases, not added here.
A profile without these curves (calibrated before they existed) gives a front end of zero cost.
"""

from __future__ import annotations


class ApiServer:
    """The API server's event loop as a FIFO single server.

    Jobs are charged in call order, which is simulated-time order up to one update: SimPy runs
    events in time order, a closed-loop client sends its next request when its last token was
    delivered (after every job charged so far), and a step's outputs are charged when its
    ``update_from_output`` starts, for its end (a fraction of a millisecond later), so a request
    sent during an update waits behind that step's outputs. A job of no cost (a profile without
    the front-end curves) passes at once and moves nothing.

    Args:
        costs: a vLLM cost model with ``frontend_s(kind, num_reqs)`` (seconds; ``kind`` "in" or "out").
    """

    def __init__(self, costs):
        self.costs = costs
        self.free_s = 0.0  # when the event loop has finished every job charged so far (s)

    def _serve(self, at_s: float, cost_s: float) -> float:
        if cost_s <= 0.0:
            return at_s
        self.free_s = max(at_s, self.free_s) + cost_s
        return self.free_s

    def ingress(self, send_s: float) -> float:
        """A request sent at ``send_s``: when it reaches the engine core's input queue (s)."""
        return self._serve(send_s, self.costs.frontend_s("in", 1))

    def egress(self, update_end_s: float, num_reqs: int) -> float:
        """A step's outputs for ``num_reqs`` requests, out of ``update_from_output`` at
        ``update_end_s``: when its tokens reach the clients (s)."""
        return self._serve(update_end_s, self.costs.frontend_s("out", num_reqs))
