"""Atomic writes: a reader sees the old file (or folder of files) or the whole new one, never a part."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

from sim.errors import UserInputError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temporary path in ``path``'s folder; when the block succeeds it replaces ``path``
    (with the usual ``0o666 & ~umask`` permissions), when it fails it is removed.

    Raises:
        UserInputError: naming ``path``, when the system refuses the folder, the temporary file,
            a write into it or the rename (an OSError: a read-only or full file system, a folder
            that takes no files such as ``/proc``); nothing is left behind."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp" + path.suffix)
        os.close(fd)
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as err:
        raise UserInputError(str(path), "", f"a file the system lets this command write ({_reason(err)})") from None
    finally:
        if tmp is not None:
            try:
                Path(tmp).unlink(missing_ok=True)
            except OSError:
                pass


def _reason(err: OSError) -> str:
    return err.strerror or type(err).__name__


def probe_writable(folder: Path, flag: str, path: Path) -> None:
    """Create and remove a file in ``folder`` (an existing folder): where the system refuses it
    although the permission bits allow it (``/proc`` as root, a read-only mount), the command
    stops now, naming ``flag`` and ``path``, not after its work."""
    try:
        before = os.stat(folder)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".overlap-sim-probe.")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise UserInputError(flag, "", f"{path}: cannot write into {folder} ({_reason(err)})") from None
    try:  # leave no trace: the folder's times as they were
        os.utime(folder, ns=(before.st_atime_ns, before.st_mtime_ns))
    except OSError:
        pass


def _check_parents(path: Path, flag: str) -> None:
    """The nearest existing folder above ``path`` is a writable folder (the rest is created)."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UserInputError(flag, "", f"{path}: {parent} is a file, not a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise UserInputError(flag, "", f"{path}: the folder {parent} is not writable")
            probe_writable(parent, flag, path)
            return


