"""A calibration profile from an SGLang server's own ``torch.profiler`` traces (``/start_profile``),
as :mod:`calibrate.real.from_trace.torch_trace` reads them; the server log; the command.

    overlap-sim calibrate --from-trace TRACE.json.gz [TRACE2 ...] [--server-log server.log] --out profile.json

Simplifications (stated in the profile's ``metadata.timing`` and ``metadata.trace.approximations``,
which ``run`` prints under the verdict):

- A trace describes the steps the server ran, not a grid. Several traces (profile windows across
  the load) are merged (:func:`merge`); every curve goes through a stated physical form fitted
  over all their steps and is priced from it up to :data:`calibrate.real.from_trace.forms.REACH` times
  beyond the data (:mod:`calibrate.real.from_trace.forms`); ``metadata.coverage`` is the data's hull,
  from which ``run`` measures how far each step lies (:mod:`sim.model.reach`).
- A prefill's forward is keyed by its new tokens N and the KV tokens each new token attends on
  average, K (the span's ``c_sqsk / c_sq``: each request's new tokens times its prefix + new
  tokens, over N), not by the mean prefix: ``metadata.extend_axis: attended``, which the simulator
  reads at each batch's own K (:mod:`sim.model.profile_costs`); without ``c_sqsk`` the requests
  are taken as equal shares (K = P + N / n).
- The profile's phases were measured under the trace's loop only and apply to both settings.
- Python stacks cost time: ``torch.profiler``'s Python tracer slows every Python call, so host
  phases are longer than without the profiler, and so is the forward on a CPU engine (on a GPU
  the kernels are not slowed). With the server log (``--decode-log-interval 1``, load outside the
  profiled windows too) :mod:`calibrate.real.from_trace.log_match` measures the slowdown: on a GPU one factor
  is divided out of every host phase; on the CPU engine the factor at each decode step's shape,
  and a per-forward overhead off each prefill (:func:`remove_slowdown`); its spread is stated as
  an uncertainty the verdict's range carries; without the log nothing is removed and the verdict's
  note says so.
"""

from __future__ import annotations

import math
import re
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from calibrate.real.from_trace import forms as trace_fit
from calibrate.real.from_trace.torch_trace import TraceRead, TraceStep, read_trace
from sim.errors import UserInputError


def merge(reads: list[TraceRead]) -> TraceRead:
    """One read of several traces of the same server (their steps and receive samples in trace
    order). Raises UserInputError (naming the trace and the field) when a trace was recorded on
    another device or under another event loop than the first."""
    if len(reads) == 1:
        return reads[0]
    first = reads[0]
    for r in reads[1:]:
        for what, a, b in (("device", first.device, r.device), ("event loop", first.loop, r.loop)):
            if a != b:
                raise UserInputError(r.source, what, f"{b or 'unknown'}, where {first.source} has {a or 'unknown'}: "
                                     "the traces of one profile come from one server under one loop")
    out = TraceRead(", ".join(r.source for r in reads), [s for r in reads for s in r.steps],
                    [x for r in reads for x in r.recv], loop=first.loop, device=first.device,
                    device_name=first.device_name, with_stack=all(r.with_stack for r in reads),
                    host_name=first.host_name, start_time=first.start_time,
                    skipped_steps=sum(r.skipped_steps for r in reads))
    assumed = [r.assumed for r in reads if r.assumed]
    if assumed:
        out.assumed = {"steps": sum(a["steps"] for a in assumed), "decode_context": assumed[0]["decode_context"],
                       "extend_prefix": assumed[0]["extend_prefix"]}
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


HOST_AXES = {"recv": "num_reqs", "launch.extend": "num_tokens"}  # else num_reqs


