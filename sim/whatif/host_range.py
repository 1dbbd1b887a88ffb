"""How far the verdict moves over what the profile says it does not know about the host.

A profile built from parts (``overlap-sim compose``) prices the scheduler's host phases by SGLang's
own functions timed on one host and moved to the device's host by a stated factor with a stated
relative uncertainty ``u`` (``metadata.composed.move.uncertainty_rel``; ``metadata.transfer``'s
``host_speed`` of a ``transfer`` with ``--host-speed`` carries no stated uncertainty and gets none
here). The true host phases then lie in ``[t / (1 + u), t (1 + u)]``. :func:`host_range`
simulates both settings again with every CPU phase scaled by ``1 / (1 + u)`` and ``1 + u``
(``costs.cpu.scale``, streamed: no tables) and returns the throughput ratios at the two ends.

Simplification, stated where the line is printed: the ratio is evaluated at the two ends and the
middle only; where the CPU phases cross the forward's time inside the range, the ratio's extreme
can lie between them (the overlap gain peaks where host and device take equally long).
"""

from __future__ import annotations

from typing import Optional

MAX_U = 10.0  # a stated uncertainty above this is not a bound but a corrupt value


def host_uncertainty(meta: Optional[dict]) -> Optional[tuple[float, str]]:
    """``(u, what)`` from a profile's metadata: the stated relative uncertainty of its host
    phases and a few words on where it comes from; None when the profile states none."""
    if not isinstance(meta, dict):
        return None
    move = (meta.get("composed") or {}).get("move") if isinstance(meta.get("composed"), dict) else None
    if isinstance(move, dict):
        u = move.get("uncertainty_rel")
        if isinstance(u, (int, float)) and 0 < u <= MAX_U:
            src = meta["composed"].get("host_cpu") or "another host"
            engine = meta["composed"].get("host_engine") or "the engine"
            return float(u), f"{engine}'s own functions timed on {src}, moved to this host by a yardstick"
    return None


def host_range(scenario, pair: tuple, u: float) -> tuple[float, float]:
    """(lowest, highest) throughput ratio ``pair[0] / pair[1]`` with the CPU phases scaled by
    ``1 / (1 + u)`` and ``1 + u``; NaN where a setting served nothing at an end."""
    import math

    from sim.simulate import simulate

    ratios = []
    base = scenario.costs.cpu.scale
    for k in (1.0 / (1.0 + u), 1.0 + u):
        sc = scenario.with_overrides([f"costs.cpu.scale={base * k!r}"])
        num, den = (simulate(sc, s, tables="none").summary() for s in pair[:2])
        a, b = float(num.get("output_throughput") or 0.0), float(den.get("output_throughput") or 0.0)
        ratios.append(a / b if a > 0 and b > 0 else math.nan)
    return min(ratios), max(ratios)
