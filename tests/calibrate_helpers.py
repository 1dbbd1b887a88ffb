"""Synthetic calibration profiles for the tests (no timing involved)."""

from __future__ import annotations

import copy

from calibrate.profile import build_profile
from sim.model.profile import CURVE_AXES

METADATA = {"backend": "torch", "device": "cuda", "device_name": "synthetic", "host_cpu": "synthetic",
            "libraries": {}, "model": {"name": "synthetic"}, "dtype": "bfloat16", "date": "2026-01-01T00:00:00+00:00",
            "grid": {}, "repeats": 1}
DEFAULT_NODES = {"num_reqs": [1, 8, 64], "ctx": [16, 1024], "num_tokens": [1, 64, 4096], "prefix": [0, 1024]}


def synthetic_profile(values: dict | None = None, nodes: dict | None = None, repeats: int = 1) -> dict:
    """A valid profile whose curves are the given functions of their axes.

    Args:
        values: curve name -> f(*point) in seconds (default: every curve constant 1 ms).
        nodes: axis name -> grid nodes (default :data:`DEFAULT_NODES`; recv adds 0 to num_reqs).
    """
    values = values or {}
    nodes = {**DEFAULT_NODES, **(nodes or {})}
    samples = []
    for name, axes in CURVE_AXES.items():
        f = values.get(name, lambda *x: 1e-3)
        grids = [([0] if name == "recv" and a == "num_reqs" and 0 not in nodes[a] else []) + list(nodes[a])
                 for a in axes]
        points = [(x,) for x in grids[0]] if len(axes) == 1 else [(x, y) for x in grids[0] for y in grids[1]]
        for p in points:
            samples.append({"curve": name, "point": dict(zip(axes, p)), "times_s": [f(*p)] * repeats})
    return build_profile(copy.deepcopy(METADATA), samples)
