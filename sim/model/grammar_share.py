"""Which requests of a scenario carry a grammar (structured output): the part of each engine's
``server.structured_output`` section that does not depend on the engine.

A grammar (a JSON schema, a regex, an EBNF grammar or a choice) is per request in both engines
(SGLang's ``SamplingParams.json_schema``/``regex``/``ebnf``, vLLM's ``structured_outputs``); a
scenario gives the share of its requests that carry one and what kind. The engines' sections
(:mod:`sim.engines.sglang.structured`, :mod:`sim.engines.vllm.structured`) add what the grammar
costs where that engine runs it.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from sim.model.schema import StrictModel

GRAMMAR_SEED = 11  # the stream that draws which requests carry a grammar: rng([seed, 11])
KINDS = ("json_schema", "regex", "grammar", "choice")


class GrammarShare(StrictModel):
    """``share`` (0-1, the requests with a grammar) and ``kind`` (one of :data:`KINDS`: what the
    grammar's costs were measured or given for).

    Raises (pydantic ValidationError, as ValueError): a share outside [0, 1], an unknown kind.
    """

    share: float = Field(ge=0.0, le=1.0)
    kind: Literal["json_schema", "regex", "grammar", "choice"] = "json_schema"

    def draw(self, num_requests: int, seed: int) -> np.ndarray:
        """Which of ``num_requests`` requests carry a grammar: bool, shape (num_requests,),
        seeded by ``[seed, GRAMMAR_SEED]`` (the same requests under every setting)."""
        if self.share >= 1.0:
            return np.ones(num_requests, dtype=bool)
        return np.random.default_rng([seed, GRAMMAR_SEED]).random(num_requests) < self.share
