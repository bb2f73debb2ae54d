"""Data-parallel training on torch.distributed: ``bnlab train --nproc N``, or any ``torchrun``
launch.

Semantics (``docs/readme/distributed.md``):

* The global batch is the batch of the one-process run (``batch_size``), drawn by the same seeded
  generator on every rank; rank r trains on its contiguous slice (sizes differ by at most one). The
  model's outputs are all-gathered (differentiably) and every rank computes the loss of the whole
  batch, so the loss, the accuracy, the divergence checks and every logged number are the
  one-process ones. The gradient: autograd across the ranks differentiates Σ_r L = N·L, DDP averages
  over the N ranks, so each rank steps with ∇L exactly (up to float summation order).
* ``sync_norms`` (default): every bnlab norm computes its batch statistics over the global batch
  (:func:`bnlab.norms.convert_sync`), so N processes train the one-process model.
  ``sync_norms=false`` keeps per-rank statistics (what plain DDP does): the per-device batch then
  sets the statistics' noise, MBN's subject; DDP then broadcasts rank 0's buffers (running
  statistics) before each forward.
* Rank 0 alone writes the run store and the checkpoints; at start every rank receives rank 0's
  checkpoint over the process group (no shared filesystem needed), so a killed run resumes when the
  same command runs again. Ranks > 0 keep only the callbacks that change training (observers and
  loggers run on rank 0) and skip evaluation.

Launching: :func:`train` runs one process, or starts ``config.nproc`` local processes through
torch.distributed's own elastic launcher (what ``torchrun --standalone`` runs), or, inside a
``torchrun`` worker (``WORLD_SIZE`` > 1 in the environment), joins that process group — the way to
use several nodes. Backend: gloo on CPU, nccl on CUDA (one GPU per local rank).
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from bnlab.norms import convert_sync
from bnlab.norms.engine.sync import all_gather
from bnlab.store import Store
from bnlab.train.engine import Trainer


@dataclass(frozen=True)
class Rank:
    """This process's place in the default process group."""

    rank: int
    world: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def current() -> Rank | None:
    """This process's rank in an initialized default group of more than one process, else None."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    return Rank(dist.get_rank(), dist.get_world_size(),
                int(os.environ.get("LOCAL_RANK", dist.get_rank())))


def is_follower() -> bool:
    """True on ranks > 0 of a data-parallel run: they train in step with rank 0 and store
    nothing."""
    me = current()
    return me is not None and not me.is_main


def split_sizes(n: int, world: int) -> list[int]:
    """Rows of a batch of n per rank, in rank order: contiguous, sizes differing by at most one."""
    return [n // world + (1 if r < n % world else 0) for r in range(world)]


# --------------------------------------------------------------------------------------------
# the data-parallel step: a forward over this rank's rows whose output is the global batch's
# --------------------------------------------------------------------------------------------


def gather_rows(t: torch.Tensor, sizes: list[int], group=None) -> torch.Tensor:
    """Every rank's rows of t (rank r holds sizes[r]) concatenated in rank order; differentiable."""
    group = group if group is not None else dist.group.WORLD
    top = max(sizes)
    padded = (torch.cat([t, t.new_zeros((top - t.shape[0], *t.shape[1:]))]) if t.shape[0] < top
              else t)
    # backward: Σ over ranks of ∂L_r/∂(rows), reaching each owner
    stacked = all_gather(padded, group)
    return torch.cat([stacked[r, :n] for r, n in enumerate(sizes)])


class ShardedForward(nn.Module):
    """``net`` (the DDP module) on this rank's slice of a global batch; returns the global
    output."""

    def __init__(self, net: nn.Module, me: Rank):
        super().__init__()
        self.net, self.me = net, me

    def forward(self, xb: torch.Tensor) -> torch.Tensor:
        sizes = split_sizes(xb.shape[0], self.me.world)
        lo = sum(sizes[: self.me.rank])
        return gather_rows(self.net(xb[lo : lo + sizes[self.me.rank]]), sizes)


