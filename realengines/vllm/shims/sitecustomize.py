"""Loaded by every Python process that has realengines/vllm/shims on PYTHONPATH (the API server,
the engine core and the worker): async scheduling let through on the CPU platform when
OVERLAP_SIM_VLLM_ASYNC=1, and the phase tracer when OVERLAP_SIM_TRACE names an output prefix."""
import os

if os.environ.get("OVERLAP_SIM_VLLM_ASYNC") == "1" or os.environ.get("OVERLAP_SIM_TRACE"):
    from realengines.vllm import startup

    startup.install(trace_prefix=os.environ.get("OVERLAP_SIM_TRACE"),
                    allow_async=os.environ.get("OVERLAP_SIM_VLLM_ASYNC") == "1")
