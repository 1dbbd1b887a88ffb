"""Nothing wrong gets through: a corpus of bad inputs over every subcommand.

Each case is a command line (and the files it reads) run in-process through ``sim.cli.main``.
Every case must end with the documented exit status (2: bad input; 3: a run whose server died
or whose requests all failed), exactly one line on stderr that names the file or flag and the
field, no traceback, no hang, and, for status 2, nothing written anywhere under the case's
folder (the working directory included: default output folders would land there).
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import shutil
import signal
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

from sim.cli import main

REPO = Path(__file__).resolve().parents[1]  # the cases run in their own folder: repository files by full path
HANG_S = 60  # a case that takes longer than this hangs (the slowest real case here takes ~2 s)

# A small valid scenario: every bad case changes one thing of it.
BASE = {
    "name": "bad",
    "seed": 0,
    "workload": {"arrival": "closed_loop", "concurrency": 2, "num_requests": 4, "warmup_requests": 0,
                 "input_len": 16, "cached_len": 0, "output_len": 4},
    "server": {"settings": ["overlap", "normal"], "kv_pool_tokens": 4096},
    "costs": {"gpu": {"decode": {"base": 0.004}, "prefill": {"base": 0.002}}},
}
TRACE_LINE = {"arrival_s": 0.0, "input_len": 16, "output_len": 4}
KERNEL = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7}


def _patch(d: dict, path: str, value) -> dict:
    d = copy.deepcopy(d)
    node = d
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    if value is _DELETE:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value
    return d


_DELETE = object()


class Ctx:
    """The files of one case, in its own folder (also the working directory)."""

    def __init__(self, tmp: Path, run_folder: Path):
        self.tmp = tmp
        self.out = str(tmp / "out")
        self._run = run_folder

    def file(self, name: str, content) -> str:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return str(path)

    def scenario(self, patches: dict | None = None, name: str = "s.yaml", base: dict = BASE) -> str:
        d = base
        for path, value in (patches or {}).items():
            d = _patch(d, path, value)
        return self.file(name, yaml.safe_dump(d, sort_keys=False))

    def trace_scenario(self, lines: list, patches: dict | None = None) -> tuple[str, str]:
        text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
        trace = self.file("t.jsonl", text)
        scen = self.scenario({"workload.arrival": "trace", "workload.trace": "t.jsonl", **(patches or {})})
        return scen, trace

    def profile(self, change: Callable[[dict], None] | None = None, text: str | None = None) -> str:
        if text is None:
            prof = json.loads((Path(__file__).parents[1] / "scenarios/profiles/cpu-torch-small.json").read_text())
            change(prof)
            text = json.dumps(prof)
        return self.file("p.json", text)

    def run_folder(self) -> str:
        dst = self.tmp / "run"
        shutil.copytree(self._run, dst)
        return str(dst)

    def chrome(self, events, name: str = "trace.json") -> str:
        return self.file(name, json.dumps({"traceEvents": events}))


def kernels(*spans) -> list[dict]:
    return [{**KERNEL, "ts": a, "dur": b - a} for a, b in spans]


@dataclass
class Case:
    id: str
    build: Callable[[Ctx], tuple[list[str], list[str]]]  # -> (argv, words the stderr line must hold)
    status: int = 2


CASES: list[Case] = []


def case(id: str, status: int = 2):
    def add(build):
        CASES.append(Case(id, build, status))
        return build
    return add


def run_scenario(ctx: Ctx, patches: dict, *words, base: dict = BASE) -> tuple[list[str], list[str]]:
    path = ctx.scenario(patches, base=base)
    return ["run", path, "--out", ctx.out], [path, *words]


# --- run: numeric fields, every kind of bad number ------------------------------------------------

FLOAT_FIELDS = [
    "costs.gpu.scale", "costs.cpu.scale", "costs.gpu.decode.base", "costs.gpu.decode.per_req",
    "costs.gpu.prefill.per_token", "costs.gpu.decode.per_ctx_token", "costs.gpu.overlap_residue",
    "costs.gpu.sync_latency", "costs.cpu.recv.base", "costs.cpu.schedule.per_req", "costs.cpu.launch.base",
    "costs.cpu.process.per_token", "costs.noise.gpu_cv", "costs.noise.cpu_cv", "costs.noise.run_gpu_cv",
    "costs.noise.run_cpu_cv", "costs.gil.switch_interval", "costs.gil.sample_launch", "costs.gil.sample_compute",
    "costs.gil.wake_latency", "workload.rate_per_s", "server.init_new_token_ratio",
]
BAD_FLOATS = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "negative": -1.0, "huge": 1e300}

for _field in FLOAT_FIELDS:
    for _name, _value in BAD_FLOATS.items():
        case(f"run-{_field}-{_name}")(lambda ctx, f=_field, v=_value: run_scenario(ctx, {f: v}, f))

INT_FIELDS = {  # field -> bad values
    "workload.concurrency": [0, -1, 10**30, 1.5, "many"],
    "workload.num_requests": [0, 10**30, float("inf")],
    "workload.warmup_requests": [-1],
    "server.max_running_requests": [0, 10**30],
    "server.chunked_prefill_size": [-10**10, float("nan")],  # <= 0: chunked prefill off (SGLang)
    "server.kv_pool_tokens": [0, -4096, 10**30],
    "server.page_size": [0, 10**30],
    "costs.gil.ops_per_forward": [0, 10**9],
    "seed": [-1, 10**30, 0.5],
    "workload.input_len": [-1, 10**30, float("nan")],
    "workload.output_len": [-3, 10**30, float("inf")],
    "workload.cached_len": [-1, 10**30],
}
for _field, _values in INT_FIELDS.items():
    for _value in _values:
        case(f"run-{_field}-{_value!r}")(lambda ctx, f=_field, v=_value: run_scenario(ctx, {f: v}, f))

# --- run: length distributions ------------------------------------------------------------------------

DISTS = [
    ("normal-mean-nan", {"dist": "normal", "mean": float("nan"), "std": 1}, "workload.input_len.mean"),
    ("normal-mean-huge", {"dist": "normal", "mean": 1e300, "std": 1}, "workload.input_len.mean"),
    ("normal-std-inf", {"dist": "normal", "mean": 16, "std": float("inf")}, "workload.input_len.std"),
    ("normal-min-above-max", {"dist": "normal", "mean": 16, "std": 1, "min": 20, "max": 10}, "workload.input_len.max"),
    ("lognormal-sigma-huge", {"dist": "lognormal", "mean": 16, "sigma": 1e6}, "workload.input_len.sigma"),
    ("lognormal-mean-negative", {"dist": "lognormal", "mean": -1, "sigma": 1}, "workload.input_len.mean"),
    ("lognormal-min-above-max", {"dist": "lognormal", "mean": 16, "sigma": 1, "min": 9, "max": 3},
     "workload.input_len.max"),
    ("uniform-low-above-high", {"dist": "uniform", "low": 20, "high": 10}, "workload.input_len.high"),
    ("uniform-high-huge", {"dist": "uniform", "low": 1, "high": 10**30}, "workload.input_len.high"),
    ("choice-weight-nan", {"dist": "choice", "values": [8, 16], "weights": [1, float("nan")]},
     "workload.input_len.weights.1"),
    ("choice-weights-zero", {"dist": "choice", "values": [8, 16], "weights": [0, 0]}, "workload.input_len.weights"),
    ("choice-no-values", {"dist": "choice", "values": []}, "workload.input_len.values"),
    ("unknown-dist", {"dist": "zipf", "a": 2}, "workload.input_len"),
    ("missing-sigma", {"dist": "lognormal", "mean": 16}, "workload.input_len.sigma"),
]
for _id, _spec, _field in DISTS:
    case(f"run-input_len-{_id}")(lambda ctx, s=_spec, f=_field: run_scenario(ctx, {"workload.input_len": s}, f))

# --- run: values that disagree with the rest ----------------------------------------------------------

CONSISTENCY = [
    ("cached-above-input", {"workload.cached_len": 17}, "workload.cached_len", "<= input_len"),
    ("cached-dist-above-input", {"workload.cached_len": {"dist": "uniform", "low": 20, "high": 30}},
     "workload.cached_len", "<= input_len"),
    ("warmup-not-below-requests", {"workload.warmup_requests": 4}, "workload.warmup_requests", "smaller"),
    ("pool-smaller-than-a-request", {"server.kv_pool_tokens": 16}, "server.kv_pool_tokens", "every request would fail"),
    # (an output longer than the pool only stops early: SGLang clips max_new_tokens at arrival)
    ("pool-smaller-than-shortest-draw", {"server.kv_pool_tokens": 64,
                                         "workload.input_len": {"dist": "uniform", "low": 60, "high": 90},
                                         "workload.cached_len": 0},
     "server.kv_pool_tokens", "every request would fail"),
    ("pool-not-whole-pages", {"server.page_size": 64, "server.kv_pool_tokens": 4000}, "server.kv_pool_tokens",
     "multiple"),
    ("forward-takes-no-time", {"costs.gpu.decode": {"base": 0.0}}, "costs.gpu.decode", "take time"),
    ("forward-takes-1e-300-s", {"costs.gpu.prefill": {"base": 1e-300}}, "costs.gpu.prefill", "take time"),
    ("settings-repeat", {"server.settings": ["overlap", "overlap"]}, "server.settings", "repeat"),
    ("settings-unknown", {"server.settings": ["overlap", "turbo"]}, "server.settings.1", "normal"),
    ("settings-empty", {"server.settings": []}, "server.settings", "at least 1"),
    ("trace-without-file", {"workload.arrival": "trace"}, "workload.trace", "trace file"),
    ("launch-args-bad-value", {"server.launch_args": ["--model-path", "x", "--page-size", "big"]}, "server",
     "--page-size"),
    ("version-garbage", {"server.version": "new"}, "server", "release"),
    ("device-unknown", {"server.device": "tpu"}, "server.device", "cuda"),
    ("finish-unknown", {"workload.finish": "stop"}, "workload.finish", "length"),
    ("arrival-unknown", {"workload.arrival": "burst"}, "workload.arrival", "closed_loop"),
    ("name-empty", {"name": ""}, "name", "at least 1"),
    ("name-missing", {"name": _DELETE}, "name", "required"),
    ("name-a-path-out", {"name": "../../escape"}, "name", "no path"),
    ("tp-size-a-bool", {"server.tp_size": True}, "server.tp_size", "a number (got true)"),
    ("concurrency-a-bool", {"workload.concurrency": False}, "workload.concurrency", "a number (got false)"),
    ("grammar-share-a-bool", {"server.structured_output": {"share": True, "mask_us_per_request": 1,
                                                           "accept_us_per_request": 1}},
     "server.structured_output.share", "a number (got true)"),
    ("engine-a-list", {"server.engine": ["vllm"]}, "server.engine", "expected one of sglang, vllm"),
    ("launch-arg-a-list", {"server.launch_args": ["--page-size", [16]]}, "server.launch_args.1",
     "expected a string"),
    ("input-len-a-bool", {"workload.input_len": True}, "workload.input_len", "a number (got true)"),
    ("sync-latency-a-bool", {"costs.gpu.sync_latency": True}, "costs.gpu.sync_latency", "a number (got true)"),
    ("choice-value-a-bool", {"workload.output_len": {"dist": "choice", "values": [4, True]}},
     "workload.output_len.values.1", "a number (got true)"),
    ("name-absolute", {"name": "/tmp/elsewhere"}, "name", "no path"),
    ("name-dot-dot", {"name": ".."}, "name", "no path"),
    ("profile-statistic", {"costs.profile_statistic": "p50"}, "costs.profile_statistic", "median"),
    ("ratio-above-one", {"server.init_new_token_ratio": 1.5}, "server.init_new_token_ratio", "1"),
]
for _id, _patches, _field, _words in CONSISTENCY:
    case(f"run-{_id}")(lambda ctx, p=_patches, f=_field, w=_words: run_scenario(ctx, p, f, w))


@case("run-unknown-key-did-you-mean")
def _(ctx):
    return run_scenario(ctx, {"workload.concurency": 3}, "workload.concurency", "did you mean 'concurrency'")


@case("run-unknown-top-level-key")
def _(ctx):
    return run_scenario(ctx, {"sed": 3}, ": sed:", "did you mean 'seed'")


@case("run-unknown-key-no-match")
def _(ctx):
    return run_scenario(ctx, {"server.turbo": True}, "server.turbo", "unknown key")


# --- run: the scenario file itself ------------------------------------------------------------------

@case("run-missing-file")
def _(ctx):
    return ["run", str(ctx.tmp / "nope.yaml"), "--out", ctx.out], ["nope.yaml", "no such scenario file"]


def _plots_without_steps(tables: str) -> None:
    @case(f"run-plots-with-tables-{tables}")  # the plots are drawn from the steps tables
    def _(ctx):
        return ["run", ctx.scenario({}), "--tables", tables, "--plots", "--out", ctx.out], ["--plots", f"--tables {tables}"]


for _tables in ("none", "summary"):
    _plots_without_steps(_tables)


@case("run-pipe-as-scenario")
def _(ctx):
    os.mkfifo(ctx.tmp / "p.yaml")
    return ["run", str(ctx.tmp / "p.yaml"), "--out", ctx.out], ["p.yaml", "not a regular file"]


@case("run-folder-as-scenario")
def _(ctx):
    (ctx.tmp / "d.yaml").mkdir()
    return ["run", str(ctx.tmp / "d.yaml"), "--out", ctx.out], ["d.yaml", "a folder; expected a scenario file"]


@case("run-not-yaml")
def _(ctx):
    path = ctx.file("s.yaml", "name: [unclosed\n")
    return ["run", path, "--out", ctx.out], [path, "not valid YAML"]


@case("run-empty-file")
def _(ctx):
    path = ctx.file("s.yaml", "")
    return ["run", path, "--out", ctx.out], [path, "mapping"]


@case("run-top-level-list")
def _(ctx):
    path = ctx.file("s.yaml", "- name: x\n")
    return ["run", path, "--out", ctx.out], [path, "mapping"]


@case("run-a-repeated-key")
def _(ctx):
    path = ctx.file("s.yaml", "name: a\nworkload:\n  concurrency: 2\n  concurrency: 3\n")
    return ["run", path, "--out", ctx.out], [path, "line 4", "duplicate key 'concurrency'"]


@case("run-binary-file")
def _(ctx):
    path = ctx.file("s.yaml", b"\xff\xfe\x00garbage\x80")
    return ["run", path, "--out", ctx.out], [path, "cannot read"]


# --- run: --set overrides -------------------------------------------------------------------------------

SETS = [
    ("typo", "workload.concurency=3", ["--set workload.concurency=3", "did you mean 'concurrency'"]),
    ("seed-negative", "seed=-1", ["--set seed=-1", "seed"]),
    ("seed-huge", "seed=100000000000000000000000000000", ["--set seed=", "seed", "less than or equal"]),
    ("scale-inf", "costs.gpu.scale=.inf", ["--set costs.gpu.scale=.inf", "finite"]),
    ("scale-nan", "costs.cpu.scale=.nan", ["--set costs.cpu.scale=.nan", "finite"]),
    ("settings-unknown", "server.settings=turbo", ["--set server.settings=turbo", "server.settings"]),
    ("no-equals", "workload.concurrency", ["--set workload.concurrency", "KEY.PATH=VALUE"]),
    ("empty-key", "=3", ["--set =3", "KEY.PATH=VALUE"]),
    ("inside-a-number", "workload.concurrency.x=1", ["--set workload.concurrency.x=1", "not a mapping"]),
    ("empty-value", "workload.concurrency=", ["--set workload.concurrency=", "workload.concurrency"]),
    ("section-to-number", "workload=3", ["--set workload=3", "workload"]),
    ("profile-missing", "costs.profile=nope.json", ["--set costs.profile=nope.json", "costs.profile", "nope.json"]),
    ("pool-too-small", "server.kv_pool_tokens=8", ["--set server.kv_pool_tokens=8", "every request would fail"]),
    ("number-too-long", "workload.concurrency=" + "9" * 5000, ["--set workload.concurrency", "more than 4,300 digits"]),
]
for _id, _item, _words in SETS:
    case(f"set-{_id}")(lambda ctx, i=_item, w=_words: (["run", ctx.scenario(), "--set", i, "--out", ctx.out], w))


for _field, _value in (("workload.ignore_eos", "yes"), ("workload.warmup_before_benchmark", "no"),
                       ("workload.ignore_eos", 1)):
    case(f"run-switch-{_field}-{_value}")(lambda ctx, f=_field, v=_value: run_scenario(ctx, {f: v}, f, "true or false"))
case("run-name-newline")(lambda ctx: run_scenario(ctx, {"name": "a\nb"}, "name", "control characters"))


@case("set-key-twice")
def _(ctx):
    return (["run", ctx.scenario(), "--set", "workload.concurrency=1", "--set", "workload.concurrency=2", "--out",
             ctx.out], ["--set workload.concurrency=2", "given twice"])


@case("set-makes-the-file-inconsistent")
def _(ctx):
    path = ctx.scenario({"workload.warmup_requests": 2})
    return (["run", path, "--set", "workload.num_requests=2", "--out", ctx.out],
            [path, "with --set workload.num_requests=2", "workload.warmup_requests"])


@case("set-trace-missing")
def _(ctx):
    scen, _trace = ctx.trace_scenario([TRACE_LINE])
    return (["run", scen, "--set", "workload.trace=gone.jsonl", "--out", ctx.out],
            ["--set workload.trace=gone.jsonl", "workload.trace", "no such file"])


@case("set-trace-a-folder")
def _(ctx):
    scen, _trace = ctx.trace_scenario([TRACE_LINE])
    (ctx.tmp / "traces").mkdir()
    return (["run", scen, "--set", "workload.trace=traces", "--out", ctx.out],
            ["--set workload.trace=traces", "workload.trace", "a folder, not a trace file"])


@case("set-a-section-after-a-key-inside-it")
def _(ctx):  # the later override replaced the section the earlier one set a key in: the later one is blamed
    return (["run", ctx.scenario(), "--set", "workload.num_requests=30", "--set", "workload=5", "--out", ctx.out],
            ["--set workload=5", "workload"])


@case("set-a-section-to-a-number")
def _(ctx):  # pydantic's "a valid dictionary or instance of Workload", said as a user reads it
    return (["run", ctx.scenario(), "--set", "costs=[1,2]", "--out", ctx.out],
            ["--set costs=[1,2]", "costs", "expected a mapping of keys (a section), got [1, 2]"])


@case("set-a-length-without-dist")
def _(ctx):  # pydantic's "Unable to extract tag using discriminator 'dist'", said as a user reads it
    return (["run", ctx.scenario(), "--set", "workload.input_len={mean: 300}", "--out", ctx.out],
            ["workload.input_len", "needs a 'dist' key", "uniform, normal, lognormal or choice"])


@case("set-a-very-long-value")
def _(ctx):  # the message quotes the value cut short, not 40,000 characters of it
    return (["run", ctx.scenario(), "--set", "workload.rate_per_s=" + "x" * 40000, "--out", ctx.out],
            ["--set workload.rate_per_s=xxxx", "...", "workload.rate_per_s"])


@case("profile-of-another-engine")
def _(ctx):  # a vLLM profile under a server section that names no engine (sglang): the engine is blamed
    prof = str(Path(__file__).parents[1] / "scenarios/profiles/cpu-vllm-tiny.json")
    return (run_scenario(ctx, {"costs.profile": prof})[0],
            ["server.engine", "is sglang (the default", "is a vllm profile"])


# --- run: trace files ------------------------------------------------------------------------------------

TRACES = [
    ("arrival-nan", [{**TRACE_LINE, "arrival_s": float("nan")}], "line 1: arrival_s", "finite"),
    ("arrival-inf", [{**TRACE_LINE, "arrival_s": float("inf")}], "line 1: arrival_s", "finite"),
    ("arrival-negative", [{**TRACE_LINE, "arrival_s": -1}], "line 1: arrival_s", "seconds"),
    ("arrival-huge", [TRACE_LINE, {**TRACE_LINE, "arrival_s": 1e300}], "line 2: arrival_s", "seconds"),
    ("arrival-text", [{**TRACE_LINE, "arrival_s": "soon"}], "line 1: arrival_s", "finite"),
    ("input-zero", [{**TRACE_LINE, "input_len": 0}], "line 1: input_len", "integer"),
    ("input-fraction", [{**TRACE_LINE, "input_len": 1.5}], "line 1: input_len", "integer"),
    ("input-huge", [{**TRACE_LINE, "input_len": 1e30}], "line 1: input_len", "integer"),
    ("input-bool", [{**TRACE_LINE, "input_len": True}], "line 1: input_len", "finite"),
    ("output-negative", [{**TRACE_LINE, "output_len": -1}], "line 1: output_len", "integer"),
    ("cached-above-input", [{**TRACE_LINE, "cached_len": 20}], "line 1: cached_len", "<= input_len"),
    ("cached-negative", [{**TRACE_LINE, "cached_len": -2}], "line 1: cached_len", "integer"),
    ("missing-key", [{"arrival_s": 0, "input_len": 8}], "line 1", "output_len"),
    ("array-line", [[0, 8, 4]], "line 1", "JSON object"),
    ("not-json", [TRACE_LINE, "{arrival_s: 1"], "line 2", "not valid JSON"),
    ("empty", [], "", "no requests"),
    ("too-long-for-pool", [{**TRACE_LINE, "input_len": 5000}], "server.kv_pool_tokens", "every request would fail"),
]
for _id, _lines, _where, _words in TRACES:
    def _build(ctx, lines=_lines, where=_where, words=_words):
        scen, trace = ctx.trace_scenario(lines)
        source = scen if where.startswith("server.") else trace
        return ["run", scen, "--out", ctx.out], [source, where, words]
    case(f"jsonl-{_id}")(_build)


@case("jsonl-binary")
def _(ctx):
    scen, trace = ctx.trace_scenario([])
    Path(trace).write_bytes(b"\x80\x81\xfe\xff" * 8)
    return ["run", scen, "--out", ctx.out], [trace, "not a text file"]


@case("jsonl-warmup-not-below-its-requests")
def _(ctx):
    scen, _trace = ctx.trace_scenario([TRACE_LINE, TRACE_LINE], {"workload.warmup_requests": 2})
    return ["run", scen, "--out", ctx.out], [scen, "workload.warmup_requests", "trace's 2 requests"]


# --- run: calibration profiles ------------------------------------------------------------------------------

def _set_in(*keys_and_value):
    *keys, value = keys_and_value

    def change(prof):
        node = prof
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return change


PROFILES = [
    ("value-nan", _set_in("curves", "recv", "values_s", 0, float("nan")), "curves.recv.values_s[0]"),
    ("value-inf", _set_in("curves", "forward.decode", "values_s", 0, 0, float("inf")),
     "curves.forward.decode.values_s[0][0]"),
    ("value-negative", _set_in("curves", "launch.decode", "values_s", 1, -1e-3), "curves.launch.decode.values_s[1]"),
    ("value-huge", _set_in("curves", "process.decode", "values_s", 0, 1e300), "curves.process.decode.values_s[0]"),
    ("sample-point-missing-axis", _set_in("samples", 0, "point", {}), "samples[0].point"),
    ("sample-time-text", _set_in("samples", 0, "times_s", 0, "fast"), "samples[0].times_s[0]"),
    ("sync-latency-text", _set_in("metadata", "sync_latency_s", "slow"), "metadata.sync_latency_s"),
    ("sync-latency-nan", _set_in("metadata", "sync_latency_s", float("nan")), "metadata.sync_latency_s"),
    ("newer-schema", _set_in("schema_version", 99), "schema_version"),
    ("not-a-profile", _set_in("format", "something else"), "format"),
    ("curve-missing", lambda p: p["curves"].pop("recv"), "curves.recv"),
    ("grid-unsorted", lambda p: p["curves"]["launch.decode"]["grid"][0].reverse(), "curves.launch.decode.grid[0]"),
    ("forward-zero", _set_in("curves", "forward.extend", "values_s", 0, 0, 0.0), "curves.forward.extend.values_s"),
]
for _id, _change, _field in PROFILES:
    def _build(ctx, change=_change, field=_field):
        prof = ctx.profile(change)
        return ["run", ctx.scenario(), "--set", f"costs.profile={prof}", "--out", ctx.out], [prof, field]
    case(f"profile-{_id}")(_build)


@case("profile-truncated")
def _(ctx):
    text = (Path(__file__).parents[1] / "scenarios/profiles/cpu-torch-small.json").read_text()
    prof = ctx.profile(text=text[: len(text) // 2])
    return ["run", ctx.scenario(), "--set", f"costs.profile={prof}", "--out", ctx.out], [prof, "not valid JSON"]


@case("profile-nested-too-deeply")
def _(ctx):
    prof = ctx.profile(text="[" * 100_000)
    return ["run", ctx.scenario(), "--set", f"costs.profile={prof}", "--out", ctx.out], [prof, "nested too deeply"]


@case("profile-relative-in-file-missing")
def _(ctx):
    path = ctx.scenario({"costs.profile": "profiles/none.json"})
    return ["run", path, "--out", ctx.out], [path, "costs.profile", "no such calibration profile",
                                             "a relative path is read from the scenario file's folder"]


# --- run: flags and output paths ----------------------------------------------------------------------------

@case("run-out-is-a-file")
def _(ctx):
    f = ctx.file("taken", "keep me")
    return ["run", ctx.scenario(), "--out", f], ["--out", "is a file"]


@case("run-out-under-a-file")
def _(ctx):
    f = ctx.file("taken", "keep me")
    return ["run", ctx.scenario(), "--out", f + "/res"], ["--out", "is a file"]


@case("run-bad-format")
def _(ctx):
    return ["run", ctx.scenario(), "--format", "xlsx", "--out", ctx.out], ["--format", "invalid choice"]


@case("run-bad-tables")
def _(ctx):
    return ["run", ctx.scenario(), "--tables", "all", "--out", ctx.out], ["--tables", "invalid choice"]


@case("run-unknown-flag")
def _(ctx):
    return ["run", ctx.scenario(), "--turbo", "--out", ctx.out], ["--turbo", "unrecognized"]


@case("run-no-scenario")
def _(ctx):
    return ["run", "--out", ctx.out], ["run", "scenario"]


@case("no-command")
def _(ctx):
    return [], ["overlap-sim", "required"]


@case("unknown-command")
def _(ctx):
    return ["simulate"], ["overlap-sim", "invalid choice"]


# --- run: the server dies, or every request fails (exit status 3, results written) ----------------------------

KV_DEATH = _patch(_patch(_patch(BASE, "server.retraction", "naive"), "server.kv_pool_tokens", 2176),
                  "workload", {"arrival": "closed_loop", "concurrency": 8, "num_requests": 16, "input_len": 512,
                               "cached_len": 448, "output_len": 193})
KV_DEATH["server"]["page_size"] = 64


@case("run-server-dies-kv", status=3)
def _(ctx):
    return run_scenario(ctx, {}, "overlap: the server died", "KV allocation failed", base=KV_DEATH)[0], \
        ["overlap: the server died", "exit status 3"]


@case("run-server-dies-mlx-normal", status=3)
def _(ctx):
    path = ctx.scenario({"server.device": "mlx", "server.settings": ["normal"], "workload.concurrency": 4})
    return ["run", path, "--out", ctx.out, "--json"], ["normal: the server died", "mlx_normal"]


# --- sweep (and its repeats: the variance tables) --------------------------------------------------------------

SWEEPS = [
    ("grid-unknown-key", ["--grid", "workload.concurency=1,2"], ["--grid workload.concurency", "did you mean"]),
    ("grid-bad-value", ["--grid", "workload.concurrency=1,0"], ["--grid workload.concurrency=1,0 (at 0)", "greater than"]),
    ("grid-nan", ["--grid", "costs.gpu.scale=1,.nan"], ["--grid costs.gpu.scale", "finite"]),
    ("grid-inf", ["--grid", "costs.cpu.scale=.inf"], ["--grid costs.cpu.scale", "finite"]),
    ("grid-no-equals", ["--grid", "workload.concurrency"], ["--grid workload.concurrency", "KEY.PATH"]),
    ("grid-no-values", ["--grid", "workload.concurrency="], ["--grid workload.concurrency=", "at least one value"]),
    ("grid-key-twice", ["--grid", "seed=0,1", "--grid", "seed=2"], ["--grid seed=2", "twice"]),
    ("grid-value-twice", ["--grid", "workload.concurrency=1,2,1"], ["--grid workload.concurrency", "twice"]),
    ("grid-seed-negative", ["--grid", "seed=0,-1"], ["--grid seed=0,-1 (at -1)", "seed"]),
    ("grid-pool-too-small", ["--grid", "server.kv_pool_tokens=4096,8"], ["--grid server.kv_pool_tokens=4096,8 (at 8)",
                                                                            "every request would fail"]),
    ("grid-too-large", ["--grid", "seed=" + ",".join(map(str, range(20))), "--repeats", "100000"],
     ["--grid", "at most"]),
    ("repeats-zero", ["--repeats", "0"], ["--repeats", "0"]),
    ("repeats-negative", ["--repeats", "-2"], ["--repeats", "-2"]),
    ("repeats-fraction", ["--repeats", "1.5"], ["--repeats", "invalid int"]),
    ("workers-zero", ["--workers", "0"], ["--workers", "0"]),
    ("workers-huge", ["--workers", "1000000"], ["--workers", "1000000"]),
    ("scheduler-without-dask", ["--scheduler", "tcp://h:8786"], ["--scheduler", "--executor dask"]),
    ("executor-unknown", ["--executor", "slurm"], ["--executor", "invalid choice"]),
    ("set-bad", ["--set", "costs.noise.gpu_cv=-0.1"], ["--set costs.noise.gpu_cv=-0.1", "costs.noise.gpu_cv"]),
    ("grid-and-set-one-key", ["--grid", "workload.concurrency=1,2", "--set", "workload.concurrency=4"],
     ["--grid workload.concurrency", "also given with --set"]),
    ("variance-cv-nan", ["--set", "costs.noise.run_gpu_cv=.nan", "--repeats", "3"],
     ["--set costs.noise.run_gpu_cv=.nan", "finite"]),
    ("variance-cv-huge", ["--grid", "costs.noise.run_cpu_cv=0,1e300", "--repeats", "3"],
     ["--grid costs.noise.run_cpu_cv", "less than or equal"]),
]
for _id, _args, _words in SWEEPS:
    def _build(ctx, args=_args, words=_words):
        workers = [] if "--workers" in args else ["--workers", "1"]
        return ["sweep", ctx.scenario(), *args, *workers, "--no-plots", "--out", ctx.out], words
    case(f"sweep-{_id}")(_build)


@case("sweep-out-is-a-file")
def _(ctx):
    f = ctx.file("taken", "keep me")
    return ["sweep", ctx.scenario(), "--grid", "seed=0,1", "--workers", "1", "--out", f], ["--out", "is a file"]


@case("sweep-grid-profile-corrupt")
def _(ctx):
    prof = ctx.profile(text="{not json")
    return (["sweep", ctx.scenario(), "--grid", f"costs.profile={prof}", "--workers", "1", "--out", ctx.out],
            [prof, "not valid JSON"])


@case("sweep-bad-scenario")
def _(ctx):
    path = ctx.scenario({"costs.gpu.scale": float("inf")})
    return ["sweep", path, "--workers", "1", "--out", ctx.out], [path, "costs.gpu.scale"]


# --- trace: a run's timeline --------------------------------------------------------------------------------------

@case("trace-results-missing")
def _(ctx):
    return ["trace", str(ctx.tmp / "nothing")], ["nothing", "no such folder"]


@case("trace-results-a-file")
def _(ctx):
    return ["trace", ctx.file("afile", "x")], ["afile", "a file, not a folder"]  # (not --out's fault)


@case("trace-results-not-a-run")
def _(ctx):
    (ctx.tmp / "empty").mkdir()
    return ["trace", str(ctx.tmp / "empty")], ["summary.json", "cannot read"]


def _summary_case(text: str, words: list[str]):
    def build(ctx):
        run = ctx.run_folder()
        Path(run, "summary.json").write_text(text)
        return ["trace", run], ["summary.json", *words]
    return build


for _id, _text, _words in [("corrupt", "{", ["cannot read"]), ("a-list", "[1, 2]", ["settings"]),
                           ("without-settings", '{"scenario": "x"}', ["settings"])]:
    case(f"trace-summary-{_id}")(_summary_case(_text, _words))


@case("trace-out-over-the-runs-summary")
def _(ctx):
    run = ctx.run_folder()
    return ["trace", run, "--out", str(Path(run, "summary.json"))], ["--out", "summary.json", "is the input"]


@case("trace-preview-over-the-runs-plot")
def _(ctx):
    run = ctx.run_folder()
    Path(run, "timeline.png").write_bytes(b"png")
    return ["trace", run, "--preview", str(Path(run, "timeline.png"))], ["--preview", "the run's own plot"]


@case("trace-steps-nan")
def _(ctx):
    import pandas as pd

    run = ctx.run_folder()
    steps = pd.read_parquet(Path(run, "steps_overlap.parquet"))
    steps.loc[3, "forward_end"] = float("nan")
    steps.to_parquet(Path(run, "steps_overlap.parquet"), index=False)
    return ["trace", run], ["steps_overlap", "forward_end", "finite"]


@case("plots-steps-a-folder")
def _(ctx):
    run = ctx.run_folder()
    Path(run, "steps_overlap.parquet").unlink()
    Path(run, "steps_overlap.parquet").mkdir()
    return ["plots", run], ["steps_overlap", "no steps table"]


@case("trace-steps-a-broken-link")
def _(ctx):
    run = ctx.run_folder()
    Path(run, "steps_overlap.parquet").unlink()
    Path(run, "steps_overlap.parquet").symlink_to(ctx.tmp / "nowhere")
    return ["trace", run], ["steps_overlap", "no steps table"]


@case("plots-tables-of-two-runs")
def _(ctx):
    import pandas as pd

    run = ctx.run_folder()
    pd.read_parquet(Path(run, "steps_normal.parquet")).to_csv(Path(run, "steps_normal.csv"), index=False)
    return ["plots", run], ["steps_normal", "both CSV and Parquet"]


@case("trace-steps-garbage")
def _(ctx):
    run = ctx.run_folder()
    Path(run, "steps_normal.parquet").write_bytes(b"\x00\x01binary\xff")
    return ["trace", run], ["steps_normal", ""]


WINDOWS = [("text", "soon"), ("reversed", "0.5:0.1"), ("nan", "nan:1"), ("inf", "inf:"), ("no-colon", "0.3")]
for _id, _w in WINDOWS:
    case(f"trace-window-{_id}")(lambda ctx, w=_w: (["trace", ctx.run_folder(), "--window", w], [f"--window {w}",
                                                                                                   "START:END"]))


@case("trace-setting-unknown")
def _(ctx):
    return ["trace", ctx.run_folder(), "--setting", "turbo"], ["--setting", "turbo"]


@case("trace-out-is-a-folder")
def _(ctx):
    (ctx.tmp / "d").mkdir()
    return ["trace", ctx.run_folder(), "--out", str(ctx.tmp / "d")], ["--out", "is a folder"]


@case("trace-out-suffix")
def _(ctx):
    return ["trace", ctx.run_folder(), "--out", str(ctx.tmp / "t.txt")], ["--out", ".json"]


@case("trace-preview-suffix")
def _(ctx):
    return ["trace", ctx.run_folder(), "--out", str(ctx.tmp / "t.json"), "--preview", str(ctx.tmp / "p.doc")], \
        ["--preview", ".png"]


@case("trace-out-under-a-file")
def _(ctx):
    f = ctx.file("taken", "x")
    return ["trace", ctx.run_folder(), "--out", f + "/t.json"], ["--out", "is a file"]


# --- gaps: a real Chrome trace ---------------------------------------------------------------------------------------

@case("gaps-missing-file")
def _(ctx):
    return ["gaps", str(ctx.tmp / "none.json")], ["none.json", "cannot read"]


@case("gaps-not-json")
def _(ctx):
    path = ctx.file("t.json", "{\"traceEvents\": [")
    return ["gaps", path], [path, "not valid Chrome trace JSON"]


@case("gaps-nested-too-deeply")
def _(ctx):
    path = ctx.file("t.json", "[" * 100_000)
    return ["gaps", path], [path, "nested too deeply"]


@case("gaps-span-args-not-an-object")
def _(ctx):
    return ["gaps", ctx.chrome([*kernels((0, 5)), {**KERNEL, "ts": 10, "dur": 5, "args": "x"}])], ["traceEvents", "args"]


@case("gaps-span-pid-a-list")
def _(ctx):
    return ["gaps", ctx.chrome([*kernels((0, 5)), {**KERNEL, "ts": 10, "dur": 5, "pid": [1]}])], ["traceEvents", "pid"]


@case("gaps-span-without-dur")
def _(ctx):  # a complete event has a dur: without it the kernel split a step in silence
    events = kernels((0, 5), (10, 15), (100, 105))
    del events[1]["dur"]
    return ["gaps", ctx.chrome(events)], ["traceEvents[1].dur", "corrupt"]


@case("gaps-event-not-an-object")
def _(ctx):
    return ["gaps", ctx.chrome([*kernels((0, 5)), "x", *kernels((100, 105))])], ["traceEvents[1]", "an event object"]


@case("gaps-span-negative-dur")
def _(ctx):
    return ["gaps", ctx.chrome([*kernels((0, 5)), {**KERNEL, "ts": 10, "dur": -3}])], ["traceEvents", "not negative"]


@case("gaps-truncated-gzip")
def _(ctx):
    blob = gzip.compress(json.dumps({"traceEvents": kernels((0, 5), (10, 15))}).encode())
    path = ctx.file("t.json.gz", blob[: len(blob) // 2])
    return ["gaps", path], [path, "truncated"]


@case("gaps-events-not-a-list")
def _(ctx):
    path = ctx.file("t.json", json.dumps({"traceEvents": 3}))
    return ["gaps", path], [path, "traceEvents"]


@case("gaps-no-kernels")
def _(ctx):
    path = ctx.chrome([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5, "pid": 1}])
    return ["gaps", path], [path, "no device kernels", "--step-name"]


@case("gaps-kernels-all-nan")
def _(ctx):
    path = ctx.chrome([{**KERNEL, "ts": float("nan"), "dur": 5}, {**KERNEL, "ts": 10, "dur": float("nan")}])
    return ["gaps", path], [path, "traceEvents", "2 span(s) are not"]


@case("gaps-step-name-missing")
def _(ctx):
    path = ctx.chrome(kernels((0, 5), (100, 105)))
    return ["gaps", path, "--step-name", "decode_forward"], [path, "--step-name", "decode_forward"]


@case("gaps-pid-unknown")
def _(ctx):
    path = ctx.chrome(kernels((0, 5), (100, 105)))
    return ["gaps", path, "--pid", "42"], [path, "--pid", "42"]


for _id, _v in (("nan", "nan"), ("negative", "-1"), ("inf", "inf"), ("text", "wide")):
    case(f"gaps-split-gap-{_id}")(lambda ctx, v=_v: (["gaps", ctx.chrome(kernels((0, 5), (100, 105))),
                                                     "--split-gap-us", v], ["--split-gap-us"]))


@case("gaps-against-a-file")
def _(ctx):
    return ["gaps", ctx.chrome(kernels((0, 5), (100, 105))), "--against", ctx.file("afile", "x")], \
        ["afile", "a file, not a folder"]


@case("gaps-against-not-a-run")
def _(ctx):
    (ctx.tmp / "empty").mkdir()
    return ["gaps", ctx.chrome(kernels((0, 5), (100, 105))), "--against", str(ctx.tmp / "empty")], \
        ["summary.json", "cannot read"]


@case("gaps-plot-is-a-folder")
def _(ctx):
    (ctx.tmp / "d.png").mkdir()
    return ["gaps", ctx.chrome(kernels((0, 5), (100, 105))), "--plot", str(ctx.tmp / "d.png")], \
        ["--plot", "is a folder"]


@case("gaps-plot-suffix")
def _(ctx):
    return ["gaps", ctx.chrome(kernels((0, 5), (100, 105))), "--plot", str(ctx.tmp / "g.xyz")], ["--plot", ".png"]


# --- log: an SGLang server log ------------------------------------------------------------------------------------------

LOG_LINE = "[2026-10-16 14:07:20 TP0] Decode batch, #running-req: 8, #token: 4096, token usage: 0.01, #queue-req: 0\n"


@case("log-missing")
def _(ctx):
    return ["log", str(ctx.tmp / "none.log")], ["none.log", "cannot read"]


@case("log-empty")
def _(ctx):
    path = ctx.file("s.log", "")
    return ["log", path], [path, "empty"]


@case("log-no-batch-lines")
def _(ctx):
    path = ctx.file("s.log", "hello\nworld\n")
    return ["log", path], [path, "none of its 2 lines"]


@case("log-binary")
def _(ctx):
    path = ctx.file("s.log", bytes(range(256)) * 4)
    return ["log", path], [path, "Decode batch"]


@case("log-garbled-numbers")
def _(ctx):
    path = ctx.file("s.log", LOG_LINE.replace("0.01", "nan").replace(": 8,", ": 1e400,"))
    return ["log", path], [path, "none of its 1 lines"]


@case("log-a-folder")
def _(ctx):
    (ctx.tmp / "d.log").mkdir()
    return ["log", str(ctx.tmp / "d.log")], ["d.log", "cannot read"]


@case("log-out-is-a-file")
def _(ctx):
    f = ctx.file("taken", "x")
    return ["log", ctx.file("s.log", LOG_LINE), "--out", f], ["--out", "is a file"]


@case("log-out-under-a-file")
def _(ctx):
    f = ctx.file("taken", "x")
    return ["log", ctx.file("s.log", LOG_LINE), "--out", f + "/x"], ["--out", "is a file"]


# --- plots: redraw from saved tables -----------------------------------------------------------------------------------------

@case("plots-missing-folder")
def _(ctx):
    return ["plots", str(ctx.tmp / "none")], ["none", "no such folder"]


@case("plots-a-file")
def _(ctx):
    return ["plots", ctx.file("f", "x")], ["f", "no such folder"]


@case("plots-empty-folder")
def _(ctx):
    (ctx.tmp / "empty").mkdir()
    return ["plots", str(ctx.tmp / "empty")], ["empty", "not a run or sweep folder"]


@case("plots-sweep-manifest-corrupt")
def _(ctx):
    ctx.file("sw/sweep.json", "{")
    ctx.file("sw/sweep.csv", "point,setting\n")
    return ["plots", str(ctx.tmp / "sw")], ["sweep.json", "cannot read"]


@case("plots-sweep-table-lacks-columns")
def _(ctx):
    ctx.file("sw/sweep.json", "{}")
    ctx.file("sw/sweep.csv", "a,b\n1,2\n")
    return ["plots", str(ctx.tmp / "sw")], ["sweep.csv", "output_throughput"]


@case("plots-run-summary-a-list")
def _(ctx):
    run = ctx.run_folder()
    Path(run, "summary.json").write_text("[]")
    return ["plots", run], ["summary.json", "settings"]


# --- round three: lines that say what is wrong, writes the system refuses -----------------------------------------------

@case("run-version-garbage-names-the-field")
def _(ctx):
    return run_scenario(ctx, {"server.version": "banana"}, "server.version", "banana")


@case("run-launch-args-tensor-parallel")
def _(ctx):
    return run_scenario(ctx, {"server.launch_args": ["--tp", "4"]}, "server.launch_args", "--tp 4",
                        "not modelled")


@case("run-launch-args-speculative")
def _(ctx):
    return run_scenario(ctx, {"server.launch_args": ["--speculative-algorithm", "EAGLE"]}, "server.launch_args",
                        "speculative decoding", "not modelled")


@case("run-flow-map-without-spaces")
def _(ctx):
    path = ctx.file("f.yaml", "name: f\nworkload: {arrival: closed_loop, concurrency: 2, num_requests: 4, input_len: 8, "
                              "output_len: {dist:lognormal,mean:300}}\n")
    return ["run", path, "--out", ctx.out], [path, "workload.output_len", "space after each colon"]


@case("run-folder-as-profile")
def _(ctx):
    (ctx.tmp / "p.json").mkdir()
    path = ctx.scenario({"costs.profile": "p.json"})
    return ["run", path, "--out", ctx.out], ["costs.profile", "a folder"]


@case("transfer-folder-as-profile")
def _(ctx):
    (ctx.tmp / "p.json").mkdir()
    return ["transfer", str(ctx.tmp / "p.json"), "--to", "l4", "--out", str(ctx.tmp / "o.json")], ["p.json", "a folder"]


@case("transfer-host-probe-missing")
def _(ctx):  # the flag given is named first, not what the profile lacks
    return (["transfer", str(REPO / "scenarios/profiles/h200-llama-3.2-1b.json"), "--to", "l4", "--host-probe",
             str(ctx.tmp / "nope.json"), "--out", str(ctx.tmp / "o.json")], ["--host-probe", "nope.json: no such file"])


@case("profile-a-device-file")
def _(ctx):
    return ["run", ctx.scenario({"costs.profile": "/dev/null"}), "--out", ctx.out], \
        ["costs.profile", "not a regular file, not a calibration profile: /dev/null"]


@case("transfer-host-speed-and-probe")
def _(ctx):
    probe = ctx.file("r.json", json.dumps({"python_s": 0.002}))
    return (["transfer", str(REPO / "scenarios/profiles/cpu-sglang-tiny.json"), "--from", "h200", "--to", "l4", "--host-speed", "2",
             "--host-probe", probe, "--out", str(ctx.tmp / "o.json")], ["--host-speed", "--host-probe"])


@case("transfer-probe-missing-names-the-path")
def _(ctx):
    return (["transfer", str(REPO / "scenarios/profiles/cpu-sglang-tiny.json"), "--from", "h200", "--to", "l4", "--host-probe",
             str(ctx.tmp / "none.json"), "--out", str(ctx.tmp / "o.json")], ["--host-probe", "none.json"])


def _h200_profile(ctx, **metadata) -> str:
    prof = json.loads((REPO / "scenarios/profiles/h200-llama-3.2-1b.json").read_text())
    for key, value in metadata.items():
        if key.startswith("model_"):
            prof["metadata"]["model"][key[6:]] = value
        else:
            prof["metadata"][key] = value
    return ctx.file("p.json", json.dumps(prof))


@case("transfer-out-is-the-input")
def _(ctx):
    path = ctx.file("p.json", (REPO / "scenarios/profiles/h200-llama-3.2-1b.json").read_text())
    return ["transfer", path, "--to", "l4", "--out", path], ["--out", "itself"]


def _yardstick(ctx, scale: float = 1.0, readings=None) -> str:
    # readings of revision f505e66's yardstick on the AMD EPYC VM (4 December 2026, 09:34 UTC), which
    # composed the H200 profiles shipped until 5 December 2026
    ruler = json.loads((REPO / "tests/data/yardstick-f505e66-amd-epyc.json").read_text())
    ruler["readings"] = readings if readings is not None else [
        {**r, "median_s": r["median_s"] * scale} for r in ruler["readings"]]
    return ctx.file("y.json", json.dumps(ruler))


def _compose_with(ctx, ruler: str) -> list:
    return ["compose", str(REPO / "scenarios/profiles/parts/h200-llama-3.2-1b.device.json"),
            str(REPO / "scenarios/profiles/parts/sglang-0.5.23-host-amd-epyc.json"), "--host-yardstick", ruler,
            "--out", str(ctx.tmp / "o.json")]


@case("compose-yardstick-empty")
def _(ctx):
    return _compose_with(ctx, _yardstick(ctx, readings=[])), ["--host-yardstick", "readings", "none there"]


@case("compose-yardstick-absurd")
def _(ctx):
    return _compose_with(ctx, _yardstick(ctx, scale=1e300)), ["--host-yardstick", "outside 1/1000..1000"]


@case("transfer-params-infinite")
def _(ctx):
    path = ctx.file("p.json", (REPO / "scenarios/profiles/h200-llama-3.2-1b.json").read_text()
                    .replace('"params": ', '"params": Infinity, "_was": ', 1))
    return ["transfer", path, "--to", "l4", "--out", str(ctx.tmp / "o.json")], ["metadata.params", "got inf"]


@case("transfer-model-size-absurd")
def _(ctx):
    return (["transfer", _h200_profile(ctx, model_hidden=10 ** 400, params=None), "--to", "l4", "--out",
             str(ctx.tmp / "o.json")], ["metadata.model.hidden", "..."])


@case("sweep-grid-empty-values")
def _(ctx):
    return ["sweep", ctx.scenario(), "--grid", "workload.concurrency=,,", "--out", ctx.out], ["--grid", "two commas"]


@case("calibrate-folder-as-server-log")
def _(ctx):
    (ctx.tmp / "log").mkdir()
    return (["calibrate", "--from-trace", str(REPO / "tests/data/sglang/profile/normal-c4.trace.json.gz"), "--server-log",
             str(ctx.tmp / "log"), "--out", str(ctx.tmp / "p.json")], ["--server-log", "a folder"])


# a folder that takes no files although its permission bits allow it (as root): /proc on Linux
REFUSING = Path("/proc")
if REFUSING.is_dir():
    for _cmd in (["run", "{s}", "--out", "/proc/overlap-sim-x"], ["sweep", "{s}", "--grid", "workload.concurrency=1,2",
                                                                  "--out", "/proc/overlap-sim-x"],
                 ["transfer", str(REPO / "scenarios/profiles/h200-llama-3.2-1b.json"), "--to", "l4", "--out", "/proc/x.json"],
                 ["ask", "--card", "h200", "--model", "llama-3.2-1b", "--concurrency", "2", "--input-len", "8",
                  "--output-len", "4", "--out", "/proc/overlap-sim-x"]):
        case(f"write-refused-{_cmd[0]}")(lambda ctx, c=_cmd: ([a.replace("{s}", ctx.scenario()) for a in c],
                                                              ["--out", "/proc", "cannot write"]))


# --- advise ---------------------------------------------------------------------------------------------------------------

ADVISE = [
    ("version-garbage", ["--version", "latest", "--", "--model-path", "x"], ["--version", "latest"]),
    ("device-unknown", ["--device", "tpu"], ["--device", "invalid choice"]),
    ("flag-needs-value", ["--", "--tp-size"], ["--tp-size", "expected a value"]),
    ("flag-bad-int", ["--", "--pp-size", "two"], ["--pp-size", "integer"]),
    # the ranges the engines' own argument checks accept (declared once per engine: the rules
    # table's `min` for SGLang, MIN_INT for vLLM)
    ("sglang-tp-negative", ["--", "--tp-size", "-1"], ["--tp-size", ">= 1"]),
    ("sglang-page-size-zero", ["--", "--page-size", "0"], ["--page-size", ">= 1"]),
    ("vllm-tp-zero", ["--engine", "vllm", "--", "-tp", "0"], ["-tp", ">= 1"]),
    ("vllm-pp-zero", ["--engine", "vllm", "--", "-pp", "0"], ["-pp", ">= 1"]),
    ("vllm-pp-negative", ["--engine", "vllm", "--", "-pp", "-1"], ["-pp", ">= 1"]),
    ("vllm-max-num-seqs-negative", ["--engine", "vllm", "--", "--max-num-seqs", "-4"], ["--max-num-seqs", ">= 1"]),
    ("vllm-spec-method-list", ["--engine", "vllm", "--", "--speculative-config", '{"method": ["ngram"]}'],
     ["--speculative-config", "a string"]),
    ("vllm-spec-method-number", ["--engine", "vllm", "--", "--speculative-config.method", "3"],
     ["--speculative-config", "a string"]),
]
for _id, _args, _words in ADVISE:
    case(f"advise-{_id}")(lambda ctx, a=_args, w=_words: (["advise", *a], w))

# --- calibrate ------------------------------------------------------------------------------------------------------------

CAL = ["calibrate", "--backend", "torch", "--device", "cpu", "--model", "tiny", "--quick"]
CALIBRATE = [
    ("model-unknown", ["--model", "gpt-9"], ["--model", "gpt-9"]),
    ("torch-gpu", ["--device", "gpu"], ["--device", "cpu, cuda"]),
    ("mlx-cuda", ["--backend", "mlx", "--device", "cuda"], ["--device", "gpu"]),
    ("layers-zero", ["--layers", "0"], ["--layers", "0"]),
    ("heads-not-dividing", ["--heads", "3"], ["--heads", "a multiple of the model's", "--kv-heads"]),
    ("kv-heads-not-dividing", ["--heads", "4", "--kv-heads", "3"], ["--kv-heads", "divisor"]),
    ("hidden-negative", ["--hidden", "-64"], ["--hidden", "-64"]),
    ("repeats-zero", ["--repeats", "0"], ["--repeats", "0"]),
    ("warmup-negative", ["--warmup", "-1"], ["--warmup", "-1"]),
    ("threads-zero", ["--threads", "0"], ["--threads", "0"]),
    ("threads-negative", ["--threads", "-4"], ["--threads", "-4"]),
    ("seed-negative", ["--seed", "-1"], ["--seed", "-1"]),
    ("batch-sizes-zero", ["--batch-sizes", "0,4"], ["--batch-sizes", "0"]),
    ("batch-sizes-text", ["--batch-sizes", "a,b"], ["--batch-sizes", "integers"]),
    ("batch-sizes-empty", ["--batch-sizes", ","], ["--batch-sizes", "integers"]),
    ("batch-sizes-an-empty-item", ["--batch-sizes", "1,,4"], ["--batch-sizes", "'1,,4'"]),
    ("contexts-negative", ["--contexts", "-5"], ["--contexts", "-5"]),
    ("prefixes-negative", ["--prefixes=-1,0"], ["--prefixes", "-1"]),
    ("prefixes-dash", ["--prefixes", "-1,0"], ["--prefixes", "expected one argument"]),
    ("extend-tokens-huge", ["--extend-tokens", "100000000000"], ["--extend-tokens"]),
    ("model-too-big-for-memory", ["--layers", "100000", "--hidden", "100000", "--heads", "1000",
                                  "--kv-heads", "1000"], ["--model", "GiB"]),
    ("dtype-unknown", ["--dtype", "fp8"], ["--dtype", "invalid choice"]),
]
for _id, _args, _words in CALIBRATE:
    case(f"calibrate-{_id}")(lambda ctx, a=_args, w=_words: ([*CAL, *a, "--out", str(ctx.tmp / "o" / "p.json")], w))


@case("calibrate-sessions-without-engine")
def _(ctx):
    return [*CAL, "--sessions", "2", "--out", str(ctx.tmp / "p.json")], ["--sessions", "--engine"]


@case("calibrate-sessions-zero")
def _(ctx):
    return ["calibrate", "--engine", "vllm", "--sessions", "0", "--out", str(ctx.tmp / "p.json")], ["--sessions", "0"]


@case("calibrate-no-backend")
def _(ctx):
    return ["calibrate", "--device", "cpu", "--out", str(ctx.tmp / "p.json")], ["--backend", "required"]


@case("calibrate-out-is-a-folder")
def _(ctx):
    (ctx.tmp / "d").mkdir()
    return [*CAL, "--out", str(ctx.tmp / "d")], ["--out", "folder"]


@case("calibrate-out-under-a-file")
def _(ctx):
    f = ctx.file("taken", "x")
    return [*CAL, "--out", f + "/p.json"], ["--out", "is a file"]


@case("calibrate-cuda-without-a-gpu")
def _(ctx):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    return [*CAL, "--device", "cuda", "--out", str(ctx.tmp / "p.json")], ["--device", "cuda"]


# --- validate -----------------------------------------------------------------------------------------------------------------

VAL = ["validate", "--backend", "torch", "--device", "cpu", "--grid", "smoke"]
VALIDATE = [
    ("torch-gpu", ["--device", "gpu"], ["--device"]),
    ("mlx-cuda", ["--backend", "mlx", "--device", "cuda"], ["--device"]),
    ("only-nothing", ["--only", "no-such-config"], ["--only", "no-such-config"]),
    ("profile-missing", ["--profile", "/nonexistent/p.json"], ["--profile", "/nonexistent/p.json"]),
    ("repeats-zero", ["--repeats", "0"], ["--repeats"]),
    ("max-wait-negative", ["--max-wait", "-1"], ["--max-wait", "-1"]),
    ("max-wait-nan", ["--max-wait", "nan"], ["--max-wait", "nan"]),
    ("max-wait-and-no-wait", ["--max-wait", "5", "--no-wait"], ["--no-wait", "--max-wait"]),
    ("grid-unknown", ["--grid", "huge"], ["--grid", "invalid choice"]),
]
for _id, _args, _words in VALIDATE:
    case(f"validate-{_id}")(lambda ctx, a=_args, w=_words: ([*VAL, *a, "--out", ctx.out], w))


@case("validate-engine-with-the-harness-backend")
def _(ctx):
    return (["validate", "--engine", "sglang", "--profile", str(REPO / "scenarios/profiles/cpu-sglang-tiny.json"),
             "--backend", "torch"], ["--backend", "without --engine"])


@case("validate-profile-corrupt")
def _(ctx):
    prof = ctx.profile(text="{\"format\": \"overlap-sim calibration profile\", \"schema_v")
    return [*VAL, "--profile", prof, "--out", ctx.out], [prof, "not valid JSON"]


@case("validate-profile-nan")
def _(ctx):
    prof = ctx.profile(_set_in("curves", "recv", "values_s", 0, float("nan")))
    return [*VAL, "--profile", prof, "--out", ctx.out], [prof, "curves.recv.values_s[0]"]


@case("validate-out-is-a-file")
def _(ctx):
    f = ctx.file("taken", "x")
    return [*VAL, "--out", f], ["--out", "is a file"]


# --- the test --------------------------------------------------------------------------------------------------------------


class Hang(Exception):
    pass


@contextmanager
def deadline(seconds: int):
    """Fail (without a traceback: one raised from a signal handler can upset pytest's report)
    when the block takes longer than ``seconds``."""
    def alarm(_sig, _frame):
        raise Hang(f"no answer in {seconds} s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    except Hang as err:
        pytest.fail(f"hang: {err}", pytrace=False)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.lstat().st_mtime_ns for p in folder.rglob("*")}  # lstat: a case's broken link


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    """A small run's results folder (both settings), for the commands that read one."""
    folder = tmp_path_factory.mktemp("run") / "res"
    scen = tmp_path_factory.mktemp("scen") / "s.yaml"
    scen.write_text(yaml.safe_dump(BASE))
    assert main(["run", str(scen), "--out", str(folder), "--no-plots"]) == 0
    return folder


def call(argv: list[str]) -> int:
    try:
        with deadline(HANG_S):
            return main(argv)
    except SystemExit as err:  # --help and friends; a bad input must never get here
        return int(err.code or 0) + 1000


def test_the_corpus_is_large_and_covers_every_command():
    assert len(CASES) >= 150, len(CASES)
    assert len({c.id for c in CASES}) == len(CASES)
    commands = {c.id.split("-")[0] for c in CASES}
    for name in ("run", "set", "jsonl", "profile", "sweep", "trace", "gaps", "log", "plots", "advise", "calibrate",
                 "validate"):
        assert name in commands


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_bad_input(c: Case, tmp_path, capsys, monkeypatch, run_folder):
    monkeypatch.chdir(tmp_path)  # default output folders (results/...) would appear here
    monkeypatch.setenv("COLUMNS", "120")
    ctx = Ctx(tmp_path, run_folder)
    argv, words = c.build(ctx)
    before = snapshot(tmp_path)
    code = call(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert "Traceback" not in err and "Traceback" not in out
    assert code == c.status, f"exit {code}, expected {c.status}; stderr: {err!r}"
    assert len(lines) == 1, f"expected one line on stderr, got {err!r}"
    for word in words:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"
    if c.status == 2:
        assert snapshot(tmp_path) == before, "a bad input wrote files"
    else:  # the run finished: its results are there
        assert (Path(ctx.out) / "summary.json").is_file()


# --- property: extreme numbers anywhere give a clean error or a finite, sane result ------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import sim  # noqa: E402
from sim.cli import run_failures  # noqa: E402
from sim.errors import UserInputError  # noqa: E402

EXTREME_FLOATS = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, -1.0, -1e300, 1e300, 1e-300, 5e-324,
                  1e6 + 1, 3600.0, 3601.0, 0.5, 1.0, 7.0, 1e-6]
EXTREME_INTS = [0, -1, 1, 2, 7, 2**31, 2**63, 10**30, -(10**30)]
EXTREMES = st.one_of(st.sampled_from(EXTREME_FLOATS), st.sampled_from(EXTREME_INTS),
                     st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70))
