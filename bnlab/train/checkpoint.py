"""Atomic, checksummed, ``weights_only``-loadable checkpoints, and the run lock.

A checkpoint holds only tensors and primitive containers (dicts, lists, str, int, float, bool,
None) -- random-generator states are byte tensors -- so it loads with
``torch.load(weights_only=True)``, which never executes code from the file. It is written to a
temporary file in the same folder, flushed to disk, and moved over the old one with ``os.replace``
(atomic on POSIX): a process killed mid-write leaves the previous checkpoint intact, and the next
save removes the temporary file it left.

Integrity: each checkpoint carries a SHA-256 of every top-level entry (tensor bytes, dtypes,
shapes and the primitive values), verified on load. A changed byte -- a bit flip on disk, a
truncated copy -- is :class:`CheckpointCorruptError` naming the damaged entry and the way out:
the checkpoint before it is kept as ``<id>.prev.pt`` (resume from there), or delete the run's
checkpoints and train from scratch. A damaged checkpoint is never resumed silently.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from bnlab.store.run_files import (
    checkpoint_path, disk_full, orphaned_temporaries, previous_path, umask,
)
from bnlab.store import Store, StoreIntegrityError

FORMAT = 2  # 2: with "checksum"; 1: an earlier bnlab's, loaded unverified with a warning
_READABLE_FORMATS = (1, 2)


class CheckpointCorruptError(ValueError):
    """A checkpoint whose content does not match its checksum, or that cannot be unpickled."""


def save_checkpoint(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Write ``state`` (with its checksum) atomically to ``path``; the checkpoint it replaces is
    kept as :func:`previous_path` (a hard link: no copy). Removes orphaned temporary files of
    this checkpoint first (the caller holds the run's lock, so none of them is in flight)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for orphan in orphaned_temporaries(path):
        orphan.unlink(missing_ok=True)
    payload = {"format": FORMAT, **state}
    payload["checksum"] = checksum(payload)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file private (0600); a checkpoint in a shared results folder must be
        # readable as any file this process creates is (0666 less the umask)
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "wb") as handle:
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        if path.exists():
            _keep_previous(path)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException as err:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        full = disk_full(err, path, "checkpoint") if isinstance(err, (OSError, RuntimeError)) \
            else None
        if full is not None:  # torch's zip writer says only "unexpected pos": say what happened
            raise full from None
        raise


def _keep_previous(path: Path) -> None:
    """Make the current checkpoint ``<id>.prev.pt`` without ever leaving ``path`` missing."""
    link = path.with_name(f".{path.name}.prev.tmp")
    link.unlink(missing_ok=True)
    try:
        os.link(path, link)
    except OSError:  # a file system without hard links: no previous checkpoint is kept
        return
    os.replace(link, previous_path(path))


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX: the directory entry lives in the folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - not POSIX
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def checksum(state: dict[str, Any]) -> dict[str, Any]:
    """SHA-256 of everything in ``state`` except ``checksum`` itself: ``{"entries": {key: hex}}``
    (names the damaged entry) and ``"all"``, over the keys and the entries' digests. ``all`` is what
    catches a flipped byte in a key: the pickle stores each key string once and both ``state`` and
    ``entries`` refer to it, so a renamed key is renamed in both and only ``all`` changes."""
    entries = {str(k): _digest(v) for k, v in state.items() if k != "checksum"}
    whole = hashlib.sha256(repr(sorted(entries.items())).encode()).hexdigest()
    return {"entries": entries, "all": whole}


def _digest(value: Any) -> str:
    h = hashlib.sha256()
    _feed(h, value)
    return h.hexdigest()


def _feed(h: Any, value: Any) -> None:
    """Hash a value of a checkpoint canonically: type tags, dict keys in sorted order, tensor
    dtype, shape and raw bytes (so one flipped bit anywhere changes the digest)."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, dict):
        h.update(b"D%d" % len(value))
        for k in sorted(value, key=repr):
            h.update(repr(k).encode())
            _feed(h, value[k])
    elif isinstance(value, (list, tuple)):
        h.update(b"L%d" % len(value))
        for v in value:
            _feed(h, v)
    else:
        h.update(f"{type(value).__name__}:{value!r};".encode())


def load_checkpoint(
    path: str | os.PathLike[str], *, map_location: Any = "cpu", verify: bool = True
) -> dict[str, Any] | None:
    """The checkpoint at ``path`` (checksum verified), or None if there is none.

    A file that cannot be unpickled or whose content does not match its checksum raises
    :class:`CheckpointCorruptError` with the recovery; an unknown format is ``ValueError``.
    """
    path = Path(path)
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # any unpickling failure means a damaged file
        raise CheckpointCorruptError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {err}). " + _recovery(path)
        ) from err
    if not isinstance(state, dict) or state.get("format") not in _READABLE_FORMATS:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(
            f"checkpoint {path} has format {found!r}; this bnlab reads {_READABLE_FORMATS}. "
            + _recovery(path)
        )
    if state["format"] == 1 and "checksum" in state:
        # format 1 never had a checksum: this is a later checkpoint relabelled to skip verification
        raise CheckpointCorruptError(
            f"checkpoint {path} says format 1 (unverified) but carries a checksum, as only format "
            "2 does: its format was changed; nothing was loaded. " + _recovery(path))
    if state["format"] == 1:
        warnings.warn(f"checkpoint {path} was written by an earlier bnlab without a checksum; "
                      "loaded unverified", stacklevel=2)
    elif verify:
        _verify(path, state)
    return state


