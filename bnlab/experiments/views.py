"""What an entry's analysis sees: each stored run as a :class:`RunView`, all of them in an
:class:`AnalysisContext` (nothing here trains).

Probe readings at an epoch's partial last batch are left out of a run's series
(:func:`partial_batch_steps`). A probe measures the training batch: its numbers are those of a batch
of the run's size, and an epoch that ends with 30 of 128 samples measures another quantity there.
Why: with digits' 1,438 training images in batches of 128, every twelfth step is a
batch of 30. Half of Santurkar's landscape probes (every 30 steps) fell on one, and with BN their
loss range along the gradient was 30–170× that of the full batches. Every third of Peng Fig. 7's
gradient probes fell on one too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bnlab.data.batching import num_batches
from bnlab.store import Store
from bnlab.train.prepare import drops_last

from .base import Experiment
from .run_facts import digits_train_images


def partial_batch_steps(config: dict) -> Callable[[int], bool] | None:
    """Whether a step (counted from 1) trained on an epoch's partial last batch, from the run's
    config; None when every batch is whole or the training set's size is not known from the config
    alone (only digits' is: its stratified split; other data keep every reading)."""
    batch = config.get("batch_size")
    if config.get("data") != "digits" or not isinstance(batch, int):
        return None
    n = digits_train_images((config.get("data_options") or {}).get("test_fraction", 0.2))
    if batch >= n or n % batch == 0 or drops_last(n, batch):
        return None
    per_epoch = num_batches(n, batch)
    return lambda step: step % per_epoch == 0


@dataclass
class RunView:
    """A stored run as the analysis sees it: label, factors, record and metric series."""

    label: str
    factors: dict[str, Any]
    id: str | None
    status: str
    record: dict[str, Any]
    _store: Any
    _partial: Callable[[int], bool] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._partial = partial_batch_steps(self.record.get("config") or {})

    def series(self, name: str, *, partial_batches: bool = False) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric, in step order. A probe's readings (``probe/…``) at an
        epoch's partial last batch are left out unless ``partial_batches``
        (:func:`partial_batch_steps`)."""
        if self.id is None:
            return [], []
        rows = self._store.metrics(self.id, names=[name]).get(name, [])
        if self._partial is not None and name.startswith("probe/") and not partial_batches:
            rows = [(s, v) for s, v in rows if not self._partial(s)]
        return [s for s, _ in rows], [v for _, v in rows]

    def final(self, name: str, default: float | None = None) -> float | None:
        value = (self.record.get("metrics") or {}).get(name)
        return default if value is None else value

    def metric_names(self, prefix: str = "") -> list[str]:
        if self.id is None:
            return []
        return sorted(n for n in self._store.metrics(self.id) if n.startswith(prefix))


@dataclass
class AnalysisContext:
    """Everything ``Experiment.analyze`` may use; nothing here trains."""

    experiment: Experiment
    preset: str
    runs: list[RunView]
    data: dict[str, Any]
    out_dir: Path
    tiny: bool
    store: Store | None = None  # the run store the views read from; open until close()
    owns_store: bool = True  # False: the caller opened ``store`` and closes it (not close())

    def close(self) -> None:
        if self.store is not None and self.owns_store:
            self.store.close()

    def __enter__(self) -> AnalysisContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, label: str) -> RunView:
        for r in self.runs:
            if r.label == label:
                return r
        labels = ", ".join(r.label for r in self.runs)
        raise KeyError(f"no run labelled {label!r}; labels: {labels}")

    def figure_path(self, name: str) -> Path:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        return self.out_dir / f"{name}.png"
