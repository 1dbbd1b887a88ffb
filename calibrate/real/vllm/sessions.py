"""What a vLLM calibration runs on the real server: the grid (:class:`VllmGrid`), the loads of
a session (:func:`design`; the drafting and constrained sessions' in
:mod:`calibrate.real.vllm.speculative` and :mod:`calibrate.real.vllm.structured`), the server's
arguments and environment (tensor parallelism: :func:`tp_bind`), and the sessions themselves,
each run once and reused while its spec is unchanged (:func:`run_session`). What is priced from
their traces, and why the loads are shaped as they are: :mod:`calibrate.real.vllm.profile`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from calibrate.real.environment import Engine, may_renice, run_module, run_probed, tp_bind  # noqa: F401 (re-exported)
from calibrate.real.jobs import Prompts, request
from calibrate.real.vllm import speculative as vllm_speculative, structured as vllm_structured

SESSION_TIMEOUT_S = 3600
BLOCK_SIZE = 128  # vllm/platforms/cpu.py: the CPU platform's default block size
# a prefill group's blocker: long enough that the group's requests all reach the engine core
# during its prefill (about 60 ms here, against about 1 ms per request through the API server),
# and a token count no prefill point uses, so its step prices nothing
BLOCKER_TOKENS = 384


@dataclass(frozen=True)
class VllmGrid:
    """What to measure (tokens)."""

    decode_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    contexts: tuple[int, ...] = (128, 256, 512, 768)
    # 1536: a multiple of every context (so each is N / C whole prompts), inside the server's
    # 2048-token step budget: the validation's bursts prefill 900-2000 tokens in one step
    prefill_tokens: tuple[int, ...] = (128, 256, 512, 1536)
    decode_steps: int = 32
    waves: int = 2
    prefill_repeats: int = 5
    shared_batch_sizes: tuple[int, ...] = (4, 8, 16)
    max_num_seqs: int = 16
    max_model_len: int = 1024
    seed: int = 0
    # the drafting and constrained sessions' load generator (--feature-client): ``own`` (this
    # project's client, token-id prompts) or ``engine`` (vLLM's own benchmark client, text
    # prompts), at niceness ``feature_client_nice``: a 2-core host shares its cores with the
    # client, and a phase measured under one client is priced under another
    feature_client: str = "own"
    feature_client_nice: int = 0
    tensor_parallel_size: int = 1  # --tensor-parallel-size: that many workers, each on its own cores

    def server_args(self) -> list[str]:
        return ["--max-model-len", str(self.max_model_len), "--max-num-seqs", str(self.max_num_seqs),
                *tp_launch(self.tensor_parallel_size)[0]]

    def server_env(self) -> dict:
        """The server's environment for this grid (:func:`tp_launch`)."""
        return tp_launch(self.tensor_parallel_size)[1]


def tp_launch(tp: int) -> tuple[list[str], dict]:
    """(server arguments, environment) of a vLLM CPU server at tensor-parallel size ``tp``:
    ``--tensor-parallel-size`` and ``VLLM_CPU_OMP_THREADS_BIND`` (:func:`tp_bind`); none at 1."""
    if tp <= 1:
        return [], {}
    return ["--tensor-parallel-size", str(tp)], {"VLLM_CPU_OMP_THREADS_BIND": tp_bind(tp)}


def check_feature_client_nice(nice: int) -> int:
    """``nice`` as :attr:`VllmGrid.feature_client_nice`: -20..19, below 0 only where this process
    may raise its priority (root, or a soft ``RLIMIT_NICE`` that reaches it).

    Raises:
        CalibrationInputError: naming ``--feature-client-nice``.
    """
    from calibrate.errors import CalibrationInputError

    if not -20 <= nice <= 19:
        raise CalibrationInputError("--feature-client-nice", "", f"a niceness from -20 to 19 (got {nice})")
    if not may_renice(nice):
        raise CalibrationInputError("--feature-client-nice", "", f"niceness {nice} needs root or a soft RLIMIT_NICE "
                                    "that reaches it")
    return nice


SHARED_PREFIX_TOKENS = 384  # the shared-prefix loads: 3 whole blocks of 128 that every request holds
SHARED_LOAD = "shared-"  # their name (and their requests' ids) start with this


