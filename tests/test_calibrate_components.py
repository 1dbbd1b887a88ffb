"""The real components calibration times: radix cache, KV allocators, requests with a real
tokenizer, the bookkeeper driving the model as a serving loop would, and the two models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calibrate.bookkeeping.bookkeeper import Bookkeeper
from calibrate.bookkeeping.kv_pool import ReqSlotAllocator, TokenSlotAllocator
from calibrate.bookkeeping.radix import RadixCache
from calibrate.bookkeeping.requests import EOS, Req, build_tokenizer
from calibrate.forward.torch_model import TorchLlama
from calibrate.forward.weights import random_weights
from calibrate.shapes import NAMED_SHAPES, resolve_shape


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_radix_match_insert_split_and_evict():
    tree = RadixCache()
    assert tree.insert([1, 2, 3, 4], np.array([10, 11, 12, 13])) == 0
    assert tree.insert([1, 2, 5], np.array([20, 21, 22])) == 2  # shares [1, 2]: the caller frees 20, 21
    kv, node = tree.match_prefix([1, 2, 3, 9])
    assert kv.tolist() == [10, 11, 12] and node.key == [3]  # split inside the [3, 4] edge
    assert tree.match_prefix([7])[0].tolist() == []
    assert tree.total_size == 5
    tree.inc_lock_ref(node)
    freed = []
    assert tree.evict(10, lambda idx: freed.extend(idx.tolist())) == 2  # [4] and [5]; [1,2],[3] locked
    assert sorted(freed) == [13, 22] and tree.total_size == 3
    tree.dec_lock_ref(node)
    assert tree.evict(10, lambda idx: freed.extend(idx.tolist())) == 3 and tree.total_size == 0


def test_allocators():
    kv = TokenSlotAllocator(8)
    a = kv.alloc(5)
    assert a.tolist() == [1, 2, 3, 4, 5] and kv.available_size() == 3 and kv.alloc(4) is None
    kv.free(a[:2])
    assert kv.available_size() == 5 and kv.alloc(5).tolist() == [6, 7, 8, 1, 2]
    req = ReqSlotAllocator(2)
    s0, s1 = req.alloc(), req.alloc()
    assert {s0, s1} == {0, 1} and req.alloc() is None
    req.free(s0)
    assert req.alloc() == s0


def test_request_detokenizes_incrementally_and_checks_stops(tokenizer):
    ids = tokenizer.encode("Return the value. Otherwise raise an error.").ids
    r = Req("a", [1, 2], max_new_tokens=100, stop_strs=("raise",))
    for t in ids:
        r.append_token(t, tokenizer)
        if r.finished_reason:
            break
    assert r.finished_reason == "stop" and r.text.endswith("raise") and r.text.startswith("Return the value.")
    assert r.text == tokenizer.decode(r.output_ids)
    eos = tokenizer.token_to_id(EOS)
    r = Req("b", [1], 100, eos_ids=frozenset({eos}))
    r.append_token(ids[0], tokenizer)
    r.append_token(eos, tokenizer)
    assert r.finished_reason == "stop"
    r = Req("c", [1], 2)
    r.append_token(ids[0], tokenizer)
    assert r.finished_reason is None
    r.append_token(ids[1], tokenizer)
    assert r.finished_reason == "length"


def _greedy_reference(model: TorchLlama, prompt: list[int], n: int) -> list[int]:
    """Greedy generation by recomputing the whole sequence every step (no decode path)."""
    seq, out = list(prompt), []
    for _ in range(n):
        tok = int(model.extend(torch.tensor(seq), [7], [0], [len(seq)], 4097 + torch.arange(len(seq)))[0])
        out.append(tok)
        seq.append(tok)
    return out


def test_bookkeeper_drives_the_model_like_a_serving_loop(tokenizer):
    """recv -> schedule -> launch -> process with prefix sharing, against a full recompute."""
    import pickle

    shape = resolve_shape("tiny", vocab=tokenizer.get_vocab_size())
    model = TorchLlama(shape, weights=random_weights(shape, 1))
    model.allocate_kv(8, 128, pool_tokens=4096 + 128)  # bookkeeper's slots 1..4096; the reference uses the rest
    bk = Bookkeeper(tokenizer, kv_tokens=4096, max_reqs=7, max_ctx=128)
    shared = tokenizer.encode("The quick brown fox jumps over the lazy dog and then").ids
    prompts = [shared + tokenizer.encode(s).ids for s in (" runs away.", " sleeps.", " barks twice.")]
    want = {f"r{i}": _greedy_reference(model, p, 5) for i, p in enumerate(prompts)}
    msgs = [pickle.dumps({"rid": f"r{i}", "input_ids": p, "sampling_params": {"max_new_tokens": 5}})
            for i, p in enumerate(prompts)]
    assert bk.recv(msgs[:1]) == 1
    done = {}

    def run_extend():
        batch = bk.schedule_extend()
        inp = bk.extend_inputs(batch)
        toks = model.extend(torch.from_numpy(inp.input_ids), inp.slots.tolist(), inp.prefix_lens, inp.extend_lens,
                            torch.from_numpy(inp.out_cache_loc), [torch.from_numpy(a) for a in inp.prefix_indices])
        for r in bk.process_extend(batch, toks.tolist()):
            done[r.rid] = r
        return batch

    first = run_extend()
    assert first.prefix_lens == [0]
    bk.recv(msgs[1:])
    second = run_extend()  # both new requests reuse the first prompt's cached prefix
    assert second.prefix_lens == [len(shared)] * 2 and second.extend_lens == [len(p) - len(shared) for p in prompts[1:]]
    while bk.running:
        batch = bk.schedule_decode()
        inp = bk.decode_inputs(batch)
        toks = model.decode(*(torch.from_numpy(a) for a in (inp.input_ids, inp.slots, inp.positions,
                                                             inp.out_cache_loc)), 64)
        for r in bk.process_decode(batch, toks.tolist()):
            done[r.rid] = r
    assert {rid: r.output_ids for rid, r in done.items()} == want
    assert all(r.finished_reason == "length" for r in done.values())
    # nothing leaked: every KV slot is free or held by the radix cache, every request slot is free
    assert bk.kv.available_size() + bk.tree.total_size == 4096
    assert bk.req_slots.available_size() == 7 and bk.tree.evictable_size == bk.tree.total_size


def test_torch_and_mlx_models_agree():
    mx = pytest.importorskip("mlx.core")
    from calibrate.forward.mlx_model import MlxLlama

    shape = NAMED_SHAPES["tiny"]
    w = random_weights(shape, 3)
    t, m = TorchLlama(shape, weights=w), MlxLlama(shape, weights=w)
    for model in (t, m):
        model.allocate_kv(2, 32)
    prompt = [5, 7, 9, 11, 13, 2, 3]
    lt = t.extend_logits(torch.tensor(prompt), [0], [0], [7], torch.arange(1, 8)).numpy()
    lm = np.array(m.extend_logits(mx.array(prompt), [0], [0], [7], mx.arange(1, 8)))
    np.testing.assert_allclose(lt, lm, atol=1e-5)
    # a second request shares the first 5 tokens' KV (a radix hit) and computes the last 2
    lt2 = t.extend_logits(torch.tensor(prompt[5:]), [1], [5], [2], torch.tensor([20, 21]), [np.arange(1, 6)]).numpy()
    lm2 = np.array(m.extend_logits(mx.array(prompt[5:]), [1], [5], [2], mx.array([20, 21]), [np.arange(1, 6)]))
    np.testing.assert_allclose(lt2, lt, atol=1e-5)
    np.testing.assert_allclose(lm2, lt, atol=1e-5)
    tok = int(lt.argmax())
    dt = t.decode_logits(torch.tensor([tok]), torch.tensor([1]), torch.tensor([7]), torch.tensor([22]), 16).numpy()
    dm = np.array(m.decode_logits(mx.array([tok]), mx.array([1]), mx.array([7]), mx.array([22]), 16))
    np.testing.assert_allclose(dt, dm, atol=1e-5)


def test_named_shapes_have_published_sizes():
    s = NAMED_SHAPES["llama-3.2-1b"]
    assert 1.2e9 < s.num_params < 1.3e9 and s.kv_bytes_per_token(2) == 32 * 1024
    assert 7.9e9 < NAMED_SHAPES["llama-3.1-8b"].num_params < 8.1e9
    assert 0.55e9 < NAMED_SHAPES["qwen3-0.6b"].num_params < 0.8e9