# sizes: a valid large value is a long run, not a wrong one (a million requests is a documented
# use); they are drawn small, or far out of range
SIZES = st.one_of(st.sampled_from(EXTREME_INTS + [float("nan"), float("inf"), -0.5, 1.5]), st.integers(1, 64),
                  st.integers(-(2**70), 0), st.integers(10**9 + 1, 2**70), st.floats(-1e300, 64))
SIZE_FIELDS = list(INT_FIELDS) + ["workload.input_len.mean", "workload.input_len.std", "workload.output_len.high"]
NUMERIC_FIELDS = FLOAT_FIELDS + SIZE_FIELDS + [
    "costs.gpu.prefill.base", "costs.gpu.decode.per_token", "costs.cpu.recv.per_req", "costs.cpu.process.base"]
FIELD_VALUES = st.one_of(st.tuples(st.sampled_from([f for f in NUMERIC_FIELDS if f not in SIZE_FIELDS]), EXTREMES),
                         st.tuples(st.sampled_from(SIZE_FIELDS), SIZES))
LOOP_SETS = [["overlap", "normal"], ["overlap_mlx", "normal"], ["thread_overlap"], ["overlap"]]


def _extreme_scenario(patches: dict, settings_: list, length_dists: bool) -> dict:
    raw = _patch(BASE, "server.settings", settings_)
    if length_dists:
        raw = _patch(raw, "workload.input_len", {"dist": "normal", "mean": 16, "std": 4})
        raw = _patch(raw, "workload.output_len", {"dist": "uniform", "low": 1, "high": 6})
    for path, value in patches.items():
        parent = path.rpartition(".")[0]
        node = raw
        for k in parent.split(".") if parent else []:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict) or not parent:  # a key inside a plain number (an int length) is left out
            raw = _patch(raw, path, value)
    return raw