def check_output_dir(path: Path | str, flag: str) -> Path:
    """Check, before any work, that ``path`` can be the folder a command writes into: an
    existing folder or one that can be created.

    Raises:
        UserInputError: naming ``flag``: the path is a file, lies under a file, or in a folder
            that is not writable.
    """
    path = Path(path).expanduser()
    if path.exists():
        if not path.is_dir():
            raise UserInputError(flag, "", f"{path} is a file; expected a folder (it would be overwritten)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UserInputError(flag, "", f"the folder {path} is not writable")
        probe_writable(path, flag, path)
        return path
    _check_parents(path, flag)
    return path


def check_output_file(path: Path | str, flag: str, suffixes: Iterable[str] | None = None,
                      inputs: Iterable[Path | str] = ()) -> Path:
    """Check, before any work, that a command can write the file ``path`` (a new or an existing
    file, in a folder that exists or can be created); ``suffixes``: the endings it may have;
    ``inputs``: the files the command reads, which it must not overwrite.

    Raises:
        UserInputError: naming ``flag``: a folder, under a file, not writable, another suffix, or
            one of ``inputs``.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise UserInputError(flag, "", f"{path} is a folder; expected a file name")
    for source in inputs:
        if path.exists() and Path(source).expanduser().exists() and path.samefile(Path(source).expanduser()):
            raise UserInputError(flag, "", f"{path} is the input {source} itself; write to another file")
    if suffixes is not None:
        allowed = tuple(suffixes)
        if not path.name.lower().endswith(allowed):
            raise UserInputError(flag, "", f"{path}: expected a file name ending in {', '.join(allowed)}")
    if path.exists() and not os.access(path, os.W_OK):
        raise UserInputError(flag, "", f"{path} is not writable")
    _check_parents(path, flag)
    return path


@contextmanager
def staged_folder(out_dir: Path, stale: Callable[[Path], list[Path]], last: str) -> Iterator[Path]:
    """A hidden folder inside ``out_dir`` to write a set of files into; when the block succeeds,
    the new files replace what the earlier set left there (``stale(out_dir)``: its files) in one
    transaction (:func:`_publish`: the one named ``last`` last), so an interrupted or failed write,
    or a publication the system refuses half way, leaves the folder as it was (and removes the
    folder if it made it). Staging folders a killed process left are removed (its files put back
    where it died while publishing). Yields the staging folder.

    Raises:
        UserInputError: naming ``out_dir`` (or the file in it), when the system refuses the
            folder, a file of the new set, or moving an earlier file aside."""
    out_dir = Path(out_dir)
    made = [p for p in (out_dir, *out_dir.parents) if not p.exists()]  # the folders this command creates
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        _remove_dead_stages(out_dir)
        stage = Path(tempfile.mkdtemp(prefix=f".run-{os.getpid()}-", suffix=".partial", dir=out_dir))
    except OSError as err:
        _remove_empty(made)
        raise UserInputError(str(out_dir), "",
                             f"a folder the system lets this command write ({_reason(err)})") from None
    try:
        yield stage
        _publish(out_dir, stage, stale(out_dir), last)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        _remove_empty(made)


def _remove_empty(folders: list[Path]) -> None:
    """Remove those of ``folders`` (innermost first) that exist and are empty: the folders a
    command made for output it did not write."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty, or gone: keep it / nothing to do
            pass


def _publish(out_dir: Path, stage: Path, stale: list[Path], last: str) -> None:
    """Move the files of ``stage`` into ``out_dir`` (``last`` last), the ``stale`` files and those
    the new ones replace first moved aside into a backup folder; if a move fails (or a Ctrl-C
    comes half way), the new files are taken out again and the earlier ones put back, so the
    folder is as it was. (A process killed outright half way leaves its backup folder, whose
    files the next run into the folder puts back where their names are free.)

    Raises:
        UserInputError: naming the file, when one of the new names is a folder in ``out_dir``
            (refused before anything moves) or the system refuses a move."""
    new = sorted(stage.iterdir(), key=lambda p: p.name == last)
    for p in new:
        target = out_dir / p.name
        if target.is_dir() and not target.is_symlink():
            raise UserInputError(str(target), "", "a folder where this command writes a file; remove it or "
                                 "write elsewhere (the folder's earlier files are left as they were)")
    replaced = {p.name for p in new if os.path.lexists(out_dir / p.name)}
    aside = list(dict.fromkeys([p.name for p in stale if os.path.lexists(p)] + sorted(replaced)))
    try:
        backup = Path(tempfile.mkdtemp(prefix=f".run-{os.getpid()}-", suffix=".old", dir=out_dir))
    except OSError as err:  # the folder became unwritable while the run went on: nothing moved yet
        raise UserInputError(str(out_dir), "", f"a folder the system lets this command write ({_reason(err)}); "
                              "its earlier files are left as they were") from None
    moved: list[str] = []
    placed: list[str] = []
    try:
        for name in aside:
            failing = out_dir / name
            os.replace(failing, backup / name)
            moved.append(name)
        for p in new:
            failing = out_dir / p.name
            os.replace(p, failing)
            placed.append(p.name)
    except BaseException as err:  # a refusal, or Ctrl-C half way: the earlier files go back
        for name in placed:
            _quietly(os.unlink, out_dir / name)
        kept = all(_quietly(os.replace, backup / name, out_dir / name) for name in moved)
        if kept:
            shutil.rmtree(backup, ignore_errors=True)
        if not isinstance(err, OSError):
            raise
        where = "the folder's earlier files are left as they were" if kept else f"the earlier files are in {backup}"
        raise UserInputError(str(failing), "", f"the system refused to replace it ({_reason(err)}); {where}") from None
    shutil.rmtree(backup, ignore_errors=True)


def _quietly(fn, *args) -> bool:
    """``fn(*args)``; False if the system refused it."""
    try:
        fn(*args)
        return True
    except OSError:
        return False


def _remove_dead_stages(out_dir: Path) -> None:
    """Remove the staging folders (``.run-<pid>-*.partial``) of processes that are gone (killed
    before they could clean up; a live one's is left alone), after putting back the earlier
    files a dead process had moved aside to publish (``.run-<pid>-*.old``) where no file of
    their name took their place."""
    for stage in [*out_dir.glob(".run-*-*.partial"), *out_dir.glob(".run-*-*.old")]:
        pid = stage.name.split("-")[1]
        if pid.isdigit() and _alive(int(pid)):
            continue
        if stage.suffix == ".old":
            for p in stage.iterdir():
                if not os.path.lexists(out_dir / p.name):
                    _quietly(os.replace, p, out_dir / p.name)
        shutil.rmtree(stage, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (signal 0: no signal sent); a zombie (killed,
    not yet reaped by its parent: state Z in Linux's ``/proc/<pid>/stat``) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # someone else's process, or a pid the system cannot check: leave its folder
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc: the signal's answer
