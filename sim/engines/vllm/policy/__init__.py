"""vLLM V1's scheduling policy as plain code (no SimPy), faithful to 0.32.0 for the default FCFS
policy: :mod:`.scheduler` (the state and ``Scheduler.schedule``: token budget, chunked prefill,
``max_num_seqs``), :mod:`.kv_blocks` (``allocate_slots`` in KV blocks), :mod:`.preemption`
(preemption by recompute), :mod:`.results` (``update_from_output``, stop checks) and
:mod:`.request` (a request's counters).
"""
