"""The arms of ``mbn-batch-size``: what a user with a small batch M can reach for.

One process, batch M: BN, Momentum BN (Yong et al. 2020), Batch Renormalization (Ioffe 2017,
``brn``) and GroupNorm (Wu & He 2018, ``gn``: no batch statistics at all). Two processes with M
samples each whose BN layers share their statistics (synced BN over 2M samples, gloo on the CPU;
the global batch is 2M, the learning rate scaled with it). And the BN runs themselves evaluated
after their running statistics are recollected over the training set with the final network
(:func:`bnlab.norms.recollect_running_stats`, Ioffe & Szegedy 2015, Alg. 2), the documented fix
for running statistics that lag the network.

The recollected arm trains nothing: its value is read from each finished BN run's final
checkpoint (:func:`recollected_metrics`), once, and kept beside the run store.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import torch

from bnlab.data import batches
from bnlab.norms import recollect_running_stats
from bnlab.train import load_model, prepare
from bnlab.train.prepare import derive_seed
from bnlab.train.record import evaluate

from ..base import RunSpec

ONE_PROCESS = {"BN": "bn", "MBN": "mbn", "BRN": "brn", "GN": "gn"}  # arm → norm spec
# GroupNorm's G per preset. The smoke MLP has no spatial extent: G = 32 would split its 64 features
# into pairs, and a pair normalizes to ±1 (the sign of its difference): chance accuracy (0.100 at
# M = 2, 2026-12-06). G = 4 keeps 16 features per group, Wu & He's 16 channels per group at 512.
GN_SPEC = {"smoke": "gn(num_groups=4)", "paper": "gn"}
SYNCED = "synced BN"
RECOLLECTED = "BN, recollected"
SYNC_PROCESSES = 2
ARMS = (*ONE_PROCESS, SYNCED, RECOLLECTED)  # the order of tables, figures and summaries
ARM_TEXT = {SYNCED: f"synced BN ({SYNC_PROCESSES} processes × M)",
            RECOLLECTED: "BN, running statistics recollected"}
RECOLLECT_DIR = "recollected"  # under the runs dir: {run id}.json, a finished run's value


def lr_for(global_batch: int) -> float:
    """Linear scaling from 0.1 at a global batch of 32."""
    return 0.1 * global_batch / 32


def one_process_runs(preset: str, base: dict, batch_sizes: Sequence[int], seeds: Sequence[int],
                     ends: Sequence[int]) -> list[RunSpec]:
    """Every one-process arm at every batch size; ``seeds`` at the compared ``ends``, seed 0
    elsewhere."""
    specs = {**ONE_PROCESS, "GN": GN_SPEC[preset]}
    return [RunSpec(f"{label}, M = {M}" + (f", seed {seed}" if seed else ""),
                    {**base, "norm": norm, "batch_size": M, "lr": lr_for(M), "seed": seed},
                    {"norm": label, "batch_size": M, "seed": seed})
            for label, norm in specs.items() for M in batch_sizes
            for seed in (seeds if M in ends else (0,))]


def synced_runs(base: dict, batch_sizes: Sequence[int]) -> list[RunSpec]:
    """Synced BN: :data:`SYNC_PROCESSES` processes × M samples, one seed. The config of M = 4 is
    the data-parallel "synced BN" arm's at 2 processes, so a sweep trains it once."""
    runs = []
    for M in batch_sizes:
        m = SYNC_PROCESSES * M
        runs.append(RunSpec(f"{SYNCED}, {SYNC_PROCESSES} processes × {M}",
                            {**base, "norm": "bn", "batch_size": m, "lr": lr_for(m),
                             "nproc": SYNC_PROCESSES, "sync_norms": True},
                            {"norm": SYNCED, "batch_size": M, "seed": base.get("seed", 0),
                             "processes": SYNC_PROCESSES}))
    return runs


def runs_dir_of(ctx) -> Path | None:
    """The runs dir the analysis reads (where the checkpoints are), None without a store."""
    store = getattr(ctx, "store", None)
    path = getattr(store, "path", None)
    return Path(path).parent if path is not None else None


def recollected_metrics(run, runs_dir: Path | None) -> dict[str, float] | None:
    """Test loss/accuracy of a finished BN run's final network after its running statistics are
    recollected over the training set (batches of the run's own size, a seeded shuffle, no
    augmentation). Kept in ``<runs_dir>/recollected/<run id>.json`` (a finished run's checkpoint
    never changes); None when the run has no checkpoint to read."""
    if runs_dir is None or run.id is None or run.status != "finished":
        return None
    cache = runs_dir / RECOLLECT_DIR / f"{run.id}.json"
    try:
        return json.loads(cache.read_text())
    except (OSError, ValueError):
        pass
    metrics = _recollect(run.id, run.record.get("config") or {}, runs_dir)
    if metrics is not None:
        try:
            cache.parent.mkdir(exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(metrics))
            tmp.replace(cache)
        except OSError:  # a read-only runs dir: the value is measured again next time
            pass
    return metrics


def _recollect(run_id: str, config: dict[str, Any], runs_dir: Path) -> dict[str, float] | None:
    try:
        model = load_model(run_id, runs_dir)
    except (FileNotFoundError, ValueError):
        return None
    prep = prepare({**config, "runs_dir": str(runs_dir), "probes": ()})
    generator = torch.Generator().manual_seed(derive_seed(prep.config.seed, "recollect"))
    inputs = (x for x, _ in batches(prep.data.x_train, prep.data.y_train, prep.batch_size,
                                    generator=generator, shuffle=True,
                                    drop_last=prep.drop_last))
    recollect_running_stats(model, inputs)
    return evaluate(model, prep.data, prep.loss_fn, prep.data.task == "classification")
