"""Sweeps: grid parsing, closed-form results per point, seeds of repeats, resuming, executors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import sim
from sim.cli import main
from sim.errors import ScenarioError, UserInputError
from sim.whatif.sweeps import load_sweep, parse_grid, plan_sweep, sweep
from tests.helpers import verdict_of

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"

# constant costs: a decode step of the normal loop is 1 ms of CPU + 4 ms x gpu.scale of device
CLOSED = {
    "name": "closed-form", "seed": 3,
    "workload": {"concurrency": 1, "num_requests": 4, "input_len": 8, "cached_len": 0, "output_len": 20},
    "costs": {"gpu": {"decode": {"base": 0.004}, "prefill": {"base": 0.002}, "overlap_residue": 0.0},
              "cpu": {"recv": {"base": 1e-4}, "schedule": {"base": 2e-4}, "launch": {"base": 3e-4},
                      "process": {"base": 4e-4}}},
}
NOISY = {**CLOSED, "name": "noisy",
         "workload": {**CLOSED["workload"], "output_len": {"dist": "uniform", "low": 5, "high": 30}},
         "costs": {**CLOSED["costs"], "noise": {"gpu_cv": 0.2, "cpu_cv": 0.2}}}


def test_parse_grid_reads_yaml_values_in_order():
    grid = parse_grid(["workload.concurrency=1,2,4", "costs.cpu.scale=0.5, 2", "server.settings=[overlap],[normal]"])
    assert list(grid) == ["workload.concurrency", "costs.cpu.scale", "server.settings"]
    assert grid["workload.concurrency"] == [1, 2, 4]
    assert grid["costs.cpu.scale"] == [0.5, 2]
    assert grid["server.settings"] == [["overlap"], ["normal"]]


@pytest.mark.parametrize("items", [["workload.concurrency"], ["=1,2"], ["workload.concurrency="],
                                   ["workload.concurrency=1", "workload.concurrency=2"]])
def test_parse_grid_rejects_bad_items(items):
    with pytest.raises(UserInputError):
        parse_grid(items)


def test_unknown_grid_key_names_the_key():
    with pytest.raises(ScenarioError) as err:
        plan_sweep(sim.load_scenario(CLOSED), {"workload.concurency": [1, 2]})
    assert "workload.concurency" in str(err.value) and "unknown key" in str(err.value)
    # the flag as given, every value: the key is wrong at every point, not at the first
    assert str(err.value).startswith("--grid workload.concurency=1,2: ")
    with pytest.raises(ScenarioError) as err:
        plan_sweep(sim.load_scenario(CLOSED), {"server.setings": [["overlap"], ["normal"]]})
    assert str(err.value).startswith("--grid server.setings=[overlap],[normal]: ")


def test_sweep_matches_closed_form_per_point():
    table = sweep(CLOSED, {"costs.gpu.scale": [0.5, 1, 2]}, workers=1)
    assert len(table) == 3 * 2
    for row in table.to_dict("records"):
        gpu_ms = 4.0 * row["costs.gpu.scale"]
        expected = gpu_ms + 1.0 if row["setting"] == "normal" else max(gpu_ms, 1.0)
        assert row["median_itl_ms"] == pytest.approx(expected, rel=1e-9)
        assert row["median_gap_ms"] == pytest.approx(1.0 if row["setting"] == "normal" else 0.0, abs=1e-9)


def test_repeats_use_consecutive_seeds_and_equal_direct_simulation():
    table = sweep(NOISY, {"workload.concurrency": [1, 2]}, repeats=3, workers=1)
    assert len(table) == 2 * 3 * 2
    assert sorted(table["seed"].unique()) == [3, 4, 5]
    for row in table.to_dict("records"):
        scen = sim.load_scenario(NOISY, [f"workload.concurrency={row['workload.concurrency']}", f"seed={row['seed']}"])
        direct = sim.simulate(scen, row["setting"]).summary()
        assert row["output_throughput"] == pytest.approx(direct["output_throughput"], rel=1e-12)
        assert row["repeat"] == row["seed"] - 3
    # different seeds give different runs (noise and lengths are drawn from the seed)
    assert table.groupby(["point", "setting"])["output_throughput"].nunique().min() == 3


def test_table_columns_and_files(tmp_path):
    table = sweep(NOISY, {"costs.cpu.scale": [1, 2]}, repeats=2, out=tmp_path, workers=1)
    cols = list(table.columns)
    assert cols[:6] == ["point", "costs.cpu.scale", "setting", "repeat", "seed", "completed"]
    for key in sim.trace.metrics.SUMMARY_KEYS + ["peak_token_usage", "outcome"]:
        assert key in cols
    from_parquet, manifest = load_sweep(tmp_path)
    pd.testing.assert_frame_equal(from_parquet, table)
    from_csv = pd.read_csv(tmp_path / "sweep.csv")
    pd.testing.assert_frame_equal(from_csv, table, check_dtype=False)
    assert manifest["grid"] == {"costs.cpu.scale": [1, 2]} and manifest["repeats"] == 2


def test_resume_skips_saved_points_and_grows_the_grid(tmp_path):
    first = sweep(NOISY, {"costs.cpu.scale": [1, 2]}, repeats=2, out=tmp_path, workers=1)
    saved = sorted((tmp_path / "points").glob("*.json"))
    assert len(saved) == 4
    saved[0].unlink()  # as if the sweep had been killed before that point finished
    progress = []
    again = sweep(NOISY, {"costs.cpu.scale": [1, 2]}, repeats=2, out=tmp_path, workers=1,
                  on_progress=lambda done, total: progress.append((done, total)))
    assert progress[0] == (3, 4) and progress[-1] == (4, 4)
    pd.testing.assert_frame_equal(again, first)
    # a bigger grid reuses the four saved points and keeps them
    progress.clear()
    grown = sweep(NOISY, {"costs.cpu.scale": [1, 2, 4]}, repeats=2, out=tmp_path, workers=1,
                  on_progress=lambda done, total: progress.append((done, total)))
    assert progress[0] == (4, 6)
    assert len(list((tmp_path / "points").glob("*.json"))) == 6
    pd.testing.assert_frame_equal(grown[grown["costs.cpu.scale"] != 4].reset_index(drop=True), first)


def test_a_file_changed_in_place_is_run_again_on_resume(tmp_path):
    """A resumed sweep reuses a saved point only if the profile and trace it reads are the ones it
    was run with: a trace edited in place (the same path) runs the points again."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": 0.0, "input_len": 8, "output_len": 20}) + "\n" for _ in range(4)))
    spec = {**CLOSED, "workload": {**CLOSED["workload"], "trace": str(trace)}}
    del spec["workload"]["output_len"], spec["workload"]["input_len"]
    out = tmp_path / "sweep"
    first = sweep(spec, {"costs.cpu.scale": [1, 2]}, out=out, workers=1)
    progress = []
    sweep(spec, {"costs.cpu.scale": [1, 2]}, out=out, workers=1, on_progress=lambda d, t: progress.append(d))
    assert progress[0] == 2  # unchanged: both points taken from the store
    trace.write_text("".join(json.dumps({"arrival_s": 0.0, "input_len": 8, "output_len": 40}) + "\n" for _ in range(4)))
    progress.clear()
    again = sweep(spec, {"costs.cpu.scale": [1, 2]}, out=out, workers=1, on_progress=lambda d, t: progress.append(d))
    assert progress[0] == 0  # edited: both run again
    assert (again["total_output_tokens"] == 2 * first["total_output_tokens"]).all()