def design(grid: VllmGrid) -> list[dict]:
    """The loads of one calibration session (``realengines.server``'s ``loads``)."""
    prompts = Prompts(grid.seed)
    loads = []
    for c in grid.contexts:
        for b in grid.decode_batch_sizes:
            reqs = [request(f"d{b}x{c}-{i}", prompts.new(c - grid.decode_steps // 2), grid.decode_steps)
                    for i in range(b * grid.waves)]
            loads.append({"name": f"decode-b{b}-c{c}", "concurrency": b, "warmup_requests": 0, "requests": reqs})
    for n in grid.prefill_tokens:
        for c in grid.contexts:
            name = f"prefill-n{n}-c{c}"
            if c <= n:
                k = n // c
                if k == 1:
                    reqs = [request(f"{name}-{i}", prompts.new(c), 1) for i in range(grid.prefill_repeats)]
                    loads.append({"name": name, "concurrency": 1, "warmup_requests": 0, "requests": reqs})
                    continue
                # per repeat: the blocker, then the group (the clients send in list order; the
                # blocker ends first, so the next blocker goes out while the group is prefilled)
                reqs = [r for i in range(grid.prefill_repeats)
                        for r in [request(f"{name}-b{i}", prompts.new(BLOCKER_TOKENS), 1)]
                        + [request(f"{name}-{i}-{j}", prompts.new(c), 1) for j in range(k)]]
                loads.append({"name": name, "concurrency": k + 1, "warmup_requests": 0, "requests": reqs})
            elif (c - n) % BLOCK_SIZE == 0:
                shared = prompts.new(c - n)
                reqs = [request(f"{name}-w", shared + prompts.new(BLOCK_SIZE), 1)]
                reqs += [request(f"{name}-{i}", shared + prompts.new(n), 1) for i in range(grid.prefill_repeats)]
                loads.append({"name": name, "concurrency": 1, "warmup_requests": 1, "requests": reqs})
    # decode waves whose B requests share a cached prefix (a warm-up request puts it in the
    # prefix cache): the forward against distinct contexts of the same length (the grid's 512)
    shared_ctx = 512 if 512 in grid.contexts else max(grid.contexts)
    if shared_ctx - grid.decode_steps // 2 > SHARED_PREFIX_TOKENS:
        for b in grid.shared_batch_sizes:
            name = f"{SHARED_LOAD}b{b}"
            prefix = prompts.new(SHARED_PREFIX_TOKENS)
            private = shared_ctx - grid.decode_steps // 2 - SHARED_PREFIX_TOKENS
            reqs = [request(f"{name}-w", prefix + prompts.new(BLOCK_SIZE), 1)]
            reqs += [request(f"{name}-{i}", prefix + prompts.new(private), grid.decode_steps)
                     for i in range(b * grid.waves)]
            loads.append({"name": name, "concurrency": b, "warmup_requests": 1, "requests": reqs})
    return loads


def run_session(engine: Engine, model_dir: Path, grid: VllmGrid, setting: str, folder: Path,
                report: Callable[[str], None], name: str | None = None, loads: list[dict] | None = None,
                env: dict | None = None, extra_args: list[str] | None = None, client_nice: int = 0) -> Path:
    """Run (or reuse a finished) calibration session of ``setting`` in ``folder/name`` (``name``:
    the setting by default) with ``loads`` (default :func:`design`), ``env`` set in the server's
    environment (``realengines.server``), ``extra_args`` after the grid's server arguments and
    the load generator at niceness ``client_nice``; returns its folder."""
    name = name or setting
    out = folder / name
    spec = {"engine": "vllm", "model_dir": str(model_dir), "setting": setting, "port": 30300,
            "server_args": grid.server_args() + list(extra_args or ()), "trace": True, "ready_timeout_s": 900,
            "loads": design(grid) if loads is None else loads, "pause_between_loads_s": 1.0}
    if env or grid.server_env():
        spec["env"] = {**grid.server_env(), **(env or {})}
    if client_nice:
        spec["client_nice"] = client_nice
    spec_path = folder / f"{name}.json"
    text = json.dumps(spec)
    if (out / "session.json").exists() and spec_path.exists() and spec_path.read_text() == text:
        report(f"{name}: reusing {out}")
        return out
    folder.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(text)
    if out.exists():
        for old in out.glob("*"):
            old.unlink()
    report(f"{name}: real vLLM server ({setting}), {len(spec['loads'])} loads")
    run_probed(engine, folder / f"{name}.hostspeed.json",
               lambda: run_module(engine, "realengines.server", [str(spec_path), str(out)],
                                  folder / f"{name}.log", timeout_s=SESSION_TIMEOUT_S))
    return out


def run_speculative_session(engine: Engine, model_dir: Path, grid: VllmGrid, setting: str, folder: Path,
                            report: Callable[[str], None], name: str, speculative: dict,
                            client_nice: int = 0) -> Path:
    """Run (or reuse) the speculative session beside the plain session ``name``
    (:mod:`calibrate.real.vllm.speculative`): ``folder/spec-<name>``."""
    loads = vllm_speculative.design(grid.decode_batch_sizes, grid.decode_steps, grid.waves, grid.seed,
                                    grid.feature_client)
    return run_session(engine, model_dir, grid, setting, folder, report, f"{vllm_speculative.SPEC_LOAD}{name}",
                       loads=loads, extra_args=vllm_speculative.speculative_args(speculative),
                       client_nice=client_nice or grid.feature_client_nice)


def run_structured_session(engine: Engine, model_dir: Path, grid: VllmGrid, setting: str, folder: Path,
                           report: Callable[[str], None], name: str) -> Path:
    """Run (or reuse) the structured-output session beside the plain session ``name``
    (:mod:`calibrate.real.vllm.structured`): ``folder/grammar-<name>``."""
    loads = vllm_structured.design(grid.decode_batch_sizes, grid.decode_steps, grid.waves, grid.seed,
                                   grid.feature_client)
    return run_session(engine, model_dir, grid, setting, folder, report, f"{vllm_structured.GRAMMAR_LOAD}{name}",
                       loads=loads, client_nice=grid.feature_client_nice)
