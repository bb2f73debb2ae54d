"""The run record: what a run stored and returns, the environment it ran in, and its lock."""

from __future__ import annotations

import dataclasses
import platform
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bnlab.store import dumps

@dataclass
class RunRecord:
    """The outcome of a run, as stored and as printed by ``bnlab train --json``.

    ``status`` is ``finished``, ``diverged``, ``failed``, ``interrupted`` (or ``running`` for a
    record read while a run is in progress); ``metrics`` holds the final ``train_loss`` (mean over
    the last epoch's batches), ``train_accuracy``, ``test_loss``/``test_accuracy`` where the data
    has a test split, and ``diverged_step``/``diverged_loss`` for a diverged run (``error`` then
    says why: a non-finite loss, parameter or buffer, or a loss above the divergence threshold).
    ``origin`` says where this record came from: ``trained`` (from step 0), ``resumed`` (from
    ``resumed_from``) or ``stored`` (an ended run returned from the store without training);
    ``message`` is the line saying so.
    """

    id: str
    status: str
    steps: int
    config: dict[str, Any]
    metrics: dict[str, Any]
    scale_invariant: list[str] = field(default_factory=list)
    error: str | None = None
    env: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None
    resumed_from: int | None = None
    origin: str = "stored"
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, **kwargs: Any) -> str:
        """Strict JSON (a non-finite loss becomes ``null``)."""
        return dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_store(cls, row: dict[str, Any]) -> RunRecord:
        summary = row.get("summary") or {}
        return cls(
            id=row["id"],
            status=row["status"],
            steps=int(row["steps"] or 0),
            config=row["config"],
            metrics=dict(summary.get("metrics") or {}),
            scale_invariant=sorted(summary.get("scale_invariant") or {}),
            error=row.get("error"),
            env=row.get("env") or {},
            checkpoint=summary.get("checkpoint"),
        )


def _git_revision() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def environment(device: torch.device) -> dict[str, Any]:
    import numpy

    import bnlab

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
    return {
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "bnlab": bnlab.__version__,
        "platform": platform.platform(),
        "device": str(device),
        "device_name": name,
        "cuda": torch.version.cuda,
        "threads": torch.get_num_threads(),
        "git": _git_revision(),
    }


def _primitive(value: Any) -> Any:
    """Config/summary values for a checkpoint: only primitives (weights_only loading)."""
    if isinstance(value, dict):
        return {str(k): _primitive(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_primitive(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


try:  # the run store's helper owns the lock (it also guards `runs delete`)
    from bnlab.train.checkpoint import RunLock, RunLockedError
except ImportError:  # pragma: no cover - until bnlab.train.checkpoint provides it
    class RunLockedError(RuntimeError):
        """Another process is training this run right now."""


    class RunLock:
        """An advisory lock so two processes never train the same run at once (freed on SIGKILL)."""

        def __init__(self, path: Path):
            self.path = path
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
