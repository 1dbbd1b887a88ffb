"""The commands shown in README.md and docs/*.md stay true.

Every command of a ```bash block, and every ``$ ``-prefixed line of another block, is treated
by an explicit rule (:func:`classify`); one that fits no rule fails, so a new kind of command
in the docs has to be classified here.

- RUN: cheap ``overlap-sim`` subcommands run for real, in the order a page shows them, in a
  temporary workspace whose ``scenarios/`` and ``docs/`` are the repository's. Shrunk without
  changing what they check (:func:`cheapen`): ``run`` and ``ask`` lose ``--plots``; ``sweep`` runs in
  process, without plots, with at most 2 repeats and shorter requests; ``calibrate
  --from-trace`` reads a recorded trace (``tests/`` is in the workspace too). Table rows and messages
  shown under a ``$`` line must be in that command's output; the README's quickstart table
  must be exactly what the quickstart prints at ``COLUMNS=100``.
- CHECK: the expensive ones (:data:`EXPENSIVE`, each with its reason) are parsed by
  ``sim.cli.build_parser()`` (subcommand and every flag), and the scenario they name must exist.
- Other programs (pip, python, jupyter, jupytext, dask, curl): what they name must exist (an extra
  in pyproject.toml, a benchmark script and each flag it is given, a notebook, a test file, the
  fields of SGLang's profile request).

Files a page's commands need but cannot make cheaply are stood in (:data:`STAND_INS`): the
profile a GPU calibration would write is the shipped H200 profile, the trace of the docs'
torch.profiler example a synthetic trace of the same shape. A ```yaml block whose first
line is ``# NAME.yaml`` is written to NAME.yaml in the workspace, and every ```yaml block with a
``name`` must validate as a scenario.

Also checked: every docs page is linked from the README (at most 300 lines); relative links,
images and #anchors resolve; repository paths in backquotes exist; docs/scenarios.md names
every scenario key.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# overlap-sim subcommands that run for real (made cheap by cheapen())
RUN_SUBCOMMANDS = {"run", "sweep", "trace", "gaps", "log", "plots", "advise", "transfer", "ask"}

# overlap-sim commands that are parsed, not run: (pattern on the command line, reason)
EXPENSIVE = [
    (r"^overlap-sim calibrate\b", "times a real model: seconds to minutes, CUDA or Metal for some"),
    (r"^overlap-sim validate\b", "runs the ground-truth harness: minutes"),
    (r"^overlap-sim conform\b", "runs a real engine's scheduler (its own environment, minutes)"),
    (r"^overlap-sim compose\b", "joins the files two calibrations write (tests/test_compose.py runs it)"),
    (r"--executor dask", "needs a Dask cluster (tests/test_sweep.py runs the executor on a LocalCluster)"),
]

# other programs whose commands are checked, not run: (pattern, reason)
NOT_RUN = [
    (r"^pip install\b", "installs packages: the extra it names must exist"),
    (r"^python -m pytest\b", "the test suite itself: the test files it names must exist"),
    (r"^python benchmarks/", "benchmarks run by hand (minutes): the script and its flags must exist"),
    (r"^jupyter (lab|execute)\b", "opens or runs a notebook: the notebook must exist"),
    (r"^jupytext --sync\b", "rewrites the notebook pair: the notebook must exist"),
    (r"^dask (scheduler|worker)\b", "starts a Dask cluster"),
    (r"^(bash )?realengines/\S+\.sh\b", "builds a real engine's environment (minutes, GBs): the script must exist"),
    (r"^python (-m realengines\.|realengines/)", "drives a real engine (SGLang, vLLM): the module must exist"),
    (r"^curl .*/(start|stop)_profile\b", "asks the reader's running SGLang server to profile: the body must be "
                                          "a ProfileReq of SGLang 0.5.23"),
]
# the fields of SGLang 0.5.23's ProfileReq (srt/managers/io_struct.py), what /start_profile accepts
PROFILE_REQ_FIELDS = {"output_dir", "start_step", "num_steps", "activities", "profile_by_stage", "with_stack",
                      "record_shapes", "profile_id", "merge_profiles", "profile_prefix", "profile_stages",
                      "detailed_annotations"}


def _bad_profile(path: Path) -> None:
    """A profile from a newer schema (the error example of docs/calibration.md)."""
    data = json.loads((ROOT / "scenarios/profiles/h200-llama-3.2-1b.json").read_text())
    data["schema_version"] = 2
    path.write_text(json.dumps(data))


def _decode_loop_trace(path: Path) -> None:
    """What the docs' torch.profiler example writes, in shape: 50 CPU spans of 'decode_forward'
    (0.35 ms) 1.09 ms apart. (A real profiler run costs seconds; tests/test_real_trace.py does one.)"""
    events = [{"ph": "X", "cat": "user_annotation", "name": "decode_forward", "pid": 1, "tid": 1,
               "ts": 1000.0 + i * 1440.0, "dur": 350.0} for i in range(50)]
    path.write_text(json.dumps({"traceEvents": events}))


# files the docs' commands read that an expensive command (or the reader's own code) would make
STAND_INS = {
    # the server's own /start_profile windows and its log: the recorded own-server fixture
    "tmp/sglang-profile/w1-TP-0.trace.json.gz": ROOT / "tests/data/sglang/own-server/b1-in128-TP-0.trace.json.gz",
    "tmp/sglang-profile/w2-TP-0.trace.json.gz": ROOT / "tests/data/sglang/own-server/b4-in128-TP-0.trace.json.gz",
    "server.log": ROOT / "tests/data/sglang/own-server/recipe.server.log",
    "decode_loop.json": _decode_loop_trace,                                # the torch.profiler example
    "my-card.json": ROOT / "scenarios/profiles/h200-llama-3.2-1b.json",  # a GPU calibration's profile
    "tmp/p.json": ROOT / "scenarios/profiles/cpu-torch-small.json",       # calibrate --device cpu --quick
    "tmp/bad.json": _bad_profile,
}


@dataclass
class Command:
    page: str
    line: int
    text: str                      # as shown (continuations joined, comment dropped)
    env: dict
    argv: list
    shown_output: list = field(default_factory=list)   # lines shown under a `$` line


# ---------------------------------------------------------------------------- extraction

FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


def blocks(path: Path):
    """(language, lines, first line number) of each fenced block."""
    lang, body, start, indent = None, [], 0, ""
    for no, line in enumerate(path.read_text().splitlines(), 1):
        m = FENCE.match(line)
        if lang is None and m:
            lang, body, start, indent = m.group(2), [], no + 1, m.group(1)
        elif lang is not None and line.strip() == "```":
            yield lang, body, start
            lang = None
        elif lang is not None:
            body.append(line[len(indent):] if line.startswith(indent) else line)


def split_command(text: str, page: str, line: int) -> list[Command]:
    """One shell line (continuations joined) into commands: `&&` splits, leading NAME=VALUE is env."""
    tokens = shlex.split(text, comments=True)
    out, current = [], []
    for tok in tokens + ["&&"]:
        if tok == "&&":
            if current:
                env = {}
                while current and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", current[0]):
                    k, _, v = current.pop(0).partition("=")
                    env[k] = v
                shown = " ".join(shlex.quote(t) for t in current)
                out.append(Command(page, line, shown, env, current))
            current = []
        else:
            current.append(tok)
    return out


def page_commands(path: Path) -> list[Command]:
    page = str(path.relative_to(ROOT))
    commands = []
    for lang, body, start in blocks(path):
        if lang == "bash":
            pending, first = "", start
            for i, line in enumerate(body):
                if not pending:
                    first = start + i
                if line.rstrip().endswith("\\"):
                    pending += line.rstrip()[:-1] + " "
                    continue
                pending += line
                if pending.strip():
                    commands.extend(split_command(pending, page, first))
                pending = ""
        elif lang in ("", "text", "console"):
            current = None
            for i, line in enumerate(body):
                if line.startswith("$ "):
                    current = split_command(line[2:], page, start + i)
                    commands.extend(current)
                elif current:
                    current[-1].shown_output.append(line)
    return commands


def yaml_scenarios(path: Path) -> list[tuple[int, str | None, dict]]:
    """(line, file name from a `# NAME.yaml` first line or None, data) of each yaml block with a name."""
    found = []
    for lang, body, start in blocks(path):
        if lang != "yaml" or not body:
            continue
        data = yaml.safe_load("\n".join(body))
        if isinstance(data, dict) and "name" in data:
            m = re.match(r"#\s*(\S+\.yaml)\b", body[0].strip())
            found.append((start, m.group(1) if m else None, data))
    return found


ALL_COMMANDS = [c for p in PAGES for c in page_commands(p)]


# ---------------------------------------------------------------------------- rules

def classify(cmd: Command) -> tuple[str, str]:
    """('run' | 'check' | 'other', reason); raises AssertionError for a command no rule covers."""
    text = " ".join(cmd.argv)
    if cmd.argv[0] == "overlap-sim":
        if cmd.argv[1:2] == ["calibrate"] and "--from-trace" in cmd.argv:
            return "run", "reads a recorded trace: about a second"
        for pattern, reason in EXPENSIVE:
            if re.search(pattern, text):
                return "check", reason
        if len(cmd.argv) > 1 and cmd.argv[1] in RUN_SUBCOMMANDS:
            return "run", "cheap"
        if cmd.argv[1:] in (["--help"], ["-h"]) or cmd.argv[-1] in ("--help", "-h"):
            return "run", "help"
    for pattern, reason in NOT_RUN:
        if re.search(pattern, text):
            return "other", reason
    raise AssertionError(f"{cmd.page}:{cmd.line}: no rule for `{cmd.text}`: classify it in "
                         "tests/test_docs_commands.py (RUN_SUBCOMMANDS, EXPENSIVE or NOT_RUN)")


def test_every_command_is_classified():
    assert ALL_COMMANDS, "no commands found in the docs"
    for cmd in ALL_COMMANDS:
        classify(cmd)


def test_docs_show_the_commands_that_matter():
    """The README's two commands come first; the kinds of command the docs promise are there."""
    readme = [c.text for c in page_commands(ROOT / "README.md")]
    assert readme[:4] == ["pip install -e .", "overlap-sim run scenarios/quickstart.yaml",
                          "pip install -e '.[test]'", "python -m pytest"], readme[:4]
    kinds = {classify(c)[0] for c in ALL_COMMANDS}
    assert kinds == {"run", "check", "other"}
    subcommands = {c.argv[1] for c in ALL_COMMANDS if c.argv[0] == "overlap-sim" and len(c.argv) > 1}
    assert RUN_SUBCOMMANDS | {"calibrate", "validate"} <= subcommands, subcommands


