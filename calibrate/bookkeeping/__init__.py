"""The scheduler's per-step CPU work, implemented for real: a radix prefix cache
(:mod:`~calibrate.bookkeeping.radix`), KV slot allocators (:mod:`~calibrate.bookkeeping.kv_pool`),
requests with a real tokenizer (:mod:`~calibrate.bookkeeping.requests`), the per-step work over
them (:mod:`~calibrate.bookkeeping.bookkeeper`) and timing it in isolation
(:mod:`~calibrate.bookkeeping.bench`). The ground-truth harness runs the same code.
"""


def version() -> str:
    """This code's version as a yardstick (:mod:`calibrate.host.yardstick`): the first 12 hex digits
    of a SHA-256 over the sources of this package's modules (this file left out), sorted by name. Every torch/MLX calibration
    records it (``metadata.yardstick_version``) and every host calibration measures the same code."""
    import hashlib
    from pathlib import Path

    digest = hashlib.sha256()
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
        if path.name == "__init__.py":
            continue
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]
