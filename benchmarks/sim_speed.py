"""Simulator speed and memory on a reference workload (run by hand; see docs/speed.md).

Reference workload: ShareGPT-like lengths (lognormal, input mean 200, output mean 180 tokens),
EOS finishes, decode step of a few ms (4 ms base), closed loop at concurrency 64 and Poisson
near saturation. For each setting it reports wall seconds, simulated seconds, the ratio
simulated/wall ("x real time"), simulated decode steps per wall second, SimPy events per step
and peak memory (max RSS of a fresh process running only that case), then the same at 1k, 10k
and 100k requests to show how cost grows.

    python benchmarks/sim_speed.py                      # table + benchmarks/results/sim_speed.csv
    python benchmarks/sim_speed.py --sizes 1000 10000 --tables steps
    python benchmarks/sim_speed.py --profile 10000      # cProfile top entries of one run

Ratios measured in one run (interleaved, repeated, each run a fresh process; median and min-max):

    python benchmarks/sim_speed.py --against /tmp/old --sizes 10000 --tables none --repeats 5
        # decode steps per second of this tree over another checkout's (e.g. `git archive <commit>
        # | tar -x -C /tmp/old`), closed loop at concurrency 64, one setting per --settings
    python benchmarks/sim_speed.py --leap open --sizes 10000 --repeats 3 --warm 4 --against /tmp/old
        # CPU per request of this tree's leap and another checkout's, each process the fastest of
        # 4 runs (steadier on a noisy VM than one cold run, which --warm 1, the default, reports)
    python benchmarks/sim_speed.py --cli-modes 20000 --repeats 3
        # `overlap-sim run` wall and CPU time, default mode (Parquet tables), --plots and --tables
        # none, then the CPU time of each part of the default mode (and of --plots) beyond the
        # streamed one
        # (add --tree DIR to run another checkout's command line)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import multiprocessing as mp
import os
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import simpy
import yaml

ROOT = Path(__file__).resolve().parents[1]
# --tree DIR (internal, for --against): import the simulator of another checkout
TREE = Path(sys.argv[sys.argv.index("--tree") + 1]) if "--tree" in sys.argv else ROOT
sys.path.insert(0, str(TREE))

import sim  # noqa: E402

SETTINGS = ["normal", "overlap", "overlap_mlx"]


def reference_scenario(num_requests: int, arrival: str, concurrency: int = 64) -> dict:
    """The reference workload; Poisson rate set near the closed loop's measured saturation."""
    return {
        "name": f"reference-{arrival}",
        "seed": 0,
        "workload": {
            "arrival": arrival, "concurrency": concurrency, "rate_per_s": 55.0, "num_requests": num_requests,
            "warmup_requests": min(64, num_requests // 10),
            "input_len": {"dist": "lognormal", "mean": 200, "sigma": 0.8, "max": 4096},
            "output_len": {"dist": "lognormal", "mean": 180, "sigma": 0.8, "max": 4096},
            "finish": "eos",
        },
        "server": {"settings": SETTINGS, "max_running_requests": max(256, concurrency)},
        "costs": {"gpu": {"decode": {"base": 0.004, "per_req": 2.0e-5, "per_ctx_token": 1.0e-9}}},
    }


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts scheduled events."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events = 0

    def schedule(self, event, priority=1, delay=0):
        self.events += 1
        super().schedule(event, priority, delay)


def peak_rss_mib() -> float:
    """This process's own peak resident memory (MiB): ``VmHWM`` of ``/proc/self/status``, the
    peak of its address space since its last ``exec``. Not ``ru_maxrss``: on Linux that keeps the
    peak of the process before the ``exec``, i.e. of the parent that started it (a fork holds the
    parent's pages), so a child of a 100 MiB benchmark process reads at least 100 MiB. Where there
    is no ``/proc`` (macOS), ``ru_maxrss`` (bytes there)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


# runs a command as its own child and writes [exit status, CPU seconds, peak RSS in KiB] to the file
# named by its first argument: the command forks from this small interpreter, not from the benchmark
# process, so its ru_maxrss is its own (see peak_rss_mib)
LAUNCHER = ("import json, os, sys\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os.execv(sys.argv[2], sys.argv[2:])\n"
            "_, status, usage = os.wait4(pid, 0)\n"
            "with open(sys.argv[1], 'w') as f:\n"
            "    json.dump([os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime, usage.ru_maxrss], f)\n")


def run_child(cmd: list[str], cwd: Path, env: dict) -> tuple[int, float, float, float]:
    """Run ``cmd`` (stdout discarded) through :data:`LAUNCHER`; return (its exit status, wall
    seconds, CPU seconds (user + system), peak RSS in MiB)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "usage.json"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-S", "-c", LAUNCHER, str(report), *cmd], cwd=cwd, env=env,
                       stdout=subprocess.DEVNULL, check=False)
        wall = time.perf_counter() - t0
        code, cpu, peak_kib = json.loads(report.read_text())
    return code, wall, cpu, peak_kib / 1024


