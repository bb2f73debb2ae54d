"""Training in one process, in ``nproc`` local processes, or as one rank of a torchrun launch.

``train`` is ``bnlab train``'s entry point: it sits above both the one-process loop
(:func:`bnlab.train.loop.run`) and the data-parallel machinery (:mod:`bnlab.train.distributed`),
which the loop itself uses, so neither of those needs to import the other lazily.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import uuid
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from bnlab.train.config import TrainConfig, check_model_name
from bnlab.train.distributed import current, torchrun_environment
from bnlab.train.loop import run


def train(config: TrainConfig | dict, *, callbacks=(), progress: Any = None, force: bool = False,
          model_factory=None):
    """``bnlab train``: one process; ``config.nproc`` local processes; or this rank of a torchrun
    launch.

    Returns the run's record (on rank 0; ``None`` on the other ranks of a torchrun launch).
    """
    cfg = TrainConfig.coerce(config)  # the boundary: a dict is validated here, once
    if model_factory is None:
        check_model_name(cfg.model)
    if torchrun_environment() and current() is None:
        return _as_rank(cfg, list(callbacks), progress, force, model_factory)
    if cfg.nproc > 1 and current() is None:
        return launch(cfg, callbacks=callbacks, progress=progress, force=force,
                      model_factory=model_factory)
    return run(cfg, callbacks=callbacks, progress=progress, force=force,
               model_factory=model_factory)


def launch(cfg: TrainConfig, *, callbacks=(), progress: Any = None, force: bool = False,
           model_factory=None):
    """Run ``cfg`` on ``cfg.nproc`` local processes with torch.distributed's elastic launcher (the
    one ``torchrun --standalone`` uses: rendezvous on a free localhost port, no restarts); rank 0's
    record. The callbacks go to every rank's process: they must pickle (checked first, by name)."""
    check_picklable(callbacks)
    launch_config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=cfg.nproc, run_id=str(uuid.uuid4()),
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1,
        start_method="spawn")
    # The elastic agent installs its own SIGINT/SIGTERM/... handlers in this process and never puts
    # the previous ones back: a later Ctrl-C would raise torch's SignalException in unrelated code.
    saved = {sig: signal.getsignal(sig) for sig in _AGENT_SIGNALS}
    try:
        results = elastic_launch(launch_config, _as_rank)(cfg, list(callbacks), progress, force,
                                                          model_factory)
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)
    return results[0]


def check_picklable(callbacks) -> None:
    """A clear error, naming the callback, for one that cannot be sent to the ranks' processes (a
    lambda, a local class, an open file or lock), instead of the pickler's from inside the
    launcher."""
    for callback in callbacks:
        try:
            pickle.dumps(callback)
        except Exception as err:  # pickling raises many types (PicklingError, AttributeError, ...)
            raise TypeError(
                f"callback {callback!r} cannot be sent to the processes of a data-parallel run "
                f"(nproc > 1), which each get a copy of every callback: {err}. Use a module-level "
                "class whose attributes pickle, or run with nproc 1") from None


_AGENT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
                       if hasattr(signal, name))


def _with_world_size(cfg: TrainConfig) -> TrainConfig:
    """cfg with nproc = the launch's WORLD_SIZE (an nproc given and different is an error)."""
    world = int(os.environ["WORLD_SIZE"])
    if cfg.nproc not in (1, world):
        raise ValueError(f"nproc {cfg.nproc} does not match the launch's WORLD_SIZE {world}")
    return dataclasses.replace(cfg, nproc=world)


def _as_rank(config: TrainConfig, callbacks: list, progress: Any, force: bool, model_factory):
    """One rank: join the default process group from the environment, train, leave. (``config``
    pickles to the spawned ranks as the frozen object it is.)"""
    cfg = _with_world_size(config)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.device(cfg.device).type == "cuda"
    if cuda:
        if torch.device(cfg.device).index is not None:
            raise ValueError(f"device {cfg.device!r} names one GPU; with several processes use "
                             "device cuda (each local rank takes GPU LOCAL_RANK)")
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        main = dist.get_rank() == 0
        kept = [cb for cb in callbacks if main or getattr(cb, "changes_training", False)]
        record = run(cfg, callbacks=kept, progress=progress if main else False,
                     force=force and main, model_factory=model_factory)
    finally:
        dist.destroy_process_group()
    return record if main else None
