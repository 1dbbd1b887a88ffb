"""What the vLLM server's processes patch at start-up (never an edit of the installed vLLM).

- Async scheduling on the CPU platform: vLLM 0.32's ``CpuPlatform.check_and_update_config``
  (``vllm/platforms/cpu.py``) sets ``scheduler_config.async_scheduling = False`` after the flag
  was resolved ("async scheduling is not required on CPU"). With ``allow_async``, the value the
  config held before that call is put back after it, so ``--async-scheduling`` runs
  ``EngineCore.step_with_batch_queue`` with a batch queue of 2 (the server logs "Batch queue is
  enabled with size 2"). Everything else that function decides is kept.
- The phase tracer (:mod:`realengines.vllm.tracer`) with ``trace_prefix``.
"""

from __future__ import annotations


def _keep_async_scheduling(module) -> None:
    platform = module.CpuPlatform
    original = platform.check_and_update_config.__func__
    if getattr(original, "_overlap_sim_patched", False):
        return

    def check_and_update_config(cls, vllm_config):
        wanted = vllm_config.scheduler_config.async_scheduling
        original(cls, vllm_config)
        if wanted:
            vllm_config.scheduler_config.async_scheduling = True

    check_and_update_config._overlap_sim_patched = True
    platform.check_and_update_config = classmethod(check_and_update_config)


def install(trace_prefix: str | None, allow_async: bool) -> None:
    """Register the patches; each runs when its vLLM module is first imported."""
    from realengines.vllm import tracer

    patches: dict = {}
    if trace_prefix:
        patches.update(tracer.tracing_patches(tracer.FileSink(trace_prefix)))
    if allow_async:
        patches["vllm.platforms.cpu"] = _keep_async_scheduling
    tracer.install_on_import(patches)
