"""A device profile from parts: a device's forward curves and a real engine's host curves.

``overlap-sim compose DEVICE.json HOST.json --out PROFILE.json`` joins

- from ``DEVICE.json`` (a torch/MLX calibration, ``calibrate --from-trace``, a ``transfer``, or
  SGLang's CPU engine, ``calibrate --engine sglang``, whose launch has no device part):
  the forward curves (``forward.decode``, ``forward.extend``), the submission curves of MLX
  (``submit.*``), and the *device part* of the launch (``launch.*`` as the device calibration
  timed it: the host time to queue the step on the device: input copies, the CUDA-graph replay
  or the eager kernel launches, the argmax and the copy back);
- from ``HOST.json`` (``calibrate --engine sglang --host-only``: SGLang's own scheduler, the
  forward stubbed): ``recv``, ``schedule.*`` and ``process.*``, and the *host part* of the
  launch (``run_batch`` less the forward and the sampler: the ``ForwardBatch`` building and,
  under overlap, the FutureMap), under each loop (``setting_curves``).

The composed ``launch.*`` at a point is the host part plus the device part there. None of the
device profile's ``recv``/``schedule``/``process`` curves (the project's re-implementation,
:mod:`calibrate.bookkeeping`) is kept.

Host curves measured on another host are divided by ``host_speed`` (the device host's speed over
the host file's, :mod:`calibrate.host.yardstick`): given with ``--host-speed``, else read from the two
files' yardsticks (the device profile's re-implementation samples, timed on the device's host,
against the host file's, timed beside the engine runs), with the spread of the yardstick's point
ratios as the stated uncertainty. ``metadata.curve_sources`` names, per curve, where it came from;
``metadata.composed`` the parts, the move and its uncertainty.

Simplification (stated in ``metadata.composed.launch``): the device part was timed with the
project's own input building (numpy index arrays, tens of microseconds), which SGLang's
``ForwardBatch`` building in the host part also does: the composed launch counts that twice.
"""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

from calibrate.config import SLEEP_CLOCK_HZ, SLEEP_MAX_CYCLES
from sim.commands import output_path
from sim.errors import ProfileError
from sim.jsonio import is_number

DEVICE_CURVES = ("forward.decode", "forward.extend", "submit.decode", "submit.extend")
HOST_CURVES = ("recv", "schedule.extend", "schedule.decode", "process.extend", "process.decode")
LAUNCH_CURVES = ("launch.decode", "launch.extend")
DEVICE_LAUNCH = "device_launch.extend"  # the device part of launch.extend, kept apart (sim.model.profile)
GRAMMAR_CURVES = ("grammar.mask", "grammar.process")  # a host file's structured-output curves, when it has them


def _curve_at(c: dict, x: float) -> float:
    """A stored one-axis curve's value at ``x`` (linear between nodes, the end node's value
    beyond them: the device part of a launch barely grows with the batch)."""
    import numpy as np

    grid = c["grid"][0]
    return float(np.interp(x, grid, c["values_s"]))


def launches_outliving_hold(device: dict) -> list[float]:
    """The prefill sizes (``num_tokens``) at which a CUDA torch calibration's launch took at least
    the longest stream hold it queues before a step (``calibrate.forward.torch_backend``:
    ``SLEEP_MAX_CYCLES`` at ``SLEEP_CLOCK_HZ``, 30 ms at a 2 GHz boost clock): the hold cannot have
    covered such a launch, so the device started the step before the launch ended, and a launch
    that fills CUDA's queue of pending kernels (about a thousand) then waits for the device to
    drain it: the device's time counts in it (docs/calibration.md). Judged on the median of the
    point's samples, and, where the calibration watched its hold (``metadata.launch_outlived_hold``:
    "extend N tokens: k of n" where any sample's launch outlived it), on that too; empty for any
    other calibration."""
    import re
    import statistics

    meta = device.get("metadata") or {}
    if meta.get("backend") != "torch" or meta.get("device") != "cuda":
        return []
    found = {float(s["point"]["num_tokens"]) for s in device.get("samples", [])
             if s.get("curve") == "launch.extend" and not s.get("setting") and s.get("times_s")
             and statistics.median(s["times_s"]) >= HOLD_MAX_S}
    for entry in meta.get("launch_outlived_hold") or []:
        if isinstance(entry, str) and (m := re.match(r"extend (\d+) tokens:", entry)):
            found.add(float(m.group(1)))
    return sorted(found)