def run_case(args: tuple) -> dict:
    """Run one (size, arrival, setting, tables) case in this process; return its measurements."""
    num_requests, arrival, setting, tables, concurrency = args
    envs = []

    def factory(*a, **k):
        env = CountingEnvironment(*a, **k)
        envs.append(env)
        return env

    # count events without touching the simulator: each engine's runner makes its environment as
    # simpy.Environment() (sim/engines/*/run.py), looked up in the simpy module when it runs
    simpy.Environment = factory
    scenario = sim.load_scenario(reference_scenario(num_requests, arrival, concurrency))
    kwargs = {"tables": tables} if tables else {}
    t0, c0 = time.perf_counter(), time.process_time()
    res = sim.simulate(scenario, setting, **kwargs)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    summ = res.summary()
    stats = getattr(res, "stats", {}) or {}
    sim_s = stats.get("sim_time_s")
    if sim_s is None:
        sim_s = float(res.steps["forward_end"].max())
    decode_steps = stats.get("decode_steps")
    if decode_steps is None:
        decode_steps = int((res.steps["kind"] == "decode").sum())
    steps = stats.get("steps", len(res.steps))
    return {
        "requests": num_requests, "arrival": arrival, "setting": setting, "tables": tables or "steps",
        "concurrency": concurrency,
        "wall_s": wall, "sim_s": sim_s, "x_real_time": sim_s / wall, "steps": steps,
        "decode_steps": decode_steps, "decode_steps_per_wall_s": decode_steps / wall,
        "cpu_s": cpu, "decode_steps_per_cpu_s": decode_steps / cpu,
        "events_per_step": envs[0].events / max(steps, 1),
        "peak_rss_mb": peak_rss_mib(),
        "output_throughput": summ["output_throughput"], "completed": summ["completed"],
    }


def spread(values: list[float], fmt: str = ".2f") -> str:
    """Median (min-max) of ``values``."""
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def compare_trees(against: Path, sizes: list[int], settings: list[str], tables: str | None, repeats: int) -> None:
    """Decode steps per CPU second (the process's own, less sensitive than wall time to other load
    on the machine) of this tree and of ``against`` on the closed-loop reference workload, each
    case run alternately in both trees (a fresh process each), ``repeats`` times."""
    for n in sizes:
        for setting in settings:
            rate: dict[str, list[float]] = {"this": [], "against": []}
            for _ in range(repeats):
                for name, tree in (("this", ROOT), ("against", against)):
                    case = json.dumps([n, "closed_loop", setting, tables, 64])
                    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--case", case, "--tree", str(tree)],
                                         capture_output=True, text=True, check=True).stdout
                    rate[name].append(json.loads(out.splitlines()[-1])["decode_steps_per_cpu_s"])
            ratios = [a / b for a, b in zip(rate["this"], rate["against"])]
            print(f"{n:>7} closed_loop c=64 {setting:<12} tables={tables or 'steps':<7} decode steps/CPU s: this "
                  f"{spread(rate['this'], '.0f')}, against {spread(rate['against'], '.0f')}; this/against "
                  f"{spread(ratios)}", flush=True)


