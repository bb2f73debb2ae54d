"""Checkpoint state: its one owner (:class:`Checkpoints`), what a checkpoint holds, and putting a
trainer back in that state (bitwise resume on CPU).

A checkpoint holds every random state (global torch RNG, CUDA RNG, the data-order generator, each
noisy layer's own generator), the model, optimizer and projection states, the step, the metric
window's state (epoch sums, first and last loss), the callbacks' states by name and the metric rows
up to the step. A mid-epoch checkpoint stores the data generator's state at the start of the epoch;
the resumed run re-draws the epoch and skips the batches already taken.

:func:`checkpoint_state` and :func:`restore_state` read and write a trainer through the
:class:`Resumable` protocol: exactly the fields a checkpoint covers, each owned by the trainer or by
the object named there (the window, the rows).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from bnlab.callbacks import CallbackList
from bnlab.train.checkpoint import load_checkpoint, pack_rows, save_checkpoint
from bnlab.train.config import TrainConfig
from bnlab.train.optim import Projection
from bnlab.train.record import MetricRows, to_primitive
from bnlab.train.window import MetricWindow

CHECKPOINT_SECONDS = 30.0  # default cadence: first epoch end after this much time


class Checkpoints:
    """The one owner of a run's checkpoint state: the file, the cadence, what was loaded.

    ``every``: a checkpoint every N steps; ``None``: at epoch ends, but at most every
    ``CHECKPOINT_SECONDS`` of wall time (a full-batch run has an "epoch" per step). Where
    checkpoints fall never changes the result. ``loaded`` is the checkpoint the run resumed from
    (``resumed_from`` its step), ``final`` the summary of a run that had already ended there."""

    def __init__(self, path: Path, every: int | None, steps_per_epoch: int) -> None:
        self.path, self.every, self.steps_per_epoch = path, every, steps_per_epoch
        self.last_time = time.monotonic()
        self.loaded: dict[str, Any] | None = None
        self.resumed_from: int | None = None
        self.final: dict[str, Any] | None = None

    def load(self, run_id: str) -> dict[str, Any] | None:
        """The run's checkpoint (verified; None if there is none); ValueError if it is another
        run's."""
        ckpt = load_checkpoint(self.path, map_location="cpu")
        if ckpt is not None and ckpt.get("run_id") != run_id:
            raise ValueError(f"checkpoint {self.path} belongs to run {ckpt.get('run_id')!r}, not "
                             f"{run_id}; nothing was resumed. Move it away (it may be that run's) "
                             "and re-run to train from scratch")
        self.loaded = ckpt
        return ckpt

    def due(self, step: int) -> bool:
        if self.every is not None:
            return step % self.every == 0
        return (step % self.steps_per_epoch == 0
                and time.monotonic() - self.last_time >= CHECKPOINT_SECONDS)

    def save(self, state: dict[str, Any]) -> None:
        save_checkpoint(self.path, state)
        self.last_time = time.monotonic()


class Resumable(Protocol):
    """What a checkpoint reads from and restores into a trainer
    (:class:`~bnlab.train.engine.Trainer`)."""

    run_id: str
    step: int
    spe: int  # steps per epoch
    config: TrainConfig
    model_spec: dict[str, Any]
    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    projection: Projection | None
    device: torch.device
    data_gen: torch.Generator
    epoch_start_state: torch.Tensor
    noise_layers: list[tuple[str, torch.Generator]]
    callbacks: CallbackList
    scale_invariant: dict[str, str]
    window: MetricWindow
    rows: MetricRows
    checkpoints: Checkpoints


def checkpoint_state(trainer: Resumable, final_summary: dict[str, Any] | None = None
                     ) -> dict[str, Any]:
    """The state of ``trainer`` to save (tensors and primitive containers only: weights_only)."""
    if trainer.optimizer is None:
        raise RuntimeError("a checkpoint needs the optimizer: call setup() first")
    at_boundary = trainer.step % trainer.spe == 0
    cuda = trainer.device.type == "cuda"
    return {
        "run_id": trainer.run_id,
        "step": trainer.step,
        "model": trainer.model.state_dict(),
        "model_spec": trainer.model_spec,
        "config": to_primitive(trainer.config.to_dict()),
        "optimizer": trainer.optimizer.state_dict(),
        "projection": trainer.projection.state_dict() if trainer.projection else None,
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state(trainer.device) if cuda else None,
        # at an epoch boundary the next epoch starts from the current state; mid-epoch the
        # resumed run re-draws this epoch from its start and skips the batches already taken
        "data_generator": trainer.data_gen.get_state() if at_boundary
        else trainer.epoch_start_state,
        "noise_generators": {name: g.get_state().cpu() for name, g in trainer.noise_layers},
        "callbacks": trainer.callbacks.state_dict(),
        "scale_invariant": dict(trainer.scale_invariant),
        **trainer.window.state_dict(),  # accumulators, last_loss, start_loss
        "final_summary": to_primitive(final_summary) if final_summary is not None else None,
        # the rows up to here, from the trainer's memory (never read back from the store, which
        # may have lost some); a resume re-creates any the store lost
        "store_rows": pack_rows(trainer.rows.up_to(trainer.step)),
    }


def restore_state(trainer: Resumable, ckpt: dict[str, Any]) -> None:
    """Put ``trainer`` back in the state ``ckpt`` holds (inverse of :func:`checkpoint_state`)."""
    if trainer.optimizer is None:
        raise RuntimeError("a resume needs the optimizer: call setup() first")
    trainer.model.load_state_dict(ckpt["model"])
    trainer.optimizer.load_state_dict(ckpt["optimizer"])
    if trainer.projection is not None:
        trainer.projection.load_state_dict(ckpt["projection"])
    torch.set_rng_state(ckpt["torch_rng"])
    if trainer.device.type == "cuda" and ckpt.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(ckpt["cuda_rng"], trainer.device)
    trainer.data_gen.set_state(ckpt["data_generator"])
    trainer.epoch_start_state = ckpt["data_generator"]
    noise = ckpt.get("noise_generators", {})
    for name, gen in trainer.noise_layers:
        if name in noise:
            gen.set_state(noise[name].to(gen.get_state().device))
    trainer.callbacks.load_state_dict(ckpt.get("callbacks", {}))
    trainer.window.load_state_dict(ckpt)
    trainer.step = int(ckpt["step"])
    trainer.checkpoints.final = ckpt.get("final_summary")
    trainer.checkpoints.resumed_from = trainer.step