def test_corrupt_point_file_is_rerun(tmp_path):
    sweep(NOISY, {"costs.cpu.scale": [1]}, out=tmp_path, workers=1)
    (path,) = (tmp_path / "points").glob("*.json")
    path.write_text('{"summaries": ')
    progress = []
    sweep(NOISY, {"costs.cpu.scale": [1]}, out=tmp_path, workers=1, on_progress=lambda d, t: progress.append(d))
    assert progress[0] == 0
    assert "overlap" in json.loads(path.read_text())["summaries"]
    # valid JSON of the wrong shape (a file edited by hand) is rerun too, not a traceback
    for summaries in ("x", {"overlap": "x"}, {"overlap": {"output_throughput": "abc"}}, {"overlap": {"x": [1]}}, {}):
        saved = json.loads(path.read_text())
        path.write_text(json.dumps({**saved, "summaries": summaries}))
        progress.clear()
        sweep(NOISY, {"costs.cpu.scale": [1]}, out=tmp_path, workers=1, on_progress=lambda d, t: progress.append(d))
        assert progress[0] == 0, summaries
        assert isinstance(json.loads(path.read_text())["summaries"]["overlap"]["output_throughput"], float)


def test_local_process_pool_equals_in_process():
    grid = {"workload.concurrency": [1, 2], "costs.gpu.scale": [1, 3]}
    serial = sweep(NOISY, grid, repeats=2, workers=1)
    pooled = sweep(NOISY, grid, repeats=2, workers=2)
    pd.testing.assert_frame_equal(pooled, serial)