# ---------------------------------------------------------------------------- checks only

def _parse(argv: list[str]):
    from sim.cli import build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"`overlap-sim {' '.join(argv)}` does not parse: {err.getvalue().strip()}") from exc


def _extras() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def check_other(cmd: Command) -> None:
    argv = cmd.argv
    where = f"{cmd.page}:{cmd.line}: `{cmd.text}`"
    if argv[:2] == ["pip", "install"]:
        for arg in argv[2:]:
            m = re.fullmatch(r"(?:\.|overlap-sim)\[([\w,-]+)\]", arg)
            if m:
                for extra in m.group(1).split(","):
                    assert extra in _extras(), f"{where}: no extra {extra!r} in pyproject.toml"
            else:
                assert arg in ("-e", "."), f"{where}: installs {arg!r}, not this package"
    elif argv[:3] == ["python", "-m", "pytest"]:
        for arg in argv[3:]:
            if not arg.startswith("-"):
                assert (ROOT / arg.split("::")[0]).exists(), f"{where}: no {arg}"
    elif argv[0] == "python" and argv[1].startswith("benchmarks/"):
        script = ROOT / argv[1]
        assert script.is_file(), f"{where}: no {argv[1]}"
        source = script.read_text()
        for flag in (a for a in argv[2:] if a.startswith("--")):
            assert f'"{flag}"' in source, f"{where}: {argv[1]} has no flag {flag}"
    elif argv[0] in ("jupyter", "jupytext"):
        notebooks = [a for a in argv[1:] if a.endswith((".ipynb", ".py"))]
        assert notebooks, where
        for nb in notebooks:
            assert (ROOT / nb).is_file(), f"{where}: no {nb}"
    elif argv[0] == "dask":
        assert argv[1] in ("scheduler", "worker"), where
    elif argv[0] == "curl":
        body = json.loads(argv[argv.index("-d") + 1]) if "-d" in argv else {}
        assert set(body) <= PROFILE_REQ_FIELDS, f"{where}: not ProfileReq fields: {set(body) - PROFILE_REQ_FIELDS}"
    elif "realengines" in " ".join(argv[:3]):
        target = next(a for a in argv[:3] if "realengines" in a)
        path = ROOT / (target.replace(".", "/") + ".py" if argv[:2] == ["python", "-m"] else target)
        assert path.is_file() or (path.with_suffix("") / "__main__.py").is_file(), f"{where}: no {target}"
    else:  # pragma: no cover - classify() admits nothing else
        raise AssertionError(where)


