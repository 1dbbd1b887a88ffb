"""The ground-truth harness on this machine's CPU: torch (device process, forward thread) and MLX
under each schedule, on a tiny configuration; its trace satisfies a simulated trace's
invariants, and the serving bookkeeping (chunked prefill, tokens in flight, overshoot) is
checked step by step."""

from __future__ import annotations

import dataclasses
import pickle
from types import SimpleNamespace

import numpy as np
import pytest

import sim
from calibrate.bookkeeping.bookkeeper import Bookkeeper
from calibrate.bookkeeping.requests import EOS, build_tokenizer
from calibrate.harness.config import HarnessConfig
from calibrate.harness.run import run_harness
from calibrate.harness.workload import EosScript, build_workload
from tests.test_invariants import check_run

MICRO = {"layers": 1, "hidden": 32, "heads": 2, "kv_heads": 1, "intermediate": 64}
SMALL = HarnessConfig("t", overrides=MICRO, num_requests=10, warmup_requests=2, concurrency=4, input_len=24,
                      cached_len=8, output_len=6, stop_strings=2)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(SMALL.tokenizer_vocab)


def _as_result(res, cfg: HarnessConfig):
    """A measured run in the shape ``check_run`` reads (the simulator's Result)."""
    return SimpleNamespace(requests=res.requests, steps=res.steps, setting=res.setting,
                           scenario=sim.load_scenario(cfg.scenario()))


@pytest.mark.parametrize("finish", ["length", "eos"])
@pytest.mark.parametrize("setting", ["normal", "overlap"])
def test_torch_device_process_trace_holds_the_simulator_invariants(tokenizer, setting, finish):
    cfg = dataclasses.replace(SMALL, finish=finish)
    res = run_harness(cfg, setting, tokenizer)
    check_run(_as_result(res, cfg))
    steps = res.steps
    assert list(steps.columns) == list(sim.simulate(cfg.scenario(), setting).steps.columns)
    summary = res.summary()
    assert summary["completed"] == cfg.num_requests - cfg.warmup_requests and summary["output_throughput"] > 0
    if setting == "overlap" and finish == "eos":  # the scheduler learns of an EOS from the token: one wasted slot
        assert summary["overshoot_tokens"] > 0
    if setting == "overlap" and finish == "length":  # v0.5.22 leaves a request finishing by length out
        assert int(steps["overshoot"].sum()) == 0


def test_thread_overlap_runs_the_forward_in_a_thread(tokenizer, monkeypatch):
    from calibrate.harness.thread_loop import ThreadWorker

    # the scheduler processes k-1 only after batch k's forward was launched (0.5.3's launch_done):
    # checked on the event itself when k-1's result is handed over, not on timestamps (a busy
    # machine delays the forward thread by any amount)
    launched_before_processing = []
    wait = ThreadWorker.wait

    def checked_wait(self, step):
        current = self.current
        tokens = wait(self, step)
        if current is not None and current is not step:
            launched_before_processing.append(current.handle.is_set())
        return tokens

    monkeypatch.setattr(ThreadWorker, "wait", checked_wait)
    res = run_harness(SMALL, "thread_overlap", tokenizer)
    req, steps = res.requests, res.steps
    assert (req["status"] == "completed").all() and (req["output_tokens"] == req["output_len"]).all()
    assert (steps["forward_start"].to_numpy()[1:] >= steps["forward_end"].to_numpy()[:-1]).all()
    assert (steps["process_start"] >= steps["forward_end"]).all()
    assert len(launched_before_processing) >= len(steps) // 2 and all(launched_before_processing)
    # and k-1 is processed after k's launch ended (both stamped by the scheduler thread: one clock, in order)
    nxt_launch = steps["launch_end"].to_numpy()[1:]
    assert (steps["process_start"].to_numpy()[:-1] >= nxt_launch).mean() >= len(launched_before_processing) / len(steps)


@pytest.mark.parametrize("setting", ["normal", "overlap_mlx"])
def test_mlx_harness_trace_holds_the_simulator_invariants(tokenizer, setting):
    pytest.importorskip("mlx.core")
    cfg = dataclasses.replace(SMALL, backend="mlx", finish="eos")
    res = run_harness(cfg, setting, tokenizer)
    check_run(_as_result(res, cfg))
    if setting == "overlap_mlx":  # a chained decode carries the requests that finished one step earlier
        assert res.summary()["overshoot_tokens"] > 0


def test_cuda_harness_needs_a_gpu(tokenizer):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        cfg = dataclasses.replace(SMALL, device="cuda")
        check_run(_as_result(run_harness(cfg, "overlap", tokenizer), cfg))
    else:
        from calibrate.harness.cuda_device import CudaDevice

        with pytest.raises(RuntimeError, match="CUDA"):
            CudaDevice(None)


