"""A calibration profile from an SGLang server's own ``torch.profiler`` trace (``/start_profile``),
as :mod:`calibrate.real.sglang_torch_trace` reads it; the server log as a check; the command.

    overlap-sim calibrate --from-trace TRACE.json.gz [--server-log server.log] --out profile.json

Simplifications (stated in the profile's ``metadata.timing``):

- A trace describes the steps the server ran, not a grid: the context (and prefix) axis is binned
  into at most :data:`MAX_BINS` nodes, each step moved to its bin's node along the least-squares
  plane ``t = c0 + c1 x + c2 y + c3 x y`` fitted over all steps of its kind, and grid cells with no
  step are filled from that plane (their samples carry ``"filled": true``).
- Extend steps are keyed by the batch's total new tokens and the mean prefix per request: exact
  for one request or no prefix, which is how the simulator prices them (``sim.model.profile_costs``).
- The profile's phases were measured under the trace's loop only and apply to both settings.
- Python stacks cost time: ``torch.profiler``'s Python tracer slows every Python call, so host
  phases are longer than without the profiler, and so is the forward on a CPU engine, or on a GPU
  whose kernels wait for their launches (eager mode, a small model; CUDA graphs launch a decode in
  one call). Kernel durations themselves are not slowed. docs/real-engines.md gives the factor
  measured on this project's VM (SGLang 0.5.23 CPU engine); :func:`log_check` measures it.
"""

from __future__ import annotations

import math
import re
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from calibrate.real.sglang_torch_trace import TraceRead, TraceStep, read_trace
from sim.errors import UserInputError

MAX_BINS = 3  # nodes of a curve's second axis (context or prefix)



def _plane(points: list[tuple[float, float, float]]):
    """Least-squares t = c0 + c1 x + c2 y + c3 x y (minimum-norm when a coordinate is constant)."""
    import numpy as np

    a = np.array([[1.0, x, y, x * y] for x, y, _ in points])
    t = np.array([p[2] for p in points])
    coef, *_ = np.linalg.lstsq(a, t, rcond=None)
    return lambda x, y: float(coef[0] + coef[1] * x + coef[2] * y + coef[3] * x * y), \
        lambda x: float(coef[2] + coef[3] * x)


