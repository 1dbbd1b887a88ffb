"""Public specifications of accelerator cards, for moving a measured profile from one card to another
(:mod:`sim.model.transfer`) and for sizing a calibration to a card's memory (``calibrate``).

Each :class:`Card` gives the vendor's peak numbers, with the page they come from (read 2026-12;
the figures are the vendors', not measured here):

- ``memory_gb``: device memory (GB = 10^9 bytes);
- ``bandwidth_gb_s``: peak memory bandwidth (GB/s);
- ``bf16_tflops``: peak dense BF16 tensor throughput (TFLOPS; NVIDIA's datasheets print the
  figure with 2:4 sparsity, halved here; ``None`` where the vendor publishes none: Apple);
- ``host``: the host CPU the card is usually paired with, in words (the host's single-thread speed
  is a separate, stated input of a transfer; see ``--host-speed``).

A10G: an AWS-only variant of the A10 with no NVIDIA datasheet; its bandwidth and memory are the
A10's (AWS's g5 page), its tensor throughput the figure Baseten's comparison gives. Apple's M-series
share memory between CPU and GPU; ``memory_gb`` is the largest configuration's (``memory_largest``: ``ask``
says so, and takes ``--memory-gb``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Card:
    """One card's public specs (see the module docstring for units and sources)."""

    key: str
    name: str
    memory_gb: float
    bandwidth_gb_s: float
    bf16_tflops: Optional[float]
    host: str
    source: str
    aliases: tuple[str, ...] = ()
    memory_largest: bool = False  # memory_gb is the largest configuration sold (Apple's unified memory)

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.bandwidth_gb_s * 1e9

    @property
    def bf16_flops(self) -> Optional[float]:
        return None if self.bf16_tflops is None else self.bf16_tflops * 1e12

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9


CARDS: dict[str, Card] = {c.key: c for c in (
    Card("l4", "NVIDIA L4", 24, 300, 121, "cloud hosts: GCP g2 (Intel Xeon, Cascade Lake / Sapphire Rapids), "
         "AWS g6 (AMD EPYC, 3rd gen)", "https://www.nvidia.com/en-us/data-center/l4/ (datasheet: FP16/BF16 "
         "242 TFLOPS with sparsity, 300 GB/s)", ("nvidia l4",)),
    Card("a10g", "NVIDIA A10G", 24, 600, 70, "AWS g5: AMD EPYC 7R32 (2nd gen)",
         "https://aws.amazon.com/ec2/instance-types/g5/ (24 GB, A10G); "
         "https://www.nvidia.com/en-us/data-center/products/a10-gpu/ (A10: 600 GB/s); "
         "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/ (A10G tensor throughput)",
         ("nvidia a10g",)),
    Card("a100-40gb", "NVIDIA A100-SXM4-40GB", 40, 1555, 312, "DGX A100: AMD EPYC 7742 (2nd gen)",
         "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (BF16 312 TFLOPS dense, 1,555 GB/s)",
         ("nvidia a100-sxm4-40gb", "a100")),
    Card("a100-80gb", "NVIDIA A100-SXM4-80GB", 80, 2039, 312, "DGX A100: AMD EPYC 7742 (2nd gen)",
         "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (BF16 312 TFLOPS dense, 2,039 GB/s)",
         ("nvidia a100-sxm4-80gb",)),
    Card("h100", "NVIDIA H100 80GB HBM3", 80, 3350, 989.5, "DGX H100: Intel Xeon Platinum 8480C (Sapphire Rapids)",
         "https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM: BF16 1,979 TFLOPS with sparsity, 3.35 TB/s)",
         ("nvidia h100 80gb hbm3", "h100-sxm", "nvidia h100")),
    Card("h200", "NVIDIA H200", 141, 4800, 989.5, "HGX H200 hosts: Intel Xeon (Sapphire/Emerald Rapids) or AMD EPYC "
         "(Genoa); the shipped profiles: 'Intel(R) Xeon(R) Processor', 16 vCPUs",
         "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: BF16 1,979 TFLOPS with sparsity, 4.8 TB/s)",
         ("nvidia h200",)),
    Card("b200", "NVIDIA B200", 180, 8000, 2250, "DGX B200: Intel Xeon Platinum 8570 (Emerald Rapids)",
         "https://www.nvidia.com/en-us/data-center/dgx-b200/ and https://www.nvidia.com/en-us/data-center/hgx/ "
         "(HGX B200, 8 GPUs: FP16/BF16 36 PFLOPS with sparsity, 64 TB/s)", ("nvidia b200",)),
    Card("rtx-4090", "NVIDIA GeForce RTX 4090", 24, 1008, 165.2, "a desktop CPU (varies)",
         "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf (Appendix: BF16 "
         "tensor with FP32 accumulate 165.2 TFLOPS dense, 1,008 GB/s)", ("nvidia geforce rtx 4090", "4090")),
    Card("m2-max", "Apple M2 Max", 96, 400, None, "its own CPU cores (8 performance + 4 efficiency)",
         "https://www.apple.com/newsroom/2023/01/apple-unveils-m2-pro-and-m2-max-next-generation-chips-for-next-"
         "level-workflows/ (400 GB/s)", memory_largest=True),
    Card("m2-ultra", "Apple M2 Ultra", 192, 800, None, "its own CPU cores (16 performance + 8 efficiency)",
         "https://www.apple.com/newsroom/2023/06/apple-introduces-m2-ultra/ (800 GB/s)", memory_largest=True),
    Card("m3-max", "Apple M3 Max", 128, 400, None, "its own CPU cores (12 performance + 4 efficiency)",
         "https://www.apple.com/newsroom/2023/10/apple-unveils-m3-m3-pro-and-m3-max-the-most-advanced-chips-for-a-"
         "personal-computer/ (up to 400 GB/s; the 14-core CPU version 300 GB/s)", memory_largest=True),
    Card("m3-ultra", "Apple M3 Ultra", 512, 819, None, "its own CPU cores (24 performance + 8 efficiency)",
         "https://www.apple.com/mac-studio/specs/ (819 GB/s)", memory_largest=True),
    Card("m4-max", "Apple M4 Max", 128, 546, None, "its own CPU cores (12 performance + 4 efficiency)",
         "https://www.apple.com/newsroom/2024/10/apple-introduces-m4-pro-and-m4-max/ (up to 546 GB/s; the "
         "14-core CPU version 410 GB/s)", memory_largest=True),
)}


def find_card(text: str) -> Optional[Card]:
    """The card whose key, name or alias is ``text`` (case-insensitive; a profile's
    ``metadata.device_name`` such as ``"NVIDIA H200"`` matches by name); None when none does."""
    t = " ".join(str(text).lower().split())
    for card in CARDS.values():
        if t in (card.key, card.name.lower(), *card.aliases):
            return card
    return None