def profile_samples(read: TraceRead) -> tuple[list[dict], dict, dict]:
    """The profile's samples from the trace's steps, each curve through its fitted form
    (:mod:`calibrate.real.from_trace.forms`), with the forms and the data's hull per curve.

    Returns (samples, fits ``{curve: Fit.as_json()}``, coverage ``{curve: {axis: [lo, hi]}}``).

    Raises:
        UserInputError: a curve the simulator needs has no step (names the curve and what to record).
    """
    src = read.source
    pts: dict[str, list[tuple]] = {}

    def add(curve: str, x: float, t: float) -> None:
        if math.isfinite(t):
            pts.setdefault(curve, []).append((float(x), t))

    fwd: dict[str, list] = {"decode": [], "extend": []}
    for s in read.steps:
        if s.kind not in fwd:
            continue
        if s.point is None:
            raise UserInputError(src, f"traceEvents: {s.label}", "token counts in the step span (g_sk / c_sk): "
                                 "profile with \"detailed_annotations\": true in the /start_profile request, or "
                                 "state them with --trace-context (decodes) and --trace-prefix (prefills)")
        fwd[s.kind].append((s.num_tokens, s.attended, s.forward_s) if s.kind == "extend" else (*s.point, s.forward_s))
        add(f"schedule.{s.kind}", s.num_reqs, s.schedule_s)
        add(f"process.{s.kind}", s.num_reqs, s.process_s)
        add(f"launch.{s.kind}", s.num_reqs if s.kind == "decode" else s.num_tokens, s.launch_s)
    for n, t in read.recv:
        add("recv", n, t)
    missing = [k for k in ("decode", "extend") if not fwd[k]]
    if missing:
        raise UserInputError(src, f"forward.{missing[0]}", f"no {missing[0].upper()} step in the trace: profile a "
                             "window with both prefills and decodes (start the profile before sending load)")
    from sim.model.profile import CURVE_AXES

    lacking = [c for c in CURVE_AXES if not c.startswith("forward") and not pts.get(c)]
    if lacking:
        why = ("the trace has no Python stacks (record with \"with_stack\": true)" if not read.with_stack
               else "no step of that kind had this phase in the trace's window")
        raise UserInputError(src, lacking[0], f"no samples for the scheduler's host phase: {why}")
    out, fits, cover = [], {}, {}
    curves = [("forward.decode", ("num_reqs", "ctx"), fwd["decode"]),
              ("forward.extend", ("num_tokens", "prefix"), fwd["extend"])]
    curves += [(c, (HOST_AXES.get(c, "num_reqs"),), pts[c]) for c in sorted(pts)]
    for curve, axes, points in curves:
        form = trace_fit.fit(curve, points)
        out += trace_fit.grid_samples(curve, axes, points, form)
        fits[curve] = form.as_json()
        cover[curve] = trace_fit.coverage(axes, points)
    return out, fits, cover


def remove_slowdown(samples: list[dict], slow: dict, device: str) -> list[dict]:
    """The samples with the profiler's slowdown divided out (``slow``: :func:`slowdown_record`'s
    record, ``removed`` true). A GPU's kernels are not slowed: there every host phase is divided
    by the one ``host_slowdown``. On the CPU engine the forward is Python-dispatched CPU work,
    slowed alike, and the slowdown depends on the step's shape: with ``slow["local"]``
    (:func:`calibrate.real.from_trace.log_match.local_slowdown`) a decode forward at (B, C) and a
    decode phase at batch B (at the matched steps' median context) are divided by the factor at
    that shape. A prefill has no log period of its own; its forward runs the same modules, ops and
    Python calls as a decode's, and the tracer costs per op and per call, not per FLOP (the
    decodes slowed x1.61 at batch 1, x1.20 at 1k-token contexts): so the overhead
    ``slow["local"]["forward_overhead_s"]`` (what the factor takes off a batch-1 decode forward
    at the reference context) is subtracted from each prefill forward, which is divided by at
    most ``host_slowdown``. Prefill phases and ``recv`` are divided by the median factor
    ``host_slowdown``."""
    from calibrate.real.from_trace.log_match import local_factor

    local = local_factor(slow["local"]) if device == "cpu" and slow.get("local") else None
    out = []
    for s in samples:
        curve, point = s["curve"], s.get("point", {})
        if device != "cpu" and curve.startswith("forward"):
            out.append(s)
            continue
        factor = slow["host_slowdown"]
        if local is not None and curve == "forward.extend":
            d = slow["local"]["forward_overhead_s"]
            out.append(dict(s, times_s=[max(t - d, t / factor) for t in s["times_s"]]))
            continue
        if local is not None and curve.endswith(".decode") and "num_reqs" in point:
            factor = local(point["num_reqs"], point.get("ctx"))
        out.append(dict(s, times_s=[t / factor for t in s["times_s"]]))
    return out


