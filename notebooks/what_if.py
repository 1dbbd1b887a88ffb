# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # What if: a faster CPU, a faster GPU, more users?
#
# **Running this notebook.** From the repository root: `pip install -e ".[notebooks]"`, then
# `jupyter lab notebooks/what_if.ipynb` and *Run > Run All Cells* (about a minute on 2 cores).
# With `OVERLAP_SIM_NOTEBOOK_SMALL=1` in the environment the sweeps use small grids and short
# requests (the tests run it so). More in `docs/notebooks.md`.
#
# The overlap scheduler hides the scheduler's CPU work (recv, schedule, launch, process) behind
# the next forward pass. How much that buys depends on how long each side takes. This notebook
# starts from the quickstart, the benchmark of the write-up "The overlap scheduler" (closed loop,
# 8 users, 512-token prompts with 511 cached, 256 output tokens) on the calibration profile
# measured on an NVIDIA H200 (`scenarios/profiles/h200-llama-3.2-1b.json`), sweeps its CPU time
# and GPU time, then the number of users, under `overlap` and `normal`.

# %%
import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import sim
from sim.model.costs import DECODE, make_cost_model
from sim.whatif.plots import ratio_heatmap
from sim.whatif.sweeps import sweep
from sim.whatif.variance import paired_ratios

# %matplotlib inline
SMALL = os.environ.get("OVERLAP_SIM_NOTEBOOK_SMALL") == "1"
ROOT = Path.cwd() if (Path.cwd() / "scenarios").is_dir() else Path.cwd().parent
WORKERS = 1 if SMALL else None  # None: one process per core
quickstart = sim.load_scenario(ROOT / "scenarios" / "quickstart.yaml")
print(quickstart.name, "on", quickstart.costs.profile)

# %% [markdown]
# ## The quickstart
#
# The same numbers as `overlap-sim run scenarios/quickstart.yaml` prints (always the full
# scenario, also in small mode: it takes a fraction of a second):

# %%
table = sim.compare(quickstart)
table[["completed", "output_throughput", "median_ttft_ms", "median_tpot_ms", "gpu_idle_fraction", "mean_gap_ms"]].round(3)

# %% [markdown]
# ## CPU time x GPU time
#
# `costs.cpu.scale` multiplies every CPU phase (a slower or faster host, a heavier Python
# scheduler); `costs.gpu.scale` multiplies every forward (a slower or faster card, a bigger or
# smaller model). On the profile, a decode step of 8 requests costs about 3.2 ms on the device
# and 0.70 ms of CPU at scale 1 under the normal loop (0.92 ms under overlap, whose measured
# host curves are dearer), so the CPU side needs a scale near 3.4 to catch up with the device.

# %%
base = quickstart.with_overrides(["workload.num_requests=24", "workload.output_len=64"] if SMALL else [])
print(base.workload.num_requests, "requests,", base.workload.output_len, "output tokens each")
cpu_scales = [0.1, 1, 10, 30] if SMALL else [0.1, 0.3, 1, 3, 10, 30]
gpu_scales = [0.25, 1, 4] if SMALL else [0.25, 0.5, 1, 2, 4]
grid = {"costs.cpu.scale": cpu_scales, "costs.gpu.scale": gpu_scales}
table = sweep(base, grid, workers=WORKERS)
table[["costs.cpu.scale", "costs.gpu.scale", "setting", "output_throughput", "median_ttft_ms", "mean_gap_ms"]].head(8)

# %% [markdown]
# The heatmap shows overlap/normal output throughput. Above 1 overlap wins. Where the CPU work
# per step is as small as the overlap loop's own device-side residue (the FutureMap resolve and
# event record, `costs.gpu.overlap_residue`), overlap stops paying: the left column tends to 1.
# Where the CPU dominates, overlap loses (the black break-even line, right): its step is then its
# own CPU time, and the profile's overlap-loop host curves cost more per step than the normal
# loop's (0.92 against 0.70 ms at scale 1), more than the forward the normal loop adds once the
# CPU scale is about 14 times the GPU scale.

# %%
fig = ratio_heatmap(table, "costs.cpu.scale", "costs.gpu.scale", base.name)
plt.show()

# %% [markdown]
# A closed form explains the picture. In steady decode the normal loop's step is
# T_cpu + T_gpu; the overlap loop's is max(T_gpu + residue, T_cpu), each loop's T_cpu from its
# own curves (the profile keeps the overlap loop's where they differ). The profile gives both at
# every decode step of a request (8 requests, context growing from the prompt to the last
# token); the mean step of each loop gives the expected gain in time per output token (TPOT).
# The simulation should agree with it: TPOT leaves out the prefill, which the closed form
# does not model.