HOLD_MAX_S = SLEEP_MAX_CYCLES / SLEEP_CLOCK_HZ  # the CUDA harness's longest stream hold at the boost clock

MAX_HOST_SPEED = 1000.0  # a host this many times faster (or slower) than another is not a measurement


def _host_move(device: dict, host: dict, host_speed: float | None, host_yardstick: dict | None,
               device_source: str, host_source: str) -> dict:
    """How far the host file's costs move to the device's host: ``{"host_speed", "uncertainty_rel",
    "method", ...}``, given (``host_speed``) or from the two hosts' yardsticks
    (:func:`calibrate.host.yardstick.host_speed`; ``host_yardstick`` in place of the host file's own).

    Raises:
        ProfileError: no yardstick on a side, readings of another code version, too few shared points.
        ValueError: a host speed that is not a positive finite number.
    """
    from calibrate.host import yardstick

    dmeta, hmeta = device["metadata"], host["metadata"]
    if host_speed is not None:
        if not (isinstance(host_speed, (int, float)) and math.isfinite(host_speed) and host_speed > 0):
            raise ValueError(f"host_speed must be a positive number (got {host_speed!r})")
        move = {"host_speed": float(host_speed), "method": "given (--host-speed)", "uncertainty_rel": None}
    else:
        target = yardstick.profile_readings(device)
        ruler = host_yardstick or hmeta.get("yardstick") or {}
        if not isinstance(ruler, dict):  # (a hand-edited host file)
            raise ProfileError(host_source, "metadata.yardstick", f"an object with the host's readings (got "
                               f"{type(ruler).__name__})")
        source = ruler.get("readings") or []
        if not isinstance(source, list):
            raise ProfileError(*(("--host-yardstick", "readings") if host_yardstick is not None else
                                 (host_source, "metadata.yardstick.readings")),
                               f"a list of readings (got {type(source).__name__})")
        want = dmeta.get("yardstick_version")
        # the host file's own readings must be of the device profile's code; readings given with
        # --host-yardstick are the caller's word that they are
        if target and host_yardstick is None and ruler and ruler.get("version") != want:
            raise ProfileError(device_source, "metadata.yardstick_version",
                               f"the yardstick code the host's readings ran ({ruler.get('version')!r}); the device "
                               f"profile's is {want or 'unrecorded (code older than the version stamp)'!r}: pass "
                               "--host-yardstick with readings of that code on the host file's host "
                               "(benchmarks/yardstick_at.py), or --host-speed")
        if not target:
            raise ProfileError(device_source, "samples", "the device host's yardstick (re-implementation samples of "
                               "recv/schedule/process, which a torch or MLX calibration writes); without them pass "
                               "--host-speed")
        # what a bad reading is blamed on: the readings given with --host-yardstick, else the files
        given = ("--host-yardstick", "readings") if host_yardstick is not None else None
        if not source:
            where = given or (host_source, "metadata.yardstick")
            raise ProfileError(*where, "the host's yardstick readings (none there); pass --host-speed")
        where = given or (host_source, "metadata.yardstick.readings")
        for i, r in enumerate(source):  # (a hand-edited file: each reading as yardstick.measure writes it)
            point = r.get("point") if isinstance(r, dict) else None
            if not (isinstance(point, dict) and isinstance(r.get("curve"), str) and isinstance(point.get("num_reqs"), int)
                    and is_number(r.get("median_s"), 0.0, sys.float_info.max)):
                raise ProfileError(where[0], f"{where[1]}[{i}]", "a reading {curve, point: {num_reqs}, median_s} "
                                   "with a finite time of 0 or more seconds")
        try:
            got = yardstick.host_speed(source, target)
        except ValueError as err:
            raise ProfileError(*(given or (device_source, "samples")), f"{err}; pass --host-speed") from None
        if not is_number(got.get("host_speed"), 1 / MAX_HOST_SPEED, MAX_HOST_SPEED):
            raise ProfileError(*(given or (host_source, "metadata.yardstick")),
                               f"readings that give a host speed of {got.get('host_speed')!r}, outside 1/"
                               f"{MAX_HOST_SPEED:g}..{MAX_HOST_SPEED:g} (the range --host-speed takes): not "
                               "this code timed on a real host; pass --host-speed")
        move = {**got, "method": "yardstick (calibrate.host.yardstick: the re-implementation on both hosts)",
                "yardstick_version": ruler.get("version"), "device_yardstick_version": want,
                "yardstick_given": host_yardstick is not None, "source_python": ruler.get("python"),
                "target_python": (dmeta.get("libraries") or {}).get("python"),
                # the bench the device's readings ran on (a calibration before 5 December 2026: sized by its
                # grid's largest batch size); the host file's yardstick runs on one of 256
                "device_bench_max_batch": dmeta.get("bookkeeping_bench_max_batch")
                or max((dmeta.get("grid") or {}).get("bookkeeping_batch_sizes") or [0]) or None}
    return move


