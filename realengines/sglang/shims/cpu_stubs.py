"""Let SGLang import on a CPU-only machine.

sglang-kernel has CUDA wheels only (setup.sh installs its Python files alone), and its
``sgl_kernel.load_utils`` would load the CUDA op library at import. Seeding that module with
no-op loaders lets ``import sgl_kernel`` succeed; with no compiled ops registered, SGLang's CPU
layers fall back to native torch (the AMX kernels are absent).
"""
import os
import sys
import types

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

_load_utils = types.ModuleType("sgl_kernel.load_utils")
_load_utils._load_architecture_specific_ops = lambda *args, **kwargs: None
_load_utils._preload_cuda_library = lambda *args, **kwargs: None
sys.modules.setdefault("sgl_kernel.load_utils", _load_utils)