def compare_cli_modes(num_requests: int, repeats: int) -> None:
    """Wall seconds of ``overlap-sim run`` of the closed-loop reference workload at
    ``num_requests``: the default mode (Parquet tables; plots only with ``--plots`` since
    5 December 2026), ``--plots`` and ``--tables none``, alternated, ``repeats`` times; the
    ratios to ``--tables none`` in wall and in CPU time (user + system of the child)."""
    modes = {"default (Parquet tables)": [], "--plots (tables + plots)": ["--plots"],
             "--tables none": ["--tables", "none"]}
    from startup import takes_plots_flag  # benchmarks/startup.py (this script's folder is on the path)

    if not takes_plots_flag(TREE):  # a tree from before 5 December 2026: its default draws the plots
        modes = {"default (Parquet tables + plots)": [], "--tables none": ["--tables", "none"]}
    with tempfile.TemporaryDirectory() as tmp:
        scenario = Path(tmp) / "reference.yaml"
        raw = reference_scenario(num_requests, "closed_loop")
        raw["server"]["settings"] = ["overlap", "normal"]
        scenario.write_text(yaml.safe_dump(raw))
        wall: dict[str, list[float]] = {m: [] for m in modes}
        peak: dict[str, list[float]] = {m: [] for m in modes}
        cpu: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(repeats):
            for mode, extra in modes.items():
                code, seconds, cpu_s, peak_mib = run_child(
                    [sys.executable, "-m", "sim.cli", "run", str(scenario), "--out", str(Path(tmp) / "out"), *extra],
                    TREE, {**os.environ, "PYTHONPATH": str(TREE)})
                if code:
                    raise SystemExit(f"overlap-sim run ({mode}) exited {code}")
                wall[mode].append(seconds)
                cpu[mode].append(cpu_s)
                peak[mode].append(peak_mib)
    for mode, values in wall.items():
        print(f"overlap-sim run, {num_requests} requests, overlap + normal, {mode:<26} wall {spread(values)} s, "
              f"CPU {spread(cpu[mode])} s, peak RSS {spread(peak[mode], '.0f')} MiB")
    streamed = "--tables none"
    for mode in list(modes)[:-1]:
        for what, times in (("wall", wall), ("CPU", cpu)):
            ratios = [a / b for a, b in zip(times[mode], times[streamed])]
            print(f"{mode} / {streamed}, {what}: {spread(ratios)}")
    print(f"where the default mode's extra time goes (CPU seconds, one fresh process each, median of {repeats}):")
    parts: dict[str, list[float]] = {}
    for _ in range(repeats):
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--parts", str(num_requests),
                              "--tree", str(TREE)], capture_output=True, text=True, check=True, cwd=TREE,
                             env={**os.environ, "OPENBLAS_NUM_THREADS": "1"}).stdout
        for name, value in json.loads(out.splitlines()[-1]).items():
            parts.setdefault(name, []).append(value)
    streamed = statistics.median(parts.pop("simulate, --tables none (both settings)"))
    print(f"  {'simulate, --tables none (both settings)':<64} {streamed:6.2f} s  (the streamed mode's core)")
    for name, values in parts.items():
        if name.startswith("(memory"):
            print(f"  {name:<64} {statistics.median(values):6.0f} MiB")
            continue
        print(f"  {name:<64} {statistics.median(values):6.2f} s  {statistics.median(values) / streamed:5.2f}x of it")


def default_mode_parts(num_requests: int) -> dict[str, float]:
    """CPU seconds (this process's) of each part of ``overlap-sim run``'s default mode beyond the
    streamed one, on the closed-loop reference workload with settings overlap and normal, in
    ``cmd_run``'s order: simulating with and without tables (numpy columns), the summaries from
    the columns, writing them as Parquet (importing pyarrow); then what ``--format csv`` and
    ``--plots`` add: importing pandas, the tables as DataFrames, CSV, matplotlib and the plots."""
    clock = time.process_time
    scenario = sim.load_scenario({**reference_scenario(num_requests, "closed_loop"),
                                  "server": {"settings": ["overlap", "normal"], "max_running_requests": 256}})
    parts: dict[str, float] = {}
    t = clock()
    for setting in scenario.server.settings:
        sim.simulate(scenario, setting, tables="none").summary()
    parts["simulate, --tables none (both settings)"] = clock() - t
    t = clock()
    results = [sim.simulate(scenario, s) for s in scenario.server.settings]
    parts["simulate with tables (rows kept, columns built), both settings"] = clock() - t
    t = clock()
    summaries = {r.setting: r.summary() for r in results}
    parts["summaries from the columns"] = clock() - t
    tables_mib = sum(values.nbytes + (sum(map(len, values)) if values.dtype == object else 0)
                     for r in results for k in ("steps", "requests", "itl")
                     for values in r.columns(k).data.values()) / 2**20
    try:
        from sim.output.run_files import write_results
    except ImportError:  # (a tree before 6 December 2026, --tree: the writers were in report)
        from sim.output.report import write_results
    with tempfile.TemporaryDirectory() as tmp:
        t = clock()
        write_results(Path(tmp), {"settings": summaries}, results)
        parts["write the tables as Parquet (pyarrow's import included)"] = clock() - t
        t = clock()
        import pandas  # noqa: F401
        parts["--format csv or --plots: import pandas"] = clock() - t
        t = clock()
        for r in results:
            r.steps, r.requests, r.itl  # noqa: B018  (the DataFrames of the same arrays)
        parts["--format csv or --plots: the tables as DataFrames"] = clock() - t
        t = clock()
        write_results(Path(tmp), {"settings": summaries}, results, "csv")
        parts["--format csv: write the same tables as CSV"] = clock() - t
        t = clock()
        from sim.output.plots import save_run_plots  # imports matplotlib
        parts["--plots: import matplotlib (and the plot module)"] = clock() - t
        t = clock()
        save_run_plots(Path(tmp), scenario.name, {r.setting: r.steps for r in results}, summaries,
                       {r.setting: r.requests for r in results})
        parts["--plots: draw and save the three plots"] = clock() - t
    parts["(memory, MiB: the tables held, steps + requests + ITL, both settings)"] = tables_mib
    return parts


