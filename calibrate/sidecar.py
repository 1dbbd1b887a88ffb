"""A calibration's sidecar, ``<out>.samples.jsonl``: a header line with the run's identity, then
one line per measured task with its raw samples, appended (and synced) as each task ends, so an
interrupted calibration resumes from it (:func:`calibrate.measure.calibrate`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from calibrate.errors import CalibrationInputError
from sim.errors import ProfileError
from sim.model.profile import SGLANG_CURVES
from sim.model.profile.file import check_samples


def sidecar_path(out: Path) -> Path:
    """The sidecar of a calibration writing ``out``: ``<out>.samples.jsonl``."""
    return out.with_name(out.name + ".samples.jsonl")


class Sidecar:
    """The append-only file of raw samples of one calibration run."""

    def __init__(self, path: Path, identity: dict, fresh: bool):
        self.path, self.identity = path, identity
        self.done: dict[str, list[dict]] = {}
        if fresh:
            path.unlink(missing_ok=True)
        if path.exists():
            self._read()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._write_line({"sidecar": "overlap-sim calibration samples", "identity": identity})

    @staticmethod
    def check(out: Path, identity: dict, fresh: bool) -> None:
        """What :class:`Sidecar` would refuse of ``out``'s sidecar on resuming, said before the plan
        is printed (a bad input is one line), writing nothing.

        Raises:
            CalibrationInputError: as the constructor would.
        """
        path = sidecar_path(Path(out))
        if not fresh and path.exists():
            Sidecar._records(path, identity)

    def _read(self) -> None:
        self.done.update(self._records(self.path, self.identity))
        text = self.path.read_text()
        if text and not text.endswith("\n"):  # (the next sample goes on a line of its own)
            with self.path.open("a") as fh:
                fh.write("\n")

    @staticmethod
    def _records(path: Path, identity: dict) -> dict[str, list[dict]]:
        """The samples a sidecar holds, by task; a last line cut short is left to be measured again.

        Raises:
            CalibrationInputError: another calibration's sidecar, or a line of the wrong shape.
        """
        lines = path.read_text().splitlines()
        try:
            head = json.loads(lines[0]) if lines else {}
        except json.JSONDecodeError:
            head = {}
        if not isinstance(head, dict) or head.get("identity") != identity:
            raise CalibrationInputError(str(path), "", "holds samples of a different calibration (backend, "
                                        "device, model, dtype or grid differ); pass --fresh to discard them")
        done: dict[str, list[dict]] = {}
        for n, line in enumerate(lines[1:], start=2):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by an interruption: measured again
                continue
            # a line edited or corrupted otherwise is said now, naming this file, not after the rest is measured
            if not (isinstance(rec, dict) and isinstance(rec.get("task"), str) and isinstance(rec.get("samples"), list)):
                raise CalibrationInputError(str(path), f"line {n}", "a task's samples ({task, samples}); pass "
                                            "--fresh to discard them")
            try:
                check_samples(rec["samples"], SGLANG_CURVES.all, str(path), f"line {n}: samples")
            except ProfileError as err:
                raise CalibrationInputError(str(path), err.field, f"{err.expected}; pass --fresh to discard "
                                            "them") from None
            done[rec["task"]] = rec["samples"]
        return done

    def _write_line(self, obj: dict) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps(obj) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def append(self, task, samples: list[dict]) -> None:
        """Keep and write ``samples`` of ``task`` (a :class:`calibrate.measure.Task`: its ``key``)."""
        self.done[task.key] = samples
        self._write_line({"task": task.key, "samples": samples})