def _bins(values: list[float]) -> list[float]:
    """At most MAX_BINS nodes for the second axis: the distinct values when few, else the medians
    of equal-count bins (rounded to whole tokens)."""
    distinct = sorted(set(values))
    if len(distinct) <= MAX_BINS:
        return distinct
    ordered = sorted(values)
    n = len(ordered)
    nodes = []
    for b in range(MAX_BINS):
        chunk = ordered[b * n // MAX_BINS:(b + 1) * n // MAX_BINS]
        if chunk:
            nodes.append(float(round(statistics.median(chunk))))
    return sorted(set(nodes))


def grid_samples(curve: str, axes: tuple[str, str], points: list[tuple[float, float, float]]) -> list[dict]:
    """Samples on a full grid for a two-axis curve from scattered ``(x, y, seconds)`` steps (see
    the module docstring): first-axis nodes are the distinct x, second-axis nodes :func:`_bins`;
    each step moves to its nearest node along the fitted plane; empty cells are filled."""
    from sim.model.profile import MIN_FORWARD_S

    plane, slope = _plane(points)
    xs = sorted({p[0] for p in points})
    ys = _bins([p[1] for p in points])
    cells: dict[tuple[float, float], list[float]] = {}
    for x, y, t in points:
        node = min(ys, key=lambda n: abs(n - y))
        cells.setdefault((x, node), []).append(max(MIN_FORWARD_S, t + slope(x) * (node - y)))
    out = []
    for x in xs:
        for y in ys:
            point = {axes[0]: x, axes[1]: y}
            if (x, y) in cells:
                out.append({"curve": curve, "point": point, "times_s": cells[(x, y)]})
            else:
                out.append({"curve": curve, "point": point, "times_s": [max(MIN_FORWARD_S, plane(x, y))],
                            "filled": True})
    return out


def assume_counts(read: TraceRead, context: Optional[float], prefix: Optional[float]) -> int:
    """Give the steps whose span carries no token counts (a profile started without
    ``detailed_annotations``, SGLang's default) assumed ones: ``context`` tokens of KV per request
    for a decode, ``prefix`` cached tokens per request for a prefill (None: leave them without).
    Returns how many steps got assumed counts; they are listed in the profile's
    ``metadata.grid.assumed``."""
    n = 0
    for s in read.steps:
        if s.sum_ctx is not None:
            continue
        if s.kind == "decode" and context is not None:
            s.sum_ctx = round(context * s.num_reqs)
        elif s.kind == "extend" and prefix is not None:
            s.sum_ctx = round(prefix * s.num_reqs) + s.num_tokens
        else:
            continue
        n += 1
    if n:
        read.assumed = {"steps": n, "decode_context": context, "extend_prefix": prefix}
    return n


def profile_samples(read: TraceRead) -> list[dict]:
    """The profile's samples from the trace's steps (see the module docstring).

    Raises:
        UserInputError: a curve the simulator needs has no step (names the curve and what to record).
    """
    src = read.source
    acc: dict[tuple, list[float]] = {}

    def add(curve: str, axis: str, x: float, t: float) -> None:
        if math.isfinite(t):
            acc.setdefault((curve, axis, float(x)), []).append(t)

    fwd: dict[str, list] = {"decode": [], "extend": []}
    for s in read.steps:
        if s.kind not in fwd:
            continue
        if s.point is None:
            raise UserInputError(src, f"traceEvents: {s.label}", "token counts in the step span (g_sk / c_sk): "
                                 "profile with \"detailed_annotations\": true in the /start_profile request, or "
                                 "state them with --trace-context (decodes) and --trace-prefix (prefills)")
        fwd[s.kind].append((*s.point, s.forward_s))
        add(f"schedule.{s.kind}", "num_reqs", s.num_reqs, s.schedule_s)
        add(f"process.{s.kind}", "num_reqs", s.num_reqs, s.process_s)
        if s.kind == "decode":
            add("launch.decode", "num_reqs", s.num_reqs, s.launch_s)
        else:
            add("launch.extend", "num_tokens", s.num_tokens, s.launch_s)
    for n, t in read.recv:
        add("recv", "num_reqs", n, t)
    missing = [k for k in ("decode", "extend") if not fwd[k]]
    if missing:
        raise UserInputError(src, f"forward.{missing[0]}", f"no {missing[0].upper()} step in the trace: profile a "
                             "window with both prefills and decodes (start the profile before sending load)")
    out = grid_samples("forward.decode", ("num_reqs", "ctx"), fwd["decode"])
    out += grid_samples("forward.extend", ("num_tokens", "prefix"), fwd["extend"])
    for (curve, axis, x), ts in sorted(acc.items()):
        out.append({"curve": curve, "point": {axis: x}, "times_s": ts})
    have = {s["curve"] for s in out}
    from sim.model.profile import CURVE_AXES

    lacking = [c for c in CURVE_AXES if c not in have]
    if lacking:
        why = ("the trace has no Python stacks (record with \"with_stack\": true)" if not read.with_stack
               else "no step of that kind had this phase in the trace's window")
        raise UserInputError(src, lacking[0], f"no samples for the scheduler's host phase: {why}")
    return out


def build_trace_profile(read: TraceRead, command: str = "", model: str = "", note: str = "",
                        log_check: Optional[dict] = None) -> dict:
    """The calibration profile (:mod:`sim.model.profile`) of a read trace."""
    from calibrate.profile import build_profile

    samples = profile_samples(read)
    device_name = read.device_name or ("cpu (SGLang CPU engine)" if read.device == "cpu" else "cuda")
    meta = {
        "backend": "sglang", "engine": "sglang", "device": read.device,
        "device_name": f"{device_name}, from a torch.profiler trace",
        "host_cpu": f"unknown (trace host {read.host_name})" if read.host_name else "unknown",
        "libraries": {"sglang": "unknown (the trace does not say; read for 0.5.23)"},
        "model": {"name": model or "unknown"}, "dtype": "unknown",
        "date": read.start_time or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "grid": {"source": "torch.profiler trace", "trace": read.source, "steps": len(read.steps),
                 "skipped_steps": read.skipped_steps, **({"assumed": read.assumed} if read.assumed else {})},
        "repeats": min(len(s["times_s"]) for s in samples if not s.get("filled")), "warmup": 0, "quick": False,
        "settings": [read.loop] if read.loop else [], "base_setting": read.loop or "normal",
        "command": command, "note": note, "sync_latency_s": 0.0,
        "timing": "SGLang torch.profiler trace (calibrate.real.sglang_torch_trace): forward = "
                  + ("device kernels per step (first start to last end)" if read.device != "cpu" else
                     "CPU span of ModelRunner.forward + ModelRunner.sample")
                  + "; recv/schedule/launch/process = wall time of the scheduler's Python functions under the "
                  "profiler's Python tracer (slower than unprofiled), CUDA synchronisation taken out; measured "
                  f"under event_loop_{read.loop or 'normal'} only; context/prefix binned, empty cells filled "
                  "from a fitted plane (samples marked filled)",
    }
    if log_check:
        meta["server_log_check"] = log_check
    return build_profile(meta, samples)


# ---------------------------------------------------------------------------------------------
# the server log as a check


def log_check(read: TraceRead, log_path: Path) -> dict:
    """Compare the decode step period the server log states with the trace's.

    SGLang 0.5.23 logs ``Decode batch, #running-req: B, #token: K, ..., gen throughput (token/s): G``
    from ``SchedulerMetricsReporter.report_decode_stats``
    (``srt/managers/scheduler_components/metrics_reporter.py``), called at the end of
    ``process_batch_result_decode`` every ``--decode-log-interval`` decode batches (default 40;
    1 gives one line per step); G = the tokens decoded since the last such line / the time since
    it. With interval 1 and one token per request, B / G is the time between the ends of two
    consecutive decode ``process_batch_result`` calls: in the trace, the end of process(k) minus
    the end of process(k-1) (without Python stacks: forward start(k) - forward start(k-1)).
    Lines are taken between the profiler's ``Profiling starts`` and ``Stop profiling`` lines when
    the log has them, and matched to the trace's decode steps in order by (B, K) = (bs, g_sk):
    ``report_decode_stats`` reads ``scheduler.running_batch`` and the KV pool, which under
    ``event_loop_overlap`` already hold the next batch (scheduled before this one's result is
    processed), so there a line is matched by the next step's (bs, g_sk).

    The log's decode lines outside that window at the same batch sizes (the server unprofiled)
    give ``profiler_slowdown``: the median period inside over the median outside (the contexts
    differ, so it is a rough figure; the profiler's Python tracer is what it mostly measures).

    Returns ``{"log", "decode_lines", "matched", "period_log_median_s", "period_trace_median_s",
    "median_abs_rel_diff", "max_abs_rel_diff", "unprofiled_lines", "period_unprofiled_median_s",
    "profiler_slowdown"}`` (NaN-free: quantities that cannot be computed are None).

    Raises:
        UserInputError: the log cannot be read or has no batch line (names the file).
    """
    from sim.engines.sglang.server_log import parse_lines, parse_log

    parse_log(log_path)  # one-line errors for a missing, empty or foreign log
    lines = Path(log_path).read_text(encoding="utf-8", errors="replace").splitlines()
    starts = [i for i, ln in enumerate(lines) if "Profiling starts" in ln]
    a = starts[-1] if starts else 0
    b = next((i for i in range(a, len(lines)) if "Stop profiling" in lines[i]), len(lines))
    recs = [r for r in parse_lines(lines[a:b], str(log_path)).records if r["kind"] == "decode"]
    decodes = [s for s in read.steps if s.kind == "decode"]
    # the line of batch k states the running batch and the KV pool when process(k) runs: under
    # event_loop_overlap the next batch k+1 is already scheduled then (its requests, one more
    # KV slot each), so its (bs, g_sk) are the line's
    after = {id(a): b for a, b in zip(read.steps, read.steps[1:])}
    pairs, j = [], 0
    for k, s in enumerate(decodes):
        key = s
        if read.loop == "overlap":
            key = after.get(id(s))
            if key is None or key.kind != "decode":
                continue
        for jj in range(j, len(recs)):
            r = recs[jj]
            if r.get("running_req") == key.num_reqs and (key.sum_ctx is None or r.get("kv_tokens") == key.sum_ctx):
                pairs.append((k, r))
                j = jj + 1
                break
    diffs, logs, traces = [], [], []
    for k, r in pairs:
        g = r.get("gen_throughput_tok_s")
        if k == 0 or not g:
            continue
        prev, cur = decodes[k - 1], decodes[k]
        if math.isfinite(cur.process_end_us) and math.isfinite(prev.process_end_us):
            t = (cur.process_end_us - prev.process_end_us) * 1e-6
        else:
            t = (cur.span.start_us - prev.span.start_us) * 1e-6
        p = cur.num_reqs / g
        logs.append(p)
        traces.append(t)
        diffs.append(abs(p - t) / t)
    med = lambda v: statistics.median(v) if v else None  # noqa: E731
    # the same batch sizes outside the profiler's window: how much the profiler slowed the steps
    sizes = {r.get("running_req") for _, r in pairs}
    outside = [] if not starts else [r for r in parse_lines(lines[:a] + lines[b:], str(log_path)).records
                                     if r["kind"] == "decode" and r.get("running_req") in sizes]
    unprofiled = [r["running_req"] / r["gen_throughput_tok_s"] for r in outside if r.get("gen_throughput_tok_s")]
    slowdown = med(logs) / med(unprofiled) if logs and unprofiled else None
    return {"log": str(log_path), "decode_lines": len(recs), "matched": len(pairs),
            "period_log_median_s": med(logs), "period_trace_median_s": med(traces),
            "median_abs_rel_diff": med(diffs), "max_abs_rel_diff": max(diffs) if diffs else None,
            "unprofiled_lines": len(unprofiled), "period_unprofiled_median_s": med(unprofiled),
            "profiler_slowdown": slowdown}


_SERVED_NAME = re.compile(r"""['"]served_model_name['"]: ['"]([^'"]+)['"]""")
_MODEL_PATH = re.compile(r"""['"]model_path['"]: ['"]([^'"]+)['"]""")


def server_log_model(log_path: Path) -> str | None:
    """The model an SGLang server log names, or None: SGLang 0.5.23 logs its ``ServerArgs`` at
    start-up (``server_args={'model_path': ..., 'served_model_name': ...}``, ``launch_server`` ->
    ``ServerArgs.__post_init__`` logging); ``served_model_name`` (defaults to ``model_path``),
    a local directory shortened to its last part (a Hugging Face id such as ``org/name`` is
    kept whole)."""
    text = Path(log_path).read_text(encoding="utf-8", errors="replace")
    line = next((ln for ln in text.splitlines() if "server_args=" in ln), "")
    found = _SERVED_NAME.search(line) or _MODEL_PATH.search(line)
    if not found:
        return None
    name = found.group(1)
    return Path(name).name if Path(name).is_absolute() else name


def summary_rows(read: TraceRead) -> list[tuple[str, str, int, float, float]]:
    """(kind, point, steps, forward median ms, schedule + launch + process median ms) per kind and
    batch (medians over the steps; NaN without Python stacks)."""
    groups: dict[tuple, list[TraceStep]] = {}
    for s in read.steps:
        if s.kind in ("decode", "extend"):
            groups.setdefault((s.kind, s.num_reqs, s.num_tokens), []).append(s)
    rows = []
    for (kind, bs, toks), ss in sorted(groups.items()):
        host = [x for s in ss for x in [s.schedule_s + s.launch_s + s.process_s] if math.isfinite(x)]
        rows.append((kind, f"bs={bs}" + (f" toks={toks}" if kind == "extend" else ""), len(ss),
                     statistics.median(s.forward_s for s in ss) * 1e3,
                     statistics.median(host) * 1e3 if host else math.nan))
    return rows


# ---------------------------------------------------------------------------------------------
# the command


def run_from_trace(args) -> int:
    """``overlap-sim calibrate --from-trace TRACE [--server-log LOG] --out PROFILE``: read, build,
    check against the log, write the profile atomically, print a summary. Returns 0.

    Raises:
        UserInputError: a bad trace, log or output path (one line, exit 2; nothing written)."""
    import shlex
    import sys

    from calibrate.profile import save_profile
    from sim.atomic import check_output_file

    check_output_file(args.out, "--out")
    if args.server_log is not None and not Path(args.server_log).is_file():
        what = "a folder; expected the server's log file" if Path(args.server_log).is_dir() else "no such server log"
        raise UserInputError(str(args.server_log), "", f"{what} (--server-log)")
    for flag in ("trace_context", "trace_prefix"):
        v = getattr(args, flag, None)
        if v is not None and not (math.isfinite(v) and 0 <= v <= 1e7 and (v >= 1 or flag == "trace_prefix")):
            raise UserInputError("--" + flag.replace("_", "-"), "", f"tokens per request, a number from "
                                 f"{0 if flag == 'trace_prefix' else 1} to 1e7 (got {v!r})")
    read = read_trace(Path(args.from_trace))
    check = log_check(read, Path(args.server_log)) if args.server_log is not None else None
    assume_counts(read, getattr(args, "trace_context", None), getattr(args, "trace_prefix", None))
    argv = ["overlap-sim", "calibrate", "--from-trace", str(args.from_trace)]
    if args.server_log is not None:
        argv += ["--server-log", str(args.server_log)]
    for flag in ("trace_context", "trace_prefix"):
        if getattr(args, flag, None) is not None:
            argv += ["--" + flag.replace("_", "-"), f"{getattr(args, flag):g}"]
    argv += ["--out", str(args.out)]
    model = args.model if getattr(args, "model", "tiny") not in (None, "tiny") else ""
    if not model and args.server_log is not None:
        model = server_log_model(Path(args.server_log)) or ""
    profile = build_trace_profile(read, shlex.join(argv), model=model, note=getattr(args, "note", "") or "",
                                  log_check=check)
    save_profile(args.out, profile)
    err = sys.stderr
    print(f"{read.source}: {len(read.steps)} forwards ({read.device}; loop: {read.loop or 'unknown'}; "
          f"Python stacks: {'yes' if read.with_stack else 'no'})", file=err)
    print(f"  {'kind':7s} {'batch':>16s} {'steps':>5s} {'forward ms':>11s} {'schedule+launch+process ms':>27s}",
          file=err)
    for kind, point, n, fwd_ms, host_ms in summary_rows(read):
        print(f"  {kind:7s} {point:>16s} {n:5d} {fwd_ms:11.3f} {host_ms:27.3f}", file=err)
    if check is not None:
        if check["median_abs_rel_diff"] is None:
            print(f"server log: {check['matched']} of the trace's decode steps matched a 'Decode batch' line; no "
                  "period to compare (run the server with --decode-log-interval 1)", file=err)
        else:
            print(f"server log: {check['matched']} decode steps matched; step period from 'gen throughput' "
                  f"{check['period_log_median_s'] * 1e3:.3f} ms against the trace's "
                  f"{check['period_trace_median_s'] * 1e3:.3f} ms (median |difference| "
                  f"{check['median_abs_rel_diff'] * 100:.1f}%)", file=err)
        if check["profiler_slowdown"] is not None:
            print(f"server log: outside the profiled window the same batches took "
                  f"{check['period_unprofiled_median_s'] * 1e3:.3f} ms a step: the profiler slowed the server "
                  f"x{check['profiler_slowdown']:.2f} (the host phases are measured slowed, and the forward on a "
                  "CPU engine, or on a GPU when its kernels wait for their launches)", file=err)
    print(f"profile written to {args.out}")
    return 0