def _verify(path: Path, state: dict[str, Any]) -> None:
    """Raise :class:`CheckpointCorruptError` unless ``state`` matches the checksum it carries."""
    stored = state.get("checksum")
    actual = checksum(state)
    if isinstance(stored, dict) and stored.get("all") == actual["all"]:
        return
    entries = stored.get("entries") if isinstance(stored, dict) else None
    written = entries if isinstance(entries, dict) else {}
    damaged = sorted(k for k, v in actual["entries"].items() if written.get(k) != v)
    what = ", ".join(damaged) if damaged else ("its entry names" if written else "its checksum")
    raise CheckpointCorruptError(
        f"checkpoint {path} is damaged: {what} no longer match(es) the checksum written with it; "
        "nothing was resumed. " + _recovery(path)
    )


def _recovery(path: Path) -> str:
    """The documented way out of a damaged checkpoint (docs/readme/train.md)."""
    prev = previous_path(path)
    run_id = path.stem
    scratch = (f"delete it ({path}) or the run (`bnlab runs delete {run_id}`) and re-run to train "
               "from scratch")
    if not prev.exists():
        return f"Recovery: {scratch}."
    try:
        previous = load_checkpoint(prev, map_location="cpu")
        if previous is None:  # gone since the exists() above
            raise ValueError(prev)
        step = previous.get("step")
    except (ValueError, AttributeError):
        return f"The previous checkpoint {prev} is damaged too. Recovery: {scratch}."
    return (f"Recovery: resume from the previous checkpoint (step {step}) with `mv {prev} {path}` "
            "and re-run the same command (the steps after it are retrained: same result), or "
            f"{scratch}.")


def pack_rows(rows: list[tuple[int, str, float | None]]) -> dict[str, Any]:
    """A run's metric rows (:meth:`bnlab.store.Store.sync_rows`) as compact tensors a checkpoint
    can carry (``weights_only``-loadable): steps, an index into the names, values (NaN for None)."""
    names = sorted({n for _, n, _ in rows})
    index = {n: i for i, n in enumerate(names)}
    return {
        "names": names,
        "steps": torch.tensor([s for s, _, _ in rows], dtype=torch.int64),
        "name_index": torch.tensor([index[n] for _, n, _ in rows], dtype=torch.int32),
        "values": torch.tensor([float("nan") if v is None else v for _, _, v in rows],
                               dtype=torch.float64),
    }


def unpack_rows(packed: dict[str, Any] | None) -> list[tuple[int, str, float | None]] | None:
    """The rows :func:`pack_rows` packed (None for a checkpoint that carries none)."""
    if packed is None:
        return None
    names = packed["names"]
    return [
        (s, names[i], None if v != v else v)
        for s, i, v in zip(packed["steps"].tolist(), packed["name_index"].tolist(),
                           packed["values"].tolist())
    ]


def repair_from_checkpoint(store: Store, runs_dir: str | os.PathLike[str],
                           run_id: str) -> dict[str, Any]:
    """Re-create a finished run's config, summary and metric rows in ``store`` from its final
    checkpoint (which keeps its own copy of the rows, written from the trainer's memory) and seal
    them; returns the verified record. :class:`StoreIntegrityError` if there is no such
    checkpoint."""
    path = checkpoint_path(runs_dir, run_id)
    ckpt = load_checkpoint(path, map_location="cpu")  # verified against its checksum
    final = ckpt.get("final_summary") if ckpt is not None else None
    rows = unpack_rows(ckpt.get("store_rows")) if ckpt is not None else None
    finished = isinstance(final, dict) and final.get("status") == "finished"
    if (ckpt is None or final is None or ckpt.get("run_id") != run_id or not finished
            or rows is None):
        why = "there is none" if ckpt is None else "it is not this finished run's final checkpoint"
        raise StoreIntegrityError(
            f"run {run_id} cannot be rebuilt from its final checkpoint {path}: {why}. "
            f"Recovery: `bnlab runs delete {run_id} --runs-dir {runs_dir}` and train it again")
    summary = {"metrics": final.get("metrics") or {},
               "scale_invariant": ckpt.get("scale_invariant") or {}, "checkpoint": str(path)}
    store.restore_run(run_id, ckpt["config"], summary, rows, steps=int(ckpt["step"]))
    row = store.get_run(run_id)
    assert row is not None
    return row