def slowdown_record(check: Optional[dict], device: str, fits: Optional[dict] = None) -> dict:
    """``metadata.trace.slowdown``: what was removed, from what, and how sure (``uncertainty_rel``,
    which :mod:`sim.whatif.stated_range` carries into the verdict), or why nothing was."""
    if check is None:
        return {"removed": False, "why": "no --server-log: the profiler's slowdown was not measured; the host phases"
                + (" and the CPU forward" if device == "cpu" else "") + " are as slowed"}
    f = check.get("host_slowdown")
    if not f or not math.isfinite(f) or not 0.2 <= f <= 20:
        why = ("the log has no decode lines outside the profiled windows, or none matched the traces' steps "
               "(run the server with --decode-log-interval 1 and send load before and after profiling)"
               if not f else f"the measured factor x{f:.2f} is not a slowdown the profiler makes")
        return {"removed": False, "why": why, "profiler_slowdown": check.get("profiler_slowdown")}
    out = {"removed": True, "host_slowdown": f, "profiler_slowdown": check.get("profiler_slowdown"),
           "uncertainty_rel": check.get("slowdown_uncertainty_rel") or 0.0,
           "applied_to": "host phases and forward (CPU engine)" if device == "cpu" else "host phases",
           "from": f"{check['unprofiled_lines']} unprofiled decode lines of {check['log']}, {check['matched']} matched"}
    if device == "cpu" and check.get("local") and fits and "forward.decode" in fits:
        from calibrate.real.from_trace.log_match import local_factor

        local = dict(check["local"])
        ref = local["reference_context"]
        fwd = trace_fit.value(fits["forward.decode"], "forward.decode", 1.0, ref)
        local["forward_overhead_s"] = max(0.0, fwd * (1 - 1 / local_factor(local)(1.0, ref)))
        out["local"] = local
        out["uncertainty_rel"] = check["local"]["uncertainty_rel"]
        out["applied_to"] += ", decode steps at their own shape's factor"
    return out


def coverage_text(cover: dict) -> str:
    """The data's decode batch x context and prefill tokens x prefix ranges, in words."""
    d, e = cover["forward.decode"], cover["forward.extend"]
    return (f"decode batch {d['num_reqs'][0]:g}-{d['num_reqs'][1]:g} x context {d['ctx'][0]:.0f}-{d['ctx'][1]:.0f}, "
            f"prefill tokens {e['num_tokens'][0]:g}-{e['num_tokens'][1]:g} x keys attended per token "
            f"{e['prefix'][0]:.0f}-{e['prefix'][1]:.0f}")


def build_trace_profile(read: TraceRead, command: str = "", model: str = "", note: str = "",
                        log_check: Optional[dict] = None) -> dict:
    """The calibration profile (:mod:`sim.model.profile`) of a read trace (or of several,
    :func:`merge`): the fitted curves, the data's hull (``metadata.coverage``, with
    :data:`calibrate.real.from_trace.forms.REACH`), the forms (``metadata.trace.fits``) and the
    profiler's slowdown taken out where the log measured it (``metadata.trace.slowdown``)."""
    from calibrate.profile import build_profile

    samples, fits, cover = profile_samples(read)
    slow = slowdown_record(log_check, read.device, fits)
    if slow["removed"]:
        samples = remove_slowdown(samples, slow, read.device)
    device_name = read.device_name or ("cpu (SGLang CPU engine)" if read.device == "cpu" else "cuda")
    approx = ("curves fitted with a stated form per curve (base + per-request + per-KV-token for a decode; "
              f"base + per-token + per-attention-pair for a prefill, keyed by the KV tokens attended per new token; "
              "a line per host phase) and priced from it up to "
              f"x{trace_fit.REACH:g} beyond the traces' data ({coverage_text(cover)}); the phases measured under "
              f"event_loop_{read.loop or 'normal'} price both settings")
    approx += (f"; the profiler's slowdown (x{slow['host_slowdown']:.2f}) divided out of the {slow['applied_to']}, "
               "one factor for every phase" if slow["removed"] else f"; {slow['why']}")
    meta = {
        "backend": "sglang", "engine": "sglang", "device": read.device, "extend_axis": "attended",
        "device_name": f"{device_name}, from a torch.profiler trace",
        "host_cpu": f"unknown (trace host {read.host_name})" if read.host_name else "unknown",
        "libraries": {"sglang": "unknown (the trace does not say; read for 0.5.23)"},
        "model": {"name": model or "unknown"}, "dtype": "unknown",
        "date": read.start_time or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "grid": {"source": "torch.profiler trace", "trace": read.source, "steps": len(read.steps),
                 "skipped_steps": read.skipped_steps, **({"assumed": read.assumed} if read.assumed else {})},
        "coverage": {**cover, "reach": trace_fit.REACH},
        "trace": {"traces": read.source.split(", "), "fits": fits, "slowdown": slow, "approximations": approx},
        "repeats": min(len(s["times_s"]) for s in samples if not s.get("filled")), "warmup": 0, "quick": False,
        "settings": [read.loop] if read.loop else [], "base_setting": read.loop or "normal",
        "command": command, "note": note, "sync_latency_s": 0.0,
        "timing": "SGLang torch.profiler trace (calibrate.real.from_trace.torch_trace): forward = "
                  + ("device kernels per step (first start to last end)" if read.device != "cpu" else
                     "CPU span of ModelRunner.forward + ModelRunner.sample")
                  + "; recv/schedule/launch/process = wall time of the scheduler's Python functions under the "
                  "profiler's Python tracer, CUDA synchronisation taken out"
                  + (f", the slowdown the server log measured divided out (x{slow['host_slowdown']:.2f})"
                     if slow["removed"] else ", slowed (not measured)")
                  + f"; measured under event_loop_{read.loop or 'normal'} only; each curve through its fitted form "
                  f"(calibrate.real.from_trace.forms), cells without a step and nodes up to x{trace_fit.REACH:g} beyond "
                  "the data filled from it (samples marked filled)",
    }
    if log_check:
        meta["server_log_check"] = log_check
    return build_profile(meta, samples)


