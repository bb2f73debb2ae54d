"""A run's files beside the store: its checkpoint paths and the lock a training process holds.

Below ``bnlab.train`` so that the store (``Store.delete_run`` holds the run's lock while deleting) and the
training loop share one lock without the store importing the trainer; :mod:`bnlab.train.checkpoint`
re-exports these names.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO


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
        self.handle: IO[str] | None = None

    def __enter__(self) -> RunLock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no locking
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = handle = open(self.path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            self.handle = None
            raise RunLockedError(
                f"run {self.path.stem} is being trained by another process (lock {self.path})"
            ) from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None


def is_locked(runs_dir: str | os.PathLike[str], run_id: str) -> bool | None:
    """True while a process holds the run's lock (it is training the run right now), False if
    none does, None where that cannot be told (no ``flock``, an unreadable lock file)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no locking
        return None
    path = lock_path(runs_dir, run_id)
    if not path.exists():
        return False
    try:
        with open(path) as handle:  # read-only: works in a read-only runs dir, creates nothing
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
    except OSError:
        return None
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
