"""Calibration sized to the card (calibrate.sizing, calibrate --device-memory-gib / --dry-run): memory
by hand, the 8B grid on a 24 GB L4 and a 139 GiB H200, the duration estimate, bad input, invariants."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibrate.config import FULL_GPU, CalibrationConfig, Grid
from calibrate.errors import CalibrationInputError
from calibrate.shapes import NAMED_SHAPES, ModelShape
from calibrate.sizing import (BOOKKEEPING_BASE_S, BOOKKEEPING_PER_REQ_S, CAPTURE_RUNS, ESTIMATE_EFFICIENCY, GIB,
                              KV_GATHER_TRAFFIC, KV_MEMORY_SHARE, LAYER_OVERHEAD_S, SETUP_S, STEP_OVERHEAD_S,
                              decode_bytes, decode_transient_bytes, estimate_duration_s, extend_bytes, need_bytes,
                              size_grid)
from sim.cli import main
from sim.model.cards import CARDS

ROOT = Path(__file__).resolve().parents[1]
L8B = NAMED_SHAPES["llama-3.1-8b"]
L4_FREE = CARDS["l4"].memory_bytes  # 24 GB: the card's whole memory, more than torch would report free


def test_kv_bytes_by_hand():
    # 8B: 32 layers x 8 kv heads x 128 x 2 (K and V) x 2 bytes = 131072 bytes per token
    assert L8B.kv_bytes_per_token(2) == 32 * 8 * 128 * 2 * 2 == 131072
    tiny = ModelShape("t", layers=2, hidden=64, heads=4, kv_heads=2, vocab=100, intermediate=128)
    # decode grid up to batch 4 x context 64: pool 4 x (64 + 64) tokens; transients of that point
    kv = 2 * 2 * 16 * 2 * 4  # layers x kv_heads x head_dim x 2 x 4 bytes
    trans = 2 * (2 * 2 * 4 * 128 * 16 * 4 + 4 * 4 * 128 * (8 + 4) + 4 * 100 * (4 + 4))
    assert decode_transient_bytes(tiny, 4, 4, 128) == trans
    assert decode_bytes(tiny, 4, (1, 4), (16, 64)) == 4 * 128 * kv + trans
    assert need_bytes(tiny, 4, Grid((1, 4), (16, 64), (8,), (0,), (1,), 1, 1)) == \
        tiny.num_params * 4 + max(4 * 128 * kv + trans, extend_bytes(tiny, 4, (8,), (0,)))


def test_8b_on_an_l4_fits_and_an_h200_keeps_more():
    small = size_grid(L8B, 2, FULL_GPU, L4_FREE, KV_MEMORY_SHARE, "L4")
    assert small.need_bytes <= small.budget_bytes
    assert small.grid.decode_batch_sizes and small.grid.decode_contexts and small.dropped
    big = size_grid(L8B, 2, FULL_GPU, 139 * GIB, KV_MEMORY_SHARE, "H200")
    assert big.need_bytes <= big.budget_bytes
    n = lambda g: len(g.decode_batch_sizes) * len(g.decode_contexts) + len(g.extend_tokens) * len(g.extend_prefixes)  # noqa: E731
    assert n(big.grid) > n(small.grid)
    assert set(small.grid.decode_batch_sizes) <= set(big.grid.decode_batch_sizes)
    # 139 GiB: batch 256 x 4160 keys x 128 KiB = 130 GiB does not fit, batch 128 does (as the shipped 8B profile chose)
    assert big.grid.decode_batch_sizes[-1] == 128 and big.grid.decode_contexts[-1] == 4096
    huge = size_grid(L8B, 2, FULL_GPU, 10_000 * GIB, KV_MEMORY_SHARE, "huge")
    assert huge.grid == FULL_GPU and not huge.dropped


def test_weights_that_do_not_fit_are_one_error():
    with pytest.raises(CalibrationInputError, match="--device-memory-gib.*15.0 GiB of weights"):
        size_grid(L8B, 2, FULL_GPU, 10 * GIB, KV_MEMORY_SHARE, "test")


def test_duration_estimate_by_hand():
    shape = NAMED_SHAPES["llama-3.2-1b"]
    grid = Grid((8,), (512,), (256,), (0,), (4,), warmup=1, repeats=4)
    cfg = CalibrationConfig("torch", "cuda", shape, grid)
    h200 = CARDS["h200"]
    p, kv = shape.num_params, shape.kv_bytes_per_token(2)
    eff = ESTIMATE_EFFICIENCY
    dec_bytes = p * 2 + KV_GATHER_TRAFFIC * 8 * 512 * kv
    dec_flops = 2 * p * 8 + 4 * 16 * 32 * 64 * 8 * 512
    dec = max(dec_flops / (eff * h200.bf16_flops), dec_bytes / (eff * h200.bandwidth_bytes_s))
    ext_flops = 2 * p * 256 + 4 * 16 * 32 * 64 * 256 * (0 + 257 / 2)
    ext = max(ext_flops / (eff * h200.bf16_flops), (p * 2 + 256 * kv) / (eff * h200.bandwidth_bytes_s))
    fixed = 16 * LAYER_OVERHEAD_S["cuda"] + STEP_OVERHEAD_S["cuda"]
    expected = (SETUP_S["cuda"] + (5 + CAPTURE_RUNS) * (dec + fixed) + 5 * (ext + fixed)
                + 5 * BOOKKEEPING_BASE_S + 5 * (BOOKKEEPING_BASE_S + 4 * BOOKKEEPING_PER_REQ_S))
    assert estimate_duration_s(cfg, h200) == pytest.approx(expected)
    # a slower card takes longer
    assert estimate_duration_s(cfg, CARDS["l4"]) > estimate_duration_s(cfg, h200)


@pytest.mark.parametrize("name", ["h200-llama-3.2-1b", "h200-llama-3.1-8b"])
def test_step_estimate_against_the_measured_h200_profiles(name):
    """The per-step estimate, summed over a shipped profile's grid, within 0.7 to 1.1 of the measured
    forward times (0.78 to 1.02 when the constants were chosen)."""
    data = json.loads((ROOT / f"scenarios/profiles/{name}.json").read_text())
    shape = ModelShape.from_dict(data["metadata"]["model"])
    g = data["metadata"]["grid"]
    grid = Grid(tuple(g["decode_batch_sizes"]), tuple(g["decode_contexts"]), tuple(g["extend_tokens"]),
                tuple(g["extend_prefixes"]), (1,), warmup=0, repeats=1)
    cfg = CalibrationConfig("torch", "cuda", shape, grid, cuda_graph=False)
    measured = sum(v for c in ("forward.decode", "forward.extend") for row in data["curves"][c]["values_s"] for v in row)
    points = len(grid.decode_batch_sizes) * len(grid.decode_contexts) + len(grid.extend_tokens) * len(grid.extend_prefixes)
    estimated = (estimate_duration_s(cfg, CARDS["h200"]) - SETUP_S["cuda"] - points * STEP_OVERHEAD_S["cuda"]
                 - 2 * BOOKKEEPING_BASE_S - BOOKKEEPING_PER_REQ_S)
    assert 0.7 <= estimated / measured <= 1.1


def test_dry_run_plans_without_a_gpu(tmp_path, capsys):
    out = tmp_path / "l4.json"
    assert main(["calibrate", "--backend", "torch", "--device", "cuda", "--model", "llama-3.1-8b", "--out", str(out),
                 "--device-memory-gib", "22", "--card", "l4", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "memory: llama-3.1-8b bfloat16 needs" in err and "cut to fit, left out: decode batch sizes 16,32,64,128,256" in err
    assert "estimated" in err and "on NVIDIA L4" in err and not out.exists()


@pytest.mark.parametrize("argv, needle", [
    (["--device-memory-gib", "0"], "--device-memory-gib"),
    (["--device-memory-gib", "4"], "--device-memory-gib"),
    (["--device-memory-gib", "22", "--card", "tpu"], "--card"),
])
def test_bad_sizing_flags_are_one_line(argv, needle, tmp_path, capsys):
    assert main(["calibrate", "--backend", "torch", "--device", "cuda", "--model", "llama-3.1-8b",
                 "--out", str(tmp_path / "x.json"), "--dry-run", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err


@settings(max_examples=60, deadline=None)
@given(st.floats(19.0, 400.0), st.floats(1.0, 50.0))
def test_sized_grid_fits_and_grows_with_memory(gib, extra):
    a = size_grid(L8B, 2, FULL_GPU, gib * GIB, KV_MEMORY_SHARE, "a")
    b = size_grid(L8B, 2, FULL_GPU, (gib + extra) * GIB, KV_MEMORY_SHARE, "b")
    for s in (a, b):
        assert s.need_bytes <= s.budget_bytes
        for field in ("decode_batch_sizes", "decode_contexts", "extend_tokens", "extend_prefixes"):
            kept = getattr(s.grid, field)
            assert kept == getattr(FULL_GPU, field)[:len(kept)]  # the smallest values, in order
    count = lambda g: len(g.decode_batch_sizes) * len(g.decode_contexts)  # noqa: E731
    assert count(b.grid) >= count(a.grid)
