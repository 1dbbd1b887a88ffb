"""Loaded by every Python process that has realengines/vllm/shims on PYTHONPATH (the API server,
the engine core and the worker): async scheduling let through on the CPU platform when
OVERLAP_SIM_VLLM_ASYNC=1, the phase tracer when OVERLAP_SIM_TRACE names an output prefix, and the
model's forward stubbed when OVERLAP_SIM_VLLM_STUB_HOLD_S gives the seconds the stub holds the
worker (realengines/vllm/startup.py; OVERLAP_SIM_VLLM_STUB_SPIN=1: it busy-waits instead of sleeping)."""
import os

_hold = os.environ.get("OVERLAP_SIM_VLLM_STUB_HOLD_S")
if os.environ.get("OVERLAP_SIM_VLLM_ASYNC") == "1" or os.environ.get("OVERLAP_SIM_TRACE") or _hold:
    from realengines.vllm import startup

    startup.install(trace_prefix=os.environ.get("OVERLAP_SIM_TRACE"),
                    allow_async=os.environ.get("OVERLAP_SIM_VLLM_ASYNC") == "1",
                    stub_hold_s=float(_hold) if _hold else None,
                    stub_spin=os.environ.get("OVERLAP_SIM_VLLM_STUB_SPIN") == "1")
