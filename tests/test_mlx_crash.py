"""The MLX crash path: event_loop_normal on MLX at v0.5.22 dies on the first batch of two or
more requests (the seed document's run), and the warm-up-first closed loop that reproduces it."""

from __future__ import annotations

import pytest

import sim
from sim.model.workload import ClosedLoopClients
from tests.conftest import SCENARIOS


def test_seed_document_run_every_benchmark_request_fails():
    s = sim.load_scenario(SCENARIOS / "mlx-disable-overlap.yaml")
    assert s.server.settings == ["normal"]  # chosen by --disable-overlap-schedule on MLX
    res = sim.simulate(s, "normal")
    x = res.summary()
    assert x["outcome"] == "server_died" and "mlx_normal_futuremap_device_mismatch" in x["outcome_reason"]
    assert (x["completed"], x["failed"], x["cut_off"], x["could_not_connect"]) == (0, 32, 8, 24)
    warm = res.requests[res.requests["warmup"]]
    assert list(warm["status"]) == ["completed"] and list(warm["output_tokens"]) == [256]
    # the 8 benchmark requests arrive when the warm-up finishes, go into one prefill batch,
    # and the server dies when that batch's result is relayed: after recv (2e-5 + 8 x 1e-5),
    # schedule (1.5e-4 + 8 x 4e-6), launch (3e-4) and the prefill forward (2e-3 + 8 x 1e-6)
    t_warm = float(warm["finish_s"].iloc[0])
    assert x["outcome_time_s"] == pytest.approx(t_warm + 1e-4 + 1.82e-4 + 3e-4 + 2.008e-3, abs=1e-9)
    bench = res.requests[~res.requests["warmup"]]
    assert (bench["arrival_s"].iloc[:8] == t_warm).all()
    assert bench["first_token_s"].isna().all()


def test_release_without_the_fault_and_the_default_mlx_loop_serve_everything():
    s = sim.load_scenario(SCENARIOS / "mlx-disable-overlap.yaml", ["server.version=0.5.10"])
    assert sim.simulate(s, "normal").summary()["completed"] == 32
    s = sim.load_scenario(SCENARIOS / "mlx-disable-overlap.yaml", ["server.settings=[overlap_mlx,normal]"])
    assert sim.simulate(s, "overlap_mlx").summary()["completed"] == 32
    s = sim.load_scenario(SCENARIOS / "mlx-disable-overlap.yaml", ["server.device=cuda", "server.launch_args=null",
                                                                  "server.settings=[normal]"])
    assert sim.simulate(s, "normal").summary()["completed"] == 32


def test_single_request_batches_do_not_trigger_the_fault():
    s = sim.load_scenario({"name": "one", "workload": {"concurrency": 1, "num_requests": 3, "output_len": 4},
                           "server": {"device": "mlx", "settings": ["normal"]}})
    x = sim.simulate(s, "normal").summary()
    assert (x["outcome"], x["completed"]) == ("ok", 3)


def test_warmup_first_clients_start_the_benchmark_after_the_warmups():
    sent = []
    clients = ClosedLoopClients(6, 3, lambda rid, t: sent.append((rid, t)), warmup_first=2)
    clients.start()
    assert sent == [(0, 0.0), (1, 0.0)]
    clients.on_finish(0, 1.0)
    assert sent[-1] == (1, 0.0)  # still waiting for warm-up 1
    clients.on_finish(1, 2.0)
    assert sent[2:] == [(2, 2.0), (3, 2.0), (4, 2.0)]  # concurrency 3
    clients.on_finish(3, 3.0)
    assert sent[-1] == (5, 3.0)


def test_a_dead_servers_run_has_no_ratio_to_the_other_setting():
    """The seed document's MLX scenario under both loops: the normal server dies, so the run's
    ratios (``summary.json``, ``--json``) are all None, not a ratio of a dead server's duration or
    counts to the served loop's."""
    from sim.output.report import ratios
    from sim.trace.metrics import served

    s = sim.load_scenario(SCENARIOS / "mlx-disable-overlap.yaml", ["server.settings=[overlap_mlx,normal]"])
    summaries = {setting: sim.simulate(s, setting, tables="none").summary() for setting in s.server.settings}
    assert served(summaries["overlap_mlx"]) and not served(summaries["normal"])
    row = ratios(summaries)["overlap_mlx/normal"]
    assert row and set(row.values()) == {None}
    both = dict(summaries)
    both["normal"] = summaries["overlap_mlx"]  # two served runs: numbers again
    assert ratios(both)["overlap_mlx/normal"]["output_throughput"] == 1.0


@pytest.mark.parametrize("arrival", ["closed_loop", "poisson"])
def test_the_fault_on_a_prefill_whose_requests_all_finish_there_fails_them(arrival):
    """One-token outputs under the MLX normal loop at v0.5.22: the batch of two that kills the
    server is a prefill whose requests finish at it (not merged into the running batch yet); they
    fail with the rest (found by a generated family: the run stalled, those requests held by no
    queue the failure walked)."""
    raw = {"name": "one-token", "workload": {"arrival": arrival, "concurrency": 2, "rate_per_s": 1000.0,
                                             "num_requests": 3, "input_len": 8, "output_len": 1, "finish": "length"},
           "server": {"device": "mlx", "version": "0.5.22", "settings": ["normal"]}}
    if arrival == "poisson":
        del raw["workload"]["concurrency"]
    else:
        del raw["workload"]["rate_per_s"]
    for leap in (True, False):
        x = sim.simulate(sim.load_scenario(raw), "normal", tables="none", leap=leap).summary()
        assert x["outcome"] == "server_died" and x["completed"] + x["failed"] == 3
