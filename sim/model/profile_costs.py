"""The simulator's cost model read from a calibration profile (no torch or MLX needed).

Each simulated step is priced by the profile's curves (see :mod:`sim.model.profile`):

- forward, decode: ``forward.decode(num_reqs, sum_ctx / num_reqs)``;
- forward, extend: ``forward.extend(num_tokens, P0) + n * (forward.extend(num_tokens / n, P) -
  forward.extend(num_tokens / n, P0))`` for ``n`` requests with mean cached prefix ``P`` per
  request (``P0``: the curve's smallest prefix, 0 in a calibration): the batch's new tokens
  priced as one request, plus what each request's cached prefix adds to its own share (the
  profile times one request per extend). One request, or no prefix, is ``forward.extend(num_tokens, P)``.
  Measured on SGLang's CPU engine, a prefill of 5 requests of about 40 new tokens each after a
  512-token cached prefix took 175 ms, where one request of all 189 tokens after that prefix
  would be priced about 60 ms: attention over a prefix is paid per request.
  A profile with ``metadata.extend_axis: attended`` (built from a server's trace,
  :mod:`calibrate.real.from_trace.forms`) keys ``forward.extend`` by the KV tokens each new token
  attends on average instead of the prefix: a batch is priced ``forward.extend(num_tokens,
  attn_pairs / num_tokens)``, ``attn_pairs`` being the sum over its requests of new x (prefix +
  new) tokens (SGLang's ``c_sqsk``), and its distance from the data is measured there too;
- recv: ``recv(new requests)``; schedule / process: ``schedule.<kind>(num_reqs)``,
  ``process.<kind>(num_reqs)``; launch: ``launch.decode(num_reqs)``,
  ``launch.extend(num_tokens)``;
- submit (MLX profiles): ``submit.<kind>`` at the forward's coordinates: the host stays in the
  launch until that long after the forward starts (``mx.async_eval``'s back-pressure).

A prefill's launch on a CUDA torch calibration is mostly that harness's own model launched eagerly
(its kernels queued one by one), standing in for the engine's model, whose launch no calibration
measures (docs/calibration.md): :func:`device_launch_part` finds that part, and
``costs.cpu.extend_launch_device_scale`` scales it (:func:`scaled_device_part`); the verdict
simulates the run with it at 0 (:mod:`sim.whatif.harness`).

With a profile, the scenario's inline linear terms (``costs.gpu.decode``/``prefill``,
``costs.cpu.recv``/...) are not used; ``costs.gpu.scale`` multiplies the forward curves,
``costs.cpu.scale`` the phase curves, and ``costs.gpu.overlap_residue``, ``costs.noise`` and
``costs.gil`` still apply as without a profile. Steps whose forward or CPU phases fall outside
the measured data (the profile's ``metadata.coverage``, else its grid) are priced by extrapolation and
counted with their distance from the data (:attr:`ProfileCostModel.reach`, :mod:`sim.model.reach`).
"""

from __future__ import annotations

import math
from pathlib import Path

from sim.model.costs import DECODE
from sim.model.profile import load_profile_read_only, profile_curves
from sim.model.reach import (BOUNDED_MAX, ReachMeter, below_share, bound_below, distance, distances,
                             farthest_axis, hulls)


