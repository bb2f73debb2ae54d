"""A run's files beside the store: its checkpoint paths and the lock a training process holds.

Below ``bnlab.train`` so that the store (``Store.delete_run`` holds the run's lock while deleting)
and the training loop share one lock without the store importing the trainer;
:mod:`bnlab.train.checkpoint` re-exports these names.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path
from typing import IO

# A run id names files (``checkpoints/<id>.pt``): letters, digits, ``_``, ``-`` and inner dots only,
# so no id can climb out of the folder (``../x``), name an absolute path or hide a separator.
_RUN_ID = re.compile(r"[A-Za-z0-9_-](?:[A-Za-z0-9_.-]{0,126}[A-Za-z0-9_-])?")


class RunDirError(OSError):
    """A run's file cannot be written (disk full, a read-only folder, a lock file this user cannot
    open); the message names the path and what to do. Nothing already stored is lost."""


class DiskFullError(RunDirError):
    """No space left (or a file size limit) while writing a checkpoint or the store."""


_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_FULL_WORDS = ("no space left", "disk is full", "file too large", "unexpected pos", "quota")


def file_size_limit() -> int | None:
    """This process's file size limit in bytes (``ulimit -f``), or None when unlimited or
    unknown."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY or soft < 0 else int(soft)


def disk_full(err: BaseException, path: str | os.PathLike[str], what: str) -> DiskFullError | None:
    """A :class:`DiskFullError` for ``err`` if it says the disk or a file size limit stopped the
    write, else None, worded for which of the two it was. torch's zip writer says either only as
    ``unexpected pos``; SQLite says ``database or disk is full`` (no space) or ``disk I/O error``
    (its write refused by the size limit, EFBIG); Python ``File too large`` (EFBIG)."""
    text, code = str(err).lower(), getattr(err, "errno", None)
    limit = file_size_limit()
    ambiguous = "unexpected pos" in text or (limit is not None and "disk i/o error" in text)
    if code not in _FULL and not any(w in text for w in _FULL_WORDS) and not ambiguous:
        return None
    folder = Path(path).parent
    try:
        free_bytes: float | None = shutil.disk_usage(folder).free
        free = f"{free_bytes / 2**20:.0f} MiB free there"
    except OSError:
        free_bytes, free = None, "free space unknown"
    explicit = code == errno.EFBIG or "file too large" in text
    room = free_bytes is None or limit is None or free_bytes > limit
    if limit is not None and (explicit or (code not in (errno.ENOSPC, errno.EDQUOT) and room
                                           and "no space left" not in text)):
        return DiskFullError(
            f"the file size limit of this process (ulimit -f: {limit} bytes) stopped writing "
            f"{what} {path} ({free}: the disk is not full). Nothing stored is lost: the previous "
            "checkpoint and the store's committed rows are intact. Raise the limit (ulimit -f "
            "unlimited, or one above the file's size) and re-run the same command to resume")
    return DiskFullError(
        f"no space left to write {what} {path} ({free}). "
        "Nothing stored is lost: the previous checkpoint and the store's committed rows are "
        f"intact. Free space in {folder} (or use another --runs-dir with a copy of it) and re-run "
        "the same command to resume"
    )


class UnsafePathError(ValueError):
    """A run id (or another name from a store or a file) that would name a path outside its root."""


def check_run_id(run_id: object, where: str = "") -> str:
    """``run_id`` if it is a valid run id, else :class:`UnsafePathError` saying why (and where it
    came from: ``where``, e.g. the store file)."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id) or ".." in run_id:
        source = f" in {where}" if where else ""
        raise UnsafePathError(
            f"invalid run id {run_id!r}{source}: a run id is 1-128 letters, digits, '_', '-' or "
            "inner '.' (no '..', no path separator), so that its files stay inside the runs dir; "
            "nothing was read, written or deleted"
        )
    return run_id


def inside(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """``path`` if, resolved (symbolic links followed), it lies inside ``root`` resolved, else
    :class:`UnsafePathError`: every file named after a run, an entry or an archive member is
    checked with this before it is read, written or deleted."""
    base = Path(root).resolve()
    full = Path(path).resolve()
    if full != base and base not in full.parents:
        raise UnsafePathError(f"{path} resolves to {full}, outside {base}; refused")
    return Path(path)


def umask() -> int:
    """The process umask, read without changing it (Linux ``/proc``); 0o022 where unknown. A file
    in a shared results folder must be readable as any file this process creates is."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def checkpoint_path(runs_dir: str | os.PathLike[str], run_id: str) -> Path:
    """``<runs_dir>/checkpoints/<run_id>.pt``, the id validated, the path confined to the folder."""
    folder = Path(runs_dir) / "checkpoints"
    return inside(folder, folder / f"{check_run_id(run_id)}.pt")


def lock_path(runs_dir: str | os.PathLike[str], run_id: str) -> Path:
    """The advisory lock file a training process holds while it trains ``run_id``."""
    path = checkpoint_path(runs_dir, run_id).with_suffix(".lock")
    return inside(path.parent, path)


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
        self.handle = handle = self._open()
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            self.handle = None
            raise RunLockedError(
                f"run {self.path.stem} is being trained by another process (lock {self.path})"
            ) from None
        return self

    def _open(self) -> IO[str]:
        """The lock file, created if missing; one this user cannot write (another user's, in a
        shared folder) is locked read-only -- flock needs no write access -- and one it cannot read
        at all is :class:`RunDirError` naming it."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return open(self.path, "a+")
        except OSError as err:
            full = disk_full(err, self.path, "the lock file")
            if full is not None:
                raise full from None
            try:
                return open(self.path)
            except OSError:
                raise RunDirError(
                    f"cannot open the run's lock file {self.path} ({err.strerror or err}): the "
                    "runs dir is read-only or the file belongs to another user. Train into another "
                    "--runs-dir, or remove the file if no process of its owner is training this run"
                ) from None

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
    """Every file of a run under ``checkpoints/``: checkpoint, previous one, orphaned temps,
    lock."""
    path = checkpoint_path(runs_dir, run_id)
    if not path.parent.is_dir():
        return []
    named = [path, previous_path(path), lock_path(runs_dir, run_id)]
    found = [p for p in named if p.exists()] + orphaned_temporaries(path)
    return [inside(path.parent, p) for p in found]  # a symbolic link out of the folder is refused


def orphaned_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """``.<id>.pt.*.tmp`` files a process killed mid-write left beside checkpoint ``path``."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    return sorted(path.parent.glob(f".{path.name}.*.tmp"))


def remove_checkpoint_files(runs_dir: str | os.PathLike[str], run_id: str) -> list[Path]:
    """Delete a run's checkpoint files (``runs delete``); returns what was removed. Every path is
    checked to lie inside ``<runs_dir>/checkpoints`` before anything is deleted."""
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