# ---------------------------------------------------------------------------------------------
# the server log


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


def _check_server_log(path) -> None:
    """Raises UserInputError (one line naming the file) unless ``path`` is None or a file."""
    if path is not None and not Path(path).is_file():
        what = "a folder; expected the server's log file" if Path(path).is_dir() else "no such server log"
        raise UserInputError(str(path), "", f"{what} (--server-log)")


def run_from_trace(args) -> int:
    """``overlap-sim calibrate --from-trace TRACE [TRACE ...] [--server-log LOG] --out PROFILE``:
    read each trace, check them against the log and measure the profiler's slowdown, build,
    write the profile atomically, print a summary (what the profile covers). Returns 0.

    Raises:
        UserInputError: a bad trace, log or output path (one line, exit 2; nothing written)."""
    import shlex
    import sys

    from calibrate.profile import save_profile
    from calibrate.real.from_trace.log_match import log_check
    from sim.atomic import check_output_file

    check_output_file(args.out, "--out")
    _check_server_log(args.server_log)
    for flag in ("trace_context", "trace_prefix"):
        v = getattr(args, flag, None)
        if v is not None and not (math.isfinite(v) and 0 <= v <= 1e7 and (v >= 1 or flag == "trace_prefix")):
            raise UserInputError("--" + flag.replace("_", "-"), "", f"tokens per request, a number from "
                                 f"{0 if flag == 'trace_prefix' else 1} to 1e7 (got {v!r})")
    paths = [Path(t) for t in (args.from_trace if isinstance(args.from_trace, list) else [args.from_trace])]
    if len(set(map(str, paths))) < len(paths):
        raise UserInputError("--from-trace", "", "a trace named twice (each profile window's trace once)")
    reads = [read_trace(t) for t in paths]
    check = log_check(reads, Path(args.server_log)) if args.server_log is not None else None
    for read in reads:
        assume_counts(read, getattr(args, "trace_context", None), getattr(args, "trace_prefix", None))
    read = merge(reads)
    argv = ["overlap-sim", "calibrate", "--from-trace", *map(str, paths)]
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
    print(f"{len(reads)} trace{'s' if len(reads) > 1 else ''}: {len(read.steps)} forwards ({read.device}; loop: "
          f"{read.loop or 'unknown'}; Python stacks: {'yes' if read.with_stack else 'no'})", file=err)
    print(f"  {'kind':7s} {'batch':>16s} {'steps':>5s} {'forward ms':>11s} {'schedule+launch+process ms':>27s}",
          file=err)
    for kind, point, n, fwd_ms, host_ms in summary_rows(read):
        print(f"  {kind:7s} {point:>16s} {n:5d} {fwd_ms:11.3f} {host_ms:27.3f}", file=err)
    meta = profile["metadata"]
    print(f"covers: {coverage_text(meta['coverage'])}; priced from the fitted forms up to x{meta['coverage']['reach']:g} "
          "beyond that (run says how many steps lie beyond the data, and how far)", file=err)
    if check is not None:
        if check["median_abs_rel_diff"] is None:
            print(f"server log: {check['matched']} of the traces' decode steps matched a 'Decode batch' line; no "
                  "period to compare (run the server with --decode-log-interval 1)", file=err)
        else:
            print(f"server log: {check['matched']} decode steps matched; step period from 'gen throughput' "
                  f"{check['period_log_median_s'] * 1e3:.3f} ms against the traces' "
                  f"{check['period_trace_median_s'] * 1e3:.3f} ms (median |difference| "
                  f"{check['median_abs_rel_diff'] * 100:.1f}%)", file=err)
    slow = meta["trace"]["slowdown"]
    if slow["removed"] and slow.get("local"):
        lo, hi = slow["local"]["factor_range"]
        print(f"server log: {check['unprofiled_lines']} decode lines outside the profiled windows: the profiler "
              f"slowed the step x{slow['profiler_slowdown']:.2f} (median), x{lo:.2f}-{hi:.2f} by the step's shape "
              f"(±{slow['uncertainty_rel']:.0%}); divided out of the {slow['applied_to']}", file=err)
    elif slow["removed"]:
        print(f"server log: {check['unprofiled_lines']} decode lines outside the profiled windows: the profiler "
              f"slowed the step x{slow['profiler_slowdown']:.2f}, the host's part x{slow['host_slowdown']:.2f} "
              f"(±{slow['uncertainty_rel']:.0%}); divided out of the {slow['applied_to']}", file=err)
    else:
        print(f"profiler slowdown not removed: {slow['why']}", file=err)
    print(f"profile written to {args.out}")
    return 0


