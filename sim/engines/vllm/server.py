"""The scenario's ``server`` section for vLLM (``server.engine: vllm``): the V1 engine's settings
that change scheduling, and the engine loops (``settings``) the simulator models.

Settings: ``sync`` (``EngineCore.step``: schedule, execute, wait, update) and ``async``
(``--async-scheduling``: ``EngineCore.step_with_batch_queue`` with a batch queue of 2 and the
``AsyncScheduler``). Field names are vLLM's engine arguments; defaults are vLLM 0.32.0's for the
OpenAI API server (``EngineArgs.get_batch_defaults``, ``engine/arg_utils.py:2894``), where they
depend on the platform (``device``).
"""

from __future__ import annotations

from typing import ClassVar, Literal, Optional

from pydantic import Field, PrivateAttr, field_validator, model_validator

from sim.engines.vllm.speculative import Speculative
from sim.engines.vllm.structured import StructuredOutput
from sim.model.profile import ParallelPricing
from sim.model.schema import MAX_POOL_TOKENS, MAX_REQUESTS, MAX_TOKENS, StrictModel

SETTINGS = ("sync", "async")
# tensor parallelism priced through a profile measured at that size (VllmServer's docstring)
TP_PRICING = ParallelPricing(
    "vllm", "tensor_parallel_size", "server.tensor_parallel_size",
    "its dispatch and forward carry that many workers' broadcast and all-reduces",
    "its broadcast to the workers in dispatch, the all-reduces in the forward",
    "each process is taken to have a core of its own (held against vLLM's CPU server at TP 2 only on a 2-core VM "
    "whose ranks took both cores: 21%/16% median error, noise floor 8-12%; docs/vllm.md#tensor-parallelism)")
Setting = Literal["sync", "async"]
VERSIONS = ("0.32.0",)  # releases whose source the model follows
DEFAULT_CACHE_TOKENS = 400_000  # a KV cache of this many tokens when num_gpu_blocks is not given
MAX_BLOCKS = MAX_POOL_TOKENS


