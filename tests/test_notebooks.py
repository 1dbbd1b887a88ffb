"""The what-if notebooks: paired with their jupytext scripts, and they run (small settings)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ["what_if", "variance"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_and_script_are_in_sync(name):
    jupytext = pytest.importorskip("jupytext")
    ipynb = jupytext.read(ROOT / "notebooks" / f"{name}.ipynb")
    script = jupytext.read(ROOT / "notebooks" / f"{name}.py")
    assert [(c.cell_type, c.source) for c in ipynb.cells] == [(c.cell_type, c.source) for c in script.cells], \
        f"run: jupytext --sync notebooks/{name}.ipynb"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes(name, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    # the kernel is a new process: make it import this checkout and run the small settings
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("OVERLAP_SIM_NOTEBOOK_SMALL", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.execute()  # raises CellExecutionError, with the cell and traceback, if a cell fails
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 2, "the notebook's plots should render"
    if name == "what_if":  # its quickstart table is the CLI's (the measured profile, the full scenario)
        from sim import compare, load_scenario

        cli = compare(load_scenario(ROOT / "scenarios" / "quickstart.yaml"))
        text = "".join("".join(o.get("data", {}).get("text/plain", "")) for o in outputs)
        for setting in ("overlap", "normal"):
            for metric in ("output_throughput", "median_ttft_ms", "median_tpot_ms"):
                assert f"{cli.loc[setting, metric]:.3f}" in text, (setting, metric)