def _existing_or_stand_in(name: str, page_files: set[str]) -> bool:
    rel = name.removeprefix("/")
    return (ROOT / name).exists() or name in page_files or rel in STAND_INS or name in STAND_INS


@pytest.mark.parametrize("cmd", [c for c in ALL_COMMANDS if classify(c)[0] != "run"],
                         ids=lambda c: f"{c.page}:{c.line}")
def test_expensive_and_other_commands_are_checked(cmd):
    kind, _reason = classify(cmd)
    if kind == "other":
        check_other(cmd)
        return
    args = _parse(cmd.argv[1:])
    files = {name for _line, name, _data in yaml_scenarios(ROOT / cmd.page) if name}
    scenario = getattr(args, "scenario", None)
    if scenario:
        assert _existing_or_stand_in(scenario, files), f"{cmd.page}:{cmd.line}: no scenario {scenario}"
    for override in getattr(args, "overrides", []) or []:
        key, _, value = override.partition("=")
        if key == "costs.profile" and value not in ("null", ""):
            assert _existing_or_stand_in(value, files), f"{cmd.page}:{cmd.line}: no profile {value}"


# ---------------------------------------------------------------------------- run for real

def cheapen(argv: list[str]) -> list[str]:
    """The same subcommand, flags and inputs, at a fraction of the cost."""
    sub = argv[1]
    argv = list(argv)
    if sub in ("run", "ask"):  # no plots (the default since 5 December 2026)
        argv = [a for a in argv if a != "--plots"]
    if sub == "sweep":
        if "--repeats" in argv:
            i = argv.index("--repeats")
            argv[i + 1] = str(min(int(argv[i + 1]), 2))
        if "--workers" in argv:
            i = argv.index("--workers")
            del argv[i:i + 2]
        argv += ["--workers", "1", "--no-plots",
                 "--set", "workload.num_requests=16", "--set", "workload.output_len=32"]
    return argv


