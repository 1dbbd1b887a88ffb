"""KV pool in pages, check_decode_mem, decode retraction and the allocation failure, with
outcomes computed by hand on small scenarios."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim
from sim.engines.sglang.policy.kvpool import DecodePageDemand, KVPool
from sim.engines.sglang.policy.retraction import AllocationFailed, keep_order, ratio_after_retract, retract_decode
from sim.model.batch import Req
from tests.conftest import SCENARIOS


def test_kv_pool_pages():
    pool = KVPool(256, 64)
    assert (pool.total_pages, pool.pages(1), pool.pages(64), pool.pages(65)) == (4, 1, 1, 2)
    assert pool.grow(64, 1) == 1 and pool.grow(63, 1) == 0 and pool.grow(0, 130) == 3
    pool.alloc(3)
    assert (pool.used_tokens, pool.free_pages, pool.usage()) == (192, 1, 0.75)
    pool.free(2)
    assert pool.peak_tokens == 192 and pool.used_tokens == 64
    with pytest.raises(ValueError):
        KVPool(100, 64)


def test_decode_page_demand_by_residue():
    d = DecodePageDemand(64)
    d.add(kv_base=64, join_seq=0)   # holds 64 + g tokens before batch g: a new page at g = 0, 64, 128
    d.add(kv_base=10, join_seq=5)   # holds 10 + (g - 5): a new page at g = 59, 123
    assert [d.need(g) for g in (0, 1, 59, 64, 123, 128)] == [1, 0, 1, 1, 1, 1]
    assert d.member_needs(64, 0, 128) and not d.member_needs(10, 5, 128)
    d.remove(64, 0)
    assert d.need(0) == 0


_MEMBER = st.tuples(st.integers(0, 5000), st.integers(0, 40), st.integers(1, 9000), st.integers(0, 3), st.booleans())


@settings(max_examples=200, deadline=None)
@given(page=st.sampled_from([1, 2, 16, 64]), full_ratio=st.booleans(),
       members=st.lists(_MEMBER, min_size=0, max_size=30), leaving=st.data())
def test_a_group_joins_and_leaves_as_its_members_one_by_one(page, full_ratio, members, leaving):
    """RunningReserve.add_all/remove_all and DecodePageDemand.add_all/remove_all (a group joining
    or leaving the running batch together) leave the state that add/remove of each member does."""
    from sim.engines.sglang.policy.reserve import RunningReserve

    reqs = []
    for i, (kv_base, join_seq, max_new, delivered, ignore_eos) in enumerate(members):
        r = _req(i, 10, max_new)
        r.kv_base, r.join_seq, r.delivered, r.ignore_eos = kv_base, join_seq, delivered, ignore_eos
        reqs.append(r)
    gone = leaving.draw(st.lists(st.sampled_from(reqs), unique=True) if reqs else st.just([]))
    one, group = (RunningReserve(full_ratio), DecodePageDemand(page)), (RunningReserve(full_ratio), DecodePageDemand(page))
    for r in reqs:
        one[0].add(r)
        one[1].add(r.kv_base, r.join_seq)
    group[0].add_all(reqs)
    group[1].add_all(reqs)
    for r in gone:
        one[0].remove(r)
        one[1].remove(r.kv_base, r.join_seq)
    group[0].remove_all(gone)
    group[1].remove_all(gone)
    for a, b in zip(one, group):
        assert {k: v for k, v in vars(a).items()} == {k: v for k, v in vars(b).items()}
    assert one[0].total(0.7, 3, 12) == group[0].total(0.7, 3, 12)


def _req(rid, input_len, output_len):
    return Req(rid, 0.0, input_len, 0, output_len, True, False, max_new_tokens=output_len)


def test_keep_order_and_ratio_after_retract():
    a, b, c = _req(0, 100, 50), _req(1, 10, 50), _req(2, 10, 50)
    known = {id(a): 5, id(b): 5, id(c): 9}
    # longest output kept first; for equal output, the shorter input
    assert keep_order([a, b, c], known) == [c, b, a]
    # (decoded + 20 x kept) / (sum of max_new_tokens + 1), capped at 1
    assert ratio_after_retract([c, b], known) == pytest.approx((9 + 5 + 40) / 101)
    assert ratio_after_retract([a, b, c], {id(a): 50, id(b): 50, id(c): 50}) == 1.0


class _FakeScheduler:
    """Requests holding ``pages[rid]`` pages, each needing one page in the batch."""

    def __init__(self, pages):
        self.pages, self.released, self.aborted = pages, [], []

    def committed_output(self, req):
        return req.rid  # larger rid: longer output, kept first

    def needs_page(self, req, g):
        return True

    def release(self, req, g, committed):
        self.released.append(req.rid)
        return self.pages[req.rid]

    def abort(self, req):
        self.aborted.append(req.rid)


def test_retract_decode_retracts_least_preferred_until_it_fits():
    reqs = [_req(i, 10, 100) for i in range(4)]
    s = _FakeScheduler({0: 1, 1: 1, 2: 5, 3: 5})
    # need 4 pages, 1 free: retract rid 0 (need 3, free 2), rid 1 (need 2, free 3): fits
    retracted, aborted, _, _ = retract_decode(s, 7, reqs, [], free_pages=1, abort_last=True)
    assert [r.rid for r in retracted] == [0, 1] and aborted is None


def test_retract_decode_last_request_aborted_or_allocation_fails():
    reqs = [_req(i, 10, 100) for i in range(2)]
    s = _FakeScheduler({0: 0, 1: 0})  # retraction frees nothing
    retracted, aborted, _, _ = retract_decode(s, 7, reqs, [], free_pages=0, abort_last=True)
    assert [r.rid for r in retracted] == [0] and aborted.rid == 1 and s.aborted == [1]
    # without abort (naive): rid 0 retracted, then rid 1 alone still needs 1 page
    with pytest.raises(AllocationFailed, match="1 page.* for the 1 request"):
        retract_decode(_FakeScheduler({0: 0, 1: 0}), 7, reqs, [], free_pages=0, abort_last=False)
    # locked members (naive under overlap) are never retracted; all candidates may go
    s = _FakeScheduler({0: 0, 1: 0})
    with pytest.raises(AllocationFailed, match="for the 1 request"):
        retract_decode(s, 7, [reqs[0]], [reqs[1]], free_pages=0, abort_last=False)
    assert s.released == [0]


# --- three requests, pool 22 tokens, page 1, no running offset (init_new_token_ratio 0) -------
# Admission reserves a new request's whole output, so requests admitted in one pass always fit
# together; the pool overflows only through a *later* admission that discounts the running
# batch's remaining output by the ratio (0 here, 0.5.4-era rules). Two clients: A (input 1,
# output 3) and B (input 6, output 10) fit one pass (4 + 16 tokens of 22); C (input 5, output 5)
# is sent when A finishes and admitted against B's current KV only. B and C then need 16 + 10
# tokens at the end: the pool runs out as B finishes by length, and under overlap the check of
# the batch after B's last runs while B's KV is still held.

def _three_requests(write_trace, policy):
    trace = write_trace([(0.0, 1, 3), (0.0, 6, 10), (0.0, 5, 5)])
    return sim.load_scenario({
        "name": "three", "workload": {"arrival": "closed_loop", "trace": trace, "concurrency": 2},
        "server": {"kv_pool_tokens": 22, "init_new_token_ratio": 0.0, "retraction": policy, "admission": "v0.5.4",
                   "settings": ["overlap", "normal"]}})


def test_v0522_skips_the_step_instead_of_retracting(write_trace):
    x = sim.simulate(_three_requests(write_trace, "v0.5.22"), "overlap").summary()
    # B is left out of the batch after its last (finishes by length); C alone still needs a slot
    # that is not free while B's result is in flight: the step is skipped, nobody retracted
    assert (x["completed"], x["skipped_decodes"], x["retractions"], x["outcome"]) == (3, 1, 0, "ok")
    assert x["peak_token_usage"] == 1.0


def test_v0510_retracts_the_request_that_was_not_finishing(write_trace):
    res = sim.simulate(_three_requests(write_trace, "v0.5.10"), "overlap")
    x = res.summary()
    # B (overshoot) and C need 2 slots, none free: C has the shorter output and is retracted,
    # then prefilled again with its input and its 4 committed output tokens = 9 tokens
    assert (x["completed"], x["retractions"], x["reprefill_tokens"]) == (3, 1, 9)
    assert list(res.requests["retractions"]) == [0, 0, 1]
    assert list(res.requests["output_tokens"]) == [3, 10, 5]  # C's client still gets 5 tokens


def test_naive_overlap_fails_allocation(write_trace):
    x = sim.simulate(_three_requests(write_trace, "naive"), "overlap").summary()
    # both members of the batch are in the in-flight batch: nothing to retract, 2 needed, 0 free
    assert x["outcome"] == "server_died" and x["outcome_token_usage"] == 1.0
    assert "needs 2 page(s) for the 2 request(s)" in x["outcome_reason"]


@pytest.mark.parametrize("policy", ["naive", "v0.5.10", "v0.5.22"])
def test_normal_loop_needs_no_retraction_here(write_trace, policy):
    # B's last batch is processed (its KV freed) before C's next batch is checked
    x = sim.simulate(_three_requests(write_trace, policy), "normal").summary()
    assert (x["completed"], x["retractions"], x["skipped_decodes"]) == (3, 0, 0)


# --- the shipped scenario ---------------------------------------------------------------------
# 34 pages of 64 tokens; 8 identical requests per round hold 64 + 192 = 256 private tokens
# (4 pages) each when they finish together, 32 pages in all, and the overshoot token of each
# starts a new page: 8 pages needed, 2 free, token usage 32/34.

def test_kv_pressure_naive_overlap_dies_at_094():
    s = sim.load_scenario(SCENARIOS / "kv-pressure.yaml")
    assert (s.server.kv_pool_tokens, s.server.page_size) == (2176, 64)  # from launch_args
    x = sim.simulate(s, "overlap").summary()
    assert x["outcome"] == "server_died"
    assert x["outcome_token_usage"] == pytest.approx(32 / 34)
    assert "needs 8 page(s) for the 8 request(s)" in x["outcome_reason"]
    assert (x["completed"], x["cut_off"], x["could_not_connect"]) == (0, 8, 56)
    n = sim.simulate(s, "normal").summary()
    assert (n["outcome"], n["completed"], n["retractions"]) == ("ok", 64, 0)
    assert n["peak_token_usage"] == pytest.approx(32 / 34)


def test_kv_pressure_v0522_survives_and_v0510_retracts():
    s = sim.load_scenario(SCENARIOS / "kv-pressure.yaml", ["server.retraction=v0.5.22"])
    x = sim.simulate(s, "overlap").summary()
    # all 8 finish by length in the in-flight batch: left out, no decode batch, nothing to check
    assert (x["outcome"], x["completed"], x["retractions"], x["skipped_decodes"]) == ("ok", 64, 0, 0)
    one_round = sim.load_scenario(SCENARIOS / "kv-pressure.yaml",
                                  ["server.retraction=v0.5.10", "workload.num_requests=8"])
    x = sim.simulate(one_round, "overlap").summary()
    # need 8, free 2: retract one (need 7, free 6), a second (need 6, free 10): 2 retracted,
    # each prefilled again: 512 input + 192 committed output - 448 cached = 256 tokens
    assert (x["completed"], x["retractions"], x["reprefill_tokens"]) == (8, 2, 512)


# --- invariants ---------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(page=st.sampled_from([1, 4, 16]), pages=st.integers(8, 64), conc=st.integers(1, 6),
       inp=st.integers(1, 60), out=st.integers(1, 60), policy=st.sampled_from(["naive", "v0.5.10", "v0.5.22"]),
       setting=st.sampled_from(["normal", "overlap", "overlap_mlx", "thread_overlap"]),
       finish=st.sampled_from(["length", "eos"]), seed=st.integers(0, 3))
def test_every_request_is_accounted_for_and_the_pool_never_overflows(page, pages, conc, inp, out, policy,
                                                                     setting, finish, seed):
    s = sim.load_scenario({
        "name": "h", "seed": seed,
        "workload": {"concurrency": conc, "num_requests": 12, "input_len": {"dist": "uniform", "low": 1, "high": inp},
                     "output_len": {"dist": "uniform", "low": 1, "high": out}, "finish": finish},
        "server": {"kv_pool_tokens": pages * page, "page_size": page, "retraction": policy,
                   "chunked_prefill_size": 16, "init_new_token_ratio": 0.3}})
    res = sim.simulate(s, setting)
    req = res.requests
    assert len(req) == 12 and set(req["status"]) <= {"completed", "failed"}
    assert set(req["failure"]) <= {"", "cut_off", "could_not_connect", "aborted", "too_long"}
    assert (res.steps["kv_used"] <= pages * page).all()
    done = req[req["status"] == "completed"]
    assert (done["output_tokens"] == done["output_len"]).all()
    if res.outcome["status"] == "ok":
        assert not (req["failure"].isin(["cut_off", "could_not_connect"])).any()


def test_cli_run_reports_the_failure_as_an_outcome(tmp_path, capsys):
    import json

    from sim.cli import main

    # exit status 3: a setting's server died (the results are written, stderr says which in one line)
    assert main(["run", str(SCENARIOS / "kv-pressure.yaml"), "--out", str(tmp_path), "--no-plots", "--json"]) == 3
    text = capsys.readouterr()
    out = json.loads(text.out)
    err = text.err.strip().splitlines()
    assert len(err) == 1 and "overlap: the server died" in err[0] and "normal" not in err[0]
    assert out["settings"]["overlap"]["outcome"] == "server_died"
    assert out["settings"]["normal"]["outcome"] == "ok"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["settings"]["overlap"]["could_not_connect"] == 56
    # the verdict says why the server died and, on inline costs, that no device was measured
    line = out["verdict"]["line"]
    assert "with overlap the server died or all its measured requests failed in this prediction (KV allocation " \
           "failed: decode batch needs" in line
    assert line.endswith("; on the scenario's inline cost terms (placeholders: no device was measured)")


@pytest.mark.parametrize("context, truncate, outcome", [
    (None, False, (14, 0, 14 * 128, 14 * 32)),  # no bound: as asked
    (160, False, (14, 0, 14 * 128, 14 * 30)),  # max_req_len 159: max_new cut to 159 - 128 - 1 = 30
    (158, False, (0, 14, 0, 0)),  # 128 + 32 > 158: the tokenizer manager's error answer (too_long)
    (100, True, (14, 0, 14 * 94, 14 * 1)),  # cut to 100, then to max_req_input_len 94; 0 new tokens priced as 1
])
def test_context_length_as_sglang_applies_it(context, truncate, outcome):
    """``server.context_length`` (``--context-length``), closed forms of SGLang 0.5.23's checks:
    (completed, too_long, input tokens, output tokens) of the 14 measured requests of 128 + 32."""
    spec = {"name": "ctx", "workload": {"arrival": "closed_loop", "concurrency": 4, "num_requests": 16,
                                        "warmup_requests": 2, "input_len": 128, "output_len": 32},
            "server": {"settings": ["overlap"], "context_length": context, "allow_auto_truncate": truncate},
            "costs": {"noise": {"gpu_cv": 0.0, "cpu_cv": 0.0}}}
    s = sim.simulate(sim.load_scenario(spec), "overlap").summary()
    assert (s["completed"], s["too_long"], s["total_input_tokens"], s["total_output_tokens"]) == outcome


def test_context_length_is_read_from_the_launch_command():
    scenario = sim.load_scenario({"name": "ctx", "server": {"launch_args": [
        "--model-path", "m", "--context-length", "4096", "--allow-auto-truncate"]}})
    assert scenario.server.context_length == 4096 and scenario.server.allow_auto_truncate


def test_context_length_weighs_the_cap_the_client_sends():
    """An EOS request whose client sends no max_new_tokens is not refused by the tokenizer
    manager's total check (SGLang checks only a sent cap); one that sends 101 on a 100-token
    prompt is, at a context of 200, and the run's warning names max_new_tokens."""
    from sim.output.report import load_warnings

    base = {"name": "ctx", "workload": {"concurrency": 4, "num_requests": 16, "input_len": 100, "output_len": 50,
                                        "finish": "eos"},
            "server": {"settings": ["overlap"], "context_length": 1000}, "costs": {"noise": {"gpu_cv": 0.0}}}
    assert sim.simulate(sim.load_scenario(base), "overlap").summary()["completed"] == 16
    capped = sim.load_scenario(base, ["workload.finish=length", "workload.max_new_tokens=101",
                                      "server.context_length=200"])
    assert sim.simulate(capped, "overlap").summary()["too_long"] == 16
    assert any("input_len + max_new_tokens reach 201" in w for w in load_warnings(capped))


def test_the_table_says_a_dead_servers_values_are_until_it_died():
    from rich.console import Console

    from sim.output.report import print_table

    import sim

    run = sim.simulate(sim.load_scenario(SCENARIOS / "kv-pressure.yaml"), "normal", tables="none").summary()
    alive = {**run, "outcome": "ok"}
    dead = {**run, "outcome": "server_died", "outcome_time_s": 0.8, "outcome_reason": "KV allocation failed"}
    console = Console(record=True, width=200)
    print_table("t", {"overlap": dead, "normal": alive}, console=console)
    assert "overlap: values until its server died" in console.export_text()
    console = Console(record=True, width=200)
    print_table("t", {"overlap": alive, "normal": alive}, console=console)
    assert "values until" not in console.export_text()
