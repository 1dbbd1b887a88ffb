"""Where a real engine's environment is, and how the project runs code inside it.

Each real engine lives in its own virtual environment (``realengines/<engine>/setup.sh``): the
project never imports it. :func:`run_module` starts ``python -m realengines.<...>`` with that
environment's interpreter and reads back what the module wrote. The interpreter is, in order:
``--engine-python``, ``$OVERLAP_SIM_<ENGINE>_PYTHON``, ``.venvs/<engine>/bin/python`` under the
repository root.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from calibrate.errors import CalibrationInputError
from sim.errors import ExternalRunError

REPO = Path(__file__).resolve().parents[2]
ENGINES = ("sglang", "vllm")
SETUP = {e: f"realengines/{e}/setup.sh" for e in ENGINES}
IMPORT_CHECK = {"sglang": "import sglang, torch; print(sglang.__version__)",
                "vllm": "import vllm, torch; print(vllm.__version__)"}
MODEL_DIMS = "1024,256,4,4,2,512"  # realengines.model's default: the tiny Llama


def model_metadata() -> dict:
    """The test model as a profile's ``metadata.model``."""
    dims = (int(x) for x in MODEL_DIMS.split(","))
    return {"name": "tiny-llama", **dict(zip(("vocab", "hidden", "layers", "heads", "kv_heads", "intermediate"), dims))}


@dataclass(frozen=True)
class Engine:
    """A real engine's environment. ``python``: its interpreter; ``version``: the engine's release."""

    name: str
    python: Path
    version: str

    def env(self, extra: dict | None = None) -> dict:
        """The environment for modules of ``realengines``: the repository on PYTHONPATH (SGLang's
        import shims too), one OpenMP thread (an idle CPU engine otherwise spins on every core)."""
        env = dict(os.environ)
        paths = [str(REPO)]
        if self.name == "sglang":
            paths.insert(0, str(REPO / "realengines" / "sglang" / "shims"))
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["OMP_NUM_THREADS"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra or {})
        return env


def find_engine(name: str, python: str | Path | None = None, flag: str = "--engine-python") -> Engine:
    """The environment of engine ``name``, checked by importing it there.

    Raises:
        CalibrationInputError: unknown engine, or no working environment (the message says how
            to build one).
    """
    if name not in ENGINES:
        raise CalibrationInputError("--engine", "", f"unknown engine {name!r}; expected one of {', '.join(ENGINES)}")
    source = flag if python else f"OVERLAP_SIM_{name.upper()}_PYTHON"
    python = python or os.environ.get(f"OVERLAP_SIM_{name.upper()}_PYTHON")
    if not python:
        python, source = REPO / ".venvs" / name / "bin" / "python", "the default environment"
    # absolute, not resolved: a venv's python is a symlink to the base interpreter, and the
    # modules run with the repository as their working directory (a relative path would then
    # name another file, or none)
    python = Path(python).expanduser().absolute()
    how = f"build it with {SETUP[name]} (about 2-10 minutes, 3 GB) or name one with --engine-python"
    if not python.exists():
        raise CalibrationInputError(source, "", f"no {name} environment at {python}: {how}")
    try:
        out = subprocess.run([str(python), "-c", IMPORT_CHECK[name]], capture_output=True, text=True, timeout=300,
                             env=Engine(name, python, "").env())
    except (OSError, subprocess.TimeoutExpired) as err:
        raise CalibrationInputError(source, "", f"{python} does not run ({err}): {how}") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise CalibrationInputError(source, "", f"{name} does not import with {python} ({last}): {how}")
    return Engine(name, python, out.stdout.strip().splitlines()[-1])