def compose(device: dict, host: dict, *, host_speed: float | None = None, device_source: str = "<device>",
            host_source: str = "<host>", host_yardstick: dict | None = None) -> dict:
    """The composed profile (see the module docstring).

    Args:
        device: a validated SGLang device profile (``metadata.kind`` not ``host``).
        host: a validated host-costs file (:data:`sim.model.profile.SGLANG_HOST_CURVES`).
        host_speed: the device host's speed over the host file's (> 0); None: from the yardsticks.
        host_yardstick: readings on the host file's host (``{"version", "python", "readings"}``)
            to use instead of the host file's own (of another code version: the device profile's).

    Raises:
        ProfileError: the device file is a host file or has no launch curves, the host file is
            not one, no host speed is given and the files' yardsticks cannot give one.
        ValueError: a host speed that is not a positive finite number.
    """
    from calibrate.profile import build_profile

    dmeta, hmeta = device["metadata"], host["metadata"]
    if dmeta.get("kind") == "host":
        raise ProfileError(device_source, "metadata.kind", "a device profile (forward curves); this is a host-costs file")
    if dmeta.get("engine", "sglang") != "sglang":
        raise ProfileError(device_source, "metadata.engine", "a device profile of forward.decode/forward.extend (a "
                           "torch or MLX calibration, --from-trace, a transfer), not a profile of engine "
                           f"{dmeta.get('engine')!r}")
    vllm = hmeta.get("engine") == "vllm"
    if not vllm and hmeta.get("kind") != "host":
        raise ProfileError(host_source, "metadata.kind", "'host': a host-costs file (calibrate --engine sglang "
                           "--host-only writes one) or a vLLM host-costs file or profile (calibrate --engine vllm)")
    for name in () if vllm else LAUNCH_CURVES:
        if name not in device["curves"]:
            raise ProfileError(device_source, f"curves.{name}", "missing: the device part of the launch")
    move = _host_move(device, host, host_speed, host_yardstick, device_source, host_source)
    if vllm:
        from calibrate.host.compose_vllm import compose_vllm

        return compose_vllm(device, host, move, device_source=device_source, host_source=host_source)
    speed = move["host_speed"]
    # the same host, said so: host costs timed beside the device's own calibration
    same_host = host_speed == 1 and hmeta.get("host_cpu") == dmeta.get("host_cpu")
    samples: list[dict] = []
    for s in device["samples"]:
        if s["curve"] in DEVICE_CURVES and not s.get("setting"):
            samples.append(copy.deepcopy(s))
    # a profile of SGLang's own CPU engine (backend sglang) timed its launch as the same function
    # the host file did (run_batch less the forward): there is no separate device part
    engine_launch = dmeta.get("backend") == "sglang"
    # a CUDA torch calibration's prefill launch queues its own model's kernels one by one (eager): that
    # part is kept apart (an MLX one builds a lazy graph, submitted at its end: not kept)
    eager_extend = dmeta.get("backend") == "torch" and dmeta.get("device") == "cuda"
    settings_curves = {None: device["curves"], **{k: {**device["curves"], **v}
                                                  for k, v in device.get("setting_curves", {}).items()}}
    device_launch: dict[float, float] = {}  # num_tokens -> the device part added to launch.extend there
    for s in host["samples"]:
        t = [v / speed for v in s["times_s"]]
        if s["curve"] in LAUNCH_CURVES:
            dev = settings_curves.get(s.get("setting"), device["curves"])[s["curve"]]
            x = s["point"]["num_reqs" if s["curve"] == "launch.decode" else "num_tokens"]
            part = 0.0 if engine_launch else _curve_at(dev, x)
            t = [v + part for v in t]
            if s["curve"] == "launch.extend" and eager_extend and not s.get("setting"):
                device_launch[x] = part
        elif s["curve"] not in HOST_CURVES and s["curve"] not in GRAMMAR_CURVES:
            continue
        samples.append({**copy.deepcopy(s), "times_s": t})
    samples += [{"curve": DEVICE_LAUNCH, "point": {"num_tokens": x}, "times_s": [part]}
                for x, part in sorted(device_launch.items())]
    unc = move.get("uncertainty_rel")
    moved = {"source": "moved" if not same_host else "measured", "from_host_cpu": hmeta.get("host_cpu"),
             "to_host_cpu": dmeta.get("host_cpu"), "host_speed": speed, "uncertainty_rel": unc}
    sources = {}
    for name in DEVICE_CURVES:
        if name in device["curves"]:
            sources[name] = {"source": "moved" if dmeta.get("transfer") else "measured",
                             "device": dmeta.get("device_name"), "date": dmeta.get("date"), "file": device_source}
    for name in HOST_CURVES + tuple(c for c in GRAMMAR_CURVES if c in host["curves"]):
        fn = (hmeta.get("curve_sources") or {}).get(name, {})
        sources[name] = {**fn, **moved, "date": hmeta.get("date"), "file": host_source}
    for name in LAUNCH_CURVES:
        fn = (hmeta.get("curve_sources") or {}).get(name, {})
        device_part = ({"source": "none", "why": "the device profile is SGLang's CPU engine: its launch is the host "
                        "part itself"} if engine_launch else
                       {"source": "measured", "device": dmeta.get("device_name"), "what": dmeta.get("timing", "")})
        sources[name] = {"source": "parts", "host_part": {**fn, **moved}, "device_part": device_part}
    meta = {k: v for k, v in dmeta.items() if k not in ("grid",)}
    meta["grid"] = {**(dmeta.get("grid") or {}), "host": hmeta.get("grid")}
    meta["engine_version"] = hmeta.get("engine_version")
    meta["libraries"] = {**(dmeta.get("libraries") or {}),
                         **{f"host.{k}": v for k, v in (hmeta.get("libraries") or {}).items()}}
    meta["curve_sources"] = sources
    if isinstance(hmeta.get("structured_output"), dict):
        meta["structured_output"] = {**hmeta["structured_output"], "moved": moved}
    meta["composed"] = {
        "device_profile": device_source, "device_date": dmeta.get("date"), "device_name": dmeta.get("device_name"),
        "host_costs": host_source, "host_date": hmeta.get("date"), "host_cpu": hmeta.get("host_cpu"),
        "host_engine": f"sglang {hmeta.get('engine_version')}", "stub": (hmeta.get("stub") or {}).get("limits"),
        "approximations": "host phases timed after a stubbed forward, on warm caches (on SGLang's CPU engine the "
                          "decode-step phases cost 2-3x as much after a real CPU forward; a GPU host's CPU does not "
                          "run the forward: docs/real-engines.md); no attention-backend planning on the host "
                          "(FlashInfer's); the launch's device part counts the project's own input building too",
        "move": move,
        "launch": "launch = the host file's run_batch (less forward and sampler), moved, plus the device profile's "
                  "launch at the same point (the host time to queue the step); the project's own input building "
                  "inside the device part is counted twice (tens of microseconds)"
                  + ("; a prefill's device part, the device calibration's own model launched eagerly in place of the "
                     f"engine's, is kept apart as {DEVICE_LAUNCH}" if device_launch else ""),
        "note": f"host phases are SGLang's own scheduler functions timed on {hmeta.get('host_cpu')} with the forward "
                f"stubbed and moved to {dmeta.get('host_cpu')} by x{1 / speed:.3g} in time"
                + (f" (±{unc:.0%}, {move['method']})" if unc is not None else f" ({move['method']})")}
    if (outlived := launches_outliving_hold(device)):
        meta["composed"]["device_launch_outlived_hold"] = {
            "num_tokens": outlived, "hold_max_s": HOLD_MAX_S,
            "what": "prefill sizes whose launch (the device part) took at least the harness's longest stream hold "
                    f"({SLEEP_MAX_CYCLES:,} cycles at an assumed {SLEEP_CLOCK_HZ / 1e9:g} GHz): the device started "
                    "before the launch ended, and a launch that filled CUDA's queue of pending kernels then waited "
                    "for the device (docs/calibration.md)"}
    meta["repeats"] = min(len(s["times_s"]) for s in samples if s["curve"] != DEVICE_LAUNCH)
    for key in ("sessions", "host_speed"):
        meta.pop(key, None)
    return build_profile(meta, samples)


