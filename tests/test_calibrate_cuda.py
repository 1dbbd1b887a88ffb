"""The CUDA path of calibration: graph-captured decode agrees with eager decode and with the
prefill path, and a tiny calibration runs end to end. Skipped without a CUDA GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _model():
    from calibrate.forward.torch_model import TorchLlama
    from calibrate.forward.weights import random_weights
    from calibrate.shapes import resolve_shape

    shape = resolve_shape("tiny")
    model = TorchLlama(shape, "cuda", torch.float32, weights=random_weights(shape, 0))
    assert model.check_attention() == "scaled_dot_product_attention"
    model.allocate_kv(4, 64)
    return model


def test_cuda_graph_decode_matches_eager_and_prefill():
    from calibrate.forward.torch_model import CudaGraphDecode

    model = _model()
    graph = CudaGraphDecode(model, 4, 16)  # capture first: its warm-up writes into padding slot 0
    prompt = torch.tensor([5, 7, 9, 11, 13, 2, 3], device="cuda")
    first = None
    for slot in range(4):  # request `slot` owns pool slots 1 + 16*slot ...
        first = model.extend(prompt, [slot], [0], [7], 1 + 16 * slot + torch.arange(7, device="cuda"))
    ids = first.repeat(4)
    slots = torch.arange(4, device="cuda")
    pos = torch.full((4,), 7, device="cuda")
    loc = 1 + 16 * slots + 7
    eager = model.decode_logits(ids, slots, pos, loc, 16)
    out = graph.launch(ids, slots, pos, loc).clone()
    assert torch.equal(out, eager.argmax(-1))
    full = model.extend_logits(torch.cat([prompt, first]), [3], [0], [8], 40 + torch.arange(8, device="cuda"))
    assert torch.allclose(eager[0], full[0], atol=1e-4)


def test_cuda_calibration_runs(tmp_path):
    from calibrate.cli import main
    from sim.model.profile import load_profile

    out = tmp_path / "cuda.json"
    rc = main(["--backend", "torch", "--device", "cuda", "--model", "tiny", "--quick", "--out", str(out), "--quiet",
               "--batch-sizes", "1,4", "--contexts", "32,128", "--extend-tokens", "1,16", "--prefixes", "0,32",
               "--bookkeeping-batch-sizes", "1,4", "--repeats", "3"])
    assert rc == 0
    prof = load_profile(out)
    assert prof["metadata"]["decode_mode"] == "cuda_graph" and prof["metadata"]["graph_capture_failures"] == []
    assert all(t > 0 for s in prof["samples"] for t in s["times_s"] if s["curve"].startswith("forward"))