def test_dask_executor_equals_local(tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    grid = {"workload.concurrency": [1, 2], "costs.cpu.scale": [0.5, 2]}
    local = sweep(NOISY, grid, repeats=2, workers=1)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client:
            via_client = sweep(NOISY, grid, repeats=2, executor="dask", client=client, out=tmp_path / "a")
        # the CLI path: connect to a scheduler by address
        via_address = sweep(NOISY, grid, repeats=2, executor="dask", scheduler=cluster.scheduler_address)
    pd.testing.assert_frame_equal(via_client, local)
    pd.testing.assert_frame_equal(via_address, local)
    assert len(list((tmp_path / "a" / "points").glob("*.json"))) == 8


def test_cli_sweep_writes_table_and_plots(tmp_path, capsys):
    out = tmp_path / "sw"
    rc = main(["sweep", str(QUICKSTART), "--grid", "costs.cpu.scale=0.5,2", "--grid", "costs.gpu.scale=0.5,1",
               "--set", "workload.num_requests=12", "--set", "workload.output_len=16", "--set", "workload.warmup_requests=0",
               "--repeats", "2", "--workers", "1", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "overlap/normal" in text and "16 rows written" in text
    spread = pd.read_csv(out / "spread.csv")
    assert {"output_throughput_cv", "mean_gap_ms_std", "n"} <= set(spread.columns) and (spread["n"] == 2).all()
    ci = pd.read_csv(out / "ratio_ci.csv")
    assert set(ci["metric"]) >= {"output_throughput", "median_ttft_ms", "mean_gap_ms"} and len(ci) % 4 == 0
    for name in ("sweep.parquet", "sweep.csv", "sweep.json", "ratio_heatmap.png", "ratio_ci.png",
                 "sweep_costs.cpu.scale.png", "sweep_costs.gpu.scale.png"):
        assert (out / name).is_file(), name
    assert (out / "ratio_heatmap.png").read_bytes()[:4] == b"\x89PNG"
    # `plots` redraws them from the saved table alone
    for png in out.glob("*.png"):
        png.unlink()
    assert main(["plots", str(out)]) == 0
    assert sorted(p.name for p in out.glob("*.png")) == ["ratio_ci.png", "ratio_heatmap.png",
                                                         "sweep_costs.cpu.scale.png", "sweep_costs.gpu.scale.png"]


def test_a_sweep_warns_at_a_point_what_a_run_of_it_would(tmp_path, capsys):
    out = tmp_path / "sw"
    rc = main(["sweep", str(QUICKSTART), "--grid", "workload.concurrency=2,16", "--set", "workload.num_requests=12",
               "--set", "workload.output_len=8", "--set", "workload.warmup_requests=0", "--workers", "1",
               "--run-cv", "0.05", "--no-plots", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    text = " ".join(printed.split())
    assert "at workload.concurrency=16: warning: workload.concurrency 16 exceeds workload.num_requests 12" in text
    assert "workload.concurrency=2: warning" not in text
    assert "; at workload.concurrency=16 the load is answered approximately (the warning above)" in verdict_of(printed)
    # the plots drawn again from the folder take the verdict's CV (--run-cv, kept in the manifest)
    from sim.whatif.sweeps import manifest_run_cv

    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["run_cv"] == 0.05 and manifest_run_cv(manifest) == 0.05
    assert manifest_run_cv({**manifest, "run_cv": None}) == 0.02  # the quickstart states no run-level noise
    assert manifest_run_cv({"scenario_config": {"costs": {"noise": {"run_gpu_cv": 0.03, "run_cpu_cv": 0.04}}}}) \
        == pytest.approx(0.05)  # the scenario's: sqrt(0.03² + 0.04²)
    assert manifest_run_cv({"scenario_config": "bad", "run_cv": "x"}) == 0.02


@pytest.mark.parametrize("args, needle", [
    (["--grid", "workload.nope=1,2"], "workload.nope"),
    (["--grid", "workload.concurrency=0,1"], "workload.concurrency"),
    (["--grid", "workload.concurrency"], "KEY.PATH="),
    (["--grid", "workload.concurrency=1", "--repeats", "0"], "repeats"),
    (["--grid", "workload.concurrency=1", "--scheduler", "tcp://127.0.0.1:1"], "--executor dask"),
    (["--grid", "workload.concurrency=1", "--executor", "dask", "--scheduler", "notaurl"], "--scheduler"),
    # combinations the runs check against the profile before their first step: refused before any point runs
    (["--grid", "server.tp_size=1,2"], "--grid server.tp_size=1,2 (at 2): server.tp_size"),
    (["--grid", "costs.profile=null"], "null is not a value a grid can take"),
    (["--grid", "server.structured_output.share=0,1"], "--grid server.structured_output.share=0,1 (at 1)"),
    (["--grid", "workload.concurrency=1,x"], "--grid workload.concurrency=1,x (at x): workload.concurrency"),
])
def test_cli_sweep_bad_input_exits_2(tmp_path, capsys, args, needle):
    rc = main(["sweep", str(QUICKSTART), "--out", str(tmp_path / "x"), *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err and err.startswith("overlap-sim: error:") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").rglob("*.json"))  # no point ran


def test_killed_sweep_loses_nothing_and_resumes(tmp_path):
    """Kill a running `overlap-sim sweep` with SIGKILL, then run it again."""
    out = tmp_path / "killed"
    args = [sys.executable, "-m", "sim.cli", "sweep", str(QUICKSTART), "--grid", "workload.concurrency=1,2,3,4,5,6,7,8",
            "--grid", "costs.cpu.scale=1,2", "--set", "workload.num_requests=48", "--workers", "1",
            "--no-plots", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    def finished():  # a killed write leaves its hidden temporary file (.NAME.XXXX.tmp.json): not a result
        return [p for p in (out / "points").glob("*.json") if not p.name.startswith(".")]

    while time.time() < deadline and len(finished()) < 3 and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = {p.name: p.read_text() for p in finished()}
    assert len(saved) >= 3
    for text in saved.values():  # atomic writes: every file there is complete
        assert "overlap" in json.loads(text)["summaries"]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    if len(saved) < 16:
        assert f"resuming: {len(saved)} of 16" in done.stderr
    for name, text in saved.items():  # not recomputed, not lost
        assert (out / "points" / name).read_text() == text
    fresh = sweep(QUICKSTART, {"workload.concurrency": list(range(1, 9)), "costs.cpu.scale": [1, 2]},
                  overrides=["workload.num_requests=48"], workers=1)
    pd.testing.assert_frame_equal(load_sweep(out)[0], fresh)


def _group_size(pgid: int) -> int:
    """How many processes of the process group ``pgid`` run (Linux's /proc)."""
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path("/proc", entry, "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
                n += 1
    return n


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process group from Linux's /proc")
@pytest.mark.parametrize("when", [2, 4])
def test_ctrl_c_on_a_sweep_with_workers_is_one_line_and_stops_them(tmp_path, when):
    """Ctrl-C reaches the whole process group, as the fork server starts (``when`` 2 processes in
    the group: it imports the simulator) or while two workers run (4): the sweep's process answers
    it (one line, exit 130) and stops its workers; the workers and the fork server print nothing
    and are gone."""
    out = tmp_path / "sw"
    args = [sys.executable, "-m", "sim.cli", "sweep", str(QUICKSTART), "--grid", "workload.concurrency=1,2,4,8",
            "--set", "workload.num_requests=3000", "--no-leap", "--workers", "2", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 120
    while _group_size(proc.pid) < when and time.time() < deadline:  # the sweep, the fork server, two workers
        time.sleep(0.01)
    time.sleep(0.5 if when == 4 else 0.0)
    os.killpg(proc.pid, signal.SIGINT)
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 130
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith("sweep")]
    assert lines == ["overlap-sim: interrupted"], err
    deadline = time.time() + 30
    while time.time() < deadline:  # no process of the group left (workers, fork server)
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("a worker or the fork server outlived the interrupted sweep")


def test_a_grid_over_seed_keeps_the_point_seed_and_each_runs_seed(tmp_path, capsys):
    # the documented use `--grid seed=0,1`: the grid's column is point_seed, seed is each run's
    table = sweep(NOISY, {"seed": [0, 10]}, repeats=2, workers=1)
    assert list(table.columns[:5]) == ["point", "point_seed", "setting", "repeat", "seed"]
    assert sorted(set(zip(table["point_seed"], table["seed"]))) == [(0, 0), (0, 1), (10, 10), (10, 11)]
    from sim.whatif.variance import ratio_ci, spread
    assert len(ratio_ci(table)) == 2 and set(spread(table)["n"]) == {2}
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(NOISY))
    assert main(["sweep", str(path), "--grid", "seed=0,1", "--repeats", "2", "--workers", "1", "--no-plots",
                 "--out", str(tmp_path / "sw")]) == 0
    assert "point_seed" in capsys.readouterr().out
    assert main(["plots", str(tmp_path / "sw")]) == 0


@pytest.mark.parametrize("kwargs, word", [
    ({"grid": [1]}, "grid"), ({"grid": {"workload.concurrency": "12"}}, "grid"), ({"grid": {"k": []}}, "grid"),
    ({"grid": {"workload.concurrency": [1]}, "repeats": "3"}, "--repeats"),
    ({"grid": {"workload.concurrency": [1]}, "workers": 0}, "--workers"),
    ({"grid": {"workload.concurrency": [1]}, "on_progress": 5}, "on_progress"),
])
def test_the_python_sweeps_arguments_of_the_wrong_type_name_themselves(kwargs, word):
    with pytest.raises(UserInputError) as err:
        sweep(QUICKSTART, **kwargs)
    assert str(err.value).startswith(word)


def test_the_python_apis_wrong_types_name_what_is_wrong():
    with pytest.raises(ScenarioError, match="a YAML file's path"):
        sim.load_scenario(42)
    with pytest.raises(ScenarioError, match="overrides"):
        sim.load_scenario(QUICKSTART, overrides="workload.concurrency=4")  # a string, not a list of them
    with pytest.raises(ValueError, match="setting"):
        sim.simulate(QUICKSTART, ["overlap"])
    with pytest.raises(ValueError, match="leap"):
        sim.simulate(QUICKSTART, "overlap", leap="no")
    # an iterator of overrides is read once (it was used up by the type check and dropped)
    assert sim.load_scenario(QUICKSTART, iter(["workload.concurrency=1"])).workload.concurrency == 1
    # sweep from Python refuses what the command line refuses
    for kwargs, words in (({"grid": {"workload.concurrency": [8, 8]}}, "given twice"),
                          ({"grid": {"workload.concurrency": [8]}, "out": 5}, "--out"),
                          ({"grid": {"workload.concurrency": [8]}, "scheduler": "tcp://h:1"}, "executor")):
        with pytest.raises(UserInputError, match=words):
            sweep(QUICKSTART, **kwargs)


def test_a_sweep_refuses_outputs_it_cannot_write_before_its_points_run(tmp_path, capsys):
    """sweep.json (or a point's file) that is a folder: one line naming it, exit 2, before any
    point runs (it failed after its work, after the progress bar)."""
    out = tmp_path / "sw"
    (out / "sweep.json").mkdir(parents=True)
    rc = main(["sweep", str(QUICKSTART), "--grid", "workload.concurrency=1,2", "--set", "workload.num_requests=16",
               "--no-plots", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "sweep.json: a folder where the sweep writes a file" in err and len(err.strip().splitlines()) == 1
    assert not (out / "points").exists()


def test_a_point_where_a_setting_dies_shows_no_ratio(tmp_path, capsys):
    """kv-pressure's overlap server dies at 12 clients and 128 output tokens: the table's cells say
    which setting failed (no 0.0, no 0 or NaN ratio, no CV of a zero), nothing warns of a log of
    0, ratio_ci.csv has no ratio of any metric there, the plots' title counts the paired runs
    with no ratio instead of a 0.00x, and the heatmap and the interval plot mark the point failed;
    repeats that are identical (no run-to-run noise) are said to be."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    from sim.whatif.plots import ratio_ci_plot, ratio_heatmap, sweep_lines
    from sim.whatif.variance import failed_settings

    out = tmp_path / "s"
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # (pandas' "divide by zero encountered in log")
        rc = main(["sweep", str(ROOT / "scenarios" / "kv-pressure.yaml"), "--grid", "workload.concurrency=4,12",
                   "--grid", "workload.output_len=64,128", "--set", "workload.num_requests=20", "--repeats", "2",
                   "--workers", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    table, _ = load_sweep(out)
    failed = failed_settings(table, ("overlap", "normal"))
    assert failed and all(v == ["overlap"] for v in failed.values())
    assert "overlap failed" in printed and "nan" not in printed
    assert "the repeats are identical" in printed  # (kv-pressure has no run-to-run noise)
    ci = pd.read_csv(out / "ratio_ci.csv")  # every metric's ratio: none at the failed point
    assert ci[ci["point"].isin(failed)][["ratio", "ci_low", "ci_high"]].isna().all().all()
    assert ci[~ci["point"].isin(failed) & (ci["metric"] == "output_throughput")]["ratio"].notna().all()
    named = ci.assign(failed=ci["failed_settings"].fillna(""))  # the failed setting named where the ratios are missing
    assert (named[named["point"].isin(failed)]["failed"] == "overlap").all()
    assert (named[~named["point"].isin(failed)]["failed"] == "").all()
    spread_rows = pd.read_csv(out / "spread.csv")  # the dead server's runs counted as failed
    assert (spread_rows[spread_rows["point"].isin(failed) & (spread_rows["setting"] == "overlap")]["failed_runs"] == 2).all()
    assert (spread_rows[spread_rows["setting"] == "normal"]["failed_runs"] == 0).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        fig = sweep_lines(table, "workload.concurrency", "kv")
        assert "no ratio in" in fig._suptitle.get_text() and "0.00x" not in fig._suptitle.get_text()
        heat = ratio_heatmap(table, "workload.concurrency", "workload.output_len", "kv")
        assert sum(t.get_text() == "failed" for t in heat.axes[0].texts) == len(failed)
        ci = ratio_ci_plot(table, "kv")
        assert sum("overlap\nfailed" == t.get_text() for t in ci.axes[0].texts) == len(failed)