def run(args) -> int:
    """``overlap-sim compose``: read, compose, write atomically; one line per bad input (exit 2)."""
    from calibrate.profile import save_profile
    from sim.atomic import check_output_file
    from sim.errors import UserInputError
    from sim.model.profile import load_profile

    if args.host_speed is not None and not (math.isfinite(args.host_speed) and 0 < args.host_speed <= MAX_HOST_SPEED):
        raise UserInputError("--host-speed", "", f"a number above 0 and at most {MAX_HOST_SPEED:g} (got "
                                                 f"{args.host_speed!r})")
    check_output_file(args.out, "--out", (".json",), inputs=[args.device, args.host])
    for flag, path in (("DEVICE", args.device), ("HOST", args.host)):
        if Path(path).is_dir():
            raise UserInputError(flag, "", f"{path} is a folder; expected a profile file")
    _check_kinds(args.device, args.host)
    device = load_profile(args.device)
    host = load_profile(args.host, _host_table(args.host))
    ruler = _read_yardstick(args.host_yardstick) if args.host_yardstick is not None else None
    if ruler is not None and args.host_speed is not None:
        raise UserInputError("--host-yardstick", "", "either it or --host-speed, not both")
    profile = compose(device, host, host_speed=args.host_speed, device_source=str(args.device),
                      host_source=str(args.host), host_yardstick=ruler)
    save_profile(args.out, profile)
    move = profile["metadata"]["composed"]["move"]
    unc = move.get("uncertainty_rel")
    print(f"host phases from {args.host} ({host['metadata'].get('host_cpu')}) moved to "
          f"{device['metadata'].get('host_cpu')}: host speed x{move['host_speed']:.3g}"
          + (f" (±{unc:.0%}, {move.get('points')} yardstick points)" if unc is not None else " (given)"))
    print(f"profile written to {args.out}")
    return 0