# --- the leap (issue 31): the same answers from fewer loop iterations ----------------------------
def open_loop_scenario(num_requests: int) -> dict:
    """Issue 31's open-loop workload (the BLIS comparison): Poisson at 4 requests/s, 512-token
    prompts, 128 output tokens by length, up to 64 running; decode 25 ms + 0.1 ms per request +
    10 ns per context token, a 512-token prefill 61 ms, CPU phases about 0.7 ms a step."""
    return {
        "name": "open-loop-512-128", "seed": 0,
        "workload": {"arrival": "poisson", "rate_per_s": 4.0, "num_requests": num_requests, "warmup_requests": 0,
                     "input_len": 512, "output_len": 128, "finish": "length"},
        "server": {"device": "cuda", "settings": ["overlap", "normal"], "max_running_requests": 64},
        "costs": {"gpu": {"decode": {"base": 0.025, "per_req": 1.0e-4, "per_ctx_token": 1.0e-8},
                          "prefill": {"base": 0.005, "per_token": 1.1e-4}},
                  "cpu": {"recv": {"base": 2e-5, "per_req": 1e-5}, "schedule": {"base": 1.5e-4, "per_req": 4e-6},
                          "launch": {"base": 3e-4}, "process": {"base": 2e-4, "per_req": 1.2e-5}},
                  "noise": {"gpu_cv": 0.0, "cpu_cv": 0.0}},
    }


def leap_workload(name: str, num_requests: int):
    """``open`` (:func:`open_loop_scenario`) or ``closed-C``: the quickstart (its profile, the tree's own copy, 256
    output tokens by length) in a closed loop of C clients; ``vllm-open``: the open-loop workload
    on vLLM 0.32 (its inline costs, ``max_num_seqs`` 64); ``vllm-closed-C``: the shipped
    ``vllm-h200`` scenario (its profile, the quickstart's load) at C clients; ``mlx-closed-C``: the
    shipped ``mlx-disable-overlap`` scenario (SGLang on MLX, its inline costs, 256 output tokens by
    length) at C clients, under the MLX chain (``overlap_mlx``)."""
    if name in ("open", "vllm-open"):
        spec = open_loop_scenario(num_requests)
        if name == "vllm-open":
            spec["server"] = {"engine": "vllm", "device": "cuda", "settings": ["async", "sync"], "max_num_seqs": 64}
        return sim.load_scenario(spec)
    concurrency = int(name.rsplit("-", 1)[1])
    path = {"vllm": "vllm-h200.yaml", "mlx": "mlx-disable-overlap.yaml"}.get(name.split("-", 1)[0], "quickstart.yaml")
    overrides = [f"workload.num_requests={num_requests}", f"workload.concurrency={concurrency}"]
    if name.startswith("mlx-"):
        overrides.append("server.settings=[overlap_mlx]")
    # each tree runs its own copy of the scenario and its profile (an older tree cannot read a newer
    # profile's curves, e.g. device_launch.extend since 6 December 2026)
    return sim.load_scenario((TREE if (TREE / "scenarios" / path).exists() else ROOT) / "scenarios" / path, overrides)


