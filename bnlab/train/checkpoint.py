"""Atomic, ``weights_only``-loadable checkpoints.

A checkpoint holds only tensors and primitive containers (dicts, lists, str, int, float, bool,
None) -- random-generator states are byte tensors -- so it loads with
``torch.load(weights_only=True)``, which never executes code from the file. It is written to a
temporary file in the same folder, flushed to disk, and moved over the old one with ``os.replace``
(atomic on POSIX): a process killed mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

FORMAT = 1


def checkpoint_path(runs_dir: str | os.PathLike[str], run_id: str) -> Path:
    return Path(runs_dir) / "checkpoints" / f"{run_id}.pt"


def lock_path(runs_dir: str | os.PathLike[str], run_id: str) -> Path:
    """The advisory lock file a training process holds while it trains ``run_id``."""
    return checkpoint_path(runs_dir, run_id).with_suffix(".lock")


class RunLockedError(RuntimeError):
    """Another process is training this run right now."""


class RunLock:
    """An advisory ``flock`` so two processes never train (or delete) one run at once.

    The kernel frees it when the holder dies, SIGKILL included, so a crash never leaves a run
    locked. ``RunLockedError`` if another process holds it.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.handle = None

    def __enter__(self) -> RunLock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no locking
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(self.path, "a+")
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.handle.close()
            self.handle = None
            raise RunLockedError(
                f"run {self.path.stem} is being trained by another process (lock {self.path})"
            ) from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None


def is_locked(runs_dir: str | os.PathLike[str], run_id: str) -> bool:
    """True while another process holds the run's lock (it is training the run right now)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no locking
        return False
    path = lock_path(runs_dir, run_id)
    if not path.exists():
        return False
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def checkpoint_files(runs_dir: str | os.PathLike[str], run_id: str) -> list[Path]:
    """Every file of a run under ``checkpoints/``: checkpoint, previous one, orphaned temps, lock."""
    path = checkpoint_path(runs_dir, run_id)
    if not path.parent.is_dir():
        return []
    named = [path, previous_path(path), lock_path(runs_dir, run_id)]
    return [p for p in named if p.exists()] + orphaned_temporaries(path)


def orphaned_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """``.<id>.pt.*.tmp`` files a process killed mid-write left beside checkpoint ``path``."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    return sorted(path.parent.glob(f".{path.name}.*.tmp"))


def remove_checkpoint_files(runs_dir: str | os.PathLike[str], run_id: str) -> list[Path]:
    """Delete a run's checkpoint files (``runs delete``); returns what was removed."""
    removed = []
    for p in checkpoint_files(runs_dir, run_id):
        try:
            p.unlink()
            removed.append(p)
        except FileNotFoundError:
            pass
    return removed


def previous_path(path: str | os.PathLike[str]) -> Path:
    """Where the checkpoint before the latest one is kept (the recovery point if it is damaged)."""
    path = Path(path)
    return path.with_name(path.stem + ".prev.pt")


def save_checkpoint(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save({"format": FORMAT, **state}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def load_checkpoint(path: str | os.PathLike[str], *, map_location: Any = "cpu") -> dict[str, Any] | None:
    """The checkpoint at ``path``, or None if there is none. A damaged file is an error that says so."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means a damaged file
        raise ValueError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {err}); delete it to restart the run"
        ) from err
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"checkpoint {path} has an unknown format; delete it to restart the run")
    return state
