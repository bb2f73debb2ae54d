"""What a checkpoint holds, and putting a trainer back in that state (bitwise resume on CPU).

Every random state (global torch RNG, CUDA RNG, the data-order generator, each noisy layer's own
generator), the model, optimizer and projection states, the counters, the epoch accumulators, the
first loss (the divergence reference) and the callbacks' states by name. A mid-epoch checkpoint
stores the data generator's state at the start of the epoch; the resumed run re-draws the epoch and
skips the batches already taken.
"""

from __future__ import annotations

from typing import Any

import torch

from bnlab.train.checkpoint import pack_rows
from bnlab.train.record import _primitive


def checkpoint_state(trainer: Any, final_summary: dict[str, Any] | None = None) -> dict[str, Any]:
    """The state of ``trainer`` to save (tensors and primitive containers only: weights_only)."""
    at_boundary = trainer.step % trainer.spe == 0
    state = {
        "run_id": trainer.run_id,
        "step": trainer.step,
        "model": trainer.model.state_dict(),
        "model_spec": trainer.prep.model_spec,
        "config": _primitive(trainer.config.to_dict()),
        "optimizer": trainer.optimizer.state_dict(),
        "projection": trainer.projection.state_dict() if trainer.projection else None,
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state(trainer.device) if trainer.device.type == "cuda" else None,
        # at an epoch boundary the next epoch starts from the current state; mid-epoch the
        # resumed run re-draws this epoch from its start and skips the batches already taken
        "data_generator": trainer.data_gen.get_state() if at_boundary else trainer.epoch_start_state,
        "noise_generators": {name: g.get_state().cpu() for name, g in trainer.noise_layers},
        "callbacks": trainer.callbacks.state_dict(),
        "scale_invariant": dict(trainer.scale_invariant),
        "accumulators": {
            "loss_sum": trainer.acc_loss, "correct": trainer.acc_correct,
            "count": trainer.acc_count, "batches": trainer.acc_batches,
        },
        "last_loss": trainer.last_loss,
        "start_loss": trainer.start_loss,
        "final_summary": _primitive(final_summary) if final_summary is not None else None,
        # the rows up to here, from the trainer's memory (never read back from the store, which may
        # have lost some); a resume re-creates any the store lost. sync_rows makes it durable.
        "store_rows": _kept_rows(trainer),
    }
    return state


def _kept_rows(trainer: Any) -> dict[str, Any]:
    trainer.store.sync_rows(trainer.run_id, trainer.step)
    return pack_rows([r for r in trainer.rows_kept if r[0] <= trainer.step])


def restore_state(trainer: Any, ckpt: dict[str, Any]) -> None:
    """Put ``trainer`` back in the state ``ckpt`` holds (the inverse of :func:`checkpoint_state`)."""
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
    acc = ckpt["accumulators"]
    trainer.acc_loss, trainer.acc_correct = float(acc["loss_sum"]), int(acc["correct"])
    trainer.acc_count, trainer.acc_batches = int(acc["count"]), int(acc["batches"])
    trainer.last_loss = float(ckpt["last_loss"])
    start = ckpt.get("start_loss")
    trainer.start_loss = float(start) if start is not None else None
    trainer.step = int(ckpt["step"])
    trainer.final = ckpt.get("final_summary")
    trainer.resumed_from = trainer.step
