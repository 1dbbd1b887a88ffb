"""Loaded by every Python process that has realengines/sglang/shims on PYTHONPATH (the server's
scheduler, tokenizer and detokenizer subprocesses included): the CPU stubs, and the phase tracer
when OVERLAP_SIM_TRACE names an output path prefix."""
import os

import cpu_stubs  # noqa: F401

if os.environ.get("OVERLAP_SIM_TRACE"):
    from realengines.sglang import tracer

    tracer.install_on_import(tracer.FileSink(os.environ["OVERLAP_SIM_TRACE"]))