def _check_sane(res) -> None:
    s = res.summary()
    for key, v in s.items():
        if isinstance(v, float):
            assert v != float("inf") and v != float("-inf"), (key, v)
    measured = int((~res.requests["warmup"].astype(bool)).sum())
    assert s["completed"] + s["failed"] == measured
    assert s["failed"] == sum(s[k] for k in ("cut_off", "could_not_connect", "aborted", "too_long"))
    if s["completed"]:
        assert 0 < s["duration_s"] < float("inf") and s["output_throughput"] > 0
    else:  # e.g. every drawn prompt too long for the pool: `run` says so and exits 3
        assert run_failures({res.setting: s})
    times = res.steps[["recv_start", "launch_end", "forward_start", "forward_end", "process_end"]].to_numpy(float)
    assert (times == times).all() and (abs(times) < float("inf")).all()
    assert (res.steps["forward_end"] > res.steps["forward_start"]).all()  # a forward takes time


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(FIELD_VALUES, max_size=4), st.sampled_from(LOOP_SETS), st.booleans())
def test_extreme_numbers_give_a_clean_error_or_a_sane_result(patches, loops, length_dists):
    raw = _extreme_scenario(dict(patches), loops, length_dists)
    try:
        scenario = sim.load_scenario(raw)
    except UserInputError as err:
        assert "\n" not in str(err) and err.field, str(err)  # one line, naming the field
        return
    with deadline(HANG_S):
        for setting in scenario.server.settings:
            _check_sane(sim.simulate(scenario, setting))


