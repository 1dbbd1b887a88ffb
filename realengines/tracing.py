"""What the engines' tracers share: wrapping a method so that every call is timed into a sink,
and patching a module right after it is first imported (an engine's server processes import the
engine themselves, after ``sitecustomize`` ran).

A record is ``{"ph", "t0", "dur", "cpu", ...}``: ``t0`` from ``time.perf_counter`` (the machine's
monotonic clock, comparable across processes), ``dur`` wall seconds, ``cpu`` the calling thread's
CPU seconds (``time.thread_time``); ``info(rec, self, args, kwargs, out)`` adds fields after the
clock stopped (a failure there is recorded as ``info_error``, the timing is kept).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
import time

clock = time.perf_counter
cpu_clock = time.thread_time


def wrap(cls, name: str, ph: str, sink, info=None) -> None:
    """Replace ``cls.name`` by a timed call that adds one record to ``sink`` (once; a missing
    method is left alone)."""
    original = _untraced(cls, name)
    if original is None:
        return

    @functools.wraps(original)
    def traced(self, *args, **kwargs):
        t0, c0 = clock(), cpu_clock()
        out = original(self, *args, **kwargs)
        rec = {"ph": ph, "t0": t0, "dur": clock() - t0, "cpu": cpu_clock() - c0}
        sink.add(_with_info(rec, info, self, args, kwargs, out))
        return out

    _install(cls, name, traced)


def stamp_entry(cls, name: str, ph: str, sink, info=None) -> None:
    """Replace the coroutine method ``cls.name`` by one that adds a record of when it was entered
    (``dur`` and ``cpu`` 0; ``info(rec, self, args, kwargs, None)`` adds fields) before awaiting
    the original (once; a missing method is left alone)."""
    original = _untraced(cls, name)
    if original is None:
        return

    @functools.wraps(original)
    async def stamped(self, *args, **kwargs):
        sink.add(_with_info({"ph": ph, "t0": clock(), "dur": 0.0, "cpu": 0.0}, info, self, args, kwargs, None))
        return await original(self, *args, **kwargs)

    _install(cls, name, stamped)


def _untraced(cls, name: str):
    """``cls.name`` when it exists and is not wrapped yet, else None."""
    original = getattr(cls, name, None)
    return None if original is None or getattr(original, "_overlap_sim_traced", False) else original


def _install(cls, name: str, replacement) -> None:
    replacement._overlap_sim_traced = True
    setattr(cls, name, replacement)


def _with_info(rec: dict, info, self, args, kwargs, out) -> dict:
    """``rec`` with ``info``'s fields (a failure there is kept as ``info_error``, the timing too)."""
    if info is not None:
        try:
            info(rec, self, args, kwargs, out)
        except Exception as err:  # a field the engine renamed: keep the timing
            rec["info_error"] = repr(err)
    return rec


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs ``patches[name](module)`` right after module ``name`` executes (its first import)."""

    def __init__(self, patches: dict):
        self.patches = dict(patches)

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.patches:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        patch = self.patches.pop(fullname)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def install_on_import(patches: dict) -> None:
    """Run each ``patches[module](module)`` when that module is first imported."""
    sys.meta_path.insert(0, _PatchOnImport(patches))
