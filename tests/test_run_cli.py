"""`overlap-sim run` end to end on the shipped quickstart scenario."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from sim.cli import main
from sim.trace.metrics import SUMMARY_KEYS
from tests.helpers import unwrapped

QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"


def test_run_writes_results_and_json(tmp_path, capsys):
    out = tmp_path / "res"
    assert main(["run", str(QUICKSTART), "--out", str(out), "--json", "--plots", "--set",
                 "workload.num_requests=24"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["scenario"] == "quickstart" and payload["seed"] == 0
    assert set(payload["settings"]) == {"overlap", "normal"}
    for summ in payload["settings"].values():
        assert set(SUMMARY_KEYS) <= set(summ)
        assert summ["completed"] == 16 and summ["failed"] == 0
    ratio = payload["ratios"]["overlap/normal"]
    assert ratio["output_throughput"] == payload["settings"]["overlap"]["output_throughput"] / \
        payload["settings"]["normal"]["output_throughput"]
    names = {p.name for p in out.iterdir()}
    for setting in ("overlap", "normal"):
        assert {f"steps_{setting}.parquet", f"requests_{setting}.parquet", f"itl_{setting}.parquet"} <= names
    assert {"summary.json", "gaps.png", "metrics.png", "timeline.png"} <= names
    assert not any(n.startswith(".") for n in names)  # no temporary files left behind
    steps = pd.read_parquet(out / "steps_overlap.parquet")
    decode = steps["kind"] == "decode"  # a graph replay starts after its launch; an eager prefill may start
    assert (steps["forward_start"][decode] >= steps["launch_end"][decode] - 1e-12).all()  # during it, ends after
    assert (steps["forward_end"] >= steps["launch_end"] - 1e-12).all()
    assert (steps["forward_start"] >= steps["launch_start"]).all()
    saved = json.loads((out / "summary.json").read_text())
    assert saved["settings"] == payload["settings"]


def test_plots_only_on_request_and_the_table_says_how(tmp_path, capsys):
    """Since 5 December 2026 a run draws no plots unless --plots (issue 31: they cost about a
    second whatever the run's length); the table's last line names the command that draws them
    from the saved tables, and that command draws the three."""
    out = tmp_path / "res"
    assert main(["run", str(QUICKSTART), "--out", str(out), "--set", "workload.num_requests=12"]) == 0
    text = capsys.readouterr().out
    assert not list(out.glob("*.png"))
    assert unwrapped(text)[-1] == (f"plots: overlap-sim plots {out}/ draws gaps.png, metrics.png and "
                                   "timeline.png from these tables (or run with --plots)")
    assert main(["plots", str(out)]) == 0
    assert {p.name for p in out.glob("*.png")} == {"gaps.png", "metrics.png", "timeline.png"}
    assert main(["run", str(QUICKSTART), "--out", str(out), "--plots", "--set", "workload.num_requests=12"]) == 0
    assert capsys.readouterr().out.rstrip().splitlines()[-1] == (
        f"plots: gaps.png, metrics.png and timeline.png drawn in {out}/")
    # --no-plots is still taken (the default), and not with --plots
    assert main(["run", str(QUICKSTART), "--out", str(out), "--no-plots", "--tables", "none", "--set",
                 "workload.num_requests=12"]) == 0
    assert "plots:" not in capsys.readouterr().out and not list(out.glob("*.png"))  # the earlier plots went
    assert main(["run", str(QUICKSTART), "--out", str(tmp_path / "x"), "--plots", "--no-plots"]) == 2
    assert "--no-plots: not allowed with argument --plots" in capsys.readouterr().err


def test_run_table_and_csv_on_request(tmp_path, capsys):
    out = tmp_path / "res"
    assert main(["run", str(QUICKSTART), "--out", str(out), "--format", "csv", "--no-plots",
                 "--set", "workload.num_requests=16"]) == 0
    text = capsys.readouterr().out
    assert "overlap/normal" in text and "output throughput" in text
    csv = pd.read_csv(out / "steps_normal.csv")
    assert csv.shape[0] > 0 and not list(out.glob("*.parquet"))
    assert not (out / "gaps.png").exists()
    # the same run's default tables (Parquet) hold the same values, bit for bit
    again = tmp_path / "again"
    assert main(["run", str(QUICKSTART), "--out", str(again), "--no-plots", "--set", "workload.num_requests=16"]) == 0
    parquet = pd.read_parquet(again / "steps_normal.parquet")
    text = [c for c in parquet if not pd.api.types.is_numeric_dtype(parquet[c])]  # kind: a category in Parquet
    pd.testing.assert_frame_equal(parquet.astype({c: object for c in text}), csv.astype({c: object for c in text}),
                                  check_exact=True, check_dtype=False)


def test_variants_get_their_own_folder_and_a_rerun_leaves_nothing_stale(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    small = ["--set", "workload.num_requests=10", "--set", "workload.warmup_requests=2"]
    assert main(["run", str(QUICKSTART), *small, "--plots"]) == 0
    variant = tmp_path / "results" / "quickstart-workload.num_requests=10,workload.warmup_requests=2"
    assert (variant / "summary.json").is_file() and (variant / "gaps.png").is_file()
    assert main(["run", str(QUICKSTART), *small, "--set", "server.settings=overlap", "--no-plots"]) == 0
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == [
        "quickstart-workload.num_requests=10,workload.warmup_requests=2",
        "quickstart-workload.num_requests=10,workload.warmup_requests=2,server.settings=overlap"]
    # the same folder again with --tables none: the earlier tables and plots are gone
    assert main(["run", str(QUICKSTART), *small, "--tables", "none", "--out", str(variant)]) == 0
    assert sorted(p.name for p in variant.iterdir()) == ["summary.json"]
    capsys.readouterr()


def test_a_profile_given_with_set_is_taken_from_the_working_directory(tmp_path, capsys, monkeypatch):
    import shutil

    shutil.copy(QUICKSTART.parent / "profiles" / "cpu-torch-small.json", tmp_path / "mine.json")
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(QUICKSTART), "--set", "costs.profile=mine.json", "--set", "workload.num_requests=10",
                 "--set", "workload.warmup_requests=2", "--json", "--no-plots", "--out", "res"]) == 0
    saved = json.loads((tmp_path / "res" / "summary.json").read_text())
    assert saved["scenario_config"]["costs"]["profile"] == str(tmp_path / "mine.json")
    capsys.readouterr()


@pytest.mark.parametrize("command", ["run {root}/scenarios/quickstart.yaml --no-plots --set workload.num_requests=16",
                                     "ask --card l4 --model llama-3.2-1b --concurrency 4 --input-len 64 --output-len 16"])
def test_a_reader_that_goes_away_ends_the_output_without_a_traceback(tmp_path, command):
    """``overlap-sim run ... | head -1``: the output is cut, the exit status is 0, stderr is empty
    (``ask``'s table went through rich's own handling, which exits with status 1)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    cmd = f"{sys.executable} -m sim.cli {command.format(root=root)} --out {tmp_path / 'out'} | head -1"
    out = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=root, capture_output=True, text=True,
                         timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert out.stdout.count("\n") == 1
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr
    assert out.returncode == 0, out.stderr


def test_the_command_lines_rich_console_hands_a_broken_pipe_to_the_command_line():
    from sim.commands import stdout_console

    console = stdout_console(80)
    with pytest.raises(BrokenPipeError):
        console.on_broken_pipe()
    assert console.quiet


def test_csv_writer_writes_to_csv_bytes(tmp_path):
    """The run's CSV writer gives the bytes of ``DataFrame.to_csv(index=False)`` for the run's
    tables and for cells that need care (NaN, quoting, bools, categories, large and small floats)."""
    import numpy as np
    import pandas as pd

    from sim.output.csv_writer import write_csv
    from sim.simulate import simulate

    res = simulate(str(Path(__file__).resolve().parents[1] / "scenarios" / "kv-pressure.yaml"), "overlap")
    odd = pd.DataFrame({"x": [1.5, np.nan, -0.0, np.inf, 1e16, 1e-5, 0.1 + 0.2], "s": ["a,b", 'q"', "", "l\nm", "z", "1", "-"],
                        "b": [True, False, True, True, False, False, True], "k": pd.Categorical(list("uvuvuvu")),
                        "i": np.arange(7, dtype=np.int64)})
    plain = pd.DataFrame({"s": ["a", "", "b c"], "x": [1.0, np.nan, 2.0]})  # text that needs no quotes
    # long columns (each distinct value converted once): values repeated within and across columns
    rng = np.random.default_rng(0)
    a = rng.choice(np.array([0.1 + 0.2, 1e-300, 5e-324, 1e300, np.inf, -np.inf, np.nan, 3.0, 1 / 3]), 3000)
    long = pd.DataFrame({"a": a, "b": np.roll(a, 1), "i": rng.integers(-5, 5, 3000), "u": np.arange(3000, dtype=np.uint64)})
    for i, frame in enumerate([res.steps, res.requests, res.itl, odd, odd.iloc[:0], plain, plain[["s"]], odd[["x"]],
                               long, long.assign(z=-0.0)]):
        want, got = tmp_path / f"want{i}.csv", tmp_path / f"got{i}.csv"
        frame.to_csv(want, index=False)
        write_csv(frame, got)
        assert got.read_bytes() == want.read_bytes(), i


def test_a_profile_of_another_kind_of_device_is_named_in_a_warning():
    from sim.output.report import device_mismatch

    cuda = {"device": "cuda", "device_name": "NVIDIA H200"}
    cpu = {"device": "cpu", "device_name": "cpu (SGLang 0.5.23 CPU engine, 1 torch thread)"}
    assert device_mismatch("cuda", cuda) is None and device_mismatch("cpu", cpu) is None
    assert device_mismatch("mlx", {"device": "gpu", "device_name": "Apple M2 (Metal)"}) is None
    assert device_mismatch("cuda", None) is None and device_mismatch("cuda", {"device": 3}) is None
    line = device_mismatch("cuda", cpu)
    assert line.startswith("warning:") and "measured on cpu" in line and "server.device is cuda" in line
    assert "NVIDIA H200" in device_mismatch("cpu", cuda)
    assert device_mismatch("cuda", {**cpu, "transfer": {"to_card": "l4"}}) is None  # moved to a card


def test_on_a_cpu_device_the_idle_row_and_the_gap_plots_name_the_cpu(tmp_path):
    """The forward runs on a CPU core when ``server.device`` is cpu: the table's idle row and the
    gap plots say so; on a GPU they keep "GPU"."""
    import io

    from rich.console import Console

    from sim.output.plots import device_word
    from sim.output.report import CPU_IDLE_LABEL, print_table

    from collections import defaultdict

    one = defaultdict(lambda: float("nan"), completed=1, failed=0, num_steps=2, gpu_idle_fraction=0.25)
    summ = {"normal": one}  # (every other metric NaN: printed "-")
    for device, want, other in (("cpu", CPU_IDLE_LABEL, "GPU idle fraction"), ("cuda", "GPU idle fraction", CPU_IDLE_LABEL)):
        buf = io.StringIO()
        print_table("t", summ, console=Console(file=buf, width=200), device=device)
        text = buf.getvalue()
        assert want in text and other not in text and "0.250" in text
    assert device_word("cpu") == "CPU forward" and device_word("cuda") == device_word("mlx") == "GPU"


def test_a_concurrency_the_run_cannot_hold_is_named(tmp_path, capsys):
    from sim.cli import main

    assert main(["run", "scenarios/quickstart.yaml", "--set", "workload.concurrency=100", "--no-plots",
                 "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "workload.concurrency 100 exceeds workload.num_requests 64" in out
    assert main(["run", "scenarios/quickstart.yaml", "--set", "workload.concurrency=100", "--set",
                 "workload.num_requests=200", "--set", "workload.output_len=8", "--no-plots",
                 "--out", str(tmp_path / "c")]) == 0
    assert "workload.concurrency 100 exceeds server.max_running_requests 64" in capsys.readouterr().out
    assert main(["run", "scenarios/quickstart.yaml", "--no-plots", "--out", str(tmp_path / "b")]) == 0
    assert "exceeds" not in capsys.readouterr().out


def test_a_dead_servers_idle_share_is_not_reported_as_serving(tmp_path, capsys):
    from sim.cli import main

    assert main(["run", "scenarios/kv-pressure.yaml", "--no-plots", "--out", str(tmp_path / "k")]) == 3
    rows = [line for line in capsys.readouterr().out.splitlines() if "idle fraction" in line or "gap mean" in line]
    assert rows and all("server died" in row for row in rows)


def test_every_subcommand_prints_its_help(capsys):
    """``overlap-sim COMMAND --help`` prints the help and exits 0 for every subcommand (a ``%`` in a
    help text once made argparse raise a traceback instead)."""
    import pytest

    from sim.cli import build_parser
    from sim.commands import COMMANDS

    build_parser()  # registers every command module
    for name in sorted(COMMANDS):
        with pytest.raises(SystemExit) as err:
            main([name, "--help"])
        assert err.value.code == 0, name
        assert "usage:" in capsys.readouterr().out, name


def test_run_json_carries_every_warning_the_table_prints(tmp_path, capsys):
    args = ["run", str(QUICKSTART), "--set", "workload.num_requests=10", "--set", "workload.concurrency=100",
            "--no-range", "--no-plots"]
    assert main([*args, "--out", str(tmp_path / "t")]) == 0
    table = [line for line in unwrapped(capsys.readouterr().out) if line.startswith(("warning:", "note:"))]
    assert main([*args, "--out", str(tmp_path / "j"), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert table and payload["warnings"] == table
    saved = json.loads((tmp_path / "j" / "summary.json").read_text())
    assert set(saved["warnings"]) <= set(payload["warnings"])


def test_an_interrupted_run_leaves_the_folder_as_it_was(tmp_path, capsys, monkeypatch):
    """Ctrl-C while the plots are drawn: one line, exit 130, and the folder still holds the earlier
    run's files, every one of them (no new table beside an old plot, no staging folder left)."""
    out = tmp_path / "out"
    args = ["run", str(QUICKSTART), "--set", "workload.num_requests=16", "--no-range", "--plots", "--out", str(out)]
    assert main(args) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    import sim.output.plots

    monkeypatch.setattr(sim.output.plots, "save_run_plots", interrupted)
    assert main([*args[:3], "workload.num_requests=24", *args[4:]]) == 130
    assert capsys.readouterr().err.strip() == "overlap-sim: interrupted"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    fresh = tmp_path / "fresh"  # a folder the interrupted run made is removed with it
    assert main([*args[:-1], str(fresh)]) == 130 and not fresh.exists()


def test_interrupted_after_a_settings_tables_were_written_leaves_the_folder_as_it_was(tmp_path, capsys,
                                                                                       monkeypatch):
    """Each setting's tables go into the staging folder as soon as it is simulated: a Ctrl-C while
    the next setting runs leaves the earlier run's folder as it was, and no staging folder."""
    import importlib

    module = importlib.import_module("sim.simulate")  # the module (the package exports the function)
    out = tmp_path / "out"
    args = ["run", str(QUICKSTART), "--set", "workload.num_requests=16", "--no-range", "--out", str(out)]
    assert main(args) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    simulate, written = module.simulate, []

    def second_interrupted(scenario, setting, **kwargs):
        if written:  # the first setting's tables are in the staging folder by now
            assert any(p.name.startswith(".run-") for p in out.iterdir())
            raise KeyboardInterrupt
        written.append(setting)
        return simulate(scenario, setting, **kwargs)

    monkeypatch.setattr(module, "simulate", second_interrupted)
    capsys.readouterr()
    assert main([*args[:3], "workload.num_requests=24", *args[4:]]) == 130
    assert capsys.readouterr().err.strip() == "overlap-sim: interrupted"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_an_empty_out_is_refused_and_a_failing_stdout_is_one_line(tmp_path, capsys):
    """``--out ''`` would be the current folder: refused by name. Standard output closed, full or
    unable to encode the table: the results are written, one line says why the table is not."""
    import subprocess
    import sys

    assert main(["run", str(QUICKSTART), "--out", ""]) == 2
    assert "argument --out: an empty path" in capsys.readouterr().err
    root = Path(__file__).resolve().parents[1]
    base = (f"{sys.executable} -m sim.cli run {QUICKSTART} --no-plots --no-range --set workload.num_requests=16 "
            f"--out {tmp_path / 'out'}")
    env = {**__import__("os").environ, "PYTHONPATH": str(root)}
    for redirect, code, words in ((">&-", 0, ""), ("> /dev/full", 2, "writing to standard output"),
                                  ("--set name=caf\u00e9 > /dev/null", 2, "cannot encode")):
        got = subprocess.run(["bash", "-c", f"{base} {redirect}"], cwd=root, capture_output=True, text=True,
                             timeout=300, env={**env, "PYTHONIOENCODING": "ascii"} if "caf" in redirect else env)
        assert got.returncode == code and "Traceback" not in got.stderr, (redirect, got.stderr)
        assert words in got.stderr and got.stderr.count("\n") <= 1
        if code:  # the run's folder was published before its table was printed: the line says it is kept
            assert "the results files it finished writing are kept, whole" in got.stderr
            assert (tmp_path / "out" / "summary.json").is_file()


def test_a_cached_prefix_that_can_outgrow_its_prompt_is_warned_of():
    """A fixed cached_len at the prompt's length, and a distribution that can draw one past the
    shortest prompt: each is cut to the prompt less one token, and the run says so."""
    import sim
    from sim.output.report import load_warnings

    fixed = sim.load_scenario(QUICKSTART, ["workload.cached_len=512"])
    assert any("cached_len 512 >= input_len 512" in w for w in load_warnings(fixed))
    drawn = sim.load_scenario(QUICKSTART, ["workload.cached_len={dist: choice, values: [0, 600]}"])
    assert any("cached_len can draw 600, at or above the shortest input_len 512" in w for w in load_warnings(drawn))
    assert not any("cached_len" in w for w in load_warnings(sim.load_scenario(QUICKSTART)))


def test_a_killed_runs_staging_folder_is_removed_by_the_next_run(tmp_path):
    """A run killed before it cleaned up leaves its hidden staging folder; the next run into the
    folder removes it (its process is gone), and leaves a live run's alone."""
    import os

    out = tmp_path / "out"
    dead, live = out / ".run-999999999-x.partial", out / f".run-{os.getpid()}-y.partial"
    for stage in (dead, live):
        stage.mkdir(parents=True)
    assert main(["run", str(QUICKSTART), "--set", "workload.num_requests=16", "--no-plots", "--no-range",
                 "--out", str(out)]) == 0
    assert not dead.exists() and live.exists()


def test_a_run_the_system_refuses_half_way_leaves_the_earlier_run_whole(tmp_path, capsys, monkeypatch):
    """Publishing a run is one transaction: a folder where the run writes a file is refused before
    anything moves, and a move the system refuses half way (an immutable file, a full disk) puts
    the earlier run's files back; either way one line, exit 2, and the folder as it was."""
    import os

    import sim.atomic

    out = tmp_path / "out"
    args = ["run", str(QUICKSTART), "--set", "workload.num_requests=16", "--no-range", "--plots", "--out", str(out)]
    assert main(args) == 0
    (out / "gaps.png").unlink()
    (out / "gaps.png").mkdir()
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    capsys.readouterr()
    again = [*args[:3], "workload.num_requests=24", *args[4:]]
    assert main(again) == 2
    err = capsys.readouterr().err
    assert "gaps.png: a folder where this command writes a file" in err and err.count("\n") == 1
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    (out / "gaps.png").rmdir()

    real = os.replace

    def refuse_one(src, dst):
        if Path(dst) == out / "steps_normal.parquet" and ".partial" in str(src):  # publishing the new one
            raise PermissionError(1, "Operation not permitted")
        return real(src, dst)

    monkeypatch.setattr(sim.atomic.os, "replace", refuse_one)
    assert main(again) == 2
    err = capsys.readouterr().err
    assert "the system refused to replace it (Operation not permitted)" in err and "left as they were" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no staging or backup folder left
    monkeypatch.setattr(sim.atomic.os, "replace", real)

    # the folder turned unwritable while the run went on (a fuzzing helper's case): the backup
    # folder cannot be made; the line names the run's folder, not a backup that never was
    make = sim.atomic.tempfile.mkdtemp

    def refuse_backup(*a, suffix="", **k):
        if suffix == ".old":
            raise PermissionError(13, "Permission denied")
        return make(*a, suffix=suffix, **k)

    monkeypatch.setattr(sim.atomic.tempfile, "mkdtemp", refuse_backup)
    assert main(again) == 2
    err = capsys.readouterr().err
    assert err == (f"overlap-sim: error: {out}: a folder the system lets this command write (Permission denied); its "
                   "earlier files are left as they were\n")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_dead_runs_moved_aside_files_are_put_back(tmp_path):
    """A run killed while publishing leaves the earlier files it had moved aside in a backup
    folder: the next run into the folder puts back those no file replaced, then goes on."""
    out = tmp_path / "out"
    backup = out / ".run-999999999-z.old"
    backup.mkdir(parents=True)
    (backup / "notes.txt").write_text("mine")
    assert main(["run", str(QUICKSTART), "--set", "workload.num_requests=16", "--no-plots", "--no-range",
                 "--out", str(out)]) == 0
    assert (out / "notes.txt").read_text() == "mine" and not backup.exists()


def test_a_results_folder_the_system_refuses_leaves_no_folder_behind(tmp_path, capsys, monkeypatch):
    """A scenario name too long for a file name: one line, exit 2, and the results/ folder the
    run made on the way is removed again."""
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(QUICKSTART), "--set", "workload.num_requests=16", "--set", "name=" + "n" * 300,
                 "--no-plots", "--no-range"]) == 2
    assert "File name too long" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_a_ctrl_c_while_a_run_publishes_puts_the_earlier_run_back(tmp_path, capsys, monkeypatch):
    """Ctrl-C between moving the earlier files aside and the last new one: the new files are
    taken out and the earlier ones put back (exit 130, the folder as it was)."""
    import os

    import sim.atomic

    out = tmp_path / "out"
    args = ["run", str(QUICKSTART), "--set", "workload.num_requests=16", "--no-range", "--plots", "--out", str(out)]
    assert main(args) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    real = os.replace

    def interrupted(src, dst):
        if Path(dst) == out / "summary.json" and ".partial" in str(src):
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(sim.atomic.os, "replace", interrupted)
    assert main([*args[:3], "workload.num_requests=24", *args[4:]]) == 130
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads a process's state from Linux's /proc")
def test_a_zombie_runs_staging_folder_is_removed(tmp_path):
    """A process killed but not yet reaped (a zombie) counts as dead, so a killed run's staging
    folder is removed by the next run while its parent has not reaped it yet."""
    import subprocess
    import time

    from sim.atomic import _alive

    child = subprocess.Popen(["sleep", "30"])
    assert _alive(child.pid)
    child.kill()
    deadline = time.time() + 10
    while _alive(child.pid) and time.time() < deadline:  # not reaped: a zombie once the kill lands
        time.sleep(0.01)
    assert not _alive(child.pid)
    child.wait()


_INTERRUPT_AT_SIMPY = """
import os, signal, sys
class Interrupt:  # Ctrl-C while the libraries load: the signal arrives as simpy is imported
    def find_spec(self, name, path=None, target=None):
        if name != "simpy":
            return None
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            if {way!r} == "as ImportError":  # numpy's C import turns it into an ImportError
                raise ImportError("the import failed") from None
            if {way!r} == "raised":
                raise
        return None  # "swallowed", as an import lock's callback does (or no KeyboardInterrupt at all)
sys.meta_path.insert(0, Interrupt())
sys.argv[0] = {argv0!r}
import sim
"""


@pytest.mark.parametrize("argv0, way", [("/usr/bin/overlap-sim", "raised"), ("/usr/bin/overlap-sim", "as ImportError"),
                                        ("/usr/bin/overlap-sim", "swallowed"), ("notebook.py", "raised")])
def test_ctrl_c_while_the_libraries_load(argv0, way):
    """A Ctrl-C during ``import sim`` in the command line: one line and exit 130, no traceback,
    however the import machinery passes it on; a program that imports sim gets the
    KeyboardInterrupt itself."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _INTERRUPT_AT_SIMPY.format(argv0=argv0, way=way)],
                          capture_output=True, text=True, timeout=120)
    if argv0.endswith("overlap-sim"):
        assert done.returncode == 130
        assert done.stderr == "overlap-sim: interrupted\n" and done.stdout == ""
    else:  # Python's own handling of an uncaught interrupt: a traceback
        assert done.returncode != 0 and done.stderr.rstrip().endswith("KeyboardInterrupt")


def test_a_ctrl_c_after_the_command_has_finished_is_ignored():
    """Run as the command (no argv given), main() ignores SIGINT once its work is done and said,
    so a late Ctrl-C cannot turn a finished run's status into death by signal."""
    import subprocess
    import sys

    code = ("import signal, sys; sys.argv = ['overlap-sim', 'run', {q!r}, '--set', 'workload.num_requests=16', "
            "'--tables', 'none', '--out', {out!r}]\nfrom sim.cli import main\nstatus = main()\n"
            "print(status, signal.getsignal(signal.SIGINT) == signal.SIG_IGN)")
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([sys.executable, "-c", code.format(q=str(QUICKSTART), out=out)], capture_output=True,
                              text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "0 True"


@pytest.mark.parametrize("args, hint", [
    (["--concurrency", "4"], "--set workload.concurrency=4"),
    (["--max-running-requests=16"], "--set server.max_running_requests=16"),
    (["--num-requests"], "--set workload.num_requests=VALUE"),
    (["--turbo", "1"], None),  # no field of that name: no hint
    (["--name", "x"], "--set name=x"),  # a top-level field
])
def test_a_flag_that_names_a_scenario_field_points_to_set(tmp_path, capsys, args, hint):
    status = main(["run", str(QUICKSTART), "--out", str(tmp_path / "r"), *args])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and "unrecognized arguments" in err
    assert "(see overlap-sim run --help)" in err  # the command's own help, not the top parser's
    if hint is None:
        assert "--set" not in err
    else:
        assert err.endswith(hint)
    assert not (tmp_path / "r").exists()


def test_field_for_flag_names_one_field_or_none():
    from sim.scenario import field_for_flag

    assert field_for_flag("--chunked-prefill-size") == "server.chunked_prefill_size"
    assert field_for_flag("--output_len") == "workload.output_len"
    assert field_for_flag("--seed") == "seed"
    assert field_for_flag("--") is None and field_for_flag("--no-such-thing") is None
    assert field_for_flag("--workload") is None  # a section, not a field
