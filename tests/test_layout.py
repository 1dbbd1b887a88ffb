"""The package layout: folders that show the architecture, imports that run one way.

Every module of ``sim`` and ``calibrate`` is parsed (imports inside functions included) and its
imports of the project's own packages are checked: sim imports no other package of the project
(calibrate depends on sim, never the reverse); sim's packages import only the ones the layering
in ``sim/__init__.py`` names; no two packages import each other, directly or around a cycle;
no folder holds more than :data:`MAX_MODULES` modules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("sim", "calibrate")
MAX_MODULES = 12  # per folder, __init__.py not counted

# sim's layers (as in sim/__init__.py's docstring) -> the layers each may import besides itself
SIM_LAYERS = {
    "base": {"sim.errors", "sim.atomic", "sim.commands", "sim.jsonio"},
    "model": {"sim.model"},
    "trace": {"sim.trace"},
    "engines": {"sim.engines"},  # sim.engines and each sim.engines.<engine>
    "output": {"sim.output"},
    "compose": {"sim.scenario", "sim.scenario_errors", "sim.simulate"},
    "whatif": {"sim.whatif"},
    "cli": {"sim.cli", "sim"},
}
MAY_IMPORT = {
    "base": set(),
    "model": {"base"},
    "trace": {"model", "base"},
    "engines": {"trace", "model", "base"},
    "output": {"trace", "model", "base"},
    "compose": {"engines", "trace", "model", "base"},
    "whatif": {"compose", "output", "engines", "trace", "model", "base"},
    "cli": {"whatif", "compose", "output", "engines", "trace", "model", "base"},
}


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the two trees (a package by its ``__init__.py``)."""
    out = {}
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()
# the project's own top-level packages (calibrate, tests, and any added later)
FIRST_PARTY = {d.name for d in ROOT.iterdir() if (d / "__init__.py").is_file()}


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import of a first-party module in ``path``, wherever in
    the file it is (module level, functions, ``try`` blocks). ``from a import b`` counts as an
    import of ``a.b`` when that is a module, else of ``a``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        found += [(t, node.lineno) for t in targets if t.split(".")[0] in FIRST_PARTY]
    return found


IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def _unit(module: str) -> str:
    """The node of the package graph a module belongs to: its sub-package (one per engine under
    ``sim.engines``), or the module itself at the top of a tree (``sim.cli``, ``calibrate.fit``)."""
    parts = module.split(".")
    return ".".join(parts[:3] if parts[:2] == ["sim", "engines"] else parts[:2])


def _layer(unit: str) -> str:
    for layer, units in SIM_LAYERS.items():
        if unit in units or (layer == "engines" and unit.startswith("sim.engines.")):
            return layer
    raise AssertionError(f"{unit} is in no layer of SIM_LAYERS: add it (and to sim/__init__.py's docstring)")


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


def test_sim_imports_no_other_package_of_the_project():
    bad = [f"{_where(m, line)} imports {t}" for m, imps in IMPORTS.items() if m.split(".")[0] == "sim"
           for t, line in imps if t.split(".")[0] != "sim"]
    assert not bad, "sim must not import calibrate (or another package of the project):\n" + "\n".join(bad)


def test_sim_imports_follow_the_layers():
    bad = []
    for m, imps in IMPORTS.items():
        if m.split(".")[0] != "sim":
            continue
        src = _unit(m)
        for t, line in imps:
            dst = _unit(t)
            if t.split(".")[0] != "sim" or dst == src:
                continue
            a, b = _layer(src), _layer(dst)
            if a == b == "engines":
                bad.append(f"{_where(m, line)}: engine {src} imports engine {dst}")
            elif a != b and b not in MAY_IMPORT[a]:
                bad.append(f"{_where(m, line)}: {src} ({a}) imports {t} ({b})")
    assert not bad, "imports against the direction stated in sim/__init__.py:\n" + "\n".join(bad)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_packages():
    edges: dict[str, set[str]] = {}
    for m, imps in IMPORTS.items():
        for t, _line in imps:
            if t.split(".")[0] in TREES and _unit(t) != _unit(m):
                edges.setdefault(_unit(m), set()).add(_unit(t))
    cycles = _cycles(edges)
    assert not cycles, "packages that import each other (around a cycle): " + "; ".join(" <-> ".join(c) for c in cycles)


def test_no_folder_holds_more_than_max_modules():
    crowded = []
    for tree in TREES:
        for folder in [ROOT / tree, *(p for p in (ROOT / tree).rglob("*") if p.is_dir())]:
            modules = [p.name for p in folder.glob("*.py") if p.name != "__init__.py"]
            if len(modules) > MAX_MODULES:
                crowded.append(f"{folder.relative_to(ROOT)}/ holds {len(modules)} modules")
    assert not crowded, f"at most {MAX_MODULES} modules per folder: " + "; ".join(crowded)


def test_the_checks_see_the_imports():
    """The parser finds imports inside functions; units and layers are the intended ones."""
    assert "sim.model.profile_costs" in {t for t, _ in IMPORTS["sim.model.costs"]}  # imported in a function
    assert "sim.commands" in {t for t, _ in IMPORTS["sim.engines.sglang.rules.advise"]}  # from a import b
    assert _unit("sim.engines.sglang.rules.loop_rules") == "sim.engines.sglang"
    assert _unit("sim.cli") == "sim.cli" and _unit("sim") == "sim" and _unit("sim.model.costs") == "sim.model"
    assert _unit("calibrate.forward.torch_model") == "calibrate.forward" and _unit("calibrate.fit") == "calibrate.fit"
    assert {_layer(_unit(m)) for m in MODULES if m.split(".")[0] == "sim"} == set(SIM_LAYERS)


def test_simulating_with_a_profile_imports_no_calibration():
    """At run time too: simulating (a scenario with a calibration profile) loads no calibrate module."""
    code = ("import sys, sim\n"
            "sim.simulate(sim.load_scenario('scenarios/quickstart.yaml', ['workload.num_requests=4', 'workload.warmup_requests=0']), 'overlap')\n"
            "import sim.cli\n"
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'calibrate')\n"
            "assert not loaded, loaded\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)