def _peek(path: Path) -> dict | None:
    """A file's ``metadata`` object, or None (unreadable or not a profile: the loader says why)."""
    import json

    try:
        meta = json.loads(Path(path).read_text()).get("metadata")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError, RecursionError):
        return None
    return meta if isinstance(meta, dict) else None


def _check_kinds(device: Path, host: Path) -> None:
    """One line when the two files are swapped or of the wrong kind, before they are loaded."""
    from sim.errors import UserInputError

    dmeta, hmeta = _peek(device), _peek(host)
    if dmeta is not None and dmeta.get("kind") == "host":
        raise UserInputError("DEVICE", "", f"{device} is a host-costs file; expected a device profile (calibrate "
                             "--backend torch/mlx, --from-trace, transfer): the order is DEVICE HOST")
    if hmeta is not None and hmeta.get("kind") != "host" and hmeta.get("engine") != "vllm":
        what = ("a full profile of SGLang's CPU engine (calibrate --engine sglang without --host-only)"
                if hmeta.get("backend") == "sglang" else "a device profile")
        raise UserInputError("HOST", "", f"{host} is {what}; expected a host-costs file (calibrate --engine sglang "
                             "--host-only) or a vLLM profile (calibrate --engine vllm)")


def _host_table(path: Path):
    """The curves the host file holds: a vLLM profile's (``metadata.engine: "vllm"``) or SGLang's
    host-costs file's (an unreadable file is left to the loader, which says why)."""
    from sim.model.profile import SGLANG_HOST_CURVES

    meta = _peek(path) or {}
    if meta.get("engine") == "vllm":
        from sim.engines.vllm.profile import VLLM_CURVES, VLLM_HOST_CURVES

        return VLLM_HOST_CURVES if meta.get("kind") == "host" else VLLM_CURVES
    return SGLANG_HOST_CURVES


