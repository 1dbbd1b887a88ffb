"""Start-up cost of ``overlap-sim run`` on a 10-request scenario (run by hand; see docs/speed.md).

Runs, interleaved and repeated, a bare ``python -c pass`` and ``overlap-sim run`` of the
quickstart cut to 10 requests in three modes (``--tables none --no-plots``, ``--no-plots``
with tables, the default since 5 December 2026, and tables with plots, ``--plots``; a tree from
before, whose default draws them, without the flag), each in a fresh process, and reports the CPU time
(user + system, seconds, from ``resource.getrusage(RUSAGE_CHILDREN)``) of each, and of each run
beyond the bare interpreter: median and spread (min-max) over the repeats. It also lists which
heavy libraries each mode imported (``-X importtime``).

    python benchmarks/startup.py                          # 15 repeats of each
    python benchmarks/startup.py --repeats 30 --against /tmp/overlap-sim-old   # and an older tree

``--against DIR`` runs the same commands from another checkout of the project (e.g. ``git
archive <commit> | tar -x -C DIR``), interleaved with this one, and prints the ratio of their
costs beyond the bare interpreter. It also times a process that only imports the third-party
modules a streamed run imports (found with ``-X importtime``): the libraries' share, which no
change to this project's code removes. CPython writes no ``.pyc`` files when
``PYTHONDONTWRITEBYTECODE`` is set; every run then compiles the project's modules again
(about 0.1 s): the script reports whether it is set.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO_ARGS = ["scenarios/quickstart.yaml", "--set", "workload.num_requests=10", "--set", "workload.warmup_requests=2"]
MODES = {
    "run --tables none --no-plots": ["--tables", "none", "--no-plots"],
    "run --no-plots": ["--no-plots"],
    "run --plots (tables + plots)": ["--plots"],
}


def takes_plots_flag(tree: Path) -> bool:
    """Whether ``tree``'s ``run`` has ``--plots``: a tree from before 5 December 2026 has not (its
    default draws the plots)."""
    return "--plots" in (tree / "sim" / "commands.py").read_text()


def mode_args(tree: Path, mode: str) -> list[str]:
    """The flags of ``mode`` as ``tree``'s command line takes them (:func:`takes_plots_flag`)."""
    extra = MODES[mode]
    return extra if takes_plots_flag(tree) else [a for a in extra if a != "--plots"]
HEAVY = ("pandas", "matplotlib", "scipy", "pyarrow", "pydantic", "rich", "numpy", "simpy", "yaml", "ddsketch")


def child_cpu_s(cmd: list[str], cwd: Path) -> float:
    """CPU seconds (user + system) that running ``cmd`` in ``cwd`` took, output discarded.

    Raises:
        RuntimeError: the command failed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(cwd), "COLUMNS": "100"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 3):
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run_cmd(tree: Path, out: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "sim.cli", "run", *SCENARIO_ARGS, "--out", str(out), *extra]


def heavy_imports(tree: Path, out: Path, extra: list[str]) -> list[str]:
    """The libraries of :data:`HEAVY` that a run in ``tree`` imports."""
    cmd = [sys.executable, "-X", "importtime", *run_cmd(tree, out, extra)[1:]]
    proc = subprocess.run(cmd, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(tree)})
    names = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    return [h for h in HEAVY if h in names]


def third_party_modules(tree: Path, out: Path) -> list[str]:
    """Every module outside the standard library and this project that a streamed run
    (``--tables none --no-plots``) in ``tree`` imports, in the order ``-X importtime`` lists
    them: what a process importing only these pays is the libraries' share of start-up."""
    def imported(args: list[str]) -> list[str]:
        proc = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=tree, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(tree)})
        return [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:") and "self [us]" not in line]

    at_start = set(imported(["-c", "pass"]))  # what site imports (.pth files) is in the bare run too
    names = imported(run_cmd(tree, out, MODES["run --tables none --no-plots"])[1:])
    return [n for n in names if n not in at_start and n.split(".")[0] not in sys.stdlib_module_names
            and n.split(".")[0] not in ("sim", "calibrate")]


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.3f} s ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--against", type=Path, default=None, metavar="DIR", help="another checkout to compare with")
    args = ap.parse_args()
    trees = {"this": ROOT} if args.against is None else {"this": ROOT, "against": args.against.resolve()}
    print(f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}; {args.repeats} repeats, "
          "interleaved; CPU seconds (user + system): median (min-max)")
    cpu: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results"
        libraries = third_party_modules(ROOT, out)
        # numpy loads with one BLAS thread, as the command line has it load (sim/__init__.py)
        # (-X importtime also lists optional imports that failed: those fail here too)
        import_only = [sys.executable, "-c", "import importlib, os\nos.environ['OPENBLAS_NUM_THREADS'] = '1'\n"
                       f"for m in {libraries!r}:\n try: importlib.import_module(m)\n except ImportError: pass"]
        for _ in range(args.repeats):
            cpu.setdefault(("", "python -c pass"), []).append(child_cpu_s([sys.executable, "-c", "pass"], ROOT))
            cpu.setdefault(("", "libraries"), []).append(child_cpu_s(import_only, ROOT))
            for tree_name, tree in trees.items():
                for mode in MODES:
                    cpu.setdefault((tree_name, mode), []).append(
                        child_cpu_s(run_cmd(tree, out, mode_args(tree, mode)), tree))
        bare = cpu[("", "python -c pass")]
        print(f"{'python -c pass':<44} {spread(bare)}")
        # (named: the importable top-level packages; a private module such as _sysconfigdata or
        # an optional import that failed is still timed, not named)
        tops = sorted({t for t in (m.split(".")[0] for m in libraries)
                       if not t.startswith("_") and importlib.util.find_spec(t) is not None})
        print(f"{'the libraries a streamed run imports, alone':<44} {spread(cpu[('', 'libraries')])}; beyond bare python "
              f"{spread([v - b for v, b in zip(cpu[('', 'libraries')], bare)])} ({len(libraries)} modules of "
              f"{', '.join(tops)})")
        beyond: dict[tuple[str, str], list[float]] = {}
        for (tree_name, mode), values in cpu.items():
            if not tree_name:
                continue
            beyond[(tree_name, mode)] = [v - b for v, b in zip(values, bare)]
            imports = ", ".join(heavy_imports(trees[tree_name], out, mode_args(trees[tree_name], mode)))
            print(f"{tree_name + ': ' + mode:<44} {spread(values)}; beyond bare python "
                  f"{spread(beyond[(tree_name, mode)])}; imports {imports}")
        if args.against is not None:
            for mode in MODES:
                ratios = [a / t for a, t in zip(beyond[("against", mode)], beyond[("this", mode)]) if t > 0]
                print(f"against / this, {mode:<32} {statistics.median(ratios):5.2f}x "
                      f"({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
