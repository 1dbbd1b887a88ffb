"""Summaries side by side: ratios, JSON, rich tables, titles and warnings (a run's results folder is
written by :mod:`sim.output.run_files`)."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sim.model.reach import FAR
from sim.output.text import wrapped
from sim.model.schema import MAX_TOKENS, length_bounds
from sim.trace.metrics import SUMMARY_KEYS, served

if TYPE_CHECKING:
    from rich.console import Console  # rich: imported when a table is printed (not by run --json)

RATIO_BASELINE = "normal"
# (the setting that overlaps CPU work with the forward, its synchronous baseline), per engine:
# SGLang's event_loop_overlap / event_loop_normal, vLLM's async / sync scheduling
RATIO_PAIRS = (("overlap", "normal"), ("async", "sync"))


def baseline_of(names) -> str:
    """The synchronous setting among ``names`` that ratios are taken against: ``normal`` (SGLang),
    else ``sync`` (vLLM), else :data:`RATIO_BASELINE`."""
    return next((den for _num, den in RATIO_PAIRS if den in names), RATIO_BASELINE)


def ratio_pair(names) -> tuple[str, str] | None:
    """The (overlapping, synchronous) pair of :data:`RATIO_PAIRS` present in ``names``, if any."""
    return next(((num, den) for num, den in RATIO_PAIRS if num in names and den in names), None)
# (label, key, format) rows of the terminal table
TABLE_ROWS = [
    ("completed / failed", None, None),
    ("failed: cut off / no connect / aborted", None, None),
    ("output throughput (tok/s)", "output_throughput", "{:.1f}"),
    ("request throughput (req/s)", "request_throughput", "{:.3f}"),
    ("TTFT mean / median / p99 (ms)", "ttft", "{:.2f}"),
    ("TPOT mean / median / p99 (ms)", "tpot", "{:.3f}"),
    ("ITL mean / median / p99 (ms)", "itl", "{:.3f}"),
    ("E2E mean / median (ms)", "e2e", "{:.1f}"),
    ("GPU idle fraction", "gpu_idle_fraction", "{:.3f}"),
    ("gap mean / median / p99 (ms)", "gap", "{:.3f}"),
    ("sync wait mean (ms)", "mean_sync_wait_ms", "{:.3f}"),
    ("steps / decode batch size", None, None),
    ("overshoot tokens", "overshoot_tokens", "{:d}"),
    ("peak KV token usage", "peak_token_usage", "{:.3f}"),
    ("retracted / re-prefilled tok / skipped", None, None),
]
CPU_IDLE_LABEL = "device idle fraction (CPU)"  # the idle row's label when the forward runs on a CPU core


def device_word(device: str) -> str:
    """What the forwards run on, as the plots name it: "GPU", or "CPU forward" when ``device`` is
    ``cpu`` (the forward runs on a CPU core: SGLang's CPU engine, vLLM's worker; the table's idle
    row is then :data:`CPU_IDLE_LABEL`)."""
    return "CPU forward" if device == "cpu" else "GPU"


def ratios(summaries: dict[str, dict], baseline: str | None = None) -> dict[str, dict]:
    """``{"X/normal": {key: X[key] / normal[key]}}`` for every numeric key and every other setting
    (baseline None: :func:`baseline_of` the settings, ``normal`` or vLLM's ``sync``); every value
    None where either setting did not serve its load (:func:`sim.trace.metrics.served`: a dead
    server's duration or counts are not a ratio of the two loops)."""
    baseline = baseline_of(summaries) if baseline is None else baseline
    if baseline not in summaries:
        return {}
    base = summaries[baseline]
    out = {}
    for name, summ in summaries.items():
        if name == baseline:
            continue
        row = {}
        both = served(summ) and served(base)
        for key in SUMMARY_KEYS:
            a, b = summ.get(key), base.get(key)
            if (both and isinstance(a, (int, float)) and isinstance(b, (int, float)) and b and not math.isnan(b)
                    and not math.isnan(a)):
                row[key] = a / b
            else:
                row[key] = None
        out[f"{name}/{baseline}"] = row
    return out


def jsonable(obj):
    """Replace NaN/inf by None and numpy scalars by Python ones, recursively."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def run_payload(name: str, seed: int, summaries: dict[str, dict]) -> dict:
    """The ``run --json`` object: scenario, seed, settings, ratios."""
    return jsonable({"scenario": name, "seed": seed, "settings": summaries, "ratios": ratios(summaries)})


def _fmt(fmt: str, v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return fmt.format(int(v) if fmt.endswith("d}") else v)


def _cell(summ: dict, key: str | None, fmt: str | None, label: str) -> str:
    if label.startswith("completed"):
        return f"{summ['completed']} / {summ['failed']}"
    if label.startswith("failed:"):
        cell = " / ".join(str(summ.get(k, 0)) for k in ("cut_off", "could_not_connect", "aborted"))
        return cell + (f" (+{summ['too_long']} too long for the KV pool)" if summ.get("too_long") else "")
    if label.startswith("retracted"):
        return f"{summ.get('retractions', 0)} / {summ.get('reprefill_tokens', 0)} / {summ.get('skipped_decodes', 0)}"
    if label.startswith("steps"):
        return f"{summ['num_steps']} / {_fmt('{:.1f}', summ['mean_decode_batch_size'])}"
    if key in ("ttft", "tpot", "itl", "gap"):
        return " / ".join(_fmt(fmt, summ[f"{s}_{key}_ms"]) for s in ("mean", "median", "p99"))
    if key == "e2e":
        return " / ".join(_fmt(fmt, summ[f"{s}_e2e_latency_ms"]) for s in ("mean", "median"))
    return _fmt(fmt, summ.get(key))


def _ratio_cell(r: dict, key: str | None, label: str) -> str:
    k = {"ttft": "median_ttft_ms", "tpot": "median_tpot_ms", "itl": "median_itl_ms", "gap": "mean_gap_ms",
         "e2e": "median_e2e_latency_ms"}.get(key, key)
    v = r.get(k) if k else None
    return "-" if v is None else f"{v:.3f}"


def console_width() -> int | None:
    """Width for tables: the terminal's, ``COLUMNS`` if set, else 110 when output is piped
    (rich would wrap every row at 80)."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return None
    return 110


def run_warnings(summaries: dict[str, dict], open_loop: bool = False) -> dict[str, list[str]]:
    """What a run's results warn of, per setting (printed under the table, in ``--json``'s and
    ``summary.json``'s ``warnings``): steps priced beyond the profile's data (how many, how far by
    :func:`sim.model.reach.distance`, and the farthest curve and axis), requests that entered
    vLLM's API server in a pool larger than its ``frontend_in`` data (``frontend_in_beyond``),
    and in an open loop (``open_loop``) a queue that grew through the run
    (:func:`sim.trace.metrics.queue_growth`)."""
    from sim.model.reach import bounded_words, reach_words
    from sim.trace.metrics import GROWN_TTFT, growth_words, queue_growth, queue_growth_words

    out: dict[str, list[str]] = {}
    for name, s in summaries.items():
        lines = out.setdefault(name, [])
        if s.get("extrapolated_steps"):
            far = f"; {s['far_steps']} beyond x{FAR:g}" if s.get("far_steps") else ""
            at = str(s.get("max_extrapolation_at") or "")
            how = "docs/vllm.md, the vLLM profile" if at.startswith("vllm.") else "docs/calibration.md"
            lines.append(f"warning: {name}: {s['extrapolated_steps']} steps (warm-up included) lie outside the "
                         f"calibration profile's measured data ({reach_words(s.get('max_extrapolation', 1.0), at)}"
                         f"{far}); their costs are extrapolated, or held at the edge where the profile's note says "
                         f"so (measure that curve further: {how})")
        if s.get("bounded_steps"):
            lines.append(f"note: {name}: {s['bounded_steps']} steps (warm-up included) are priced below the calibration "
                         f"profile's measured contexts "
                         f"{bounded_words(float(s.get('max_bounded_share') or 0.0), str(s.get('max_bounded_at') or ''))}"
                         "; counted apart from the steps beyond the data (whose price has no such bound)")
        if s.get("frontend_in_beyond"):  # vLLM's API server (sim.engines.vllm.frontend)
            lines.append(f"warning: {name}: {s['frontend_in_beyond']} requests (warm-up included) entered vLLM's API server "
                         f"while it held more than the largest burst vllm.frontend_in was measured at "
                         f"({s['frontend_in_measured_to']}; "
                         f"up to {s['frontend_in_pool']} at once): their way to the engine extends the curve's line "
                         "past its data (measure larger bursts: docs/vllm.md, the vLLM profile)")
        if open_loop and (grown := queue_growth(s)):
            label, values = grown
            how = (f"TTFT rose {growth_words(values[0])} per second of arrivals (median TTFT "
                   f"{s['median_ttft_ms']:.0f} ms): the arrivals outpace this setting, or nearly"
                   if label == GROWN_TTFT else
                   f"{queue_growth_words(grown)} (admitted requests wait in a running batch that keeps growing, "
                   "TTFT may stay flat): the arrivals outpace this setting, or nearly, or the run is short for its "
                   "latency")
            lines.append(f"warning: {name}: the queue grew through the run: {how}, so this open loop's throughput "
                         "and latency answer for its length (workload.num_requests; ask: --num-requests), not for a "
                         "steady state")
    return {name: lines for name, lines in out.items() if lines}


def print_table(title: str, summaries: dict[str, dict], console: Console | None = None, streamed: bool = False,
                device: str = "cuda", warned: dict[str, list[str]] | None = None) -> None:
    """A rich table: one column per setting plus the ratio to ``normal`` (vLLM: ``sync``; latency
    ratios: medians). ``streamed``: the medians and p99s come from a streaming sketch
    (``--tables summary|none``). ``device``: the scenario's ``server.device``; on ``cpu`` the
    forward runs on a CPU core, and the idle fraction is labelled as that device's. Warnings
    follow, per setting: ``warned`` (:func:`run_warnings` of these summaries, which the caller
    keeps for its JSON too; None: computed here, as of a closed loop) and a server that died."""
    from rich.table import Table

    from sim.commands import stdout_console

    console = console or stdout_console(console_width())
    rat = ratios(summaries)
    caption = (f"ratios: setting / {baseline_of(summaries)}; on mean / median / p99 rows, the ratio of the medians "
               "(gap: of the means)")
    if streamed:
        caption += "; medians and p99s streamed (DDSketch, within 0.5%)"
    died = [name for name, s in summaries.items() if s.get("outcome", "ok") != "ok"]
    if died:  # (its values are until then: ITL and sync wait of the steps it ran, no idle share after)
        caption += f"; {' and '.join(died)}: values until {'its server' if len(died) == 1 else 'their servers'} died"
    table = Table(title=title, caption=caption if rat or streamed or died else None)
    table.add_column("metric")
    for name in summaries:  # (a name too long for a narrow terminal folds, not cut to "thread_overl…")
        table.add_column(name, justify="right", overflow="fold")
    for rname in rat:
        table.add_column(rname, justify="right", overflow="fold")
    for label, key, fmt in TABLE_ROWS:
        if key == "gpu_idle_fraction" and device_word(device) != "GPU":
            label = CPU_IDLE_LABEL
        # a server that died idles ever after: its idle share and gaps describe no serving
        idle_row = key in ("gpu_idle_fraction", "gap")
        cells = ["server died" if idle_row and name in died else _cell(s, key, fmt, label)
                 for name, s in summaries.items()]
        cells += ["-" if idle_row and any(part in died for part in rname.split("/")) else _ratio_cell(r, key, label)
                  for rname, r in rat.items()]
        table.add_row(label, *cells)
    console.print(table)
    if warned is None:
        warned = run_warnings(summaries)
    for name, s in summaries.items():
        for line in warned.get(name, ()):
            console.print("\n".join(wrapped(line, console.width)), style="yellow", markup=False, highlight=False)
        if s.get("outcome", "ok") != "ok":
            usage = s.get("outcome_token_usage")
            at_usage = f", token usage {usage:.2f}" if isinstance(usage, float) and usage == usage else ""
            console.print(f"[bold red]{name}: {s['outcome']}[/] at t={s.get('outcome_time_s', float('nan')):.3f}s"
                          f"{at_usage}: {s.get('outcome_reason', '')}")


def profile_metadata(path) -> dict | None:
    """The ``metadata`` object of the calibration profile at ``path`` (None when unreadable: the
    scenario validated it already, so this only labels the table): the loaded profile's where the
    run loaded this file version (:func:`sim.model.profile.loaded_metadata`), else read from the
    file."""
    from sim.model.profile import loaded_metadata

    if (meta := loaded_metadata(path)) is not None:
        return meta
    try:
        meta = json.loads(Path(path).read_text()).get("metadata")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return meta if isinstance(meta, dict) else None


def run_title(name: str, seed: int, device: str, meta: dict | None) -> str:
    """The run table's title: scenario, seed, device kind, and the card and model the numbers
    describe (the profile's ``metadata.device_name`` and ``metadata.model.name``; a profile moved
    to another card by ``overlap-sim transfer`` says from which card and with what uncertainty; one
    built from parts by ``overlap-sim compose`` says where its host phases were timed and how far
    they were moved)."""
    head = f"{name} (seed {seed}, {device})"
    if meta is None:
        return f"{head}: inline cost terms (no calibration profile)"
    model = meta.get("model")
    model_name = model.get("name") if isinstance(model, dict) else model
    card = str(meta.get("device_name", "unknown device"))
    moved = meta.get("transfer")
    if isinstance(moved, dict):
        card += f" (transferred from {moved.get('from_device_name', '?')}, ±{moved.get('uncertainty_rel', 0):.0%})"
    tail = ""
    composed = meta.get("composed")
    if isinstance(composed, dict):
        u = (composed.get("move") or {}).get("uncertainty_rel")
        tail = f"; host phases from {composed.get('host_cpu', '?')}" + (
            f" ±{u:.0%}" if isinstance(u, (int, float)) else "")
    return f"{head}: {card}, {model_name or 'unknown model'}{tail}"


def composed_note(meta: dict | None) -> str | None:
    """A line on what a profile built from parts (``overlap-sim compose``) approximates beyond its
    stated host move (``metadata.composed.approximations``), or one read from a server's traces
    (``metadata.trace.approximations``); None for any other profile."""
    composed = meta.get("composed") if isinstance(meta, dict) else None
    if not isinstance(composed, dict):  # a profile read from a server's traces says the same of itself
        composed = meta.get("trace") if isinstance(meta, dict) else None
    text = composed.get("approximations") if isinstance(composed, dict) else None
    return (f"note: the profile approximates (beyond its stated uncertainties): {text}"
            if isinstance(text, str) and text else None)


def load_warnings(scenario) -> list[str]:
    """The warnings a run prints under its table and ``summary.json`` carries (``warnings``): what
    the scenario asks for that is answered only approximately, each naming the value. The engine's
    own (its server section's ``warnings()``, given the profile's metadata: launch arguments it passed over, a loop on a device
    its engine does not run it on; ``running_cap``: which field caps the running requests); an output length of 0 (a request produces at least one token
    here); a closed loop with more clients than requests or than the server's running cap."""
    w, server = scenario.workload, scenario.server
    meta = profile_metadata(scenario.resolve_path(scenario.costs.profile)) if scenario.costs.profile else None
    out = list(server.warnings(meta))
    cached, prompt = getattr(w, "cached_len", None), getattr(w, "input_len", None)
    if isinstance(cached, int) and isinstance(prompt, int) and cached >= prompt > 0:
        out.append(f"warning: workload.cached_len {cached} >= input_len {prompt}: the last prompt token is always "
                   f"computed (a prefill extends at least one token): priced as {prompt - 1} cached")
    elif cached is not None and prompt is not None and not w.trace and \
            length_bounds(cached)[1] >= max(length_bounds(prompt)[0], 1):
        out.append(f"warning: workload.cached_len can draw {length_bounds(cached)[1]}, at or above the shortest "
                   f"input_len {length_bounds(prompt)[0]}: such a request's cached prefix is cut to its prompt less "
                   "one token (the last prompt token is always computed)")
    if getattr(w, "trace", None):  # the trace gives these per request: a value the scenario gives is not used
        defaults = type(w).model_fields
        given = [k for k in ("num_requests", "input_len", "cached_len", "output_len", "max_new_tokens", "ignore_eos")
                 if getattr(w, k) != defaults[k].default]
        if given:
            out.append(f"warning: workload.{', workload.'.join(given)} not used: the trace {w.trace} gives each "
                       "request's lengths (and its number of requests)")
    if getattr(w, "input_len", None) is not None and not w.trace and length_bounds(w.input_len)[0] == 0:
        out.append("warning: workload.input_len can be 0: such a prompt is priced here as 1 token (a request with "
                   "an empty prompt is not modelled; vLLM's API refuses one: 'The decoder prompt cannot be empty')")
    if getattr(w, "output_len", None) == 0:
        out.append("warning: workload.output_len 0: every request produces at least 1 token here (a prefill-only "
                   "request of max_new_tokens 0 is not modelled): priced as 1")
    return out + _client_warnings(w, server) + _length_warnings(w, server)


def _length_warnings(w, server) -> list[str]:
    """A request whose prompt and output can outgrow what the engine lets one request reach
    (each engine's ``length_cap``): its output is cut there, shorter than ``output_len`` asks."""
    if w.arrival == "trace" or getattr(w, "trace", None):  # the trace's lengths: not the workload's fields
        return []
    field, most, how, *fate = server.length_cap
    prompt, output = length_bounds(w.input_len)[1], length_bounds(w.output_len)[1]
    longest, what = prompt + output, "output_len"
    if fate and w.max_new_tokens is not None:  # a refusal weighs the cap the client sends, not the output
        longest, what = prompt + max(output, length_bounds(w.max_new_tokens)[1]), "max_new_tokens"
    if longest <= most or MAX_TOKENS in (prompt, output):  # (an unbounded distribution's cap: not a length asked)
        return []
    fate = fate[0] if fate else "such requests finish there, with fewer output tokens than asked"
    return [f"warning: workload input_len + {what} reach {longest} tokens, beyond the {most} that {field} "
            f"lets one request reach ({how}): {fate}"]


def _client_warnings(w, server) -> list[str]:
    n = getattr(w, "concurrency", None)
    if getattr(w, "arrival", None) != "closed_loop" or not isinstance(n, int):
        return []
    out = []
    measured = w.num_requests - min(w.warmup_requests, w.num_requests)
    if n > w.num_requests:
        out.append(f"warning: workload.concurrency {n} exceeds workload.num_requests {w.num_requests}: at most "
                   f"{w.num_requests} requests are ever in flight")
    elif measured < 2 * n and not getattr(w, "trace", None):  # (fewer than two measured requests a client)
        out.append(f"warning: workload.concurrency {n} with {measured} measured requests: each client sends fewer "
                   "than 2 of them, so the run is about one wave from an empty server, its throughput and latency "
                   "a burst's, not a steady state (raise workload.num_requests)")
    name, cap = server.running_cap  # each engine's own cap
    if min(n, w.num_requests) > cap:
        out.append(f"warning: workload.concurrency {n} exceeds {name} {cap}: at most {cap} requests run at once, "
                   "the others wait in the queue (their TTFT includes the wait)")
    return out


def reimplementation_warning(meta: dict | None) -> str | None:
    """A warning for a torch or MLX profile of a GPU or a Mac whose host phases are still the
    project's re-implementation (``calibrate/bookkeeping``: 3-10x cheaper than SGLang's real
    scheduler, docs/calibration.md), not SGLang's own functions (``overlap-sim compose``). None
    for a composed profile, a CPU profile (the project's own harness runs that code), a real
    engine's, or none."""
    if not isinstance(meta, dict) or meta.get("composed") or meta.get("backend") not in ("torch", "mlx"):
        return None
    if meta.get("device") == "cpu":
        return None
    # a profile from before the yardstick had a version (e.g. revision f505e66's) is moved by
    # readings of its own code on the host file's host (benchmarks/yardstick_at.py REV)
    old = not meta.get("yardstick_version")
    ruler = " --host-yardstick READINGS.json" if old else ""
    why = (" (this profile's code predates the yardstick's version: READINGS.json, readings of that code on the "
           "host file's host, from benchmarks/yardstick_at.py REV)") if old else ""
    return ("warning: this profile's host phases are the project's re-implementation of the scheduler "
            "(calibrate/bookkeeping, 3-10x cheaper than SGLang's own functions): the overlap gain is "
            "under-predicted; join the forward to SGLang's host costs with overlap-sim compose PROFILE "
            f"scenarios/profiles/parts/sglang-0.5.23-host-amd-epyc.json{ruler} --out NEW.json{why}")


def device_mismatch(device: str, meta: dict | None) -> str | None:
    """A warning when the scenario's ``server.device`` and the device its calibration profile was
    measured on (``metadata.device``) differ in whether they are a CUDA GPU: a CUDA profile
    priced for a ``cpu``/``mlx``/``mps`` loop, or a CPU or Metal profile for a ``cuda`` one.
    The run goes on (a what-if may mean it); the line says what the numbers then are. None when
    they agree, when there is no profile, or when ``overlap-sim transfer`` moved the profile to a
    card (``metadata.transfer``: its forward is that card's, which the table's title names)."""
    if not isinstance(meta, dict) or not isinstance(meta.get("device"), str) or isinstance(meta.get("transfer"), dict):
        return None
    measured = meta["device"]
    if (measured == "cuda") == (device == "cuda"):
        return None
    return (f"warning: costs.profile was measured on {measured} ({meta.get('device_name', 'unknown device')}) but "
            f"server.device is {device}: the forward and CPU phases are that device's and host's, the loop is "
            f"the {device} one")