def run_profile_server(args) -> int:
    """``overlap-sim calibrate --profile-server URL [--trace-dir DIR] [--num-steps N] [--max-batch
    N] [--server-log LOG] --out PROFILE``: the designed load with a profile window per stage
    (:mod:`calibrate.real.from_trace.record`), then the profile from those traces exactly as
    :func:`run_from_trace` builds it. Returns 0.

    Raises:
        UserInputError: a bad flag, a server that does not answer, a trace that does not appear
            (one line, exit 2; the profile is not written, finished traces are kept)."""
    import sys

    from calibrate.real.from_trace import record
    from sim.atomic import check_output_file

    if args.from_trace is not None:
        raise UserInputError("--profile-server", "", "records its own traces: give --from-trace or --profile-server, "
                             "not both")
    check_output_file(args.out, "--out")
    _check_server_log(args.server_log)  # before the recording, not after it
    num_steps = 40 if args.num_steps is None else args.num_steps
    if not 4 <= num_steps <= 1000:
        raise UserInputError("--num-steps", "", f"forwards per window, an integer from 4 to 1000 (got {num_steps})")
    if args.max_batch is not None and not 1 <= args.max_batch <= 4096:
        raise UserInputError("--max-batch", "", f"an integer from 1 to 4096 (got {args.max_batch})")
    limits = record.server_limits(args.profile_server)
    max_batch = args.max_batch or int(limits.get("max_running_requests") or 0)
    if not max_batch:
        raise UserInputError("--max-batch", "", "the server did not say its max_running_requests: give the largest "
                             "batch to profile")
    stages = record.design(max_batch, int(limits.get("context_length") or 4096), num_steps,
                           limits.get("max_total_num_tokens"))
    trace_dir = args.trace_dir or Path(args.out).with_name(Path(args.out).stem + "-traces")
    print(f"{args.profile_server}: {len(stages)} profile windows of {num_steps} forwards: "
          + ", ".join(f"{s.batch} x {s.input_len}+{s.output_len} tokens" for s in stages), file=sys.stderr)
    args.from_trace = record.record_windows(args.profile_server, trace_dir, stages, num_steps,
                                            device=str(limits.get("device") or "cpu"),
                                            say=lambda line: print(line, file=sys.stderr))
    return run_from_trace(args)