TRACE_VALUES = st.one_of(st.sampled_from(EXTREME_FLOATS + EXTREME_INTS + [True, None, "1", [], {}]),
                         st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.fixed_dictionaries({}, optional={k: TRACE_VALUES for k in ("arrival_s", "input_len", "output_len",
                                                                              "cached_len")}), max_size=4))
def test_extreme_trace_lines_give_a_clean_error_or_finite_requests(tmp_path, lines):
    from sim.model.workload import read_trace

    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    try:
        specs = read_trace(path)
    except UserInputError as err:
        assert "\n" not in str(err) and str(path) in str(err)
        return
    assert len(specs) == len(lines) > 0
    assert ((specs.arrival_s >= 0) & (specs.arrival_s < float("inf"))).all()
    assert (specs.input_len >= 1).all() and (specs.output_len >= 1).all()
    assert ((specs.cached_len >= 0) & (specs.cached_len < specs.input_len)).all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["forward.decode", "forward.extend", "recv", "launch.decode", "process.extend"]),
       st.integers(0, 2), st.one_of(st.sampled_from(EXTREME_FLOATS), st.floats(allow_nan=True, allow_infinity=True)))
def test_extreme_profile_times_give_a_clean_error_or_finite_costs(tmp_path, curve, index, value):
    from sim.model.costs import DECODE, EXTEND
    from sim.model.profile_costs import ProfileCostModel

    prof = json.loads((Path(__file__).parents[1] / "scenarios/profiles/cpu-torch-small.json").read_text())
    values = prof["curves"][curve]["values_s"]
    if isinstance(values[0], list):
        values[index][0] = value
    else:
        values[index] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    try:
        model = ProfileCostModel.from_file(path, gpu_scale=1e6, cpu_scale=1e6)
    except UserInputError as err:
        assert "\n" not in str(err) and str(path) in str(err) and curve in err.field
        return
    for kind in (EXTEND, DECODE):
        for n in (1, 8, 10_000):
            costs = [model.forward_s(kind, n, n, 64 * n), model.schedule_s(kind, n, n, 64 * n),
                     model.launch_s(kind, n, n, 64 * n), model.process_s(kind, n, n, 64 * n), model.recv_s(n)]
            assert all(0 <= c < float("inf") for c in costs), costs


