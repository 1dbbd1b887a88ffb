"""The validation grids and how each configuration is calibrated.

A grid is a list of :class:`calibrate.harness.config.HarnessConfig`, each labelled with the
regime it is meant to exercise: ``gpu-bound`` (the forward is longer than the step's CPU work:
overlap hides the CPU), ``cpu-bound`` (the bookkeeping is longer: overlap hides the forward),
``balanced`` (about equal: where overlap gains most), each with ``length`` and ``eos``
finishes. The knobs are the model's size, the concurrency (batch size), the prompt and output
lengths and the bookkeeping per token (stop strings). ``quick`` takes minutes on 2 cores;
``full`` adds sizes and lengths.

The calibration of a configuration times this device on the configuration's own ranges:
decode batches up to its concurrency over its contexts, prefill batches of its prompts (several
requests of ``input_len - cached_len`` new tokens each, after ``cached_len`` cached tokens),
and the bookkeeping on its own requests (prompt and output lengths, stop strings, tokenizer).
"""

from __future__ import annotations

import dataclasses

from calibrate.config import BenchWorkload, CalibrationConfig, Grid
from calibrate.harness.config import HarnessConfig
from calibrate.harness.workload import stop_strings

# model sizes (overrides of the `tiny` shape, vocabulary = the 1024-token tokenizer's)
MICRO = {"layers": 1, "hidden": 32, "heads": 2, "kv_heads": 1, "intermediate": 64}
TINY1 = {"layers": 1}
TINY2 = {"layers": 2}
SMALL4 = {"layers": 4, "hidden": 128, "heads": 4, "kv_heads": 2, "intermediate": 256}

REGIMES = ("gpu-bound", "balanced", "cpu-bound")


def _case(name, regime, finish, **kw) -> tuple[str, HarnessConfig]:
    return regime, HarnessConfig(name=f"{name}-{finish}", finish=finish, **kw)


def _torch_cases(full: bool) -> list[tuple[str, HarnessConfig]]:
    # the decode step's CPU time over its forward, measured in the normal loop: ~0.1, ~0.9, ~1.6
    cases = []
    for finish in ("length", "eos"):
        cases += [
            _case("gpu-tiny2-c8", "gpu-bound", finish, overrides=TINY2, concurrency=8, num_requests=40,
                  warmup_requests=8, input_len=128, cached_len=64, output_len=48, stop_strings=2),
            _case("bal-micro-c48", "balanced", finish, overrides=MICRO, concurrency=48, num_requests=144,
                  warmup_requests=48, input_len=48, cached_len=32, output_len=24, stop_strings=256),
            _case("cpu-micro-c64", "cpu-bound", finish, overrides=MICRO, concurrency=64, num_requests=192,
                  warmup_requests=64, input_len=40, cached_len=24, output_len=16, stop_strings=512),
        ]
    if full:
        for finish in ("length", "eos"):
            cases += [
                _case("gpu-micro-c16", "gpu-bound", finish, overrides=MICRO, concurrency=16, num_requests=64,
                      warmup_requests=16, input_len=96, cached_len=64, output_len=40, stop_strings=24),
                _case("gpu-small4-c4", "gpu-bound", finish, overrides=SMALL4, concurrency=4, num_requests=24,
                      warmup_requests=4, input_len=192, cached_len=128, output_len=48, stop_strings=2),
                _case("bal-tiny1-c32-uniform", "balanced", finish, overrides=TINY1, concurrency=32, num_requests=96,
                      warmup_requests=32, input_len=96, cached_len=64,
                      output_len={"dist": "uniform", "low": 24, "high": 40}, stop_strings=128),
                _case("cpu-micro-c48-chunked", "cpu-bound", finish, overrides=MICRO, concurrency=48, num_requests=144,
                      warmup_requests=48, input_len=80, cached_len=16, output_len=24, stop_strings=512,
                      chunked_prefill_size=1024),
            ]
    return cases


