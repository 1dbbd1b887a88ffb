"""What one harness run serves: the model, the workload, the server's scheduling knobs and the
bookkeeping knobs; and the simulator scenario that describes the same run.

Lengths are drawn by the simulator's own :func:`sim.model.workload.make_requests` from the scenario
built here, so the harness and the simulation serve the same requests in the same order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from calibrate.errors import CalibrationInputError
from calibrate.shapes import ModelShape, resolve_shape

BACKENDS = {"torch": ("cpu", "cuda"), "mlx": ("cpu", "gpu")}
HARNESS_SETTINGS = {"torch": ("normal", "overlap", "thread_overlap"), "mlx": ("normal", "overlap_mlx")}
EOS_SLACK = 64  # max_new_tokens beyond output_len for `finish: eos` (the scheduler cannot foresee the EOS)


@dataclass(frozen=True)
class HarnessConfig:
    """One configuration of the harness (and of the simulation that predicts it).

    Attributes:
        name: label. backend / device: ``torch`` on ``cpu`` or ``cuda``; ``mlx`` on ``cpu`` or ``gpu``.
        model: a named shape (:mod:`calibrate.shapes`) and ``overrides`` of its sizes; the
            vocabulary is always the tokenizer's (``tokenizer_vocab``).
        num_requests, warmup_requests, concurrency: closed-loop clients (``bench_serving
            --max-concurrency``); the first ``warmup_requests`` are left out of the metrics.
        input_len, cached_len, output_len: tokens; an int or a simulator length spec (dict).
            ``cached_len`` tokens of each prompt are a system prompt already in the radix cache.
        finish: ``length`` (the request stops at ``max_new_tokens = output_len``) or ``eos``
            (the model samples EOS at ``output_len``; ``max_new_tokens`` is larger, so the
            scheduler learns the finish only from the token).
        stop_strings: stop strings per request (checked on the detokenized text every token).
        max_running_requests, chunked_prefill_size: as SGLang's server arguments.
        torch_threads: intra-op threads of the forward (torch backends).
        seed: seed of the lengths, prompts and model weights.
    """

    name: str
    backend: str = "torch"
    device: str = "cpu"
    model: str = "tiny"
    overrides: dict = field(default_factory=dict)
    tokenizer_vocab: int = 1024
    num_requests: int = 48
    warmup_requests: int = 8
    concurrency: int = 8
    input_len: int | dict = 128
    cached_len: int | dict = 0
    output_len: int | dict = 64
    finish: str = "length"
    stop_strings: int = 2
    max_running_requests: int = 64
    chunked_prefill_size: int = 8192
    torch_threads: int = 1
    seed: int = 0

    def __post_init__(self):
        if self.backend not in BACKENDS or self.device not in BACKENDS[self.backend]:
            raise CalibrationInputError("harness", "backend/device", f"one of {BACKENDS} (got {self.backend} on "
                                        f"{self.device})")
        if self.finish not in ("length", "eos"):
            raise CalibrationInputError("harness", "finish", f"length or eos (got {self.finish!r})")
        if self.warmup_requests >= self.num_requests:
            raise CalibrationInputError("harness", "warmup_requests", "fewer than num_requests")

    @property
    def shape(self) -> ModelShape:
        """The model's sizes (its vocabulary is the tokenizer's)."""
        return resolve_shape(self.model, **{**self.overrides, "vocab": self.tokenizer_vocab})

    @property
    def settings(self) -> tuple[str, ...]:
        """The schedules the harness runs for this backend."""
        return HARNESS_SETTINGS[self.backend]

    def scenario(self, profile: str | None = None, settings: tuple[str, ...] | None = None,
                 gil: dict | None = None, gpu: dict | None = None) -> dict:
        """The simulator scenario of this configuration (a dict for :func:`sim.load_scenario`).

        Args:
            profile: the calibration profile (``costs.profile``, priced at each point's mean:
                the harness is judged on time averages). settings: loops to simulate.
            gil: ``costs.gil`` values (thread_overlap). gpu: other ``costs.gpu`` values.
        """
        costs: dict = {"gpu": {"overlap_residue": 0.0, **(gpu or {})}}
        if profile:
            costs["profile"] = str(profile)
            costs["profile_statistic"] = "mean"
        if gil:
            costs["gil"] = dict(gil)
        return {
            "name": self.name, "seed": self.seed,
            "workload": {"arrival": "closed_loop", "concurrency": self.concurrency,
                         "num_requests": self.num_requests, "warmup_requests": self.warmup_requests,
                         "input_len": self.input_len, "cached_len": self.cached_len,
                         "output_len": self.output_len, "finish": self.finish},
            "server": {"device": "cpu" if self.device == "cpu" else ("mlx" if self.backend == "mlx" else "cuda"),
                       # the harness's device is a process or thread beside the scheduler's
                       "forward_on_scheduler_thread": False,
                       "version": "0.5.22", "retraction": "v0.5.22",
                       "settings": list(settings or self.settings),
                       "max_running_requests": self.max_running_requests,
                       "chunked_prefill_size": self.chunked_prefill_size,
                       "kv_pool_tokens": self.kv_pool_tokens()},
            "costs": costs,
        }

    def kv_pool_tokens(self) -> int:
        """A KV pool that holds every request's prompt and output at once (no admission waits, no
        retraction, no eviction: the harness does not implement those; the simulation is given
        the same pool)."""
        return self.num_requests * (_max_len(self.input_len) + _max_len(self.output_len) + EOS_SLACK + 2) + 64

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "HarnessConfig":
        return cls(**d)


def _max_len(spec) -> int:
    if isinstance(spec, int):
        return spec
    for key in ("high", "max"):
        if spec.get(key) is not None:
            return int(spec[key])
    if "values" in spec:
        return int(max(spec["values"]))
    raise CalibrationInputError("harness", "length", f"a length with a bound (int, uniform, choice, or max:) (got {spec})")
