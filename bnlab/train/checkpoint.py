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