class VllmServer(StrictModel):
    """vLLM engine arguments that change scheduling (names as ``vllm serve`` flags, ``_`` for ``-``).

    ``device``: ``cpu`` (vLLM's CPU platform: the forward is the worker process's own compute) or
    ``cuda`` (the forward runs on the GPU while the worker's CPU goes on). ``max_num_seqs``
    (None: 128 on cpu, 256 on cuda: the API server's defaults, ``arg_utils.py:2974`` and the
    under-70-GB GPU branch), ``max_num_batched_tokens`` (the per-step token budget; 2048 on both),
    ``max_model_len`` (prompt plus output; ``max_tokens`` is capped to what is left),
    ``block_size`` (None: 128 on cpu, ``platforms/cpu.py:292``; 16 on cuda,
    ``CacheConfig.DEFAULT_BLOCK_SIZE``), ``num_gpu_blocks`` (the KV cache in blocks, the null
    block included, as vLLM logs it and ``--num-gpu-blocks-override`` sets it; None: a cache of
    400,000 tokens), ``enable_chunked_prefill`` and ``enable_prefix_caching`` (both on by default
    for generative models), ``long_prefill_token_threshold`` (0: off), ``speculative``
    (``--speculative-config`` and what the simulator is told of it: :mod:`sim.engines.vllm.speculative`;
    None: plain decoding), ``structured_output`` (the share of requests with a grammar and its
    costs: :mod:`sim.engines.vllm.structured`; None: none), ``tensor_parallel_size`` (``-tp``: one
    engine core, that many workers in lockstep; priced by a profile measured at that size,
    :func:`sim.engines.vllm.profile.check_tensor_parallel`, or by the inline costs as given).
    """

    engine: Literal["vllm"]
    version: Literal["0.32.0"] = "0.32.0"
    device: Literal["cuda", "cpu"] = "cuda"
    settings: list[Setting] = Field(default_factory=lambda: ["async", "sync"], min_length=1)
    max_num_seqs: Optional[int] = Field(default=None, ge=1, le=MAX_REQUESTS)
    max_num_batched_tokens: int = Field(default=2048, ge=1, le=MAX_TOKENS)
    max_model_len: int = Field(default=8192, ge=2, le=MAX_TOKENS)
    block_size: Optional[int] = Field(default=None, ge=1, le=MAX_TOKENS)
    num_gpu_blocks: Optional[int] = Field(default=None, ge=2, le=MAX_BLOCKS)
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = Field(default=0, ge=0, le=MAX_TOKENS)
    tensor_parallel_size: int = Field(default=1, ge=1, le=1024)
    speculative: Optional[Speculative] = None
    structured_output: Optional[StructuredOutput] = None
    _from_launch_args: tuple = PrivateAttr(default=())  # as the SGLang section (scenario overrides read it)

    @field_validator("settings", mode="before")
    @classmethod
    def _one_setting(cls, value):
        return [value] if isinstance(value, str) else value  # `--set server.settings=async`: a one-item list

    # the cost fields of SGLang's loops, which vLLM's do not read (sim.engines.vllm.costs): given
    # with other values than their defaults, a vLLM scenario is refused (the answer would not move)
    UNREAD_COSTS: ClassVar[tuple[str, ...]] = ("gpu.overlap_residue", "gpu.sync_latency", "cpu.after_wait_scale",
                                               "cpu.extend_launch_device_scale", "gil")

    @property
    def resolved_block_size(self) -> int:
        """Tokens per KV block (the platform's default when ``block_size`` is None)."""
        if self.block_size is not None:
            return self.block_size
        return 128 if self.device == "cpu" else 16

    @property
    def kv_blocks(self) -> int:
        """Blocks in the KV cache, the null block included."""
        if self.num_gpu_blocks is not None:
            return self.num_gpu_blocks
        return -(-DEFAULT_CACHE_TOKENS // self.resolved_block_size) + 1

    @property
    def seqs_limit(self) -> int:
        """``max_num_seqs`` (the platform's default when None)."""
        if self.max_num_seqs is not None:
            return self.max_num_seqs
        return 128 if self.device == "cpu" else 256

    @property
    def running_cap(self) -> tuple[str, int]:
        """(the field, its value) that caps the requests running at once (the platform's default
        ``max_num_seqs`` when unset)."""
        return "server.max_num_seqs", self.seqs_limit

    @property
    def length_cap(self) -> tuple[str, int, str]:
        """(the field, the most tokens a request's prompt and output may reach, how the engine
        stops it there): ``check_stop`` finishes a request at ``max_model_len``
        (FINISHED_LENGTH_CAPPED, :mod:`sim.engines.vllm.policy.results`)."""
        return "server.max_model_len", self.max_model_len, "vLLM stops a request at max_model_len"

    def warnings(self, profile_meta: dict | None = None) -> list[str]:
        """What this server section asks for that is answered only approximately: speculative
        decoding's given values (:meth:`Speculative.caveats`, told what the profile whose
        metadata is ``profile_meta`` measured of it); the launch arguments vLLM's rules read are
        checked where they are parsed."""
        out = []
        meta = profile_meta if isinstance(profile_meta, dict) else {}
        if self.speculative is not None:
            measured = meta.get("speculative")
            out += self.speculative.caveats(measured if isinstance(measured, dict) else None)
        if self.structured_output is not None and self.structured_output.share > 0:
            measured = meta.get("structured_output")
            out += self.structured_output.caveats(measured if isinstance(measured, dict) else None)
        if tp := TP_PRICING.caveat(self.tensor_parallel_size, measured=profile_meta is not None):
            out.append(tp)
        return out

    def rests_on_another_model(self, profile_meta: dict | None) -> bool:
        """Whether the answer rests on another model's costs than the command serves: a vLLM
        section names no launch command (no model to compare), so never."""
        return False

    def verdict_caveats(self, profile_meta: dict | None = None) -> list[str]:
        """Clauses the verdict line carries on what its answer rests on beyond the profile: with
        speculative decoding on a profile without its host curves (``metadata.speculative``),
        the drafter's host work left out (:meth:`SpeculativeConfig.caveats` says it in full); at
        tensor parallelism, how far the TP model has been held against the real server (on
        4 December 2026 only on a 2-core VM whose two ranks took every core, docs/vllm.md)."""
        out = []
        measured = profile_meta.get("speculative") if isinstance(profile_meta, dict) else None
        if self.speculative is not None and not measured:  # (SpeculativeConfig.caveats' warning, in brief)
            out.append("the drafter's own host work per step is not modelled (the profile has no speculative curves; "
                       "against vLLM's CPU server with a draft model that left throughput 36% high and TPOT 29% "
                       "low): outside any range below")
        if self.tensor_parallel_size <= 1:
            return out
        return out + [f"tensor parallel size {self.tensor_parallel_size}: the async/sync ratio at TP > 1 is not validated "
                "on a host with a core per process (on the TP 2 check's three loads, 2 cores, the real server "
                "measured 1.05 pooled where the model gave 1.12, per load off by up to 37 points; "
                "docs/vllm.md#tensor-parallelism)"]

    @property
    def blocking_forward(self) -> bool:
        """The forward occupies the worker process (vLLM's CPU platform: the model runs on the
        worker's own core); on a GPU the worker's CPU goes on while the device runs it."""
        return self.device == "cpu"

    @model_validator(mode="after")
    def _consistent(self):
        """vLLM's own start-up checks (``SchedulerConfig.verify_max_model_len``,
        ``config/scheduler.py``; ``check_enough_kv_cache_memory``, ``v1/core/kv_cache_utils.py:1104``)."""
        if self.speculative is not None and self.structured_output is not None and self.structured_output.share > 0:
            raise ValueError("structured_output: with speculative decoding not modelled (vLLM validates the drafts "
                             "against the grammar before the bitmask; not simulated)")
        if len(set(self.settings)) != len(self.settings):
            raise ValueError(f"settings: must not repeat a setting (got {self.settings})")
        if self.max_num_batched_tokens < self.seqs_limit:
            raise ValueError(f"max_num_batched_tokens: must be >= max_num_seqs {self.seqs_limit} (got "
                             f"{self.max_num_batched_tokens}); vLLM refuses to start")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(f"max_num_batched_tokens: without chunked prefill it must be >= max_model_len "
                             f"{self.max_model_len} (got {self.max_num_batched_tokens}); vLLM refuses to start")
        if self.long_prefill_token_threshold > self.max_model_len:
            raise ValueError(f"long_prefill_token_threshold: must be <= max_model_len {self.max_model_len} "
                             f"(got {self.long_prefill_token_threshold})")
        if self.block_size is not None and self.block_size > min(self.max_model_len, DEFAULT_CACHE_TOKENS):
            raise ValueError(f"block_size: a block of {self.block_size} tokens is larger than max_model_len "
                             f"{self.max_model_len} (or the default cache of {DEFAULT_CACHE_TOKENS} tokens): no request "
                             "fills one, and the cache's size would come from the block, not the memory (vLLM's "
                             "attention kernels take blocks of 16 to a few hundred tokens)")
        usable = (self.kv_blocks - 1) * self.resolved_block_size
        if usable < self.max_model_len:
            raise ValueError(f"num_gpu_blocks: the KV cache ({self.kv_blocks} blocks of {self.resolved_block_size} "
                             f"tokens, one the null block) holds {usable} tokens, less than one request of "
                             f"max_model_len {self.max_model_len}; vLLM refuses to start")
        return self
