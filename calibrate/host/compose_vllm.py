"""A vLLM profile for a card from parts: a card's forward curves and vLLM's own host curves.

``overlap-sim compose DEVICE.json VLLM.json --out PROFILE.json`` with a vLLM file as the host
part (``metadata.engine: "vllm"``: the host-costs file of ``calibrate --engine vllm --host-only``,
vLLM's server with the forward stubbed, :mod:`calibrate.host.vllm`; or a full CPU profile of
``calibrate --engine vllm``) writes a vLLM profile (:data:`sim.engines.vllm.profile.VLLM_CURVES`) whose

- ``vllm.forward`` (scheduled tokens x mean context) is the card's: each node priced from the
  device profile's SGLang-shaped curves as ``overlap-sim transfer`` maps a vLLM node
  (:func:`sim.model.transfer.vllm_forward_point`): up to the largest decode batch of the device
  profile a decode of that many requests (``forward.decode``); beyond it ``r`` prefills of ``t``
  tokens after ``p`` cached, priced as one prefill of ``r t`` tokens after ``p``
  (``forward.extend``: the device calibration's convention for a prefill of several requests);
- every other curve (the engine core's ``add_request``, ``schedule``, ``update``; the RPCs'
  ``dispatch``, ``roundtrip``, ``collect``, ``pickup``; the worker's ``prepare`` and ``sample``;
  the API server's ``frontend_*``) is vLLM's own, timed in the real server, divided by
  ``host_speed`` (:mod:`calibrate.host.compose` says how it is found), under each setting.

Stated approximations (in ``metadata.composed``): the worker's ``prepare`` and ``sample`` were
timed on vLLM's CPU platform, where ``_prepare_inputs`` builds CPU attention metadata and
sampling runs on the CPU; on a GPU the first builds FlashAttention's metadata and copies inputs
to the device, the second launches GPU sampling and waits for its copy back (the wait for the
forward is the simulator's, from the device stream). Host curves reach as far as the vLLM
calibration's batch sizes (16 on the shipped profile) and extend linearly beyond
(``curve_sources.*.measured_to``). The CPU calibration's mixed-step rule and shared-prefix
saving are the CPU kernel's and are dropped (a GPU forward reads the weights once per step; the
saving was not measured on a card).
"""

from __future__ import annotations

import copy

from sim.errors import ProfileError

FORWARD = "vllm.forward"
# prefill token counts of the composed forward grid beyond the decode batches (up to the device grid)
PREFILL_TOKENS = (512, 1024, 2048, 4096, 8192)


def _forward_nodes(device: dict) -> tuple[list[float], list[float], float]:
    grid = device["curves"]["forward.decode"]["grid"]
    ext = device["curves"]["forward.extend"]["grid"][0]
    decode_max = max(grid[0])
    tokens = sorted({*grid[0], *(t for t in PREFILL_TOKENS if decode_max < t <= max(ext))})
    return tokens, sorted(grid[1]), decode_max


def forward_samples(device: dict) -> tuple[list[dict], float]:
    """``vllm.forward`` samples (one per node, the device curves' value there) and the largest
    decode batch they assume."""
    from sim.model.profile import profile_curves
    from sim.model.transfer import vllm_forward_point

    curves = profile_curves(device)
    tokens, contexts, decode_max = _forward_nodes(device)
    out = []
    for n in tokens:
        for ctx in contexts:
            shape, a, b, r = vllm_forward_point(n, ctx, decode_max)
            t = curves[shape](a, b) if shape == "forward.decode" else curves[shape](a * r, b)
            out.append({"curve": FORWARD, "point": {"num_tokens": n, "ctx": ctx}, "times_s": [float(t)]})
    return out, decode_max


def _stub_bias(host: dict) -> str:
    """What the vLLM stub check found, and how far and how the API server's curves were measured."""
    curve = host["curves"].get("vllm.frontend_out")
    front = host["metadata"].get("frontend") or {}
    if not curve:
        out = ""
    elif front.get("sessions") == "frontend":  # (calibrate.host.vllm.frontend_session, since 6 December 2026)
        work = host["curves"].get("vllm.frontend_work")
        out = (f"; the API server's frontend_out measured to {max(curve['grid'][0]):g} requests"
               + (f" and its process_outputs to {max(work['grid'][0]):g} (a call per slice of 128)" if work else "")
               + f" in sessions whose stub sleeps {front.get('hold_s', 0) * 1e3:g} ms a step, both settings pooled, "
               "with the load's client on the same cores (an upper bound of the API server's latency)")
    else:
        out = (f"; the API server's frontend_out measured to {max(curve['grid'][0]):g} requests (with the load's "
               "client on the same cores) and held at its value there beyond (a step's outputs beyond it are priced "
               "as the largest measured, and counted as extrapolated)")
    return ("; the stub check, run once, on the AMD EPYC host file of 2026-12-02 (not repeated for other host "
            "files; the same method), found that file's synchronous RPC intervals and prepare 10-60% dearer, and "
            "async's collect 3.4x, than the CPU calibration's on its smaller server (a GPU-sized server and the "
            "contention of two cores; benchmarks/results/vllm-host-stub-check.json), which leans async/sync high"
            + out)


