"""Test data for the vLLM engine: small scenarios and hand-made vLLM profiles.

The profiles here are TEST DATA (constant or linear made-up curves), not measurements: a product
profile of vLLM comes only from a calibration against the real engine.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from sim.engines.vllm.profile import VLLM_CURVE_AXES

# constant costs (s) of a test profile: the engine core's and the worker's phases, the forward
CONSTANT = {"add_request": 0.0, "schedule": 2e-4, "dispatch": 1e-4, "prepare": 3e-4, "forward": 4e-3,
            "roundtrip": 5e-5, "sample": 2e-4, "collect": 5e-5, "update": 3e-4}


def make_profile(costs: dict | None = None, prefill_per_token: float = 0.0, setting_curves: dict | None = None,
                 frontend: dict | None = None) -> dict:
    """A vLLM profile (test data) whose curves are constant over a wide grid: ``costs`` overrides
    :data:`CONSTANT` by phase name; the forward grows by ``prefill_per_token`` per scheduled
    token beyond one per request (an approximation: it is a curve over num_tokens); ``frontend``
    ``{"in": s, "out": s}``: the API server's constant costs (optional curves)."""
    c = {**CONSTANT, **(costs or {})}
    curves = {}
    for name, axes in VLLM_CURVE_AXES.items():
        phase = name.split(".", 1)[1]
        if len(axes) == 1:
            curves[name] = {"axes": list(axes), "grid": [[0, 100000]], "values_s": [c[phase], c[phase]]}
        else:
            hi = c[phase] + prefill_per_token * 100000
            curves[name] = {"axes": list(axes), "grid": [[0, 100000], [0, 100000]],
                            "values_s": [[c[phase], c[phase]], [hi, hi]]}
    for kind, value in (frontend or {}).items():
        curves[f"vllm.frontend_{kind}"] = {"axes": ["num_reqs"], "grid": [[0, 100000]], "values_s": [value, value]}
    profile = {
        "format": "overlap-sim calibration profile", "schema_version": 1,
        "metadata": {"backend": "vllm", "device": "cpu", "engine": "vllm", "engine_version": "0.32.0",
                     "device_name": "test data (made up)", "host_cpu": "none", "libraries": {}, "model": {"name": "test"},
                     "date": "2026-12-01", "grid": {}, "repeats": 1},
        "samples": [], "curves": curves,
    }
    if setting_curves:
        profile["setting_curves"] = setting_curves
    return profile


def write_profile(folder: Path, name: str = "vllm-test.json", **kwargs) -> str:
    """Write :func:`make_profile` into ``folder``; returns its path."""
    path = Path(folder) / name
    path.write_text(json.dumps(make_profile(**kwargs)))
    return str(path)


def vllm_scenario(*, profile: str | None = None, c: int = 4, n: int | None = None, input_len=64, output_len=40,
                  cached_len=0, finish: str = "length", device: str = "cpu", settings=("async", "sync"),
                  **extra) -> dict:
    """A closed-loop vLLM scenario of ``c`` clients (``n`` requests, default ``c``), no noise.
    ``extra``: ``section__key=value`` entries (``server__max_num_seqs=2``)."""
    scenario = {
        "name": "vllm-test", "seed": 0,
        "workload": {"arrival": "closed_loop", "concurrency": c, "num_requests": n or c, "input_len": input_len,
                     "cached_len": cached_len, "output_len": output_len, "finish": finish},
        "server": {"engine": "vllm", "device": device, "settings": list(settings), "block_size": 16,
                   "num_gpu_blocks": 4096, "max_model_len": 2048},
        "costs": {"profile": profile} if profile else {},
    }
    for path, value in extra.items():
        node = scenario
        keys = path.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = copy.deepcopy(value)
    return scenario