def workload_settings(workload: str, settings: list[str]) -> list[str]:
    """The settings to run ``workload`` under: vLLM's (``async``, ``sync``) for a ``vllm-``
    workload, whatever ``settings`` name of them (none: both); ``overlap_mlx`` for an ``mlx-``
    workload (its scenario's ``normal`` loop dies at v0.5.22, as the seed document's run did);
    else ``settings``."""
    if workload.startswith("mlx-"):
        return ["overlap_mlx"]
    if not workload.startswith("vllm-"):
        return settings
    return [s for s in settings if s in ("async", "sync")] or ["async", "sync"]


def run_leap_case(args: tuple) -> dict:
    """One (workload, requests, setting, mode[, warm]) run in this process, ``--tables none``: CPU
    seconds (this process's), simulated seconds, steps and leapt steps. ``mode``: ``leap`` or
    ``step`` (this tree's ``leap=False``) or ``tree`` (the tree under --tree, as it runs by
    default). ``warm`` > 1: the simulation runs that many times and the least CPU is reported."""
    workload, num_requests, setting, mode, *rest = args
    warm = rest[0] if rest else 1
    scenario = leap_workload(workload, num_requests)
    kwargs = {} if mode == "tree" else {"leap": mode == "leap"}
    cpu = math.inf
    for _ in range(warm):  # --warm N: the fastest of N runs in this process
        c0 = time.process_time()
        res = sim.simulate(scenario, setting, tables="none", **kwargs)
        summary = res.summary()
        cpu = min(cpu, time.process_time() - c0)
    return {"workload": workload, "requests": num_requests, "setting": setting, "mode": mode, "cpu_s": cpu,
            "sim_s": res.stats["sim_time_s"], "steps": res.stats["steps"],
            "leapt_steps": res.stats.get("leapt_steps", 0), "throughput": summary["output_throughput"],
            "peak_rss_mb": peak_rss_mib()}


