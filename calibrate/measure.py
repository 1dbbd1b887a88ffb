"""Run a calibration: measure every grid point, append raw samples to a sidecar file as they are
measured (an interrupted run resumes from it), fit the curves and write the profile atomically.

The sidecar is ``<out>.samples.jsonl`` (:mod:`calibrate.sidecar`): a header line with the run's
identity, then one line per measured point. A rerun with the same settings skips the points already there; a rerun with
other settings refuses to mix them (``--fresh`` starts over). It is deleted once the profile is
written. torch and MLX are imported only when their backend is created.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from calibrate.bookkeeping.bench import BookkeepingBench
from calibrate.bookkeeping.bookkeeper import Bookkeeper, DecodeBatch, ExtendBatch
from calibrate.bookkeeping.requests import Req
from calibrate.config import YARDSTICK_BATCH_SIZES, CalibrationConfig
from calibrate.errors import CalibrationInputError
from calibrate.profile import build_profile, save_profile
from calibrate.sidecar import Sidecar, sidecar_path
from calibrate.sizing import DECODE_ROW_PAD, KV_MEMORY_SHARE, MEMORY_SHARE, host_memory_bytes

MAX_SPREAD, RETRIES = 0.25, 2  # re-measure a forward point whose samples spread more than this


@dataclass(frozen=True)
class Task:
    """One grid point: ``kind`` is 'decode', 'extend' or 'bookkeeping'; ``a``/``b`` its coordinates."""

    kind: str
    a: int
    b: int = 0

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.a}:{self.b}"

    def label(self) -> str:
        return {"decode": f"decode batch {self.a} x ctx {self.b}", "extend": f"extend {self.a} tokens after {self.b}",
                "bookkeeping": f"CPU bookkeeping, batch {self.a}"}[self.kind]


def plan(cfg: CalibrationConfig) -> list[Task]:
    """Every point of the grid, forwards first (decode, extend), then the CPU bookkeeping."""
    g = cfg.grid
    tasks = [Task("decode", bs, ctx) for bs in g.decode_batch_sizes for ctx in g.decode_contexts]
    tasks += [Task("extend", t, p) for t in g.extend_tokens for p in g.extend_prefixes]
    tasks += [Task("bookkeeping", n) for n in (0,) + g.bookkeeping_batch_sizes]
    return tasks


def host_cpu() -> str:
    """The host CPU's model name (Linux /proc/cpuinfo, macOS sysctl, else platform)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine()


def make_backend(cfg: CalibrationConfig):
    """The torch or MLX backend (imports the framework here, not at module load).

    Raises:
        CalibrationInputError: the framework is not installed, or the device is not there.
    """
    try:
        if cfg.backend == "torch":
            from calibrate.forward.torch_backend import TorchBackend as cls
        else:
            from calibrate.forward.mlx_backend import MlxBackend as cls
    except ImportError as err:
        hint = "pip install 'mlx[cpu]' (Linux) or mlx (macOS)" if cfg.backend == "mlx" else "pip install torch"
        raise CalibrationInputError("--backend", "", f"{cfg.backend} needs {err.name or 'its package'}: {hint}") from None
    return cls(cfg)


def _out_of_memory(err: BaseException) -> bool:
    """A failed allocation: MemoryError, torch's OutOfMemoryError (CUDA), or MLX's / torch's
    RuntimeError saying so."""
    text = str(err).lower()
    return (isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError"
            or "out of memory" in text or "failed to allocate" in text)


def check_host_memory(cfg: CalibrationConfig) -> None:
    """On a CPU, the model's weights and the largest KV cache of the grid must fit in memory (an
    impossible shape or grid would otherwise be killed by the OS after minutes).

    Raises:
        CalibrationInputError: naming the flags that size them."""
    if cfg.device != "cpu":
        return  # device memory is checked against what the device reports, when the KV is allocated
    total = host_memory_bytes()
    if total is None:
        return
    g, shape = cfg.grid, cfg.shape
    dtype_bytes = 4 if cfg.resolved_dtype == "float32" else 2
    kv_tokens = max(max(g.decode_batch_sizes) * (max(g.decode_contexts) + DECODE_ROW_PAD), g.max_extend_ctx)
    need = shape.num_params * dtype_bytes + kv_tokens * shape.kv_bytes_per_token(dtype_bytes)
    if need > MEMORY_SHARE * total:
        raise CalibrationInputError("--model", "", f"{shape.name} with a KV cache of {kv_tokens} tokens needs "
                                    f"{need / 2**30:.1f} GiB but this machine has {total / 2**30:.1f} GiB; pass a "
                                    "smaller shape (--layers/--hidden/--vocab/...) or grid (--batch-sizes/--contexts/"
                                    "--extend-tokens/--prefixes)")


