"""The public entry points: ``run(config) -> RunRecord`` and ``load_model(run_id)``.

One call validates the whole configuration and builds data, model and callbacks
(:mod:`bnlab.train.prepare`), derives the run id from everything that changes the result (the
config, the model's architecture, the callbacks that change training, the bnlab version), then
trains with :class:`bnlab.train.engine.Trainer`, recording everything in the run store
(``<runs_dir>/bnlab.db``) and checkpointing to ``<runs_dir>/checkpoints/<id>.pt``. Running the
same run again in the same ``runs_dir`` resumes it from its last checkpoint ("resuming <id> from
step 240 of 600"), or returns the ended record without training ("<id> already finished — stored
result; --force to retrain"); ``force=True`` deletes it and trains again.

Reproducibility: ``seed`` fixes initialization (global torch RNG, seeded right before the model is
built), data order and augmentation (one CPU ``torch.Generator``), and layer noise (each stochastic
layer's own generator, :func:`bnlab.norms.seed_layers`). A checkpoint holds every one of these
states, the optimizer state, the counters and the metric accumulators; a mid-epoch checkpoint
stores the data generator's state at the start of the epoch and the resumed run replays the
epoch's draws up to the checkpointed batch. Hence a resumed run ends bitwise equal to an
uninterrupted one on CPU.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from torch import nn

from bnlab import models
from bnlab.store import ReadOnlyStoreError, Store, StoreIntegrityError
from bnlab.callbacks import Callback
from bnlab.store.run_files import RunLock, checkpoint_path, remove_checkpoint_files
from bnlab.train.checkpoint import CheckpointCorruptError, load_checkpoint, repair_from_checkpoint
from bnlab.train.config import TrainConfig
from bnlab.train import distributed
from bnlab.train.engine import Trainer
from bnlab.train.interrupt import DeferredInterrupt
from bnlab.train.prepare import (
    ModelFactory,
    Prepared,
    build_model,
    derive_seed,
    identity_hash,
    parse_probe_spec,
    prepare,
    run_identity,
)
from bnlab.train.record import RunRecord, environment

_Trainer = Trainer  # the name before the split (tests patch it)

__all__ = [
    "Callback", "ModelFactory", "Prepared", "RunInterrupted", "RunRecord",
    "Trainer", "build_model", "derive_seed", "environment", "load_model", "parse_probe_spec",
    "prepare", "run",
]

ENDED = ("finished", "diverged")


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during training: the run is stored ``interrupted`` (with a checkpoint at
    the step it stopped); running it again resumes it. ``signum``: the signal (the CLI exits
    128 + it)."""

    def __init__(self, run_id: str, step: int, signum: int | None = None):
        self.run_id, self.step = run_id, step
        self.signum = int(signum or signal.SIGINT)
        name = signal.Signals(self.signum).name
        super().__init__(f"interrupted at step {step} — re-run the same command to resume "
                         f"({name}, run {run_id})" + _resume_command())


def _resume_command() -> str:
    """The command that resumes: this one, when it is the ``bnlab`` CLI."""
    program = Path(sys.argv[0])
    module = program.parent.name == "bnlab" and program.name in ("cli.py", "__main__.py")
    if program.name == "bnlab" or module:
        return ": " + shlex.join(["bnlab", *sys.argv[1:]])
    return ""


def _say(progress: Any, message: str) -> None:
    if progress is not False:
        print(message, file=sys.stderr, flush=True)


def run(
    config: TrainConfig | dict,
    *,
    callbacks: Iterable[Any] = (),
    progress: Any = None,
    model_factory: ModelFactory | None = None,
    force: bool = False,
) -> RunRecord | None:
    """Train one run (or resume it, or return it if it already ended) and return its record.
    (None on ranks > 0 of a data-parallel run: rank 0 stores the record.)

    ``config`` is a :class:`TrainConfig` or a dict of its keys. Every check happens before
    training, and before anything is stored: a bad config raises ``ValueError`` naming the problem
    and the valid choices. ``callbacks``: :class:`bnlab.callbacks.Callback` instances (probes
    included; a TypeError names any other object). ``model_factory(input_shape, num_outputs)``
    builds a custom model instead of ``bnlab.models.create`` (``config.model`` is then its label;
    the built module's architecture enters the run id). ``progress``: ``None`` = a tqdm bar when
    stderr is a terminal, else silent; ``"bar"``; ``"lines"``; ``False`` (also silences the
    resume/stored line).
    ``force=True`` deletes a stored run of this identity (record, metrics, checkpoints) and
    trains it again.

    A diverged run is a result (status ``diverged``), not an error. Ctrl-C stores the run
    ``interrupted`` and raises :class:`RunInterrupted`; any other exception marks it ``failed`` and
    is re-raised. Running the same run again resumes it from its last checkpoint.

    Ctrl-C and SIGTERM are deferred from the first line on (not only once training starts:
    building data, model and optimizer takes seconds): one during set-up stops the run before its
    first step, stored ``interrupted``; a second one during set-up raises
    :class:`~bnlab.train.interrupt.InterruptedBeforeTraining` (nothing stored yet).
    """
    # data-parallel ranks don't defer (bnlab.train.interrupt): they must stop together
    interrupt = DeferredInterrupt(enabled=distributed.current() is None)
    interrupt.setting_up = True
    with interrupt:
        return _run(config, list(callbacks), progress, model_factory, force, interrupt)


