"""What the vLLM server's processes patch at start-up (never an edit of the installed vLLM).

- Async scheduling on the CPU platform: vLLM 0.32's ``CpuPlatform.check_and_update_config``
  (``vllm/platforms/cpu.py``) sets ``scheduler_config.async_scheduling = False`` after the flag
  was resolved ("async scheduling is not required on CPU"). With ``allow_async``, the value the
  config held before that call is put back after it, so ``--async-scheduling`` runs
  ``EngineCore.step_with_batch_queue`` with a batch queue of 2 (the server logs "Batch queue is
  enabled with size 2"). Everything else that function decides is kept.
- The phase tracer (:mod:`realengines.vllm.tracer`) with ``trace_prefix``.
- With ``stub_hold_s`` (not None), the model's forward stubbed (:func:`_stub_forward`): the host
  calibration (:mod:`calibrate.host.vllm`).
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


RUNNER = "vllm.v1.worker.gpu_model_runner"


def _stub_forward(module, hold_s: float, spin: bool = False) -> None:
    """Replace ``GPUModelRunner._model_forward`` (``v1/worker/gpu_model_runner.py``, the call
    around the model's ``forward`` that the CPU runner inherits; vLLM's docstring names it as the
    place to wrap the model execution) by a stub: it holds the worker ``hold_s`` seconds (in
    ``time.sleep``, or busy-waiting with ``spin``) and returns zero hidden states, one row per scheduled token, so ``compute_logits``, the sampler and the output
    processing run on well-formed tensors. Everything else of the worker (``_update_states``,
    ``_prepare_inputs``, the attention metadata of the CPU backend, ``sample_tokens``) runs as in a
    server; no KV cache entry is written. ``spin``: the core kept busy, as a GPU host's worker
    spins in CUDA's synchronisation while the device runs (the host calibration's default)."""
    import time

    import torch

    runner = module.GPUModelRunner
    if getattr(runner._model_forward, "_overlap_sim_stub", False):
        return

    def stub(self, input_ids=None, positions=None, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        rows = (input_ids if input_ids is not None else inputs_embeds).shape[0]
        if hold_s > 0 and spin:
            end = time.perf_counter() + hold_s
            while time.perf_counter() < end:
                pass
        elif hold_s > 0:
            time.sleep(hold_s)
        return torch.zeros((rows, self.model_config.get_hidden_size()), dtype=self.dtype, device=self.device)

    stub._overlap_sim_stub = True
    runner._model_forward = stub


def _chain(*patches):
    def run(module):
        for patch in patches:
            patch(module)
    return run


def install(trace_prefix: str | None, allow_async: bool, stub_hold_s: float | None = None,
            stub_spin: bool = False) -> None:
    """Register the patches; each runs when its vLLM module is first imported. The stub goes in
    before the tracer wraps ``_model_forward``, so the ``forward`` record times the stub."""
    import functools

    from realengines.vllm import tracer

    patches: dict = {}
    if trace_prefix:
        patches.update(tracer.tracing_patches(tracer.FileSink(trace_prefix)))
    if allow_async:
        patches["vllm.platforms.cpu"] = _keep_async_scheduling
    if stub_hold_s is not None:
        stub = functools.partial(_stub_forward, hold_s=stub_hold_s, spin=stub_spin)
        patches[RUNNER] = _chain(stub, patches[RUNNER]) if RUNNER in patches else stub
    tracer.install_on_import(patches)
