"""The engine: the training loop of one prepared run, its checkpoints and its divergence checks.

Speed: the step does no host synchronisation. The loss of every step and the epoch
accumulators stay on the device; logged values are kept as device tensors and read (one
``tolist`` for all of them) every ``check_every`` steps, at checkpoints and at the end, where
the losses of the window and every parameter and floating buffer are also checked for
divergence. Module lists (layers that follow the learning rate, regularizers, noise generators,
the tensors checked for finiteness) are built once, not walked per step.

Divergence is data: a run whose loss turns non-finite or exceeds ``divergence_factor`` × its
first loss, or whose parameters or buffers (BN running statistics) turn non-finite, ends with
status ``diverged``; ``diverged_step`` is the first offending step within the checked window
(for a non-finite parameter or buffer with finite losses, the step of the check), and the run
stops at the check that found it (at most ``check_every - 1`` steps later).

State has one owner each: the :class:`~bnlab.train.window.MetricWindow` (the steps' values since
the last read, the epoch sums, the first and last loss), :class:`~bnlab.train.record.MetricRows`
(rows on their way to the store), :class:`~bnlab.train.resume.Checkpoints` (the file, its cadence,
what was resumed) and :class:`~bnlab.train.progress.Progress` (what stderr shows); the trainer
owns the step, the model, the optimizer and the random streams, and calls the others' methods.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from bnlab.data import batches
from bnlab.norms import compiled_steps, regularization_loss
from bnlab.store import Store
from bnlab.callbacks import CallbackList
from bnlab.train.callbacks import TrainLoop
from bnlab.store.run_files import checkpoint_path
from bnlab.train.divergence import Divergence, check_state, scan_losses, state_tensors
from bnlab.train.health import check_final, check_variances, variance_buffers
from bnlab.train.interrupt import DeferredInterrupt
from bnlab.train.optim import Projection, build_optimizer, find_scale_invariant, set_lr_factor
from bnlab.train.prepare import Prepared, derive_seed
from bnlab.train.progress import Progress
from bnlab.train.record import MetricRows, evaluate
from bnlab.train.resume import Checkpoints, checkpoint_state, restore_state
from bnlab.train.schedules import parse_schedule
from bnlab.train.window import MetricWindow

DETECTION_BATCH = 256  # samples of the fixed batch used to test scale invariance
CHECK_EVERY = 50  # default steps between reads of the device values (no host sync in between)
MAX_WINDOW = 1000


class Trainer:
    """Trains one prepared run; ``run`` creates it. Exposes ``config``, ``run_id``, ``model``,
    ``optimizer``, ``step`` (steps taken), ``total_steps``, ``data``, ``scale_invariant``."""

    # Ctrl-C stops the run at the next step boundary (bnlab.train.interrupt)
    defer_interrupts = True

    def __init__(self, prep: Prepared, store: Store, run_id: str, progress: Any,
                 callbacks: list[Any]):
        self.prep = prep
        self.config = cfg = prep.config
        self.store = store
        self.run_id = run_id
        self.model = prep.model
        self.model_spec = prep.model_spec
        self.data = prep.data
        self.loss_fn = prep.loss_fn
        self.device = prep.device
        self.total_steps = prep.total_steps
        self.spe = prep.steps_per_epoch
        self.callbacks = CallbackList(callbacks)
        self.schedule = parse_schedule(cfg.schedule)
        self.classification = self.data.task == "classification"
        log_every = cfg.log_every or (1 if self.total_steps <= 20000 else self.total_steps // 10000)
        # at most MAX_WINDOW steps' values wait on the device (a huge log_every must not hoard them)
        self.check_every = min(cfg.log_every or CHECK_EVERY, MAX_WINDOW)
        self.window = MetricWindow(steps_per_epoch=self.spe, log_every=log_every,
                                   total_steps=self.total_steps, classification=self.classification)
        self.rows = MetricRows(store, run_id)
        self.checkpoints = Checkpoints(checkpoint_path(cfg.runs_dir, run_id), cfg.checkpoint_every,
                                       self.spe)
        if cfg.eval_every is not None:
            self.eval_every = cfg.eval_every
        else:  # every epoch, but at most ~100 evaluations per run
            self.eval_every = self.spe * max(1, -(-prep.total_epochs // 100))
        self.progress_mode = progress  # Progress's mode (None, "bar", "lines", False)
        self.step = 0
        self.data_gen = torch.Generator(device="cpu")
        self.data_gen.manual_seed(derive_seed(cfg.seed, "data-order"))
        self.epoch_start_state = self.data_gen.get_state()
        self.scale_invariant: dict[str, str] = {}
        self.optimizer: torch.optim.Optimizer | None = None
        self.projection: Projection | None = None
        self.interrupt = DeferredInterrupt(enabled=self.defer_interrupts)
        self.loop = TrainLoop(self, self.callbacks)  # what the hooks receive (bnlab.callbacks.Loop)
        self._build_module_lists()

    # -- module lists, built once ----------------------------------------------------------------

    def _build_module_lists(self) -> None:
        modules = list(self.model.modules())
        # duck-typed: any layer with set_progress(lr=, epoch=, epochs=) (CBN, MBN, a user's own)
        self.progress_layers: list[Any] = [m for m in modules
                                           if callable(getattr(m, "set_progress", None))]
        # regularization_loss is 0.0 (a float) when no layer has a regularizer: skip it per step
        has_regularizer = torch.is_tensor(regularization_loss(self.model))
        self.regularizer = regularization_loss if has_regularizer else None
        self.state_tensors = state_tensors(self.model)
        self.variances = variance_buffers(self.model)
        self.noise_layers = []
        for name, module in self.model.named_modules():
            if hasattr(module, "generator_for"):
                self.noise_layers.append((name, module.generator_for(self.device)))
            elif isinstance(getattr(module, "generator", None), torch.Generator):
                self.noise_layers.append((name, module.generator))
        self.forward = torch.compile(self.model) if self.config.compile else self.model
        self._progress_key: tuple | None = None
        self._lr_factor: float | None = None

    # -- metrics ---------------------------------------------------------------------------------

    def log(self, name: str, value: Any, step: int, divisor: float = 1.0) -> None:
        """Record ``value`` (a number or a 0-d device tensor, read at the next check) at
        ``step``."""
        self.rows.log(name, value, step, divisor)

    def _read_pending(self) -> None:
        """Read the window and every pending device value; hand the rows to on_log."""
        rows = self.rows.read(self.window.read(self.step))
        if not rows:
            return
        if self.callbacks.has("on_log"):
            by_step: dict[int, dict[str, float]] = {}
            for step, name, value in rows:
                by_step.setdefault(step, {})[name] = value
            for step, metrics in by_step.items():
                self.callbacks.call("on_log", self.loop, step, metrics)
        if self.rows.write_due():
            self.flush()

    def flush(self) -> None:
        """Read pending values and write every buffered row to the store."""
        self._read_pending()
        self.rows.write()

    # -- divergence ------------------------------------------------------------------------------

    def check(self) -> None:
        """Read the steps since the last check and pending values; raise :class:`Divergence` if
        one of those losses, or a parameter or buffer now, says the run diverged."""
        self._read_pending()
        for first, losses in self.window.take_unscanned():
            scan_losses(losses, first, self.window.start_loss, self.config.divergence_factor)
        check_state(self.state_tensors, self.step, self.window.last_loss)
        check_variances(self.variances, self.step, self.window.last_loss)

    # -- setup -----------------------------------------------------------------------------------

    def setup(self) -> None:
        """Load the checkpoint (if any), find scale-invariant weights, build the optimizer. Writes
        nothing to the store: an error here leaves no record."""
        ckpt = self.checkpoints.load(self.run_id)
        cfg = self.config
        if ckpt is not None:
            self.scale_invariant = dict(ckpt["scale_invariant"])
        elif self.prep.scale_invariant is not None:
            self.scale_invariant = dict(self.prep.scale_invariant)
        else:
            n = min(DETECTION_BATCH, self.data.n_train)
            batch = (self.data.x_train[:n], self.data.y_train[:n])
            # The detection's forward passes are training-mode passes: layers that need progress
            # (CBN's AMAT, MBN's λ) get the run's first values instead of warning they have none.
            self._tell_progress(cfg.lr, 0)
            self.scale_invariant = find_scale_invariant(
                self.model, self.loss_fn, batch, seed=derive_seed(cfg.seed, "detection")
            )
        self.optimizer = build_optimizer(
            self.model,
            self.scale_invariant,
            lr=cfg.lr,
            lr_scale_invariant=cfg.lr_scale_invariant,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
        )
        if cfg.optimizer == "psgd":
            self.projection = Projection(self.model, self.scale_invariant)
        if ckpt is not None:
            restore_state(self, ckpt)

    def truncate_store(self) -> None:
        """Whatever a previous attempt logged after its last checkpoint is replayed, so drop it.
        Rows up to the checkpoint that the store lost are re-created from those it carries
        (``rows.recreated``: the steps that were missing)."""
        self.rows.truncate(self.checkpoints.loaded)

    # -- checkpoints -----------------------------------------------------------------------------

    def _checkpoint_due(self) -> bool:
        return self.checkpoints.due(self.step)

    def checkpoint(self, *, final_summary: dict[str, Any] | None = None) -> None:
        self.flush()  # the store then holds every row up to this step, and none beyond it
        self.checkpoints.save(checkpoint_state(self, final_summary))

    # -- evaluation --------------------------------------------------------------------------------

    def evaluate(self) -> dict[str, float]:
        """Loss (and accuracy) on the test split in eval mode (:func:`evaluate`)."""
        return evaluate(self.model, self.data, self.loss_fn, self.classification)

    # -- the step --------------------------------------------------------------------------------

    def step_once(self, xb: torch.Tensor, yb: torch.Tensor, epoch: int) -> float:
        """One SGD step (no host sync); returns the learning rate used."""
        optimizer = self.optimizer
        if optimizer is None:
            raise RuntimeError("step_once needs the optimizer: call setup() first")
        factor = self.schedule(self.step, epoch)
        if factor != self._lr_factor:
            set_lr_factor(optimizer, factor)
            self._lr_factor = factor
        lr = self.config.lr * factor
        number = self.step + 1
        self._tell_progress(lr, epoch)
        out = self.forward(xb)
        loss = self.loss_fn(out, yb)
        objective = loss + self.regularizer(self.model) if self.regularizer is not None else loss
        optimizer.zero_grad(set_to_none=True)
        # the hooks of bnlab.callbacks, in Lightning's order
        hooks, loop = self.callbacks, self.loop
        loop.step, loop.batch, loop.lr, loop.loss = number, (xb, yb), lr, loss
        hooks.call("on_before_backward", loop)
        objective.backward()
        hooks.call("on_after_backward", loop)
        hooks.call("on_before_optimizer_step", loop)
        optimizer.step()
        if self.projection is not None:
            self.projection.project()
        self.step = number
        value = loss.detach()
        # argmax has no gradient: no graph is built
        correct = (out.argmax(dim=1) == yb).sum() if self.classification else None
        self.window.push(value, int(yb.shape[0]), correct)
        loop.loss = value
        hooks.call("on_train_batch_end", loop)
        return lr

    # -- the loop --------------------------------------------------------------------------------

    def _tell_progress(self, lr: float, epoch: int) -> None:
        """Give the layers that need it (CBN's AMAT, MBN's λ) the lr and 1-based epoch, on
        change."""
        if self.progress_layers and (lr, epoch) != self._progress_key:
            for layer in self.progress_layers:
                layer.set_progress(lr=lr, epoch=epoch + 1, epochs=self.prep.total_epochs)
            self._progress_key = (lr, epoch)

    def train(self) -> tuple[str, dict[str, Any]]:
        """Train to ``total_steps`` (or divergence); returns ``(status, final metrics)``."""
        self.loop.start()
        progress = Progress(self.progress_mode, run_id=self.run_id,
                            label=f"{self.config.model}/{self.config.norm}", start_step=self.step,
                            total_steps=self.total_steps, total_epochs=self.prep.total_epochs)
        divergence: Divergence | None = None
        self.model.train()
        # on: the layers' compiled steps (off: whatever the process set, BNLAB_COMPILED_STEPS)
        steps = compiled_steps() if self.config.compiled_steps else contextlib.nullcontext()
        with self.interrupt as interrupt, steps:  # the loop enters interrupt first (the ending)
            interrupt.raise_if_requested()  # a signal during set-up: stored, stopped at this step
            try:
                while self.step < self.total_steps and self.checkpoints.final is None:
                    epoch, skip = divmod(self.step, self.spe)  # 0-based epoch
                    if skip == 0:
                        self.epoch_start_state = self.data_gen.get_state()
                    epoch_batches = batches(
                        self.data.x_train, self.data.y_train, self.prep.batch_size,
                        generator=self.data_gen, shuffle=True, drop_last=self.prep.drop_last,
                        augment=self.prep.augment,
                    )
                    for _ in range(skip):  # replay the draws of batches taken before the checkpoint
                        next(epoch_batches)
                    for xb, yb in epoch_batches:
                        lr = self.step_once(xb, yb, epoch)
                        self._after_step(epoch, lr, progress)
                        if interrupt.requested:  # Ctrl-C or SIGTERM: stop here, with a checkpoint
                            self.check()
                            self.checkpoint()
                            interrupt.raise_if_requested()
                        if self.step == self.total_steps:
                            break
            except Divergence as found:
                divergence = found
        progress.close(self.step)
        final = self.checkpoints.final
        if final is not None:  # killed after the final checkpoint, before the status update
            return final["status"], final["metrics"]
        if divergence is None:
            try:
                self.check()
            except Divergence as found:
                divergence = found
        return self._finish(divergence)

    def _after_step(self, epoch: int, lr: float, progress: Progress) -> None:
        epoch_end = self.step % self.spe == 0 or self.step == self.total_steps
        if epoch_end:
            self.log("lr", lr, self.step)
        # A progress line or the run's last step reads the losses (one sync), so what is shown is
        # this step's loss, never a stale or not-yet-read (nan) one.
        if (self.step % self.check_every == 0 or self.step == self.total_steps
                or progress.line_due(self.step, epoch_end)):
            self.check()
        last_eval = {}
        if self.step % self.eval_every == 0 and self.step < self.total_steps:
            last_eval = self.evaluate()
            for name, value in last_eval.items():
                self.log(name, value, self.step)
        if epoch_end:
            self.callbacks.call("on_train_epoch_end", self.loop, epoch + 1)
        progress.update(self.step, self.window.last_loss, epoch, epoch_end, last_eval)
        if self.step < self.total_steps and self._checkpoint_due():
            self.check()  # never checkpoint a diverged state
            self.checkpoint()

    def _finish(self, divergence: Divergence | None) -> tuple[str, dict[str, Any]]:
        metrics: dict[str, Any] = self.window.epoch_means()
        status = "finished"
        final_eval = self.evaluate()
        if divergence is None:  # finished means healthy: the final evaluation within the bound too
            try:
                check_final(final_eval, self.step, self.window.last_loss, self.window.start_loss,
                            self.config.divergence_factor)
            except Divergence as found:
                divergence = found
        if divergence is not None:
            status = "diverged"
            metrics["train_loss"] = divergence.loss
            metrics["diverged_step"] = divergence.step
            metrics["diverged_loss"] = divergence.loss
            self.divergence_reason = divergence.reason
            self.log("diverged_step", divergence.step, self.step)
        metrics.update(final_eval)
        for name, value in final_eval.items():
            self.log(name, value, self.step)
        metrics["epochs"] = self.step / self.spe
        summary = {"status": status, "metrics": metrics}
        if status == "finished":
            self.checkpoint(final_summary=summary)
        self.flush()
        return status, metrics
