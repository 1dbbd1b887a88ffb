"""A profile from the user's own SGLang server: its ``/start_profile`` traces and its log.

``torch_trace`` reads a torch.profiler trace into steps and phases; ``log_match`` matches the log's
``Decode batch`` lines to those steps and measures the profiler's slowdown; ``forms`` fits the
stated physical forms the curves extrapolate by; ``profile`` writes the profile and runs the
``overlap-sim calibrate --from-trace`` command.
"""
