"""The loads and launch flags of the validation against a real server (:mod:`calibrate.real.validate`):
the default grid (closed loops of the project's own token-id client), the held-out grid (loads the
calibration never ran, closed and open, sent by each engine's own benchmark client), the
speculative-decoding grid, each engine's settings and flags, and the load generator's niceness per
grid.
"""

from __future__ import annotations

from dataclasses import replace

from calibrate.real.jobs import Workload

SERVER_ARGS = ("--context-length", "2048", "--max-running-requests", "16", "--mem-fraction-static", "0.05")
VLLM_SERVER_ARGS = ("--max-model-len", "1024", "--max-num-seqs", "16")
# engine -> (settings, launch flags): the setting that hides CPU work first
ENGINE_PLANS = {"sglang": (("overlap", "normal"), SERVER_ARGS), "vllm": (("async", "sync"), VLLM_SERVER_ARGS)}
CONFIGS = (
    Workload("c4-len", num_requests=36, warmup_requests=4, concurrency=4, input_len=(128, 128), output_len=(128, 128)),
    Workload("c8-len", num_requests=48, warmup_requests=8, concurrency=8, input_len=(128, 128), output_len=(128, 128)),
    Workload("c16-len", num_requests=64, warmup_requests=16, concurrency=16, input_len=(128, 128),
             output_len=(96, 96)),
    Workload("c8-mixed", num_requests=48, warmup_requests=8, concurrency=8, input_len=(32, 512), output_len=(16, 192),
             seed=1),
    Workload("c8-stop", num_requests=48, warmup_requests=8, concurrency=8, input_len=(64, 256), output_len=(32, 256),
             stop=True, seed=2),
    Workload("c8-prefix", num_requests=48, warmup_requests=8, concurrency=8, input_len=(16, 64), output_len=(64, 64),
             shared_prefix=512, seed=3),
)
# Loads the calibration never ran, sent by the engine's own benchmark client (random text prompts:
# the API server tokenizes them), closed loops of other shapes and open loops below, near and past
# the server's saturation, Poisson and bursty: the validation held out from the calibration's
# designed loads (decode waves of 1-16 requests at fixed contexts, prefill groups). The lengths are
# uniform with one range ratio for input and output (both benchmarks). SGLang's benchmark (0.5.23)
# draws only Poisson arrivals: for SGLang the gamma load is sent by the own client
# (:data:`ENGINE_CLIENT_BURSTY`, :meth:`Plan.for_engine`).
HELDOUT = (
    Workload("c2-256x64", num_requests=42, warmup_requests=2, concurrency=2, input_len=(256, 256),
             output_len=(64, 64), client="engine", seed=21),
    Workload("c12-128x128", num_requests=62, warmup_requests=2, concurrency=12, input_len=(128, 128),
             output_len=(128, 128), client="engine", seed=22),
    Workload("c6-512x32", num_requests=50, warmup_requests=2, concurrency=6, input_len=(512, 512),
             output_len=(32, 32), client="engine", seed=23),
    Workload("c16-96x160", num_requests=66, warmup_requests=2, concurrency=16, input_len=(72, 120),
             output_len=(120, 200), client="engine", seed=24),
    Workload("p8-64x96", num_requests=66, warmup_requests=2, concurrency=0, rate_per_s=8.0, input_len=(64, 64),
             output_len=(96, 96), client="engine", seed=25),
    Workload("p20-64x96", num_requests=162, warmup_requests=2, concurrency=0, rate_per_s=20.0, input_len=(64, 64),
             output_len=(96, 96), client="engine", seed=26),
    Workload("p40-128x64", num_requests=202, warmup_requests=2, concurrency=0, rate_per_s=40.0,
             input_len=(128, 128), output_len=(64, 64), client="engine", seed=27),
    Workload("g12-128x96", num_requests=98, warmup_requests=2, concurrency=0, rate_per_s=12.0, burstiness=0.25,
             input_len=(128, 128), output_len=(96, 96), client="engine", seed=28),
)
# Loads for speculative decoding (vLLM's own client): a closed loop below and one at the
# running-request cap, and a Poisson open loop; run with ``Plan.speculative``. The first load
# warms up with six requests: the first speculative steps of a session were seconds slow (its
# drafter's first shapes), measured in a probe of 4 December 2026
SPECULATIVE = (
    Workload("c4-128x128", num_requests=38, warmup_requests=6, concurrency=4, input_len=(128, 128),
             output_len=(128, 128), client="engine", seed=31),
    Workload("c16-96x160", num_requests=50, warmup_requests=2, concurrency=16, input_len=(72, 120),
             output_len=(120, 200), client="engine", seed=32),
    Workload("p10-64x96", num_requests=82, warmup_requests=2, concurrency=0, rate_per_s=10.0, input_len=(64, 64),
             output_len=(96, 96), client="engine", seed=33),
)
# Loads for structured output: the speculative grid's loads (vLLM's own client), each request
# constrained to the JSON schema calibrate.real.jobs.JSON_SCHEMA (through --extra-body), seeds 41-43
STRUCTURED = tuple(replace(c, name=f"{c.name}-json", seed=c.seed + 10, grammar="json_schema") for c in SPECULATIVE)
# Loads for tensor parallelism (run with --tensor-parallel-size): the speculative grid's loads,
# plain, seeds 51-53
TENSOR_PARALLEL = tuple(replace(c, name=f"{c.name}-tp", seed=c.seed + 20) for c in SPECULATIVE)
GRIDS = {"default": CONFIGS, "heldout": HELDOUT, "speculative": SPECULATIVE, "structured": STRUCTURED,
         "tp": TENSOR_PARALLEL}
# engine -> whether its benchmark client draws gamma (bursty) arrivals: vLLM's ``--burstiness``;
# SGLang 0.5.23's ``get_request`` draws exponential gaps only
ENGINE_CLIENT_BURSTY = {"vllm": True, "sglang": False}
# The load generator's niceness per grid (realengines.server, ``client_nice``). The held-out loads
# run the client ten steps more favoured: on this project's 2-vCPU VM the vLLM worker is pinned to
# one core and busy-waits there, the engine core busy-waits on the other, and a client at the same
# priority was found starved for up to seconds (its open-loop sends late by up to 1.4 s, tokens read
# in bursts while the API server had processed each step's output on time): the load generator then
# measures itself. The default grid keeps its recorded conditions (0).
CLIENT_NICE = {"default": 0, "heldout": -10, "speculative": -10, "structured": -10, "tp": -10}