class ProfileCostModel:
    """A :class:`sim.model.costs.CostModel` whose durations come from a measured profile.

    Args:
        profile: a validated profile (see :func:`sim.model.profile.load_profile`).
        gpu_scale, cpu_scale: multipliers of the forward and of the CPU phase curves.
        overlap_residue_s: device time the FutureMap resolve adds per step under ``overlap``.
        statistic: ``median`` (the profile's curves) or ``mean`` (each point's samples averaged,
            see :func:`sim.model.profile.profile_curves`, which refuses a forward point whose
            samples average no time).
        setting: the event loop simulated: the profile's curves for that loop (``setting_curves``)
            replace its base curves.
        sync_latency_s: from the end of a forward until the host can read its results; None:
            the profile's ``metadata.sync_latency_s`` (measured by calibrations that can see it,
            e.g. the harness's device process), else 0.
        source: where the profile came from (recorded by :meth:`describe`).
    """

    def __init__(self, profile: dict, gpu_scale: float = 1.0, cpu_scale: float = 1.0,
                 overlap_residue_s: float = 0.0, source: str = "<dict>", gil=None,
                 sync_latency_s: float | None = None, statistic: str = "median", setting: str | None = None,
                 extend_launch_device_scale: float = 1.0):
        self.profile = profile
        self.source = source
        self.gil = gil  # sim.model.schema.GilCosts for the thread_overlap loop (not measured here)
        # None: the latency the calibration measured (metadata.sync_latency_s), else 0
        self.sync_latency_s = float(profile["metadata"].get("sync_latency_s", 0.0)) if sync_latency_s is None \
            else sync_latency_s
        self.reach = ReachMeter()
        self.gpu_scale, self.cpu_scale = gpu_scale, cpu_scale
        self.overlap_residue_s = overlap_residue_s * gpu_scale
        c = self.curves = profile_curves(profile, statistic, setting, source=source)
        self.setting = setting
        self.statistic = statistic
        self._forward = (c["forward.extend"], c["forward.decode"])
        self.extend_attended = profile["metadata"].get("extend_axis") == "attended"
        self._recv = c["recv"]
        self._schedule = (c["schedule.extend"], c["schedule.decode"])
        self.device_launch = device_launch_part(profile, c)
        self._device_scale = extend_launch_device_scale
        self._launch = (c["launch.extend"], c["launch.decode"])
        if extend_launch_device_scale != 1.0 and self.device_launch is not None:
            self._launch = (scaled_device_part(c["launch.extend"], self.device_launch, extend_launch_device_scale),
                            c["launch.decode"])
        self._process = (c["process.extend"], c["process.decode"])
        self._submit = (c.get("submit.extend"), c.get("submit.decode"))  # MLX profiles only
        self.decode_submits = self._submit[1] is not None  # a decode's launch can block (the leap steps aside)
        self._decode_cpu_seen: dict[int, tuple[float, float, float]] = {}  # batch size -> a decode's CPU phases
        self._decode_reach: dict[int, float] = {}  # batch size -> its distance from the data (count_decode_steps)
        self._farthest: tuple | None = None  # the farthest step's (kind, num_reqs, forward's point, launch's x)
        self._bounded: tuple | None = None  # the bounded decode of the largest share's (num_reqs, ctx)
        h = hulls(profile, c)
        self._hull = tuple((h[f"forward.{k}"], h[f"launch.{k}"], h[f"schedule.{k}"], h[f"process.{k}"])
                           for k in ("extend", "decode"))
        hf = self._hull[DECODE][0]  # the decode forward's data on its context axis (none on one axis: all inside)
        self._decode_ctx_range = (hf[0][1], hf[1][1]) if len(hf[0]) > 1 else (-math.inf, math.inf)

    @property
    def extrapolated_steps(self) -> int:
        """Steps priced beyond the measured data (:mod:`sim.model.reach`)."""
        return self.reach.extrapolated_steps

    @classmethod
    def from_file(cls, path: str | Path, **kwargs) -> "ProfileCostModel":
        """Load ``path`` (raises :class:`sim.errors.ProfileError` if it is unusable)."""
        return cls(load_profile_read_only(path), source=str(path), **kwargs)

    def forward_s(self, kind: int, num_reqs: int, num_tokens: int, sum_ctx: int, attn_pairs: int = 0) -> float:
        """The forward's device time; also measures the step's distance from the profile's data
        (its forward and CPU phases: :attr:`reach`; the loops ask for the forward once per step).
        ``attn_pairs``: a prefill's sum over its requests of new x (prefix + new) tokens (read by a
        profile keyed by the attended tokens; 0: not known, the requests taken as equal shares)."""
        if kind == DECODE:  # the batch size's distance kept (_decode_size), the context's computed here
            ctx = sum_ctx / num_reqs
            d = self._decode_reach.get(num_reqs)
            if d is None:
                d = self._decode_size(num_reqs)
            lo, hi = self._decode_ctx_range
            price = self._forward[DECODE](num_reqs, ctx)
            if not lo <= ctx <= hi:  # beyond the data's contexts (rare): the context's own distance,
                # or below them a price bounded by the edge's (sim.model.reach: not extrapolated)
                share = below_share(price, self._forward[DECODE](num_reqs, lo)) if ctx < lo else math.inf
                if share > BOUNDED_MAX:
                    d = max(d, distance(((lo,), (hi,)), ctx))
                elif d == 1.0:
                    if self.reach.bounded(share):
                        self._bounded = (num_reqs, ctx)
                    return price * self.gpu_scale
                else:  # beyond the data on its batch size only (the step's point: the context bounded)
                    ctx = lo
            if d > 1.0 and self.reach.step(d):
                self._farthest = (DECODE, num_reqs, (num_reqs, ctx), num_reqs)
            return price * self.gpu_scale
        if self.extend_attended:  # the KV tokens a new token attends: given, else equal shares
            attended = attn_pairs / num_tokens if attn_pairs else sum_ctx / num_reqs
            x, launch_x = (num_tokens, attended), num_tokens
        else:
            x, launch_x = (num_tokens, (sum_ctx - num_tokens) / num_reqs), num_tokens
        forward = self._forward[kind]
        hf, hl, hs, hp = self._hull[kind]
        if self.reach.step(max(distance(hf, *x), distance(hl, launch_x), distance(hs, num_reqs),
                               distance(hp, num_reqs))):
            self._farthest = (kind, num_reqs, x, launch_x)
        if self.extend_attended or num_reqs == 1 or x[1] <= forward.lo[1]:
            return forward(*x) * self.gpu_scale
        p0, share = forward.lo[1], num_tokens / num_reqs
        t = forward(num_tokens, p0) + num_reqs * (forward(share, x[1]) - forward(share, p0))
        return max(t, forward(*x)) * self.gpu_scale  # never cheaper than one request of all the tokens

    def recv_s(self, num_new_reqs: int) -> float:
        return self._recv(num_new_reqs) * self.cpu_scale

    def schedule_s(self, kind: int, num_reqs: int, num_tokens: int, sum_ctx: int) -> float:
        return self._schedule[kind](num_reqs) * self.cpu_scale

    def launch_s(self, kind: int, num_reqs: int, num_tokens: int, sum_ctx: int) -> float:
        return self._launch[kind](num_reqs if kind == DECODE else num_tokens) * self.cpu_scale

    def eager_share(self, kind: int, num_tokens: int) -> float:
        """The device part's share of a prefill's launch (:func:`device_launch_part`, as scaled by
        ``costs.cpu.extend_launch_device_scale``): the eager kernels the device runs as they are
        queued. 0 for a decode (a CUDA-graph replay, queued at the launch's end) and on a profile
        without such a part."""
        if kind == DECODE or self.device_launch is None:
            return 0.0
        launch = self._launch[kind](num_tokens)
        part = self.device_launch(num_tokens) * self._device_scale
        return min(1.0, part / launch) if launch > 0.0 else 0.0

    def process_s(self, kind: int, num_reqs: int, num_tokens: int, sum_ctx: int) -> float:
        return self._process[kind](num_reqs) * self.cpu_scale

    def decode_s(self, num_reqs: int, sum_ctx: int) -> tuple[float, float, float, float]:
        """(schedule, launch, forward, process) of a decode batch (:meth:`sim.model.costs.CostModel.decode_s`)."""
        sched, launch, process = self._decode_cpu(num_reqs)
        return sched, launch, self.forward_s(DECODE, num_reqs, num_reqs, sum_ctx), process

    def _decode_cpu(self, num_reqs: int) -> tuple[float, float, float]:
        """A decode's (schedule, launch, process) at ``num_reqs``, each curve evaluated once per
        batch size (the same floats as :meth:`schedule_s`, :meth:`launch_s`, :meth:`process_s`)."""
        got = self._decode_cpu_seen.get(num_reqs)
        if got is None:
            cpu = self.cpu_scale
            got = self._decode_cpu_seen[num_reqs] = (
                self._schedule[DECODE](num_reqs) * cpu, self._launch[DECODE](num_reqs) * cpu,
                self._process[DECODE](num_reqs) * cpu)
        return got

    def decode_arrays(self, num_reqs: int, sum_ctx):
        """:meth:`decode_s` over an array of contexts (float64), without counting the steps'
        reach (:meth:`count_decode_steps` does, for the steps that run): four arrays, the same
        floats elementwise."""
        import numpy as np

        k = len(sum_ctx)
        sched, launch, process = self._decode_cpu(num_reqs)
        forward = self._forward[DECODE].along(num_reqs, sum_ctx / num_reqs) * self.gpu_scale
        return np.full(k, sched), np.full(k, launch), forward, np.full(k, process)

    def decode_submit_arrays(self, num_reqs: int, sum_ctx):
        """:meth:`submit_s` of decode batches over an array of contexts (float64), for a profile
        with ``submit.decode`` (:attr:`decode_submits`): the same floats elementwise (the curve
        along the contexts per request)."""
        return self._submit[DECODE].along(num_reqs, sum_ctx / num_reqs) * self.gpu_scale

    def count_decode_steps(self, num_reqs: int, sum_ctx, ascending: bool = False) -> None:
        """Count decode steps of ``num_reqs`` requests at the contexts ``sum_ctx`` (an array) in
        :attr:`reach`, as :meth:`forward_s` counts each (``ascending``: the contexts rise, as a
        run's do, so their least and greatest are the first and last)."""
        import numpy as np

        hf = self._hull[DECODE][0]
        size = self._decode_reach.get(num_reqs)  # the batch size's distance, the same at every context
        if size is None:
            size = self._decode_size(num_reqs)
        if len(hf[0]) > 1:
            lo, hi = hf[0][1], hf[1][1]
            if size == 1.0:  # (dividing by the batch size keeps the order: the extremes' quotients bound all)
                least, most = (sum_ctx[0], sum_ctx[-1]) if ascending else (sum_ctx.min(), sum_ctx.max())
                if lo <= np.float64(least) / num_reqs and np.float64(most) / num_reqs <= hi:
                    return  # every step inside the data: nothing to count
            x = sum_ctx.astype(np.float64) / num_reqs
            d = np.maximum(distances(lo, hi, x), size)
            # below the data's contexts: bounded where the price is near the edge's
            if (widest := bound_below(self.reach, self._forward[DECODE], num_reqs, x, lo, d, size)) is not None:
                self._bounded = (num_reqs, widest)
        elif size == 1.0:
            return
        else:
            d = np.full(len(sum_ctx), size)
        if (i := self.reach.steps(d)) >= 0:  # (the context per request as forward_s divides it)
            ctx = float(x[i]) if len(hf[0]) > 1 else int(sum_ctx[i]) / num_reqs
            self._farthest = (DECODE, num_reqs, (num_reqs, ctx), num_reqs)

    def farthest_at(self) -> str:
        """Where the run's farthest step from the profile's data lies: the curve and axis
        (:func:`sim.model.reach.farthest_axis` over the curves that priced it), "" when none lay
        beyond."""
        if self._farthest is None:
            return ""
        kind, num_reqs, x, launch_x = self._farthest
        k = ("extend", "decode")[kind]
        hf, hl, hs, hp = self._hull[kind]
        c = self.curves
        return farthest_axis([(f"forward.{k}", c[f"forward.{k}"].axes, hf, x),
                              (f"launch.{k}", c[f"launch.{k}"].axes, hl, (launch_x,)),
                              (f"schedule.{k}", c[f"schedule.{k}"].axes, hs, (num_reqs,)),
                              (f"process.{k}", c[f"process.{k}"].axes, hp, (num_reqs,))])

    def bounded_at(self) -> str:
        """Where the run's bounded step of the largest share lies (:mod:`sim.model.reach`), in
        words: ``"forward.decode at ctx 17, measured from 128"``; "" when none was bounded."""
        if self._bounded is None:
            return ""
        return f"forward.decode at ctx {self._bounded[1]:.4g}, measured from {self._decode_ctx_range[0]:.6g}"

    def _decode_size(self, num_reqs: int) -> float:
        """A decode step's distance from the data at ``num_reqs`` requests over its curves' batch
        axes (the forward's first axis, launch, schedule, process; :func:`sim.model.reach.distance`),
        kept per batch size: with the context's own distance, what :meth:`forward_s` counts."""
        hf, hl, hs, hp = self._hull[DECODE]
        size = self._decode_reach[num_reqs] = max(distance(hf, num_reqs), distance(hl, num_reqs),
                                                  distance(hs, num_reqs), distance(hp, num_reqs))
        return size

    def submit_s(self, kind: int, num_reqs: int, num_tokens: int, sum_ctx: int) -> float:
        """``submit.<kind>`` at the forward's coordinates (0 without that curve), times ``gpu_scale``."""
        curve = self._submit[kind]
        if curve is None:
            return 0.0
        x = (num_reqs, sum_ctx / num_reqs) if kind == DECODE else (num_tokens, (sum_ctx - num_tokens) / num_reqs)
        return curve(*x) * self.gpu_scale

    def grid_text(self) -> str:
        """The measured ranges in words (for warnings)."""
        d, e = self.curves["forward.decode"], self.curves["forward.extend"]
        return (f"decode batch {d.lo[0]:g}-{d.hi[0]:g} x context {d.lo[1]:g}-{d.hi[1]:g}, "
                f"extend tokens {e.lo[0]:g}-{e.hi[0]:g} x prefix {e.lo[1]:g}-{e.hi[1]:g}")

    def describe(self) -> dict:
        m = self.profile["metadata"]
        return {"kind": "profile", "path": self.source, "backend": m.get("backend"), "device": m.get("device"),
                "device_name": m.get("device_name"), "model": m.get("model", {}).get("name"),
                "date": m.get("date"), "gpu_scale": self.gpu_scale, "cpu_scale": self.cpu_scale,
                "overlap_residue_s": self.overlap_residue_s, "sync_latency_s": self.sync_latency_s,
                "statistic": self.statistic}