class Measurer:
    """Measures tasks with one backend, one model and one bookkeeping bench (created lazily)."""

    def __init__(self, cfg: CalibrationConfig, backend):
        self.cfg, self.backend = cfg, backend
        self.rng = np.random.default_rng(cfg.seed)
        self._model = None
        self._kv_for = None
        self._bench = None

    def _model_with_kv(self, kind: str):
        if self._model is None:
            self._model = self.backend.create_model(self.cfg.shape)
        g = self.cfg.grid
        # decode rows are longer than the longest context, so every point gathers a part of a
        # row, as a serving loop does
        slots, ctx = ((max(g.decode_batch_sizes), max(g.decode_contexts) + DECODE_ROW_PAD) if kind == "decode"
                      else (1, g.max_extend_ctx))
        pool = slots * ctx
        if kind == "extend" and g.extend_request_tokens:  # several requests sharing one cached prefix
            slots = -(-max(g.extend_tokens) // g.extend_request_tokens)
            ctx = max(g.extend_prefixes) + min(g.extend_request_tokens, max(g.extend_tokens))
            pool = max(g.extend_prefixes) + max(g.extend_tokens)
        if self._kv_for != (slots, ctx):
            self._check_memory(pool)
            self._model.allocate_kv(slots, ctx, pool)
            self._kv_for = (slots, ctx)
        return self._model

    def _check_memory(self, tokens: int) -> None:
        free = self.backend.free_bytes()
        dtype_bytes = 4 if self.cfg.resolved_dtype == "float32" else 2
        need = tokens * self.cfg.shape.kv_bytes_per_token(dtype_bytes)
        if free is not None and need > KV_MEMORY_SHARE * free:
            raise CalibrationInputError("calibration grid", "", f"a KV pool of {tokens} tokens "
                                        f"needs {need / 2**30:.1f} GiB but {free / 2**30:.1f} GiB are free; pass "
                                        "smaller --batch-sizes / --contexts / --extend-tokens / --prefixes")

    def _tokens(self, n: int) -> list[int]:
        return self.rng.integers(0, self.cfg.shape.vocab, n).tolist()

    @staticmethod
    def _steadiest(measure_once) -> tuple[list[float], ...]:
        """Measure a forward point; while its samples spread widely (interquartile range over
        MAX_SPREAD of the median: another process took the CPU), measure it again, at most
        RETRIES more times, and keep the steadiest attempt."""
        best, best_spread = None, math.inf
        for _ in range(1 + RETRIES):
            res = measure_once()  # (forward, launch[, submit]) samples
            q = np.percentile(res[0], [25, 50, 75])
            spread = (q[2] - q[0]) / q[1] if q[1] > 0 else 0.0
            if spread < best_spread:
                best, best_spread = tuple(res), spread
            if spread <= MAX_SPREAD:
                break
        return best

    def run(self, task: Task) -> list[dict]:
        """Measure one task; returns its sample records (curve, point, times_s)."""
        g = self.cfg.grid
        if task.kind == "decode":
            bs, ctx = task.a, task.b
            model = self._model_with_kv("decode")
            row = model.max_ctx  # request i owns pool slots 1 + i*row ... (contiguous, as after a prefill)
            for i in range(bs):
                model.set_req_to_token(i, 0, 1 + i * row + np.arange(ctx, dtype=np.int64))
            reqs = [Req(f"d{i}", self._tokens(ctx), 1 << 30, req_slot=i) for i in range(bs)]
            batch = DecodeBatch(reqs, 1 + np.arange(bs, dtype=np.int64) * row + ctx - 1)
            res = self._steadiest(lambda: self.backend.measure_decode(
                model, lambda: Bookkeeper.decode_inputs(batch), bs, ctx, g.warmup, g.repeats))
            out = [{"curve": "forward.decode", "point": {"num_reqs": bs, "ctx": ctx}, "times_s": res[0]},
                   {"curve": "launch.decode", "point": {"num_reqs": bs}, "times_s": res[1]}]
            if len(res) > 2:  # how long the submission blocked the host (MLX)
                out.append({"curve": "submit.decode", "point": {"num_reqs": bs, "ctx": ctx}, "times_s": res[2]})
            return out
        if task.kind == "extend":
            tokens, prefix = task.a, task.b
            per = g.extend_request_tokens or tokens
            sizes = [min(per, tokens - k) for k in range(0, tokens, per)]
            shared = np.arange(1, prefix + 1, dtype=np.int64)  # the cached prefix, shared through the radix cache
            reqs = [Req(f"e{i}", self._tokens(prefix + e), 1 << 30, req_slot=i, prefix_indices=shared)
                    for i, e in enumerate(sizes)]
            batch = ExtendBatch(reqs, [prefix] * len(sizes), sizes,
                                np.arange(prefix + 1, prefix + tokens + 1, dtype=np.int64))
            model = self._model_with_kv("extend")
            res = self._steadiest(lambda: self.backend.measure_extend(
                model, lambda: Bookkeeper.extend_inputs(batch), g.warmup, g.repeats))
            out = [{"curve": "forward.extend", "point": {"num_tokens": tokens, "prefix": prefix}, "times_s": res[0]},
                   {"curve": "launch.extend", "point": {"num_tokens": tokens}, "times_s": res[1]}]
            if len(res) > 2:
                out.append({"curve": "submit.extend", "point": {"num_tokens": tokens, "prefix": prefix},
                            "times_s": res[2]})
            return out
        if self._bench is None:
            self._bench = BookkeepingBench(bench_max_batch(g.bookkeeping_batch_sizes), seed=self.cfg.seed,
                                           workload=self.cfg.bookkeeping)
        out = self._bench.measure(task.a, g.warmup, g.repeats)
        return [{"curve": name, "point": {"num_reqs": task.a}, "times_s": times} for name, times in out.items()]


def merge_samples(records: list[dict]) -> list[dict]:
    """One record per (curve, point), samples of repeated points (e.g. launch.decode measured at
    every context) pooled."""
    merged: dict[tuple, dict] = {}
    for r in records:
        key = (r["curve"], tuple(sorted(r["point"].items())))
        if key in merged:
            merged[key]["times_s"] = merged[key]["times_s"] + r["times_s"]
        else:
            merged[key] = {"curve": r["curve"], "point": dict(r["point"]), "times_s": list(r["times_s"])}
    return list(merged.values())


def bench_max_batch(batch_sizes) -> int:
    """The requests the bookkeeping bench is sized for (its KV pool and request slots): the grid's
    largest batch size, and at least the host yardstick's (:data:`calibrate.config.YARDSTICK_BATCH_SIZES`),
    so that the samples a GPU or Mac calibration writes, which ``overlap-sim compose`` reads as that
    host's yardstick, time the same work as the yardstick a host calibration times beside its runs
    (the pool's size moves some points: on this project's VM a bench of 128 costs 0.80-1.02x one of
    256, point by point; calibrations before 5 December 2026 sized it by the grid alone)."""
    return max(*batch_sizes, *YARDSTICK_BATCH_SIZES)


def metadata(cfg: CalibrationConfig, described: dict, command: str) -> dict:
    """The profile's metadata object."""
    import tokenizers

    from calibrate.bookkeeping import version

    libs = {"python": platform.python_version(), "tokenizers": tokenizers.__version__, **described.pop("libraries")}
    return {"backend": cfg.backend, "device": cfg.device, "device_name": described.pop("device_name"),
            "host_cpu": host_cpu(), "host_cores": os.cpu_count(), "platform": platform.platform(),
            "libraries": libs, "model": cfg.shape.to_dict(), "params": cfg.shape.num_params,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "grid": cfg.grid.to_dict(),
            "repeats": cfg.grid.repeats, "warmup": cfg.grid.warmup, "quick": cfg.quick, "seed": cfg.seed,
            "note": cfg.note, "command": command, "yardstick_version": version(),
            "bookkeeping_bench_max_batch": bench_max_batch(cfg.grid.bookkeeping_batch_sizes),
            "timing": _TIMING[cfg.backend if cfg.device == "cpu" else cfg.device],
            "curve_sources": harness_curve_sources(cfg.backend, cfg.device), **described}


# what times each host curve of a torch/MLX calibration (calibrate.bookkeeping.bench.BookkeepingBench)
HARNESS_FUNCTIONS = {"recv": "Bookkeeper.recv", "schedule.extend": "Bookkeeper.schedule_extend",
                     "schedule.decode": "Bookkeeper.schedule_decode", "process.extend": "Bookkeeper.process_extend",
                     "process.decode": "Bookkeeper.process_decode"}


def harness_curve_sources(backend: str, device: str) -> dict:
    """``metadata.curve_sources`` of a torch/MLX calibration: the forward and the launch measured
    on the device; the host curves the project's re-implementation (:mod:`calibrate.bookkeeping`),
    which prices this project's own harness (that runs this code), and no engine: a card's or a
    Mac's answer joins the forward to an engine's host costs (``overlap-sim compose``)."""
    why = ("the project's re-implementation of the scheduler (calibrate.bookkeeping): it prices this project's own "
           "harness, which runs it; for an engine on this device, overlap-sim compose joins the forward to the "
           "engine's own host costs (calibrate --engine sglang --host-only)")
    out = {name: {"source": "re-implementation", "function": f"calibrate.bookkeeping.{fn}", "why": why}
           for name, fn in HARNESS_FUNCTIONS.items()}
    for name in ("forward.decode", "forward.extend", "launch.decode", "launch.extend"):
        out[name] = {"source": "measured", "device": f"{backend} {device}",
                     "function": "the harness's forward + argmax + copy back" if name.startswith("forward")
                     else "the harness's input building and kernel launch (calibrate.harness)"}
    return out


_TIMING = {
    "torch": "forward: perf_counter around forward + argmax + tolist; launch: building the inputs",
    "mlx": "forward: perf_counter from mx.async_eval to tolist after an mx.eval barrier; launch: inputs + "
           "lazy graph",
    "cuda": "forward: CUDA events around inputs copy + forward + argmax + device-to-host copy (stream held "
            "until queued); launch: perf_counter CPU time to queue the step",
    "gpu": "forward: perf_counter from mx.async_eval to tolist after an mx.eval barrier; launch: inputs + "
           "lazy graph",
}


POINT_ATTEMPTS = 3


def calibrate(cfg: CalibrationConfig, out: Path, *, fresh: bool = False,
              report: Callable[[int, int, str], None] | None = None, command: str = "", backend=None,
              steady: Callable[[], bool] | None = None) -> dict:
    """Measure ``cfg``'s grid (resuming from ``out``'s sidecar), write the profile to ``out``.

    Args:
        report: called as ``report(done, total, label)`` before each point is measured and
            once at the end with ``label == ""`` (progress display).
        backend: the timing backend (default: :func:`make_backend` of ``cfg``); the harness's
            validation passes one that times its device process
            (:class:`calibrate.harness.process_backend.ProcessTorchBackend`).
        steady: called after each point; False (the machine was slowed down meanwhile, e.g. by
            another guest of a virtual machine) measures the point again, at most
            ``POINT_ATTEMPTS`` times in all (the last attempt is kept).

    Returns:
        The profile written.

    Raises:
        CalibrationInputError: missing framework or device, a model or grid too large for the
            device or the host's memory (checked first, or found out of memory at a point), a
            sidecar of another calibration. A run that fails before its first point leaves no
            sidecar behind (a corrected rerun starts clean).
    """
    out = Path(out)
    backend = backend or make_backend(cfg)  # a missing framework or device fails before any file is written
    check_host_memory(cfg)
    sidecar = Sidecar(sidecar_path(out), cfg.identity(), fresh)
    tasks = plan(cfg)
    measurer = Measurer(cfg, backend)
    done = sum(t.key in sidecar.done for t in tasks)
    try:
        for task in tasks:
            if task.key in sidecar.done:
                continue
            if report is not None:
                report(done, len(tasks), task.label())
            for _ in range(POINT_ATTEMPTS):
                try:
                    samples = measurer.run(task)
                except (MemoryError, RuntimeError) as err:
                    if not _out_of_memory(err):
                        raise
                    raise CalibrationInputError("calibration grid", "", f"out of {cfg.device} memory at "
                                                f"{task.label()} ({' '.join(str(err).split())[:120]}); pass a "
                                                "smaller --model shape or --batch-sizes / --contexts / "
                                                "--extend-tokens") from None
                if steady is None or steady():
                    break
            sidecar.append(task, samples)
            done += 1
    except BaseException:
        if not sidecar.done:  # nothing measured: leave no file that would block a corrected retry
            sidecar.path.unlink(missing_ok=True)
        raise
    if report is not None:
        report(done, len(tasks), "")
    records = [s for t in tasks for s in sidecar.done[t.key]]
    profile = build_profile(metadata(cfg, backend.describe(), command), merge_samples(records))
    save_profile(out, profile)
    sidecar.path.unlink(missing_ok=True)
    return profile
