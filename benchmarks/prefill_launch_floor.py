"""How far answers on the shipped H200 profiles move without calibrate's own prefill launch (run by hand).

A composed CUDA profile's ``launch.extend`` is mostly the device calibration's plain-torch model
queued kernel by kernel, standing in for SGLang's model launch, which no calibration measures
(docs/calibration.md, "The prefill launch on CUDA"). For a few loads on the shipped profiles this
simulates both settings as measured and with that part nil (``costs.cpu.extend_launch_device_scale``
0: the engine's host part alone, the floor the verdict's clause simulates) and prints the
throughput ratio and the median TTFT and TPOT of each setting (exact medians, from the tables). Deterministic;
about a second.

    python benchmarks/prefill_launch_floor.py
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
EIGHT_B = f"costs.profile={ROOT / 'scenarios' / 'profiles' / 'h200-llama-3.1-8b.json'}"
LOADS = {
    "the quickstart (1B, 8 clients, 1 new token a prompt)": [],
    "1B, 32 clients, 512 uncached in, 32 out, 400 requests": [
        "workload.concurrency=32", "workload.cached_len=0", "workload.output_len=32", "workload.num_requests=400",
        "workload.warmup_requests=32"],
    "8B, 8 clients, 2,048 uncached in, 128 out, 200 requests": [
        EIGHT_B, "workload.input_len=2048", "workload.cached_len=0", "workload.output_len=128",
        "workload.num_requests=200"],
    "8B, Poisson 20/s, 32 in and out, 1,000 requests": [
        EIGHT_B, "workload.arrival=poisson", "workload.rate_per_s=20", "workload.input_len=32",
        "workload.cached_len=0", "workload.output_len=32", "workload.num_requests=1000",
        "workload.warmup_requests=50"],
}


def measure(overrides: list[str]) -> dict[str, dict]:
    """Each setting's summary (exact medians, as a default run's) of the quickstart with ``overrides``."""
    from sim.scenario import load_scenario
    from sim.simulate import simulate

    scenario = load_scenario(str(QUICKSTART), overrides)
    return {name: simulate(scenario, name).summary() for name in scenario.server.settings}


def row(s: dict[str, dict]) -> str:
    ratio = s["overlap"]["output_throughput"] / s["normal"]["output_throughput"]
    return (f"{ratio:.3f}x; median TTFT {s['overlap']['median_ttft_ms']:.1f} / {s['normal']['median_ttft_ms']:.1f} ms; "
            f"median TPOT {s['overlap']['median_tpot_ms']:.2f} / {s['normal']['median_tpot_ms']:.2f} ms")


def main() -> None:
    print("| load | as measured (overlap / normal) | the device part nil |")
    print("|---|---|---|")
    for name, overrides in LOADS.items():
        measured = measure(overrides)
        floor = measure(overrides + ["costs.cpu.extend_launch_device_scale=0"])
        print(f"| {name} | {row(measured)} | {row(floor)} |")


if __name__ == "__main__":
    main()
