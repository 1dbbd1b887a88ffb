"""The scheduler's per-step CPU work, implemented for real: a radix prefix cache
(:mod:`~calibrate.bookkeeping.radix`), KV slot allocators (:mod:`~calibrate.bookkeeping.kv_pool`),
requests with a real tokenizer (:mod:`~calibrate.bookkeeping.requests`), the per-step work over
them (:mod:`~calibrate.bookkeeping.bookkeeper`) and timing it in isolation
(:mod:`~calibrate.bookkeeping.bench`). The ground-truth harness runs the same code.
"""