def _read_yardstick(path: Path) -> dict:
    """A yardstick reading file (``{"version", "python", "readings": [...]}``); one line per fault."""
    import json

    from sim.errors import UserInputError

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise UserInputError("--host-yardstick", "", f"a readable JSON file of yardstick readings ({path}: "
                             f"{type(err).__name__})") from None
    ok = (isinstance(data, dict) and isinstance(data.get("readings"), list) and all(
        isinstance(r, dict) and isinstance(r.get("curve"), str) and isinstance(r.get("point"), dict)
        and isinstance(r["point"].get("num_reqs"), int) and isinstance(r.get("median_s"), (int, float))
        and math.isfinite(r["median_s"]) and r["median_s"] >= 0 for r in data["readings"]))
    if not ok:
        raise UserInputError("--host-yardstick", "readings", f"a list of {{curve, point: {{num_reqs}}, median_s}} "
                             f"readings with finite times ({path})")
    return data


def add_arguments(p) -> None:
    p.add_argument("device", type=Path, metavar="DEVICE", help="a device profile: its forward curves and the device "
                   "part of the launch (calibrate --backend torch/mlx, --from-trace, or transfer)")
    p.add_argument("host", type=Path, metavar="HOST", help="a host-costs file (calibrate --engine sglang --host-only), "
                   "or a vLLM profile (calibrate --engine vllm) for a vLLM profile of the card")
    p.add_argument("--out", type=output_path, required=True, help="the composed profile (JSON)")
    p.add_argument("--host-speed", type=float, default=None, metavar="X",
                   help="the device host's single-thread speed over the host file's (2: its phases take half the "
                        "time); default: from the two files' yardsticks (calibrate.host.yardstick)")
    p.add_argument("--host-yardstick", type=Path, default=None, metavar="JSON",
                   help="yardstick readings on the host file's host of the code the device profile's host ran "
                        "(benchmarks/yardstick_at.py REV), when the host file's own are of another version")