# --- a real process: what a user sees (few: each costs a second of imports) ---------------------------------------------

@pytest.mark.parametrize("kind", ["nan-arrival-hang", "server-dies"])
def test_in_a_real_process(tmp_path, kind):
    import subprocess
    import sys

    ctx = Ctx(tmp_path, tmp_path)
    if kind == "nan-arrival-hang":  # looped forever in the idle wait before
        scen, _trace = ctx.trace_scenario([TRACE_LINE, {**TRACE_LINE, "arrival_s": float("nan")}])
        status, words = 2, ["line 2: arrival_s", "finite"]
    else:
        scen, status, words = ctx.scenario(base=KV_DEATH), 3, ["overlap: the server died", "exit status 3"]
    proc = subprocess.run([sys.executable, "-m", "sim.cli", "run", scen, "--out", ctx.out, "--no-plots"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=HANG_S)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == status and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    assert all(w in lines[0] for w in words)


@pytest.mark.parametrize("model_built", [False, True])
def test_an_engine_that_fails_is_one_line_naming_its_log_and_exit_4(tmp_path, monkeypatch, capsys, model_built):
    """An engine environment that imports but whose modules fail (a broken install): no
    traceback; the line names the module and its log; a relative --work means this folder. The
    repository's model folder is this test's own (nothing written into the checkout)."""
    import calibrate.real.environment as environment

    fake = tmp_path / "python"
    fake.write_text('#!/bin/bash\nif [ "$1" = "-c" ]; then echo "0.5.23"; exit 0; fi\n'
                    'echo "fake python: cannot run $*" >&2; exit 1\n')
    fake.chmod(0o755)
    monkeypatch.setattr(environment, "REPO", tmp_path)
    if model_built:  # the tiny model is there: the first module to fail is the calibration's own
        model = tmp_path / ".venvs" / "models" / "tiny-llama"
        model.mkdir(parents=True)
        (model / "config.json").write_text("{}")
        (model / "model.safetensors").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    code = main(["conform", "--engine", "sglang", "--engine-python", str(fake), "--work", "w"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("overlap-sim: error:")]
    assert code == 4 and len(errors) == 1 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == errors[0]  # after the progress lines, the one error
    assert "failed in the sglang environment" in errors[0] and "cannot run" in errors[0]
    log = Path(errors[0].rsplit("the whole log: ", 1)[1])
    assert (log if log.is_absolute() else tmp_path / log).is_file()  # the log is where the line says
    if model_built:
        assert str(log).startswith("w/")  # a relative --work: this folder's, in the engine's module too