def _in_workspace(arg: str, ws: Path) -> str:
    """Absolute /tmp paths of the docs go under the workspace."""
    if arg.startswith("/tmp/"):
        return str(ws / arg[1:])
    m = re.match(r"^(costs\.profile=)(/tmp/.*)$", arg)
    return m.group(1) + str(ws / m.group(2)[1:]) if m else arg


def _workspace(tmp_path: Path, page: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ("scenarios", "docs", "notebooks", "tests"):  # tests: its recorded traces
        (ws / name).symlink_to(ROOT / name)
    (ws / "tmp").mkdir()
    for name, source in STAND_INS.items():
        target = ws / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if callable(source):
            source(target)
        else:
            shutil.copy(source, target)
    for _line, name, data in yaml_scenarios(page):
        if name:
            (ws / name).write_text(yaml.safe_dump(data))
    return ws


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("│").split("│")]


def _check_shown_output(cmd: Command, output: str, ws: Path) -> None:
    """Every table row and message shown under a `$` line is in the command's output."""
    where = f"{cmd.page}:{cmd.line}: `{cmd.text}`"
    output = output.replace(str(ws / "tmp"), "/tmp").replace(str(ws) + "/", "")
    rows = [_cells(line) for line in output.splitlines() if line.startswith("│")]
    for line in cmd.shown_output:
        if not line.startswith("│"):
            continue
        shown = _cells(line)
        if shown[0] and not any(v for v in shown[1:]):
            continue  # the second line of a wrapped label
        assert any(r[0].startswith(shown[0]) and r[1:] == shown[1:] for r in rows), \
            f"{where}: shown row not in the output:\n{line}\noutput:\n{output}"
    flat = " ".join(output.split())
    text, paragraphs = [], []
    for line in cmd.shown_output + [""]:
        if line.startswith(("│", "┃", "┏", "┡", "└")) or not line.strip():
            if text:
                paragraphs.append(" ".join(text))
            text = []
        else:
            text.append(line.strip())
    for para in paragraphs:
        for fragment in para.split("..."):
            fragment = " ".join(fragment.split())
            if fragment:
                assert fragment in flat, f"{where}: shown text not in the output:\n{fragment}\noutput:\n{output}"


