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
# The overlap scheduler hides the scheduler's CPU work (recv, schedule, launch, process) behind
# the next forward pass. How much that buys depends on how long each side takes. This notebook
# sweeps the CPU time and the GPU time of the seed document's benchmark (closed loop, 8 users,
# 512-token prompts with 511 cached, 256 output tokens) and then the number of users, under
# `overlap` and `normal`.
#
# Set `OVERLAP_SIM_NOTEBOOK_SMALL=1` for a quick run (the tests do).

# %%
import os
from pathlib import Path

import matplotlib.pyplot as plt

import sim
from sim.whatif.plots import ratio_heatmap
from sim.whatif.sweeps import sweep
from sim.whatif.variance import paired_ratios

# %matplotlib inline
SMALL = os.environ.get("OVERLAP_SIM_NOTEBOOK_SMALL") == "1"
ROOT = Path.cwd() if (Path.cwd() / "scenarios").is_dir() else Path.cwd().parent
WORKERS = 1 if SMALL else None  # None: one process per core
# the closed form below needs linear costs: drop the quickstart's measured profile for the
# schema's default inline terms (the simulator core's original quickstart costs)
base = sim.load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                         ["costs.profile=null"] + (["workload.num_requests=24", "workload.output_len=64"] if SMALL else []))
print(base.name, base.workload.num_requests, "requests,", base.workload.output_len, "output tokens each")

# %% [markdown]
# ## CPU time x GPU time
#
# `costs.cpu.scale` multiplies every CPU phase (a slower or faster host, a heavier Python
# scheduler); `costs.gpu.scale` multiplies every forward (a slower or faster card, a bigger or
# smaller model). At scale 1 a decode step costs about 4.2 ms on the device and 0.76 ms of CPU.

# %%
cpu_scales = [0.02, 0.1, 0.5, 2, 8] if SMALL else [0.01, 0.03, 0.1, 0.3, 1, 2, 4, 8]
gpu_scales = [0.25, 1, 4] if SMALL else [0.125, 0.25, 0.5, 1, 2, 4]
grid = {"costs.cpu.scale": cpu_scales, "costs.gpu.scale": gpu_scales}
table = sweep(base, grid, workers=WORKERS)
table[["costs.cpu.scale", "costs.gpu.scale", "setting", "output_throughput", "median_ttft_ms", "mean_gap_ms"]].head(8)

# %% [markdown]
# The heatmap shows overlap/normal output throughput. Above 1 overlap wins. The black line is
# the break-even: where the CPU work per step is as small as the overlap loop's own device-side
# residue (the FutureMap resolve and event record, `costs.gpu.overlap_residue`), overlap stops
# paying.

# %%
fig = ratio_heatmap(table, "costs.cpu.scale", "costs.gpu.scale", base.name)
plt.show()

# %% [markdown]
# A closed form explains the picture. With constant costs the normal loop's decode step is
# T_cpu + T_gpu; the overlap loop's is max(T_gpu + residue, T_cpu). Their ratio is the
# throughput gain in steady decode: the simulation should agree with it wherever decode
# dominates.

# %%
ratios = paired_ratios(table, "output_throughput")
decode = base.costs.gpu.decode
cpu = base.costs.cpu
bs = base.workload.concurrency
ctx = bs * (base.workload.input_len + base.workload.output_len / 2)
t_gpu = decode.base + decode.per_req * bs + decode.per_ctx_token * ctx
t_cpu = sum(t.base + t.per_req * bs for t in (cpu.recv, cpu.schedule, cpu.launch, cpu.process))
res = base.costs.gpu.overlap_residue
ratios["closed_form"] = [
    (c * t_cpu + g * t_gpu) / max(g * (t_gpu + res), c * t_cpu)
    for c, g in zip(ratios["costs.cpu.scale"], ratios["costs.gpu.scale"])]
ratios["error"] = ratios["ratio"] / ratios["closed_form"] - 1
print(f"T_gpu = {t_gpu * 1e3:.2f} ms, T_cpu = {t_cpu * 1e3:.3f} ms per decode step at scale 1")
print(f"simulated vs closed-form ratio: largest deviation {ratios['error'].abs().max():.1%}")
assert ratios["error"].abs().max() < 0.1, "the sweep should follow the steady-state closed form"
ratios.round(3).head(10)

# %% [markdown]
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
                   values=["output_throughput", "median_ttft_ms"]).round(1)
pivot

# %% [markdown]
# Overlap raises throughput at every concurrency in this scenario. Its first tokens come later
# at low concurrency: a prefill's token reaches the user only after the next batch has been
# launched, one step later than in the normal loop.

# %%
low = conc[conc["workload.concurrency"] == users[0]].set_index("setting")
print(f"at {users[0]} user(s): median TTFT overlap {low.loc['overlap', 'median_ttft_ms']:.2f} ms, "
      f"normal {low.loc['normal', 'median_ttft_ms']:.2f} ms")
assert (conc.pivot(index="workload.concurrency", columns="setting", values="output_throughput")
        .eval("overlap >= normal").all())
