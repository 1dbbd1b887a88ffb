"""Real serving engines run on this machine, as the simulator's source of costs and its judge.

Nothing here is imported by the simulator or by the project's own environment: each engine
runs in its own virtual environment (``realengines/<engine>/setup.sh``) and the project starts
these modules there as subprocesses (``python -m realengines.<engine>.<module>``), reading back
what they write (JSON lines). ``realengines.model`` writes the small random-weight Llama both
engines load; ``realengines.sglang`` drives SGLang 0.5.23's CPU engine; ``realengines.vllm``
drives vLLM's CPU build.
"""