# %%
bs = base.workload.concurrency
ctx = np.arange(base.workload.input_len + 1, base.workload.input_len + base.workload.output_len)


def cpu_per_step(costs):
    return np.array([costs.recv_s(0) + sum(phase(DECODE, bs, bs, bs * c) for phase in
                                           (costs.schedule_s, costs.launch_s, costs.process_s)) for c in ctx])


costs = make_cost_model(base, "normal")  # the profile's curves, at scale 1
t_gpu = np.array([costs.forward_s(DECODE, bs, bs, bs * c) for c in ctx])
t_cpu = cpu_per_step(costs)
t_cpu_overlap = cpu_per_step(make_cost_model(base, "overlap"))  # the profile's overlap-loop curves
res = base.costs.gpu.overlap_residue
ratios = paired_ratios(table, "output_throughput").rename(columns={"ratio": "throughput_ratio"})
tpot = paired_ratios(table, "median_tpot_ms")
ratios["tpot_gain"] = 1 / tpot["ratio"].to_numpy()  # normal TPOT / overlap TPOT
ratios["closed_form"] = [
    np.mean(c * t_cpu + g * t_gpu) / np.mean(np.maximum(g * (t_gpu + res), c * t_cpu_overlap))
    for c, g in zip(ratios["costs.cpu.scale"], ratios["costs.gpu.scale"])]
ratios["error"] = ratios["tpot_gain"] / ratios["closed_form"] - 1
print(f"T_gpu = {t_gpu.mean() * 1e3:.2f} ms, T_cpu = {t_cpu.mean() * 1e3:.3f} ms (normal) and "
      f"{t_cpu_overlap.mean() * 1e3:.3f} ms (overlap) per decode step at scale 1")
print(f"simulated TPOT gain vs closed form: largest deviation {ratios['error'].abs().max():.1%}")
assert ratios["error"].abs().max() < 0.05, "the sweep should follow the steady-state closed form"
ratios[["costs.cpu.scale", "costs.gpu.scale", "throughput_ratio", "tpot_gain", "closed_form", "error"]].round(3)

# %% [markdown]
# Throughput gains less than TPOT where the CPU is slow: every prefill's launch is CPU work too
# (on this host an eager prefill takes 9.6 ms of CPU time to queue its kernels, at scale 1),
# and in a closed loop each request's prefill waits for it in both loops alike.
#
# ## More users
#
# A bigger batch costs more on the device (per request and per context token) but the CPU
# phases grow too (per request), so the share of exposed CPU time changes with concurrency.
# Throughput and time to first token for both settings:

# %%
users = [1, 4, 16, 64] if SMALL else [1, 2, 4, 8, 16, 32, 64]
conc = sweep(base, {"workload.concurrency": users},
             overrides=[f"workload.num_requests={64 if SMALL else 256}", "workload.warmup_requests=0"],
             workers=WORKERS)
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
for setting, g in conc.groupby("setting", sort=False):
    axes[0].plot(g["workload.concurrency"], g["output_throughput"], "o-", label=setting)
    axes[1].plot(g["workload.concurrency"], g["median_ttft_ms"], "o-", label=setting)
for ax, label in zip(axes, ["output throughput (tok/s)", "median TTFT (ms)"]):
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency (closed-loop users)")
    ax.set_ylabel(label)
    ax.legend()
fig.suptitle(f"{base.name}: concurrency sweep")
fig.tight_layout()
plt.show()

# %%
pivot = conc.pivot(index="workload.concurrency", columns="setting",
                   values=["output_throughput", "median_ttft_ms"]).round(2)
pivot

# %% [markdown]
# Overlap raises throughput at every concurrency in this scenario. Its first tokens come
# slightly later (1.7 ms at one user): the host file prices the prefill's receive, scheduling,
# launch and processing about 0.9 ms dearer under the overlap loop than under the normal one
# (measured per loop), and a prefill's token reaches the user only after the next batch has been
# launched: that decode launch (about 0.5 ms of CPU) comes after the prefill's own launch, which
# the prefill's forward (2.9 ms) runs under (the device runs an eager prefill's kernels as they
# are queued), so nothing hides it. TTFT is dominated by the prefill's own launch (9.6 ms of CPU
# on this host), mostly calibrate's plain-torch model standing in for SGLang's: the verdict says
# how far TTFT moves without it.

# %%
low = conc[conc["workload.concurrency"] == users[0]].set_index("setting")
print(f"at {users[0]} user(s): median TTFT overlap {low.loc['overlap', 'median_ttft_ms']:.2f} ms, "
      f"normal {low.loc['normal', 'median_ttft_ms']:.2f} ms")
assert (conc.pivot(index="workload.concurrency", columns="setting", values="output_throughput")
        .eval("overlap >= normal").all())
