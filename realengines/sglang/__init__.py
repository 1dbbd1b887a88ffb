"""Real SGLang 0.5.23 on its CPU engine: environment, import shims, a phase tracer, an
in-process driver of the real ``Scheduler`` and a server runner (see realengines/__init__.py).

Runs only inside the SGLang environment built by ``realengines/sglang/setup.sh``.
"""