def device_launch_part(profile: dict, curves: dict):
    """The part of ``launch.extend`` that a CUDA torch calibration timed as its own model's eager
    launch (:mod:`calibrate.forward.torch_backend`: from the first input array built to the last
    kernel queued), standing in for the engine's model launch: a composed profile's
    ``device_launch.extend`` curve (``overlap-sim compose`` keeps it apart), or, on a profile of
    that calibration itself (``metadata.backend`` torch, ``metadata.device`` cuda, not composed),
    the whole ``launch.extend``. None on any other profile (SGLang's CPU engine, a CPU or MLX
    calibration, a server's trace, inline costs). ``curves``: the profile's curves as the cost
    model reads them (:func:`sim.model.profile.profile_curves`)."""
    meta = profile.get("metadata") or {}
    if meta.get("backend") != "torch" or meta.get("device") != "cuda":
        return None  # (an MLX launch builds a lazy graph the device starts only at its submission)
    if (part := curves.get("device_launch.extend")) is not None:
        return part
    return None if meta.get("composed") else curves["launch.extend"]


def scaled_device_part(launch, device, scale: float):
    """``launch`` (a one-axis :class:`sim.model.curve.Curve` of ``launch.extend``, seconds) with its
    ``device`` part (a curve on the same axis) times ``scale`` (>= 0), as a function of the tokens:
    ``launch(x) - (1 - scale) * device(x)``, held between 0 and ``launch(x)`` (beyond the data the
    two curves extend their edge segments, clamped at 0 each) at ``scale`` <= 1, and at least
    ``launch(x)`` above it. ``scale`` 0 leaves the host part alone; 1 gives ``launch`` back."""
    if scale == 1.0:
        return launch
    if scale < 1.0:
        return lambda x: min(launch(x), max(0.0, launch(x) - (1.0 - scale) * device(x)))
    return lambda x: launch(x) + (scale - 1.0) * device(x)