def _run(cmd: Command, ws: Path, monkeypatch) -> str:
    from sim.cli import main

    argv = [_in_workspace(a, ws) for a in cheapen(cmd.argv)]
    out, err = io.StringIO(), io.StringIO()
    with monkeypatch.context() as m:
        m.setenv("COLUMNS", cmd.env.get("COLUMNS", "200"))
        for k, v in cmd.env.items():
            m.setenv(k, v)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv[1:])
            except SystemExit as exc:  # --help
                rc = exc.code
    expect_error = any(line.startswith("overlap-sim: error:") for line in cmd.shown_output)
    died = any("server_died" in line or "failed: " in line and "/ 0 /" not in line for line in cmd.shown_output)
    if rc == 3 and not expect_error:  # documented: a run in which a setting's server died exits 3
        assert died or "server died" in err.getvalue() or "completed" in err.getvalue(), \
            f"{cmd.page}:{cmd.line}: `{cmd.text}` exited 3\n{err.getvalue()}"
        rc = 0
    assert (rc != 0) == expect_error, \
        f"{cmd.page}:{cmd.line}: `{cmd.text}` exited {rc}\n{out.getvalue()}\n{err.getvalue()}"
    return out.getvalue() + err.getvalue()


@pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")  # ratio of a 0 gap, shrunk sweeps
@pytest.mark.parametrize("page", [p for p in PAGES if any(classify(c)[0] == "run" for c in page_commands(p))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_cheap_commands_run(page, tmp_path, monkeypatch):
    ws = _workspace(tmp_path, page)
    monkeypatch.chdir(ws)
    for cmd in page_commands(page):
        if classify(cmd)[0] != "run":
            continue
        output = _run(cmd, ws, monkeypatch)
        if cmd.shown_output:
            _check_shown_output(cmd, output, ws)


def test_readme_quickstart_table_is_what_the_quickstart_prints(tmp_path, monkeypatch):
    from sim.cli import main

    lines = (ROOT / "README.md").read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if "quickstart (seed 0, cuda)" in l)
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("results written to"))
    shown = lines[start:end]
    monkeypatch.setenv("COLUMNS", "100")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["run", str(ROOT / "scenarios/quickstart.yaml"), "--out", str(tmp_path), "--no-plots"]) == 0
    printed = out.getvalue().splitlines()
    assert [l.rstrip() for l in printed[:len(shown)]] == [l.rstrip() for l in shown]


