"""The run record: what a run stores and returns (its final evaluation, the values read back from
the device, the metric rows on their way to the store), the environment it ran in, and its lock."""

from __future__ import annotations

import dataclasses
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy
import torch

import bnlab
from bnlab.jsonsafe import dumps
from bnlab.store import Store

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

    def to_dict(self, *, copy: bool = True) -> dict[str, Any]:
        """The record's fields as a dict; ``copy=False`` shares the nested config, metrics and env
        with the record instead of deep-copying them (a record just decoded from the store, read
        for every run of every entry by a report)."""
        if copy:
            return dataclasses.asdict(self)
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_json(self, **kwargs: Any) -> str:
        """Strict JSON (a non-finite loss becomes ``null``)."""
        return dumps(self.to_dict(copy=False), **kwargs)  # serialized, never mutated: no copy

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


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device) -> dict[str, Any]:
    """What a run's numbers depend on beyond its config. ``cpu_capability`` (torch's SIMD level,
    e.g. AVX512) and the CPU model: float32 kernels round differently across them, so the same
    run on another machine ends within its seed-to-seed noise, not bit for bit (measured: the
    catalogue's smoke runs moved between two machines; one verdict at the edge of its rule did)."""
    cpu = cpu_model()  # read once: /proc/cpuinfo is parsed line by line
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu
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
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_model": cpu,
        "git": _git_revision(),
    }


def to_primitive(value: Any) -> Any:
    """Config/summary values for a checkpoint: only primitives (weights_only loading)."""
    if isinstance(value, dict):
        return {str(k): to_primitive(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_primitive(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


from bnlab.train.checkpoint import unpack_rows  # noqa: E402

EVAL_CHUNK = 1024


def evaluate(model: torch.nn.Module, data: Any, loss_fn: Any,
             classification: bool) -> dict[str, float]:
    """Loss (and accuracy) on ``data``'s test split in eval mode; non-finite outputs count as
    wrong."""
    x, y = data.x_test, data.y_test
    if x is None:
        return {}
    was_training = model.training
    model.eval()
    n = x.shape[0]
    loss_sum = torch.zeros((), dtype=torch.float64, device=x.device)
    correct = torch.zeros((), dtype=torch.int64, device=x.device)
    with torch.no_grad():
        for start in range(0, n, EVAL_CHUNK):
            xb, yb = x[start : start + EVAL_CHUNK], y[start : start + EVAL_CHUNK]
            out = model(xb)
            loss_sum += loss_fn(out, yb).double() * xb.shape[0]
            if classification:
                ok = torch.isfinite(out).all(dim=1) & (out.argmax(dim=1) == yb)
                correct += ok.sum()
    model.train(was_training)
    result = {"test_loss": float(loss_sum) / n}
    if classification:
        result["test_accuracy"] = int(correct) / n
    return result


def read_values(values: list[Any]) -> list[float]:
    """Python floats of ``values`` (numbers or 0-d tensors): one stack and one read per dtype."""
    out: list[Any] = [float(v) if not torch.is_tensor(v) else None for v in values]
    by_dtype: dict[torch.dtype, list[int]] = {}
    for index, value in enumerate(values):
        if torch.is_tensor(value):
            by_dtype.setdefault(value.dtype, []).append(index)
    for indices in by_dtype.values():
        read = torch.stack([values[i].reshape(()) for i in indices]).tolist()
        for index, value in zip(indices, read):
            out[index] = float(value)
    return out


Row = tuple[int, str, float]
FLUSH_ROWS = 5000
FLUSH_SECONDS = 10.0  # at most this long between writes of rows: `runs list` follows progress


class MetricRows:
    """The one owner of a run's metric rows between the step and the store.

    ``log`` keeps a value (a number or a 0-d device tensor) until the next read; ``read`` turns the
    pending values into rows (one transfer per dtype) and buffers them with the rows given (the
    metric window's); ``write`` sends the buffer to the store. ``kept`` is every row written, which
    checkpoints carry and the run's end seals; ``recreated`` the steps a resume re-created in a
    store that had lost them."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store, self.run_id = store, run_id
        self.pending: list[tuple[int, str, Any, float]] = []  # (step, name, value, divisor)
        self.buffer: list[Row] = []  # read back, not yet in the store
        self.kept: list[tuple[int, str, float | None]] = []
        self.recreated: list[int] = []
        self.last_write = time.monotonic()

    def log(self, name: str, value: Any, step: int, divisor: float = 1.0) -> None:
        if torch.is_tensor(value) and value.requires_grad:
            value = value.detach()
        self.pending.append((int(step), str(name), value, divisor))

    def read(self, rows: list[Row]) -> list[Row]:
        """``rows`` plus the pending values' rows, buffered for the store; returns them."""
        if self.pending:
            pending, self.pending = self.pending, []
            values = read_values([v for _, _, v, _ in pending])
            rows = rows + [(s, n, value / d) for (s, n, _, d), value in zip(pending, values)]
        self.buffer.extend(rows)
        return rows

    def write_due(self) -> bool:
        return len(self.buffer) >= FLUSH_ROWS or time.monotonic() - self.last_write >= FLUSH_SECONDS

    def write(self) -> None:
        """Every buffered row to the store (and to ``kept``)."""
        self.last_write = time.monotonic()
        if self.buffer:
            rows, self.buffer = self.buffer, []
            self.store.log_rows(self.run_id, rows)
            self.kept.extend(rows)

    def truncate(self, ckpt: dict[str, Any] | None) -> None:
        """Drop what a previous attempt logged after its last checkpoint (it is replayed); rows up
        to the checkpoint that the store lost are re-created from those the checkpoint carries."""
        if ckpt:
            expected = unpack_rows(ckpt.get("store_rows"))
            self.recreated = self.store.check_rows_up_to(self.run_id, ckpt["step"], expected)
            # (a checkpoint of an earlier bnlab carries no rows: then the store's are all there is)
            self.kept = expected if expected is not None else self.store.sync_rows(
                self.run_id, ckpt["step"])
        self.store.delete_metrics_after(self.run_id, ckpt["step"] if ckpt else -1)

    def up_to(self, step: int) -> list[tuple[int, str, float | None]]:
        """The rows up to ``step``, made durable in the store first (a checkpoint carries them)."""
        self.store.sync_rows(self.run_id, step)
        return [r for r in self.kept if r[0] <= step]