def run_module(engine: Engine, module: str, args: list[str], log: Path, timeout_s: float | None = None,
               env: dict | None = None) -> None:
    """Run ``python -m <module> <args>`` in the engine's environment, output to ``log``.

    The module runs in its own process group, killed whole when it overruns ``timeout_s`` or
    this process is interrupted (SGLang's scheduler would otherwise outlive its parent).

    Raises:
        ExternalRunError: the module failed or timed out (one line: its last log line and the log).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        # in this process's folder (the repository is on PYTHONPATH): a relative path in ``args``
        # (the default --work results/...) means in the child what it means here
        proc = subprocess.Popen([str(engine.python), "-m", module, *args], stdout=f, stderr=subprocess.STDOUT,
                                env=engine.env(env), cwd=os.getcwd(), start_new_session=True)
        try:
            proc.wait(timeout_s)
        except BaseException as err:  # timeout, Ctrl-C: no orphaned engine processes
            _kill_group(proc)
            if isinstance(err, subprocess.TimeoutExpired):
                raise ExternalRunError(f"{module} did not finish within {timeout_s:.0f} s in the {engine.name} "
                                       f"environment; log {log}") from None
            raise
    if proc.returncode != 0:
        last = next((line.strip() for line in reversed(log.read_text(errors="replace").splitlines()) if line.strip()),
                    "(empty)")
        raise ExternalRunError(f"{module} failed in the {engine.name} environment (exit {proc.returncode}): "
                               f"{last[:300]}; the whole log: {log}")


def probe_host_speed(engine: Engine, out: Path, timeout_s: float = 300) -> dict:
    """Run the host speed probe (:mod:`calibrate.hostspeed`) in the engine's environment (its
    interpreter and torch, one OpenMP thread); write its reading to ``out`` and return it.

    Raises:
        RuntimeError: the probe failed in the engine's environment.
    """
    import json

    run_module(engine, "calibrate.hostspeed", [str(out)], out.with_suffix(".log"), timeout_s=timeout_s)
    return json.loads(out.read_text())


def run_probed(engine: Engine, probe_path: Path, run) -> None:
    """``run()`` between two host speed probes; ``probe_path`` gets ``{"before": reading,
    "after": reading}`` once both are taken (so a run that failed leaves no reading).

    Raises:
        RuntimeError: the probe or ``run`` failed.
    """
    import json

    probe_path.unlink(missing_ok=True)
    tmp = probe_path.with_name(probe_path.stem + ".before.json")
    before = probe_host_speed(engine, tmp)
    run()
    after = probe_host_speed(engine, probe_path.with_name(probe_path.stem + ".after.json"))
    probe_path.write_text(json.dumps({"before": before, "after": after}) + "\n")


def _read_probes(paths) -> list[dict]:
    """The readings (before and after) of every probe file of ``paths`` that exists."""
    import json

    out: list[dict] = []
    for path in paths:
        if Path(path).exists():
            d = json.loads(Path(path).read_text())
            out += [d["before"], d["after"]]
    return out


def session_order(settings: tuple[str, ...], sessions: int) -> list[tuple[str, str]]:
    """``(setting, name)`` of each calibration session in the order they run. One session per
    setting is named after it (``sync``, ``async``); with ``sessions`` > 1 each setting runs that
    many times, named ``<setting>-<i>``, the settings' order reversed every other round (sync-0,
    async-0, async-1, sync-1, ...) so that a slow drift of the host weighs on both alike.

    Raises:
        ValueError: ``sessions`` below 1."""
    if sessions < 1:
        raise ValueError(f"sessions: at least 1 (got {sessions})")
    if sessions == 1:
        return [(s, s) for s in settings]
    return [(s, f"{s}-{i}") for i in range(sessions) for s in (settings if i % 2 == 0 else settings[::-1])]


def mean_probe(paths) -> dict | None:
    """The mean reading (:func:`calibrate.hostspeed.mean_reading`) of the probe files ``paths``,
    or None when any of them is missing (a run recorded before probes existed)."""
    paths = [Path(p) for p in paths]
    if not paths or not all(p.exists() for p in paths):
        return None
    from calibrate.hostspeed import mean_reading

    return mean_reading(_read_probes(paths))


def _kill_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM the module's process group (a server session then stops its server), SIGKILL it
    after ``grace_s``."""
    import signal

    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue


def test_model(engine: Engine, folder: Path) -> Path:
    """The tiny random-weight Llama both engines load (written once into ``folder``)."""
    if not (folder / "config.json").exists() or not (folder / "model.safetensors").exists():
        run_module(engine, "realengines.model", [str(folder), "--dims", MODEL_DIMS], folder.parent / "model.log")
    return folder


def may_renice(nice: int) -> bool:
    """Whether this process may run ``nice`` steps nicer than now (``setpriority(2)``): any
    ``nice`` >= 0; below 0 as root, or with a soft ``RLIMIT_NICE`` that reaches it."""
    import resource

    if nice >= 0 or os.geteuid() == 0:
        return True
    soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
    return soft == resource.RLIM_INFINITY or os.getpriority(os.PRIO_PROCESS, 0) + nice >= 20 - soft


def tp_bind(tp: int, cores: int | None = None) -> str:
    """A CPU server's core binding for ``tp`` ranks on this host's ``cores`` (vLLM's
    ``VLLM_CPU_OMP_THREADS_BIND``, SGLang's ``SGLANG_CPU_OMP_THREADS_BIND``, the same syntax):
    each rank its own contiguous share of the cores (``0|1`` for 2 ranks on 2 cores; ``0-3|4-7``
    on 8), the remainder to the last (vLLM's CPU worker binds its OpenMP threads to its share,
    ``v1/worker/cpu_worker.py``; SGLang's ``numa_utils.init_threads_binding``, 0.5.23).

    Raises:
        CalibrationInputError: fewer cores than ranks (named ``--tensor-parallel-size``).
    """
    from calibrate.errors import CalibrationInputError

    cores = (os.cpu_count() or 1) if cores is None else cores
    if tp > cores:
        raise CalibrationInputError("--tensor-parallel-size", "", f"{tp} workers need at least {tp} cores "
                                    f"(this host has {cores})")
    share, parts = cores // tp, []
    for r in range(tp):
        lo, hi = r * share, (cores - 1 if r == tp - 1 else (r + 1) * share - 1)
        parts.append(str(lo) if lo == hi else f"{lo}-{hi}")
    return "|".join(parts)
