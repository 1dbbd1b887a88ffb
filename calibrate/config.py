"""What a calibration measures: backend, device, model shape and the grid of points."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from calibrate.errors import CalibrationInputError
from calibrate.shapes import ModelShape

# the batch sizes of the host yardstick (calibrate.host.yardstick), which a calibration's bookkeeping bench
# is sized to hold too (calibrate.measure.bench_max_batch)
YARDSTICK_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)

BACKEND_DEVICES = {"torch": ("cpu", "cuda"), "mlx": ("cpu", "gpu")}
# the CUDA harness holds the stream (torch.cuda._sleep) before each timed step so the whole step is
# queued before its first event fires (calibrate.forward.torch_backend); the hold's cycles, and the
# clock they are counted at (H100/H200 boost ~1.98 GHz): 1 ms .. 30 ms
SLEEP_CLOCK_HZ = 2.0e9
SLEEP_MIN_CYCLES, SLEEP_MAX_CYCLES = 2_000_000, 60_000_000


@dataclass(frozen=True)
class Grid:
    """The measured points and how often each is timed.

    Attributes:
        decode_batch_sizes, decode_contexts: decode steps at every (batch size, context) pair;
            context = keys each request attends over (its tokens so far, the new one included).
        extend_tokens, extend_prefixes: one request's prefill of that many new tokens after
            that many cached prefix tokens, every pair.
        bookkeeping_batch_sizes: batch sizes of the CPU phases (``recv`` also at 0).
        warmup, repeats: untimed and timed runs per point.
        extend_request_tokens: 0 (default): each extend point is one request of that many new
            tokens; N > 0: the tokens are split into requests of N new tokens (a prefill batch of
            several prompts, as a serving loop runs them; each with the same cached prefix).
    """

    decode_batch_sizes: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    extend_tokens: tuple[int, ...]
    extend_prefixes: tuple[int, ...]
    bookkeeping_batch_sizes: tuple[int, ...]
    warmup: int
    repeats: int
    extend_request_tokens: int = 0


    def __post_init__(self):
        for f in ("decode_batch_sizes", "decode_contexts", "extend_tokens", "bookkeeping_batch_sizes"):
            v = getattr(self, f)
            if not v or any(x < 1 for x in v):
                raise CalibrationInputError("calibration grid", f, "a non-empty list of integers >= 1")
        if not self.extend_prefixes or any(x < 0 for x in self.extend_prefixes):
            raise CalibrationInputError("calibration grid", "extend_prefixes", "a non-empty list of integers >= 0")
        if self.repeats < 1 or self.warmup < 0:
            raise CalibrationInputError("calibration grid", "repeats", "repeats >= 1 and warmup >= 0")
        if self.extend_request_tokens < 0:
            raise CalibrationInputError("calibration grid", "extend_request_tokens", "an integer >= 0")
        for f in ("decode_batch_sizes", "decode_contexts", "extend_tokens", "extend_prefixes",
                  "bookkeeping_batch_sizes"):
            object.__setattr__(self, f, tuple(sorted(set(getattr(self, f)))))

    @property
    def max_extend_ctx(self) -> int:
        return max(self.extend_tokens) + max(self.extend_prefixes)

    def to_dict(self) -> dict:
        out = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}
        if not self.extend_request_tokens:
            del out["extend_request_tokens"]  # (profiles and sidecars written before it existed match)
        return out


@dataclass(frozen=True)
class BenchWorkload:
    """The requests the CPU bookkeeping is timed on (:class:`calibrate.bookkeeping.bench.BookkeepingBench`).

    The defaults are a chat workload: prompts of ``system_len`` tokens of one of
    ``system_prompts`` shared system prompts (radix-cache hits) plus ``user_len`` tokens of
    text, outputs of ``output_lo``..``output_hi`` tokens, ``stop_strs`` checked on the text, a
    tokenizer of ``vocab`` tokens. A validation sets them to the workload it serves.
    """

    system_prompts: int = 16
    system_len: int = 384
    user_len: int = 128
    output_lo: int = 128
    output_hi: int = 384
    stop_strs: tuple[str, ...] = ("\n\nUser:", "<|end|>")
    vocab: int = 8192

    def __post_init__(self):
        if self.system_prompts < 1 or self.system_len < 0 or self.user_len < 1 or not 1 <= self.output_lo <= self.output_hi:
            raise CalibrationInputError("bookkeeping workload", "", "system_prompts >= 1, system_len >= 0, "
                                        "user_len >= 1, 1 <= output_lo <= output_hi")
        object.__setattr__(self, "stop_strs", tuple(self.stop_strs))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["stop_strs"] = list(self.stop_strs)
        return d


QUICK = Grid((1, 4, 16), (64, 256, 1024), (1, 32, 256), (0, 512), (1, 8, 32), warmup=1, repeats=5)
FULL_CPU = Grid((1, 2, 4, 8, 16, 32, 64), (128, 512, 1024, 2048), (1, 16, 64, 256, 1024), (0, 512, 1024),
                (1, 2, 4, 8, 16, 32, 64, 128), warmup=2, repeats=10)
FULL_GPU = Grid((1, 2, 4, 8, 16, 32, 64, 128, 256), (128, 512, 1024, 2048, 4096),
                (1, 16, 64, 256, 1024, 4096, 8192), (0, 512, 2048), (1, 2, 4, 8, 16, 32, 64, 128, 256),
                warmup=3, repeats=15)


def default_grid(device: str, quick: bool) -> Grid:
    """``--quick``: a 3x3 grid of few repeats (seconds on a CPU with the ``tiny`` shape); else the
    full grid for a CPU or for an accelerator (``cuda``, ``gpu``)."""
    if quick:
        return QUICK
    return FULL_CPU if device == "cpu" else FULL_GPU


@dataclass(frozen=True)
class CalibrationConfig:
    """One calibration run. ``dtype`` None: bfloat16 on CUDA, float16 on Metal, float32 on CPUs.
    ``cuda_graph``: capture decode steps as CUDA graphs (CUDA only). ``threads``: torch CPU
    threads (None: torch's default). ``note``: free text about the machine, kept in metadata.
    ``bookkeeping``: the requests the CPU phases are timed on."""

    backend: str
    device: str
    shape: ModelShape
    grid: Grid
    dtype: str | None = None
    seed: int = 0
    threads: int | None = None
    cuda_graph: bool = True
    quick: bool = False
    note: str = ""
    bookkeeping: BenchWorkload = BenchWorkload()

    def __post_init__(self):
        if self.backend not in BACKEND_DEVICES:
            raise CalibrationInputError("--backend", "", f"one of {', '.join(BACKEND_DEVICES)} (got {self.backend!r})")
        if self.device not in BACKEND_DEVICES[self.backend]:
            raise CalibrationInputError("--device", "", f"one of {', '.join(BACKEND_DEVICES[self.backend])} for "
                                        f"--backend {self.backend} (got {self.device!r})")
        if self.dtype not in (None, "float32", "float16", "bfloat16"):
            raise CalibrationInputError("--dtype", "", f"float32, float16 or bfloat16 (got {self.dtype!r})")

    @property
    def resolved_dtype(self) -> str:
        if self.dtype:
            return self.dtype
        return {"cuda": "bfloat16", "gpu": "float16"}.get(self.device, "float32")

    def identity(self) -> dict:
        """What must match for samples from an interrupted run to be reused."""
        out = {"backend": self.backend, "device": self.device, "model": self.shape.to_dict(),
               "dtype": self.resolved_dtype, "grid": self.grid.to_dict(), "seed": self.seed,
               "threads": self.threads, "cuda_graph": self.cuda_graph}
        if self.bookkeeping != BenchWorkload():
            out["bookkeeping"] = self.bookkeeping.to_dict()
        return out
