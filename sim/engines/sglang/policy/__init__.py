"""SGLang's scheduling policy as plain code (no SimPy): :mod:`.scheduler` (the state and
``get_next_batch_to_run``), :mod:`.admission` (prefill admission), :mod:`.reserve` (the running
batch's KV offset), :mod:`.decode` (``update_running_batch``), :mod:`.retraction`,
:mod:`.results` (``process_batch_result``) and :mod:`.kvpool` (the KV pool in pages).
"""