def leap_report(workloads: list[str], sizes: list[int], settings: list[str], repeats: int, against: Path | None,
                out: Path, warm: int = 1) -> None:
    """CPU per request and simulated seconds per CPU second with the leap, step by step and (with
    ``against``) in another checkout, each case a fresh process, the modes alternated, repeated.
    ``warm`` > 1: each process runs its case that many times and reports the least CPU (steadier
    on a noisy VM than one cold run; step by step is then left out: it is the slow mode)."""
    rows = []
    modes = (["leap"] if warm > 1 else ["leap", "step"]) + (["tree"] if against else [])
    for workload in workloads:
        for n in sizes:
            for setting in workload_settings(workload, settings):
                for _ in range(repeats):
                    for mode in modes:
                        tree = ["--tree", str(against)] if mode == "tree" else []
                        case = json.dumps([workload, n, setting, mode, warm])
                        text = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--leap-case", case, *tree],
                                              capture_output=True, text=True, check=True).stdout
                        rows.append(json.loads(text.splitlines()[-1]))
                got = [r for r in rows if (r["workload"], r["requests"], r["setting"]) == (workload, n, setting)]
                by = {m: [r for r in got if r["mode"] == m] for m in modes}
                own = {r["throughput"] for m in modes if m != "tree" for r in by[m]}
                if len(own) != 1:  # the leap must not move an answer
                    print(f"  ! {workload} {n} {setting}: this tree's modes give different throughputs: {sorted(own)}")
                elif against and {r["throughput"] for r in by["tree"]} != own:
                    other = by["tree"][0]["throughput"]
                    print(f"  ({workload} {n} {setting}: the other tree's throughput differs by "
                          f"{abs(other / next(iter(own)) - 1):.1e} relative)")
                line = [f"{workload:<9} {n:>8} {setting:<8}"]
                for m in modes:
                    per_req = [1e6 * r["cpu_s"] / n for r in by[m]]
                    line.append(f"{m}: {spread(per_req, '.1f')} us/req, {spread([r['sim_s'] / r['cpu_s'] for r in by[m]], '.0f')} sim-s/CPU-s")
                base = "tree" if against else "step"
                if base in by:
                    ratios = [a["cpu_s"] / b["cpu_s"] for a, b in zip(by["leap"], by[base])]
                    line.append(f"leap/{base} CPU {spread(ratios)};")
                line.append(f"leapt {by['leap'][0]['leapt_steps'] / by['leap'][0]['steps']:.0%} "
                            f"of {by['leap'][0]['steps']} steps; peak RSS {max(r['peak_rss_mb'] for r in by['leap']):.0f} MB")
                print("  ".join(line), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    import pandas as pd  # here, not at the top: a case's process holds only what the simulator imports

    pd.DataFrame(rows).to_csv(out, index=False)
    print(f"written {out}")


def sweep_cpu(repeats: int, against: Path | None, num_requests: int = 1000) -> None:
    """CPU seconds (the command's process and its workers) of ``overlap-sim sweep`` over 100 points
    of the quickstart at ``num_requests`` requests (concurrency 1-10 x CPU scale 0.5-5, both
    settings, one worker, no plots): this tree with the leap, with --no-leap, and ``against``,
    alternated, each in a fresh results folder."""
    grid = ["--grid", "workload.concurrency=" + ",".join(str(c) for c in range(1, 11)),
            "--grid", "costs.cpu.scale=" + ",".join(f"{0.5 * (i + 1):g}" for i in range(10))]
    trees = {"leap": (ROOT, []), "step": (ROOT, ["--no-leap"])}
    if against:
        trees["tree"] = (against, [])
    cpu: dict[str, list[float]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for name, (tree, extra) in trees.items():
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                subprocess.run([sys.executable, "-m", "sim.cli", "sweep", str(ROOT / "scenarios" / "quickstart.yaml"),
                                *grid, "--set", f"workload.num_requests={num_requests}", "--workers", "1", "--no-plots",
                                "--out", str(Path(tmp) / f"{name}-{r}"), *extra], cwd=tree, check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(tree)})
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    for name, values in cpu.items():
        print(f"sweep, 100 points x {num_requests} requests, one worker, {name:<5}: CPU {spread(values)} s")
    base = "tree" if against else "step"
    print(f"{base} / leap: {spread([b / a for a, b in zip(cpu['leap'], cpu[base])])}")


def baseline_rss(_=None) -> float:
    return peak_rss_mib()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--arrivals", nargs="+", default=["closed_loop", "poisson"])
    ap.add_argument("--settings", nargs="+", default=SETTINGS)
    ap.add_argument("--tables", default=None, help="passed to simulate(tables=...) when supported")
    ap.add_argument("--out", type=Path, default=None,
                    help="CSV of the cases (default benchmarks/results/sim_speed.csv; sim_speed_leap.csv with --leap)")
    ap.add_argument("--profile", type=int, default=None, metavar="N", help="cProfile one closed-loop overlap run of N requests")
    ap.add_argument("--batch-sizes", type=int, nargs="*", default=None, metavar="C",
                    help="instead: closed-loop runs of 20,000 requests at these concurrencies (per-step cost vs batch size)")
    ap.add_argument("--against", type=Path, default=None, metavar="DIR",
                    help="instead: decode steps/s of this tree over another checkout's, interleaved (closed loop, c=64)")
    ap.add_argument("--cli-modes", type=int, default=None, metavar="N",
                    help="instead: `overlap-sim run` wall time, default mode over --tables none, at N requests")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of each case with --against or --cli-modes")
    ap.add_argument("--leap", nargs="*", default=None, metavar="WORKLOAD",
                    help="instead: CPU per request with the leap, step by step and (with --against) another "
                         "checkout, workloads 'open' and/or 'closed-C' (quickstart at C clients), and on vLLM "
                         "'vllm-open' and/or 'vllm-closed-C' (vllm-h200 at C clients), and on MLX 'mlx-closed-C' "
                         "(mlx-disable-overlap at C clients, overlap_mlx), at --sizes, --settings "
                         "(default overlap normal; async sync for vLLM), --repeats")
    ap.add_argument("--warm", type=int, default=1, metavar="N",
                    help="with --leap: each case process runs N times and reports its least CPU (no step-by-step mode)")
    ap.add_argument("--case", default=None, help=argparse.SUPPRESS)  # internal: one case, JSON in and out
    ap.add_argument("--leap-case", default=None, help=argparse.SUPPRESS)  # internal: one leap case
    ap.add_argument("--sweep-cpu", action="store_true",
                    help="instead: CPU of a 100-point sweep of the quickstart (1,000 requests a point) with the leap, "
                         "with --no-leap and (with --against) another checkout, --repeats times")
    ap.add_argument("--parts", type=int, default=None, help=argparse.SUPPRESS)  # internal: default_mode_parts
    ap.add_argument("--tree", default=None, help=argparse.SUPPRESS)  # internal: read before the imports
    args = ap.parse_args()
    if args.warm < 1:
        ap.error("--warm: at least 1 run a case")
    if args.case:
        print(json.dumps(run_case(tuple(json.loads(args.case)))))
        return
    if args.leap_case:
        print(json.dumps(run_leap_case(tuple(json.loads(args.leap_case)))))
        return
    if args.sweep_cpu:
        sweep_cpu(args.repeats, args.against.resolve() if args.against else None)
        return
    if args.leap is not None:
        settings = args.settings if args.settings != SETTINGS else ["overlap", "normal"]
        leap_report(args.leap or ["open", "closed-8", "closed-64"], args.sizes, settings, args.repeats,
                    args.against.resolve() if args.against else None,
                    args.out or ROOT / "benchmarks" / "results" / "sim_speed_leap.csv", args.warm)
        return
    if args.parts:
        print(json.dumps(default_mode_parts(args.parts)))
        return
    if args.against:
        compare_trees(args.against.resolve(), args.sizes, args.settings, args.tables, args.repeats)
        return
    if args.cli_modes:
        compare_cli_modes(args.cli_modes, args.repeats)
        return
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        run_case((args.profile, "closed_loop", "overlap", args.tables, 64))
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
        print(buf.getvalue())
        return
    args.out = args.out or ROOT / "benchmarks" / "results" / "sim_speed.csv"
    ctx = mp.get_context("spawn")
    if args.batch_sizes:
        cases = [(20000, "closed_loop", s, args.tables, c) for c in args.batch_sizes for s in args.settings]
        args.out = args.out.with_name("sim_speed_batch.csv")
    else:
        cases = [(n, a, s, args.tables, 64) for n in args.sizes for a in args.arrivals for s in args.settings]
    rows = []
    with ctx.Pool(1, maxtasksperchild=1) as pool:  # one fresh process per case: peak RSS is its own
        base = pool.apply(baseline_rss)
        for case in cases:
            row = pool.apply(run_case, (case,))
            row["baseline_rss_mb"] = base
            rows.append(row)
            print(f"{row['requests']:>7} {row['arrival']:<11} c={row['concurrency']:<4} {row['setting']:<12} wall {row['wall_s']:7.2f}s  "
                  f"sim {row['sim_s']:8.1f}s  x{row['x_real_time']:7.0f}  {row['decode_steps_per_wall_s']:9.0f} decode steps/s  "
                  f"{row['events_per_step']:.2f} ev/step  {row['peak_rss_mb']:6.0f} MB", flush=True)
    import pandas as pd

    df = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out, index=False)
    print(f"\nbaseline RSS after imports: {base:.0f} MB; written {args.out}")
    # growth: wall time per request should stay flat as the run grows (linear cost)
    by = "concurrency" if args.batch_sizes else "requests"
    growth = df.groupby(["arrival", "setting"]).apply(
        lambda g: pd.Series({f"us_per_step@{by}={n}": 1e6 * w / s for n, w, s in zip(g[by], g["wall_s"], g["steps"])}),
        include_groups=False)
    print(growth.round(2).to_string())
    if args.batch_sizes:
        # wall = a * decode steps + b * prefill steps + c * requests: a flat a across batch sizes
        # means no per-request loop on a decode step
        import numpy as np

        for setting, g in df.groupby("setting"):
            x = np.column_stack([g["decode_steps"], g["steps"] - g["decode_steps"], g["requests"]]).astype(float)
            coef, *_ = np.linalg.lstsq(x, g["wall_s"].to_numpy(), rcond=None)
            resid = g["wall_s"].to_numpy() - x @ coef
            print(f"{setting}: wall = {coef[0] * 1e6:.2f} us x decode steps + {coef[1] * 1e6:.2f} us x prefill steps "
                  f"+ {coef[2] * 1e6:.2f} us x requests (max residual {np.abs(resid).max() * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
