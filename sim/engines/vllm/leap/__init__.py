"""Leaping over vLLM's steady decode runs: :mod:`sim.engines.vllm.leap.loop` takes a run's
iterations one at a time as the float operations of the engine core's, the worker's and the API
server's processes (:class:`Leap`); :mod:`sim.engines.vllm.leap.runs` takes long stretches of them
with numpy. Both give the processes' answer to the last bit."""

from sim.engines.vllm.leap.loop import Leap

__all__ = ["Leap"]
