"""How far the verdict moves over what the profile says it does not know.

A profile states up to three uncertainties the simulator can carry into the answer:

- the host phases of a profile built from parts (``overlap-sim compose``): timed on one host and
  moved to the device's host by a factor with a stated relative uncertainty ``u``
  (``metadata.composed.move.uncertainty_rel``);
- the profiler's slowdown divided out of a profile read from a server's traces
  (``overlap-sim calibrate --from-trace`` with its log, ``metadata.trace.slowdown.uncertainty_rel``:
  the spread of the log's per-step factor), on the host phases (and the CPU engine's forward);
- the forward of a profile moved to another card by public specs (``overlap-sim transfer``,
  ``metadata.transfer.uncertainty_rel``, ±30% stated in docs/transfer.md).

The true costs then lie within ``[t / (1 + u), t (1 + u)]`` on each axis. :func:`stated_range`
simulates both settings again at every corner of that box (``costs.cpu.scale`` and
``costs.gpu.scale``, streamed: no tables) and returns the lowest and highest throughput ratio.

Simplification, stated where the line is printed: only the corners are evaluated (the middle is
the run itself); where host and device times cross inside the box, the ratio's extreme can lie
between corners (the overlap gain peaks where host and device take equally long), so the range
can be narrower than the true one.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple, Optional

from sim.jsonio import is_number
from sim.model.profile.file import MAX_STATED_U as MAX_U  # (a profile with a larger one is refused on loading)


class Stated(NamedTuple):
    """One stated uncertainty: ``axis`` ``cpu`` (every host phase), ``gpu`` (the forward) or ``both``
    (one factor on both: the profiler's slowdown on a CPU engine), its
    relative size ``u`` (> 0) and where it comes from, in words."""

    axis: str
    u: float
    what: str


def _u(value) -> Optional[float]:
    """A stated relative uncertainty to simulate over, or None (none stated, 0, or out of range)."""
    return float(value) if is_number(value, 0.0, MAX_U, above=True) else None


def stated_uncertainties(meta: Optional[dict]) -> list[Stated]:
    """The uncertainties a profile's metadata states (empty when it states none)."""
    out: list[Stated] = []
    if not isinstance(meta, dict):
        return out
    composed = meta.get("composed")
    if isinstance(composed, dict) and isinstance(composed.get("move"), dict):
        if (u := _u(composed["move"].get("uncertainty_rel"))) is not None:
            engine = composed.get("host_engine") or "the engine"
            src = composed.get("host_cpu") or "another host"
            dst = meta.get("host_cpu") or "the profile's host"
            moved = meta.get("transfer") if isinstance(meta.get("transfer"), dict) else None
            card = moved.get("from_device_name") if moved else None  # (a profile moved on to another card)
            host = f"the {card}'s host ({dst})" if card else f"the device's host ({dst})"
            out.append(Stated("cpu", u, f"host phases ±{u:.0%}: {engine}'s own functions timed on {src}, moved to "
                                        f"{host} by a yardstick"))
    slow = (meta.get("trace") or {}).get("slowdown") if isinstance(meta.get("trace"), dict) else None
    if isinstance(slow, dict) and slow.get("removed") and (u := _u(slow.get("uncertainty_rel"))) is not None:
        axis = "both" if meta.get("device") == "cpu" else "cpu"
        out.append(Stated(axis, u, f"{'host phases and forward' if axis == 'both' else 'host phases'} ±{u:.0%}: "
                                   f"the profiler's slowdown (x{slow.get('host_slowdown', 0):.2f}) divided out, as "
                                   "the server log measured it"))
    moved = meta.get("transfer")
    if isinstance(moved, dict) and (u := _u(moved.get("uncertainty_rel"))) is not None:
        assumed = ("" if moved.get("compute_published") is not False else
                   " (one card publishes no compute figure: the other's compute-to-bandwidth balance assumed, "
                   "which prices the prefill, outside this range)")
        out.append(Stated("gpu", u, f"forward ±{u:.0%}: moved from {moved.get('from_device_name', 'another card')} "
                                    f"by public specs{assumed}"))
    return out


def stated_range(scenario, pair: tuple, stated: list[Stated]) -> tuple[float, float]:
    """(lowest, highest) throughput ratio ``pair[0] / pair[1]`` over the corners of the stated
    box; NaN where a setting served nothing at a corner."""
    from sim.simulate import simulate

    base = {"cpu": scenario.costs.cpu.scale, "gpu": scenario.costs.gpu.scale}
    ratios = []
    for signs in itertools.product((-1, 1), repeat=len(stated)):
        scale = dict(base)
        for s, sign in zip(stated, signs):
            for axis in (("cpu", "gpu") if s.axis == "both" else (s.axis,)):
                scale[axis] *= (1.0 + s.u) ** sign
        sc = scenario.with_overrides([f"costs.cpu.scale={scale['cpu']!r}", f"costs.gpu.scale={scale['gpu']!r}"])
        num, den = (simulate(sc, name, tables="none").summary() for name in pair[:2])
        a, b = float(num.get("output_throughput") or 0.0), float(den.get("output_throughput") or 0.0)
        ratios.append(a / b if a > 0 and b > 0 else math.nan)
    if not all(math.isfinite(r) for r in ratios):
        return math.nan, math.nan
    return min(ratios), max(ratios)
