"""Check the stubbed host calibration against the full CPU-engine one, measured in one window.

    python benchmarks/stub_check.py --full FULL.json --host HOST.json [--validation DIR --repeats N]
        [--touch-bytes 12000000 --work DIR] --out benchmarks/results/sglang-host-stub-check.json
    python benchmarks/stub_check.py --engine vllm --full FULL.json --host HOST.json [--validation DIR]
        --out benchmarks/results/vllm-host-stub-check.json

``--engine vllm``: FULL is ``calibrate --engine vllm`` (the CPU server, its real forward), HOST is
``calibrate --engine vllm --host-only`` (the same server, forward stubbed); the settings are
``sync``/``async`` and the re-scored profile is FULL with every curve but ``vllm.forward`` taken
from HOST (:func:`swap_vllm_host`); ``--hold-control`` runs the stubbed server on FULL's grid with
the stub sleeping and busy-waiting (:func:`hold_control`, needs the vLLM environment).
``--touch-bytes`` is SGLang's only.

- **Agreement per curve**: at every point both files measured (decode batches 1-16, prefills of
  16-512 tokens, under each loop), the stubbed median over the full CPU engine's median
  (``overlap-sim calibrate --engine sglang``: the same functions, after a real CPU forward).
- **Cache effect** (``--touch-bytes``): the stubbed driver on the full calibration's own grid,
  once with the plain stub and once with a stub that also reads that many bytes (a CPU forward
  streams its weights through the caches: the tiny model's are 11.6 MB), normal loop only; how
  much of the gap the reading explains.
- **Re-scored validation** (``--validation``: the folder of an ``overlap-sim validate --engine
  sglang`` run in the same window): the measured runs against the full profile and against a
  profile of the full profile's forward curves and the stubbed host curves (``overlap-sim
  compose FULL HOST --host-speed 1``), median |error| and the pooled speedup.

Needs the SGLang environment only with ``--touch-bytes``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


BASE_SETTING = {"sglang": "normal", "vllm": "sync"}


def medians(profile: dict, base: str = "normal") -> dict:
    """(setting, curve, x) -> median seconds of a profile's host samples (``base``: the setting of
    samples without one)."""
    out = {}
    for s in profile["samples"]:
        if s["curve"].startswith("forward") or s["curve"] == "vllm.forward":
            continue
        out[(s.get("setting", base), s["curve"], next(iter(s["point"].values())))] = statistics.median(s["times_s"])
    return out


def agreement(full: dict, host: dict, base: str = "normal") -> list[dict]:
    """Per (setting, curve): the stubbed/full ratio at each shared point and their median."""
    a, b = medians(full, base), medians(host, base)
    rows: dict[tuple, list] = {}
    for key in sorted(a):
        if key in b and a[key] > 0:
            rows.setdefault(key[:2], []).append({"x": key[2], "full_ms": a[key] * 1e3, "stub_ms": b[key] * 1e3,
                                                 "ratio": b[key] / a[key]})
    return [{"setting": s, "curve": c, "median_ratio": statistics.median(p["ratio"] for p in pts), "points": pts}
            for (s, c), pts in rows.items()]


def touch_experiment(full: dict, touch_bytes: int, work: Path) -> list[dict]:
    """The stubbed driver on the CPU-engine grid, plain and reading ``touch_bytes`` per forward."""
    sys.path.insert(0, str(ROOT))
    from calibrate.real import sglang_trace
    from calibrate.real.environment import REPO, find_engine, test_model
    from calibrate.real.sglang_profile import SglangGrid, design, run_job, samples

    engine = find_engine("sglang")
    model = test_model(engine, REPO / ".venvs" / "models" / "tiny-llama")
    grid = SglangGrid()
    d = design(grid)
    got = {}
    for name, touch in (("plain", 0), ("touch", touch_bytes)):
        job = {**d.job(str(model), False, grid), "stub_forward": True, "stub_touch_bytes": touch}
        trace = run_job(engine, job, work, f"stub-{name}", lambda m: print(m, file=sys.stderr))
        _, records, _ = sglang_trace.read_records(trace)
        for s in samples(sglang_trace.iterations(records), d):
            if not s["curve"].startswith("forward"):
                got[(name, s["curve"], next(iter(s["point"].values())))] = statistics.median(s["times_s"])
    ref = medians(full)
    out = []
    for (name, curve, x), t in sorted(got.items()):
        if name == "plain" and ("touch", curve, x) in got and ("normal", curve, x) in ref:
            f, tt = ref[("normal", curve, x)], got[("touch", curve, x)]
            out.append({"curve": curve, "x": x, "full_ms": f * 1e3, "stub_ms": t * 1e3, "stub_touch_ms": tt * 1e3,
                        "gap_explained": (tt - t) / (f - t) if f != t else None})
    return out


def hold_control(full: dict, work: Path) -> dict:
    """vLLM: the stubbed server on the full calibration's own grid and server configuration
    (its batch sizes, contexts, prefill lengths, ``max_num_seqs`` and ``max_model_len``, and the
    CPU API server's default step budget of 2048 tokens), once with the stub sleeping its hold and
    once busy-waiting it (the host calibration's stub): per mode, the host-costs file
    (``work/hold-<mode>.json``) and its agreement with the full calibration per (setting, curve).
    So the stub is compared with the real forward on the same server; the host calibration's
    own grid and configuration (256 sequences, 8192-token steps) are a different server."""
    sys.path.insert(0, str(ROOT))
    from calibrate.host.vllm import calibrate_vllm_host, control_grid
    from calibrate.profile import save_profile
    from calibrate.real.environment import REPO, find_engine, test_model

    grid = control_grid(full["metadata"]["grid"])
    engine = find_engine("vllm")
    model = test_model(engine, REPO / ".venvs" / "models" / "tiny-llama")
    out = {}
    for mode, spin in (("sleep", False), ("busy_wait", True)):
        host = calibrate_vllm_host(engine, model, grid, work / f"control-{mode}", spin=spin, report=print)
        path = work / f"control-{mode}.json"
        save_profile(path, host)
        out[mode] = {"host_file": str(path), "agreement": agreement(full, host, "sync")}
    return out


def swap_vllm_host(full: dict, host: dict) -> dict:
    """A vLLM CPU profile: ``full``'s forward samples (and its forward-side metadata: mixed steps,
    shared prefix) with every other curve's samples from the stubbed ``host`` (same host, no move)."""
    import copy

    from calibrate.profile import build_profile
    from sim.engines.vllm.profile import VLLM_CURVES

    samples = [copy.deepcopy(s) for s in full["samples"] if s["curve"] == "vllm.forward"]
    samples += [copy.deepcopy(s) for s in host["samples"]]
    meta = copy.deepcopy(full["metadata"])
    meta["repeats"] = min(len(s["times_s"]) for s in samples)
    meta["note"] = f"forward of {full['metadata']['date']}, host phases of the stubbed run of {host['metadata']['date']}"
    return build_profile(meta, samples, VLLM_CURVES)


def rescore(full_path: Path, host_path: Path, validation: Path, repeats: int, work: Path,
            engine: str = "sglang") -> dict:
    sys.path.insert(0, str(ROOT))
    from calibrate.host.compose import compose
    from calibrate.profile import save_profile
    from calibrate.real.validate import Plan, compare
    from sim.model.profile import SGLANG_HOST_CURVES, load_profile

    if engine == "vllm":
        from sim.engines.vllm.profile import VLLM_CURVES, VLLM_HOST_CURVES

        composed = swap_vllm_host(load_profile(full_path, VLLM_CURVES), load_profile(host_path, VLLM_HOST_CURVES))
    else:
        composed = compose(load_profile(full_path), load_profile(host_path, SGLANG_HOST_CURVES), host_speed=1.0,
                           device_source=str(full_path), host_source=str(host_path))
    work.mkdir(parents=True, exist_ok=True)
    stub_profile = work / "cpu-forward-stub-host.json"
    save_profile(stub_profile, composed)
    plan = Plan.for_engine(engine, repeats=repeats)
    out = {}
    for name, prof in (("full", full_path), ("stub_host", stub_profile)):
        r = compare(validation, plan, prof)
        out[name] = {"median_abs_error": r["median_abs_error"], "speedup_pooled": r.get("speedup_pooled"),
                     "noise_floor": r.get("noise_floor"),
                     "per_case": [{"name": c["name"], **{s: v["error"] for s, v in c["settings"].items()}}
                                  for c in r["cases"]]}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=sorted(BASE_SETTING), default="sglang")
    p.add_argument("--full", type=Path, required=True)
    p.add_argument("--host", type=Path, required=True)
    p.add_argument("--validation", type=Path, default=None)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--touch-bytes", type=int, default=0)
    p.add_argument("--hold-control", action="store_true",
                   help="vLLM: the stubbed server on FULL's grid with the stub sleeping, then busy-waiting (hold_control)")
    p.add_argument("--work", type=Path, default=Path("results/stub-check"))
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from sim.model.profile import SGLANG_HOST_CURVES, load_profile

    if args.engine == "vllm":
        from sim.engines.vllm.profile import VLLM_CURVES, VLLM_HOST_CURVES

        if args.touch_bytes:
            p.error("--touch-bytes: SGLang's only")
        full, host = load_profile(args.full, VLLM_CURVES), load_profile(args.host, VLLM_HOST_CURVES)
    else:
        full, host = load_profile(args.full), load_profile(args.host, SGLANG_HOST_CURVES)
    result = {"command": " ".join(["python", "benchmarks/stub_check.py", *(argv or sys.argv[1:])]),
              "full": {"file": str(args.full), "date": full["metadata"]["date"], "host_cpu": full["metadata"]["host_cpu"]},
              "host": {"file": str(args.host), "date": host["metadata"]["date"], "host_cpu": host["metadata"]["host_cpu"]},
              "engine": args.engine, "agreement": agreement(full, host, BASE_SETTING[args.engine])}
    if args.touch_bytes:
        result["touch_bytes"] = args.touch_bytes
        result["cache_effect"] = touch_experiment(full, args.touch_bytes, args.work)
    if args.hold_control:
        result["hold_control"] = hold_control(full, args.work)
    if args.validation:
        result["rescored_validation"] = rescore(args.full, args.host, args.validation, args.repeats, args.work,
                                                   args.engine)
        for mode, ctl in result.get("hold_control", {}).items():
            ctl["rescored_validation"] = rescore(args.full, Path(ctl["host_file"]), args.validation, args.repeats,
                                                 args.work / f"rescore-{mode}", args.engine)["stub_host"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for row in result["agreement"]:
        print(f"{row['setting']:8s} {row['curve']:16s} stub/full median {row['median_ratio']:.2f} "
              '(' + ', '.join(f"{q['x']:g}: {q['ratio']:.2f}" for q in row['points']) + ')')
    for mode, ctl in result.get("hold_control", {}).items():
        for row in ctl["agreement"]:
            print(f"{mode:9s} {row['setting']:6s} {row['curve']:18s} stub/full median {row['median_ratio']:.2f}")
        if r := ctl.get("rescored_validation"):
            errs = ", ".join(f"{k} {v * 100:.1f}%" for k, v in r["median_abs_error"].items())
            print(f"validation with the {mode} control's host curves: {errs}; pooled speedup error "
                  f"{r['speedup_pooled']['error_pp']:+.1f} pp")
    for row in result.get("cache_effect", []):
        share = row["gap_explained"]
        print(f"cache   {row['curve']:16s} {row['x']:>5g}: full {row['full_ms']:.3f} stub {row['stub_ms']:.3f} "
              f"stub+touch {row['stub_touch_ms']:.3f} ms" + (f" ({share:.0%} of the gap)" if share is not None else ""))
    for name, r in result.get("rescored_validation", {}).items():
        errs = ", ".join(f"{k} {v * 100:.1f}%" for k, v in r["median_abs_error"].items())
        pooled = r["speedup_pooled"]
        print(f"validation with the {name} profile: {errs}; pooled speedup error {pooled['error_pp']:+.1f} pp "
              f"[{pooled['ci95_pp'][0]:+.1f}, {pooled['ci95_pp'][1]:+.1f}]")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