@pytest.mark.parametrize("page", [p for p in PAGES if yaml_scenarios(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_scenarios_in_the_docs_validate(page, tmp_path):
    from sim.scenario import load_scenario

    for line, name, data in yaml_scenarios(page):
        path = tmp_path / (name or "scenario.yaml")
        path.write_text(yaml.safe_dump(data))
        overrides = []
        profile = (data.get("costs") or {}).get("profile")
        if profile and not (tmp_path / profile).exists():
            overrides = ["costs.profile=null"]  # the reader's own profile
        load_scenario(path, overrides)


def test_every_docs_page_is_reachable_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)(?:#[\w-]+)?\)", readme))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"not linked from the README: {sorted(pages - linked)}"
    assert len(readme.splitlines()) <= 300


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}


def test_relative_links_images_and_anchors_resolve():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path) if path else page
            if linked.resolve() == (ROOT / "docs/real-engines.md") and not linked.exists():
                continue  # written in parallel, by another hand
            assert linked.exists(), f"{page.relative_to(ROOT)}: broken link {target}"
            if anchor:
                assert anchor in _anchors(linked), f"{page.relative_to(ROOT)}: no heading for {target}"


def _scenario_keys():
    """Every key a scenario file takes, as dotted paths (cost terms and the GIL block as one key)."""
    from typing import Annotated, Union, get_args, get_origin

    from pydantic import BaseModel

    from sim.model.schema import CostTerm, GilCosts
    from sim.scenario import Scenario

    def sections(ann) -> list:
        """The models a field holds: itself, or each engine's section of a union (server)."""
        if isinstance(ann, type) and issubclass(ann, BaseModel) and ann not in (CostTerm, GilCosts):
            return [ann]
        members = [get_args(a)[0] if get_origin(a) is Annotated else a for a in get_args(ann)]
        return [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)] if get_origin(ann) is Union else []

    def walk(model, prefix):
        for name, f in model.model_fields.items():
            if f.exclude:
                continue
            found = sections(f.annotation)
            for section in found:
                yield from walk(section, f"{prefix}{name}.")
            if not found:
                yield f"{prefix}{name}"
    return list(dict.fromkeys(walk(Scenario, "")))


def test_every_scenario_key_is_in_the_reference():
    """docs/scenarios.md's table names every key: `a.b` itself, or `b` in a row that starts with `a.`."""
    rows = [l for l in (ROOT / "docs/scenarios.md").read_text().splitlines() if l.startswith("| `")]
    missing = []
    for key in _scenario_keys():
        section, _, leaf = key.rpartition(".")
        if not any(f"`{key}`" in r or (section and r.split("|")[1].strip().startswith(f"`{section}.")
                                       and f"`{leaf}`" in r.split("|")[1]) for r in rows):
            missing.append(key)
    assert not missing, f"scenario keys not in docs/scenarios.md: {missing}"


REPO_FOLDERS = ("sim/", "calibrate/", "tests/", "benchmarks/", "scenarios/", "notebooks/", "docs/", "realengines/")


def test_repository_paths_named_in_the_docs_exist():
    for page in PAGES:
        for name in re.findall(r"`([\w./-]+)`", page.read_text()):
            if name.startswith(REPO_FOLDERS) and "*" not in name and "<" not in name:
                assert (ROOT / name).exists(), f"{page.relative_to(ROOT)}: no {name}"