def compose_vllm(device: dict, host: dict, move: dict, *, device_source: str, host_source: str) -> dict:
    """The composed vLLM profile (see the module docstring); ``move``: ``{"host_speed",
    "uncertainty_rel", "method", ...}`` as :func:`calibrate.host.compose.compose` found it.

    Raises:
        ProfileError: the device profile lacks the forward curves; the host file is no vLLM profile.
    """
    from calibrate.profile import build_profile
    from sim.engines.vllm.profile import VLLM_CURVES

    hmeta, dmeta = host["metadata"], device["metadata"]
    if hmeta.get("engine") != "vllm":
        raise ProfileError(host_source, "metadata.engine", "'vllm': a vLLM profile (calibrate --engine vllm)")
    for name in ("forward.decode", "forward.extend"):
        if name not in device["curves"]:
            raise ProfileError(device_source, f"curves.{name}", "missing: the card's forward")
    speed = move["host_speed"]
    samples, decode_max = forward_samples(device)
    for s in host["samples"]:
        if s["curve"] == FORWARD:
            continue
        samples.append({**copy.deepcopy(s), "times_s": [t / speed for t in s["times_s"]]})
    measured_to = max((hmeta.get("grid") or {}).get("decode_batch_sizes") or [0]) or None
    stubbed = hmeta.get("kind") == "host"  # calibrate --engine vllm --host-only: the forward stubbed
    moved = {"source": "moved", "from_host_cpu": hmeta.get("host_cpu"), "to_host_cpu": dmeta.get("host_cpu"),
             "host_speed": speed, "uncertainty_rel": move.get("uncertainty_rel"), "engine": f"vllm {hmeta.get('engine_version')}",
             "measured_on": hmeta.get("device_name"), "measured_to": measured_to, "date": hmeta.get("date"),
             "file": host_source}
    functions = hmeta.get("curve_sources") or {}
    sources = {name: {**functions.get(name, {}), **moved} for name in VLLM_CURVES.all
               if name != FORWARD and (not stubbed or name in host["curves"])}
    sources[FORWARD] = {"source": "moved" if dmeta.get("transfer") else "measured", "device": dmeta.get("device_name"),
                        "date": dmeta.get("date"), "file": device_source,
                        "how": "the device profile's forward.decode / forward.extend at each node (vllm_forward_point)"}
    unc = move.get("uncertainty_rel")
    meta = {k: v for k, v in dmeta.items() if k not in ("grid", "yardstick_version")}
    meta.update({
        "backend": "vllm", "engine": "vllm", "engine_version": hmeta.get("engine_version"),
        "settings": hmeta.get("settings", ["sync", "async"]), "base_setting": hmeta.get("base_setting", "sync"),
        "grid": {"decode_batch_sizes": sorted({*device["curves"]["forward.decode"]["grid"][0]}),
                 "host": hmeta.get("grid")},
        "libraries": {**(dmeta.get("libraries") or {}),
                      **{f"host.{k}": v for k, v in (hmeta.get("libraries") or {}).items()}},
        "curve_sources": sources,
        "composed": {
            "device_profile": device_source, "device_date": dmeta.get("date"), "device_name": dmeta.get("device_name"),
            "host_costs": host_source, "host_date": hmeta.get("date"), "host_cpu": hmeta.get("host_cpu"),
            "host_engine": f"vllm {hmeta.get('engine_version')}", "move": move,
            "stub": (hmeta.get("stub") or {}).get("limits") if stubbed else None,
            "approximations": "the worker's prepare and sample as timed on vLLM's CPU platform (CPU attention "
                              "metadata and CPU sampling; on a GPU, FlashAttention's metadata, input copies, GPU "
                              f"sampling and its copy back); host curves measured to {measured_to} requests"
                              + (" with the forward stubbed" if stubbed else " beside the CPU forward")
                              + " and extended linearly beyond" + (_stub_bias(host) if stubbed else "")
                              + "; the CPU kernel's mixed-step rule and shared-prefix saving dropped",
            "note": f"host phases are vLLM's own functions timed on {hmeta.get('host_cpu')} ({hmeta.get('device_name')}"
                    + (f", to {measured_to} requests, forward stubbed" if stubbed else "") + ") "
                    f"and moved to {dmeta.get('host_cpu')} by x{1 / speed:.3g} in time"
                    + (f" (±{unc:.0%}, {move['method']})" if unc is not None else f" ({move['method']})")},
    })
    meta["repeats"] = min(len(s["times_s"]) for s in samples)
    meta["largest_decode_batch"] = decode_max
    for key in ("mixed_steps", "shared_prefix", "sessions", "host_speed"):
        meta.pop(key, None)
    return build_profile(meta, samples, VLLM_CURVES)