def test_harness_serves_the_simulators_requests(tokenizer):
    cfg = dataclasses.replace(SMALL, input_len={"dist": "uniform", "low": 12, "high": 30}, cached_len=6)
    w = build_workload(cfg, tokenizer)
    specs = sim.model.workload.make_requests(sim.load_scenario(cfg.scenario()))
    np.testing.assert_array_equal(w.input_len, specs.input_len)
    np.testing.assert_array_equal(w.output_len, specs.output_len)
    prompts = [pickle.loads(m)["input_ids"] for m in w.messages]
    assert [len(p) for p in prompts] == specs.input_len.tolist()
    # every prompt starts with the shared cached prefix, then a token no other prompt has there
    assert all(p[:6] == w.system_prompt[:6] for p in prompts)
    assert len({p[6] for p in prompts}) == len(prompts)


def test_eos_script_ends_answers_exactly_where_asked():
    script = EosScript(np.array([3, 0]), eos_id=0, max_slots=4)
    script.admit(2, 0)  # request 0 in slot 2 ends at its 3rd token
    script.admit(1, 1)  # request 1 never samples EOS
    assert script.apply([2, 1], [0, 0]) == [1, 1]  # an early EOS becomes another token
    assert script.apply([2, 1], [5, 5]) == [5, 5]
    assert script.apply([2, 1], [5, 0]) == [0, 1]


def _bookkeeper(tokenizer, n: int, prompt_len: int, out: int):
    bk = Bookkeeper(tokenizer, kv_tokens=4096, max_reqs=8, max_ctx=128)
    msgs = [pickle.dumps({"rid": i, "input_ids": [1 + i] + list(range(20, 20 + prompt_len - 1)),
                          "sampling_params": {"max_new_tokens": out}}) for i in range(n)]
    bk.recv(msgs)
    return bk


def test_chunked_prefill_continues_first_then_joins_the_running_batch(tokenizer):
    bk = _bookkeeper(tokenizer, 3, prompt_len=10, out=4)
    first = bk.schedule_extend(token_budget=15)  # 10 tokens + a 5-token chunk of the second prompt
    assert first.extend_lens == [10, 5] and first.is_last == [True, False] and bk.chunked_req is first.reqs[1]
    second = bk.schedule_extend(token_budget=15)  # the chunked request first, before the waiting one
    assert second.reqs[0] is first.reqs[1] and second.prefix_lens[0] == 5 and second.extend_lens == [5, 10]
    assert bk.running == [first.reqs[0]]  # the finished prompt joined at this schedule, before its token came back
    ids = Bookkeeper.extend_inputs(second).input_ids
    assert ids[:5].tolist() == list(range(24, 29))  # the rest of the chunked prompt
    bk.process_extend(first, [7, 7])
    assert first.reqs[0].output_ids == [7] and first.reqs[1].output_ids == []  # a chunk samples nothing


def test_decodes_scheduled_in_flight_take_the_next_positions(tokenizer):
    bk = _bookkeeper(tokenizer, 1, prompt_len=6, out=3)
    pre = bk.schedule_extend()
    d1 = bk.schedule_decode()  # scheduled while the prefill is in flight (overlap)
    assert d1.positions.tolist() == [6]  # feeds the prefill's token, at position 6
    d2 = bk.schedule_decode()
    assert d2.positions.tolist() == [7]
    assert bk.schedule_decode(exclude_finishing=True) is None  # 3 tokens in flight reach max_new_tokens
    req = pre.reqs[0]
    bk.process_extend(pre, [5])
    bk.process_decode(d1, [5])
    assert bk.process_decode(d2, [5]) == [req] and req.finished_reason == "length"
    assert bk.kv.available_size() + bk.tree.total_size == 4096 and bk.req_slots.available_size() == 8


def test_overshoot_token_is_discarded_and_its_slot_freed(tokenizer):
    eos = tokenizer.token_to_id(EOS)
    bk = _bookkeeper(tokenizer, 1, prompt_len=6, out=50)
    pre = bk.schedule_extend()
    bk.process_extend(pre, [5])
    a = bk.schedule_decode()
    b = bk.schedule_decode()  # launched before a's EOS is known
    req = a.reqs[0]
    assert bk.process_decode(a, [eos]) == [req] and req.finished_reason == "stop"
    assert bk.process_decode(b, [9]) == [] and req.output_ids == [5, eos]
    assert bk.kv.available_size() + bk.tree.total_size == 4096 and not bk.running