def _mlx_cases(full: bool) -> list[tuple[str, HarnessConfig]]:
    # the decode step's CPU time over its forward, measured in the normal loop: ~0.25, ~1, ~2
    cases = []
    for finish in ("length", "eos"):
        cases += [
            _case("mlx-gpu-tiny2-c8", "gpu-bound", finish, backend="mlx", overrides=TINY2, concurrency=8,
                  num_requests=32, warmup_requests=8, input_len=96, cached_len=64, output_len=40, stop_strings=2),
            _case("mlx-bal-micro-c48", "balanced", finish, backend="mlx", overrides=MICRO, concurrency=48,
                  num_requests=144, warmup_requests=48, input_len=48, cached_len=32, output_len=24, stop_strings=512),
            _case("mlx-cpu-micro-c64", "cpu-bound", finish, backend="mlx", overrides=MICRO, concurrency=64,
                  num_requests=192, warmup_requests=64, input_len=40, cached_len=24, output_len=16, stop_strings=1024),
        ]
    if full:
        for finish in ("length", "eos"):
            cases += [
                _case("mlx-gpu-micro-c24", "gpu-bound", finish, backend="mlx", overrides=MICRO, concurrency=24,
                      num_requests=72, warmup_requests=24, input_len=64, cached_len=32, output_len=32, stop_strings=64),
                _case("mlx-gpu-micro-c16", "gpu-bound", finish, backend="mlx", overrides=MICRO, concurrency=16,
                      num_requests=64, warmup_requests=16, input_len=96, cached_len=64, output_len=40,
                      stop_strings=24),
            ]
    return cases


def _smoke(backend: str) -> list[tuple[str, HarnessConfig]]:
    # seconds: for the tests (a tiny model, few short requests, both finish kinds)
    return [_case(f"smoke-{backend}", "balanced", finish, backend=backend, overrides=MICRO, concurrency=4,
                  num_requests=10, warmup_requests=2, input_len=24, cached_len=8, output_len=6, stop_strings=2)
            for finish in ("length", "eos")]


GRIDS = ("quick", "full", "smoke")


def grid(backend: str, name: str) -> list[tuple[str, HarnessConfig]]:
    """(regime, configuration) pairs of grid ``name`` for ``backend``: ``quick`` (minutes on 2
    cores), ``full``, or ``smoke`` (two tiny configurations, seconds: for tests)."""
    if name == "smoke":
        return _smoke(backend)
    full = name == "full"
    return _torch_cases(full) if backend == "torch" else _mlx_cases(full)


def _spread(lo: int, hi: int) -> tuple[int, ...]:
    pts = {lo, hi}
    v = 1
    while v < hi:
        if v > lo:
            pts.add(v)
        v *= 2
    return tuple(sorted(pts))


def _bounds(spec) -> tuple[int, int]:
    if isinstance(spec, int):
        return spec, spec
    if spec.get("dist") == "uniform":
        return int(spec["low"]), int(spec["high"])
    if spec.get("dist") == "choice":
        return int(min(spec["values"])), int(max(spec["values"]))
    return int(spec.get("min", 1)), int(spec["max"])


def calibration_config(cfg: HarnessConfig, repeats: int = 30, warmup: int = 2) -> CalibrationConfig:
    """The calibration that times this device on ``cfg``'s ranges (see the module docstring)."""
    in_lo, in_hi = _bounds(cfg.input_len)
    c_lo, c_hi = _bounds(cfg.cached_len)
    o_lo, o_hi = _bounds(cfg.output_len)
    new_tokens = max(1, in_hi - c_lo)
    batch = min(cfg.concurrency, cfg.max_running_requests)
    contexts = tuple(sorted({in_lo + 1, (in_lo + in_hi + o_hi) // 2, in_hi + o_hi}))
    per_prefill = min(cfg.chunked_prefill_size, batch * new_tokens)
    extend = tuple(sorted({t * new_tokens for t in _spread(1, batch) if t * new_tokens <= per_prefill} | {per_prefill}))
    g = Grid(_spread(1, batch), contexts, extend, tuple(sorted({c_lo, c_hi})), _spread(1, batch),
             warmup=warmup, repeats=repeats, extend_request_tokens=new_tokens)
    book = BenchWorkload(system_prompts=1, system_len=c_hi, user_len=max(1, in_hi - c_hi), output_lo=o_lo,
                         output_hi=o_hi, stop_strs=tuple(stop_strings(cfg.stop_strings)), vocab=cfg.tokenizer_vocab)
    device = cfg.device
    return CalibrationConfig(cfg.backend, device, cfg.shape, g, seed=cfg.seed, cuda_graph=False,
                             threads=cfg.torch_threads if cfg.backend == "torch" else None, bookkeeping=book,
                             note="overlap-sim validate: calibrated on this configuration's ranges")


def with_name(cfg: HarnessConfig, name: str) -> HarnessConfig:
    return dataclasses.replace(cfg, name=name)