def _run(config: TrainConfig | dict, callbacks: list, progress: Any,
         model_factory: ModelFactory | None, force: bool,
         interrupt: DeferredInterrupt) -> RunRecord | None:
    prep = prepare(config, callbacks, model_factory)
    cfg = prep.config
    identity = run_identity(prep)
    run_id = identity_hash(identity)[:12]
    # --- data parallel: ranks > 0 train in step with rank 0, store nothing
    if distributed.is_follower():
        distributed.follow(prep, run_id)
        return None
    runs_dir = Path(cfg.runs_dir)
    store = Store(runs_dir / "bnlab.db")
    try:
        existing = _existing(store, runs_dir, run_id, force, progress)
        if existing is not None and existing["id"] != run_id:
            existing = None  # a longer id with this prefix: not this run
        if force:
            _delete(store, runs_dir, run_id, existing)
        elif existing is not None and existing["status"] in ENDED:
            record = RunRecord.from_store(existing)
            record.message = (f"{run_id} already {existing['status']} — stored result; "
                              "--force to retrain")
            _say(progress, record.message)
            distributed.announce(False, run_id)  # data parallel: the other ranks stop too
            return record
        if store.readonly:
            raise ReadOnlyStoreError(
                f"runs dir {runs_dir} is read-only (store {store.path}); run {run_id} is not "
                "finished there, so it cannot be trained or resumed in it: pass another "
                "--runs-dir (a writable copy of this one resumes from its checkpoints)")
        with RunLock(checkpoint_path(runs_dir, run_id).with_suffix(".lock")):
            distributed.announce(True, run_id)  # data parallel: the other ranks train with this one
            return _train(prep, store, run_id, identity, progress, interrupt)
    finally:
        store.close()


def _existing(store: Store, runs_dir: Path, run_id: str, force: bool, progress: Any) -> dict | None:
    """The stored run of this id, verified. A damaged finished record (``force`` aside) is
    rebuilt from the run's final checkpoint, saying so; one that cannot be is the error naming
    the way out."""
    try:
        return store.get_run(run_id)
    except StoreIntegrityError as err:
        if force:
            return store.get_run(run_id, verify=False)
        try:
            row = repair_from_checkpoint(store, runs_dir, run_id)
        except (StoreIntegrityError, CheckpointCorruptError) as why:
            raise StoreIntegrityError(f"{err} ({why})") from None
        _say(progress, f"{run_id}: its stored record in {store.path} was damaged; re-created its "
                       "config, final metrics and metric rows from its final checkpoint")
        return row


def _delete(store: Store, runs_dir: Path, run_id: str, existing: dict | None) -> None:
    """``force``: remove the stored run and its checkpoints (or a checkpoint without a record)."""
    if existing is not None:
        store.delete_run(run_id)
        return
    remove_checkpoint_files(runs_dir, run_id)