class DataParallelTrainer(Trainer):
    """:class:`~bnlab.train.engine.Trainer` on one rank of a data-parallel run (see the module
    docstring)."""

    defer_interrupts = False  # ranks must stop together: a Ctrl-C raises where it lands

    def __init__(self, prep, store, run_id: str, progress: Any, callbacks: list[Any]):
        me = current()
        if me is None:
            raise RuntimeError("DataParallelTrainer needs an initialized process group of more "
                               "than one rank")
        self.me = me
        super().__init__(prep, store, run_id, progress if me.is_main else False, callbacks)
        self.ddp: nn.Module | None = None

    def setup(self) -> None:
        received = self._share_checkpoint()
        try:
            # scale-invariance detection runs on the unsynced model, as in one process
            super().setup()
        finally:
            if received is not None:
                received.unlink(missing_ok=True)
        if self.config.sync_norms:
            convert_sync(self.model)
        cuda = self.device.type == "cuda"
        self.ddp = nn.parallel.DistributedDataParallel(
            self.model, device_ids=[self.device.index] if cuda else None,
            # synced buffers are equal on every rank already; unsynced ones follow rank 0, as in
            # plain DDP
            forward_sync_buffers=not self.config.sync_norms)
        # torch.compile of a module returns an OptimizedModule (an nn.Module); its stub says only
        # Callable
        net = cast(nn.Module, torch.compile(self.ddp)) if self.config.compile else self.ddp
        self.forward = ShardedForward(net, self.me)

    def _share_checkpoint(self) -> Path | None:
        """Rank 0's checkpoint file, sent as bytes to every rank; ranks > 0 load it from a private
        copy."""
        path = self.checkpoints.path
        payload = [path.read_bytes() if self.me.is_main and path.exists() else b""]
        dist.broadcast_object_list(payload, src=0)
        if self.me.is_main:
            return None
        fd, name = tempfile.mkstemp(prefix=f"bnlab-rank{self.me.rank}-", suffix=".pt")
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload[0])
        self.checkpoints.path = Path(name)
        if not payload[0]:
            self.checkpoints.path.unlink()
        return self.checkpoints.path

    def _checkpoint_due(self) -> bool:
        """As in one process, but a wall-time cadence is rank 0's decision: a checkpoint runs a
        divergence check, and every rank must stop at the same step."""
        if self.checkpoints.every is not None or self.step % self.spe:
            return super()._checkpoint_due()  # a function of the step alone: equal on every rank
        due = torch.tensor([int(super()._checkpoint_due())], device=self.device)
        dist.broadcast(due, src=0)
        return bool(due.item())

    def checkpoint(self, *, final_summary: dict[str, Any] | None = None) -> None:
        if self.me.is_main:
            super().checkpoint(final_summary=final_summary)
        else:
            self.flush()
            self.checkpoints.last_time = time.monotonic()

    def evaluate(self) -> dict[str, float]:
        return super().evaluate() if self.me.is_main else {}


# --------------------------------------------------------------------------------------------
# ranks > 0 in bnlab.train.loop.run
# --------------------------------------------------------------------------------------------


def announce(train: bool, run_id: str) -> None:
    """Rank 0 tells the other ranks whether the run trains (False: it had already ended)."""
    if current() is not None:
        dist.broadcast_object_list([(train, run_id)], src=0)


def follow(prep, run_id: str) -> None:
    """A rank > 0's part of ``bnlab.train.loop.run``: train in step with rank 0 into a throwaway
    store."""
    message: list[Any] = [None]  # filled with rank 0's (train, run id)
    dist.broadcast_object_list(message, src=0)
    train, main_id = message[0]
    if main_id != run_id:
        raise RuntimeError(f"rank {dist.get_rank()} built run {run_id} but rank 0 runs {main_id}: "
                           "the ranks were given different configurations")
    if not train:
        return
    with tempfile.TemporaryDirectory(prefix=f"bnlab-rank{dist.get_rank()}-") as scratch:
        store = Store(Path(scratch) / "bnlab.db")
        try:
            store.create_run(run_id, prep.config.to_dict(), config_hash=prep.config.config_hash(),
                             env={})
            kept = [cb for cb in prep.callbacks if getattr(cb, "changes_training", False)]
            trainer = DataParallelTrainer(prep, store, run_id, False, kept)
            trainer.setup()
            trainer.train()
        finally:
            store.close()


# --------------------------------------------------------------------------------------------
# launching
# --------------------------------------------------------------------------------------------


def torchrun_environment() -> bool:
    """True in a worker that torchrun (or the elastic agent) started with more than one rank."""
    return "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
