"""The vLLM profile from the real vLLM 0.32 server: its trace joined into steps (:mod:`.trace`),
the designed sessions and the curves (:mod:`.profile`), and the speculative host curves
(:mod:`.speculative`)."""
