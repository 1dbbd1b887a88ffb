"""Calibration profiles as the simulator reads them.

- :mod:`sim.model.profile.file`: the profile file: its format and curves, validation, loading
  (a read-only cache per file version) and the curves a simulated setting uses;
- :mod:`sim.model.profile.measured`: what a profile measured against what a scenario asks of it:
  the tensor-parallel size and how an engine prices it, and whether the model it measured is the
  one a launch command serves.

The names the rest of the simulator uses are importable from this package.
"""

from sim.model.profile.file import (ALL_CURVE_AXES, CURVE_AXES, FORMAT, GRAMMAR_CURVE_AXES, GRAMMAR_SAMPLE_AXES,
                                    MAX_STEP_S, MIN_FORWARD_S, OPTIONAL_CURVE_AXES, REQUIRED_METADATA,
                                    SCHEMA_VERSION, SGLANG_CURVES, SGLANG_HOST_CURVES, CurveTable, load_profile,
                                    load_profile_read_only, loaded_metadata, profile_curves, validate_profile)
from sim.model.profile.measured import (MAX_PARALLEL_SIZE, ParallelPricing, measured_size, model_caveat,
                                        model_words, profile_model, same_model)

__all__ = ["ALL_CURVE_AXES", "CURVE_AXES", "FORMAT", "GRAMMAR_CURVE_AXES", "GRAMMAR_SAMPLE_AXES", "MAX_STEP_S",
           "MIN_FORWARD_S", "OPTIONAL_CURVE_AXES", "REQUIRED_METADATA", "SCHEMA_VERSION", "SGLANG_CURVES",
           "SGLANG_HOST_CURVES", "CurveTable", "load_profile", "load_profile_read_only", "loaded_metadata",
           "profile_curves", "validate_profile", "MAX_PARALLEL_SIZE", "ParallelPricing", "measured_size",
           "model_caveat", "model_words", "profile_model", "same_model"]