def _train(prep: Prepared, store: Store, run_id: str, identity: dict, progress: Any,
           interrupt: DeferredInterrupt) -> RunRecord:
    cfg = prep.config
    # data parallel
    trainer = (distributed.DataParallelTrainer if distributed.current() else Trainer)(
        prep, store, run_id, progress, prep.callbacks)
    if interrupt.installed:  # the one installed before set-up: a signal there is already counted
        trainer.interrupt = interrupt
    trainer.setup()  # reads the checkpoint and detects scale invariance; stores nothing
    env = {**environment(prep.device), "identity": _brief_identity(identity)}
    store.create_run(run_id, cfg.to_dict(), config_hash=cfg.config_hash(), env=env)
    trainer.truncate_store()
    if trainer.rows.recreated:
        lost = trainer.rows.recreated
        _say(progress, f"the store had lost the rows of {len(lost)} steps up to the checkpoint "
                       f"({lost[0]}..{lost[-1]}); re-created them from the checkpoint")
    resumed = trainer.checkpoints.resumed_from
    if resumed is not None and trainer.checkpoints.final is None:
        _say(progress, f"resuming {run_id} from step {resumed} of {trainer.total_steps}")
    base_summary = {"scale_invariant": trainer.scale_invariant,
                    "checkpoint": str(trainer.checkpoints.path)}
    store.set_status(run_id, "running", steps=trainer.step, env=env, summary=base_summary)
    # signals deferred to a step boundary; ignored while the end is recorded
    interrupt.setting_up = False  # stored: from here a signal ends the run `interrupted`
    with trainer.interrupt:
        return _train_and_record(trainer, store, run_id, base_summary)


def _train_and_record(trainer: Trainer, store: Store, run_id: str, base_summary: dict) -> RunRecord:
    try:
        status, metrics = trainer.train()
    except BaseException as err:
        trainer.interrupt.hold()
        interrupted = isinstance(err, KeyboardInterrupt)
        status = "interrupted" if interrupted else "failed"
        try:
            trainer.flush()
            trainer.loop.end(status)
        finally:
            error = (f"interrupted at step {trainer.step}" if interrupted
                     else f"{type(err).__name__}: {err}")
            store.set_status(run_id, status, steps=trainer.step, error=error, summary=base_summary)
        if interrupted:
            raise RunInterrupted(run_id, trainer.step, trainer.interrupt.signum) from None
        try:  # lets a caller find the stored record of the failed run
            setattr(err, "bnlab_run_id", run_id)
        except AttributeError:  # pragma: no cover - exceptions with __slots__
            pass
        raise
    trainer.interrupt.hold()
    trainer.loop.end(status)
    checkpoint = str(trainer.checkpoints.path) if status == "finished" else None
    summary = {"metrics": metrics, "scale_invariant": trainer.scale_invariant,
               "checkpoint": checkpoint}
    reason = getattr(trainer, "divergence_reason", None) if status == "diverged" else None
    # sealed with the rows the trainer kept in memory (the store is made to hold exactly those)
    store.set_status(run_id, status, steps=trainer.step, error=reason, summary=summary,
                     rows=trainer.rows.kept)
    row = store.get_run(run_id)
    if row is None:  # deleted by another process since set_status
        raise RuntimeError(f"run {run_id} is no longer in the store (deleted while it trained)")
    record = RunRecord.from_store(row)
    record.resumed_from = trainer.checkpoints.resumed_from
    record.origin = "resumed" if trainer.checkpoints.resumed_from is not None else "trained"
    return record


def _brief_identity(identity: dict) -> dict:
    """What the stored config row says about the identity beyond the config keys."""
    return {"model": identity["model"][:16], "callbacks": identity["callbacks"],
            "bnlab": identity["bnlab"]}


def load_model(
    run_id: str,
    runs_dir: str | os.PathLike[str] = "runs",
    *,
    device: str = "cpu",
    model_factory: ModelFactory | None = None,
) -> nn.Module:
    """Rebuild a run's model and load the weights of its last checkpoint (eval mode).

    A run trained with ``model_factory`` needs the same factory here (the store holds its
    weights, not its code): ``load_model(run_id, runs_dir, model_factory=factory)``.
    """
    path = checkpoint_path(runs_dir, run_id)
    ckpt = load_checkpoint(path, map_location=device)
    if ckpt is None:
        raise FileNotFoundError(f"no checkpoint for run {run_id!r} at {path}")
    cfg = TrainConfig.from_dict(ckpt["config"])
    spec = ckpt["model_spec"]
    custom = spec.get("model_factory")
    if custom is None:  # a checkpoint from before the flag: a label the registry does not know
        custom = cfg.model not in models.MODELS
    if model_factory is None and custom:
        raise ValueError(
            f"run {run_id} was trained with a model_factory (model label {cfg.model!r}); its code "
            f"is not stored, so pass the same factory: load_model({run_id!r}, {str(runs_dir)!r}, "
            "model_factory=your_factory)"
        )
    model = build_model(cfg, spec["input_shape"], spec["num_classes"], model_factory)
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval()
