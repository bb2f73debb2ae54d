"""The training engine: ``run(config) -> RunRecord``.

One call validates the whole configuration, loads the data onto the device, builds the model,
finds the scale-invariant weights, and trains with SGD / projected SGD under a learning-rate
schedule, recording everything in the run store (``<runs_dir>/bnlab.db``) and checkpointing to
``<runs_dir>/checkpoints/<id>.pt``. The run id is a prefix of the hash of the config (minus
cosmetic keys), so running the same config again in the same ``runs_dir`` resumes from the last
checkpoint, or returns the finished record without training.

Reproducibility: ``seed`` fixes initialization (global torch RNG, seeded right before the model is
built), data order and augmentation (one CPU ``torch.Generator``), and layer noise (each stochastic
layer's own generator, :func:`bnlab.norms.seed_layers`). A checkpoint holds every one of these
states, the optimizer state, the counters and the metric accumulators; a mid-epoch checkpoint
stores the data generator's state at the start of the epoch and the resumed run replays the
epoch's draws up to the checkpointed batch. Hence a resumed run ends bitwise equal to an
uninterrupted one on CPU.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bnlab.store import Store, dumps
from bnlab.train.checkpoint import checkpoint_path, load_checkpoint, save_checkpoint
from bnlab.train.config import TrainConfig, validate_static
from bnlab.train.optim import (
    Projection,
    build_optimizer,
    find_scale_invariant,
    resolve_override,
    set_lr_factor,
)
from bnlab.train.schedules import parse_schedule

DETECTION_BATCH = 256  # samples of the fixed batch used to test scale invariance
EVAL_CHUNK = 1024
CHECKPOINT_SECONDS = 30.0  # default cadence: first epoch end after this much time
_FLUSH_ROWS = 5000


# --------------------------------------------------------------------------------------------
# records and callback context
# --------------------------------------------------------------------------------------------


@dataclass
class RunRecord:
    """The outcome of a run, as stored and as printed by ``bnlab train --json``.

    ``status`` is ``finished``, ``diverged``, ``failed`` (or ``running`` for a record read while a
    run is in progress); ``metrics`` holds the final ``train_loss`` (mean over the last epoch's
    batches), ``train_accuracy``, ``test_loss``/``test_accuracy`` where the data has a test split,
    and ``diverged_step`` for a diverged run.
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


class StepContext:
    """What a callback sees. Attributes are refreshed before every hook call.

    ``model``, ``optimizer``, ``loss_fn`` (``loss_fn(output, target)``, the mean training loss),
    ``batch`` (``(xb, yb)`` of the current step), ``step`` (1-based number of the step in progress;
    the resumed step count in ``on_start``), ``epoch`` (1-based), ``lr`` (current rate of the
    scale-variant group), ``loss`` (this step's loss tensor), ``config``, ``run_id``, ``data``,
    ``scale_invariant`` (``{name: granularity}``), ``total_steps``; ``log(name, value)`` records a
    metric for this run at ``step``.
    """

    def __init__(self, trainer: _Trainer):
        self._trainer = trainer
        self.model = trainer.model
        self.optimizer = trainer.optimizer
        self.loss_fn = trainer.loss_fn
        self.config = trainer.config
        self.run_id = trainer.run_id
        self.data = trainer.data
        self.scale_invariant = trainer.scale_invariant
        self.total_steps = trainer.total_steps
        self.batch: tuple[torch.Tensor, torch.Tensor] | None = None
        self.loss: torch.Tensor | None = None
        self.step = trainer.step
        self.epoch = 1
        self.lr = trainer.config.lr

    def log(self, name: str, value: Any) -> None:
        self._trainer.log(name, value, self.step)


def _call(callbacks: Sequence[Any], hook: str, ctx: StepContext) -> None:
    for cb in callbacks:
        method = getattr(cb, hook, None)
        if method is not None:
            method(ctx)


# --------------------------------------------------------------------------------------------
# preparation: everything that can fail before training starts
# --------------------------------------------------------------------------------------------


def derive_seed(seed: int, stream: str) -> int:
    """Independent 31-bit seeds for the random streams of one run, all fixed by ``seed``."""
    digest = hashlib.sha256(f"bnlab:{seed}:{stream}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def _loss_for(task: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    # Regression: mean squared error over all outputs. Santurkar's DLN minimises
    # ||W_1...W_k x - A x||^2 per sample; the mean over the d=10 outputs only rescales the
    # learning rate by d, which we state rather than hide (docs/readme/train.md).
    return F.cross_entropy if task == "classification" else F.mse_loss


def _resolve_device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"invalid device {name!r}; valid: cpu, cuda, cuda:N, mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available here; use device cpu")
    if device.type == "cuda" and device.index is None:
        # "cuda" and "cuda:0" compare unequal; layers compare generator devices, so be explicit
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {name!r} requested but MPS is not available here; use device cpu")
    return device


@dataclass
class Prepared:
    config: TrainConfig
    device: torch.device
    data: Any
    model: nn.Module
    model_spec: dict[str, Any]
    loss_fn: Callable
    batch_size: int
    drop_last: bool
    steps_per_epoch: int
    total_steps: int
    total_epochs: int
    augment: Callable | None
    callbacks: list[Any]


ModelFactory = Callable[[tuple, int], nn.Module]


def build_model(
    config: TrainConfig, input_shape: Sequence[int], num_outputs: int, model_factory: ModelFactory | None = None
) -> nn.Module:
    """The model of ``config`` with its initialization fixed by ``config.seed`` (on the CPU).

    ``model_factory(input_shape, num_outputs)`` replaces ``bnlab.models.create`` (custom models;
    ``config.model`` is then only a label, and part of the run id).
    """
    torch.manual_seed(config.seed)
    if model_factory is not None:
        model = model_factory(tuple(input_shape), int(num_outputs))
    else:
        model = _create_model(config, input_shape, num_outputs)
    try:
        from bnlab.norms import seed_layers
    except ImportError:  # pragma: no cover
        seed_layers = None
    if seed_layers is not None:
        seed_layers(model, derive_seed(config.seed, "layer-noise"))
    return model


def _create_model(config: TrainConfig, input_shape: Sequence[int], num_outputs: int) -> nn.Module:
    from bnlab import models

    try:
        return models.create(
            config.model,
            norm=config.norm,
            activation=config.activation,
            placement=config.placement,
            input_shape=tuple(input_shape),
            num_classes=int(num_outputs),
            **config.model_options,
        )
    except TypeError as err:
        raise ValueError(f"model {config.model!r} rejected its options: {err}") from None


def prepare(
    config: TrainConfig | dict, callbacks: Iterable[Any] = (), model_factory: ModelFactory | None = None
) -> Prepared:
    """Validate ``config`` completely and build data, model and callbacks; ``ValueError`` if bad."""
    from bnlab import data as data_mod

    cfg = validate_static(TrainConfig.coerce(config), check_model=model_factory is None)
    device = _resolve_device(cfg.device)
    options = dict(cfg.data_options)
    data_seed = options.pop("seed", cfg.seed)
    ds = data_mod.load(
        cfg.data,
        device=device,
        seed=data_seed,
        data_dir=cfg.data_dir,
        verify=cfg.verify,
        download=cfg.download,
        **options,
    )
    n = ds.n_train
    if cfg.batch_size == "full":
        batch_size = n
    else:
        if cfg.batch_size > n:
            raise ValueError(
                f"batch_size {cfg.batch_size} is larger than the training set of {cfg.data!r} "
                f"({n} samples); use at most {n}, or batch_size full"
            )
        batch_size = int(cfg.batch_size)
    # A final batch of a single sample has no batch statistics (BN would divide by zero), so it
    # is dropped in that one case; otherwise every sample is used every epoch.
    drop_last = batch_size < n and n % batch_size == 1
    steps_per_epoch = n // batch_size if drop_last else -(-n // batch_size)
    total_steps = cfg.steps if cfg.steps is not None else cfg.epochs * steps_per_epoch
    total_epochs = -(-total_steps // steps_per_epoch)

    augment = None
    if cfg.augment:
        if len(ds.input_shape) != 3:
            raise ValueError(
                f"augment needs image data (C, H, W); {cfg.data!r} has input shape {ds.input_shape}"
            )
        augment = data_mod.cifar_augment

    model = build_model(cfg, ds.input_shape, ds.num_outputs, model_factory).to(device)
    loss_fn = _loss_for(ds.task)
    _check_forward(cfg, model, ds, loss_fn)

    cbs = list(callbacks)
    if cfg.probes:
        try:
            from bnlab import probes
        except ImportError:
            probes = None
        if probes is None or not hasattr(probes, "create"):
            raise ValueError("probes need bnlab.probes.create, which is not available in this install")
        for spec in cfg.probes:
            name, options = parse_probe_spec(spec)
            cbs.append(probes.create(name, every=options.pop("every", cfg.probe_every), **options))

    return Prepared(
        config=cfg,
        device=device,
        data=ds,
        model=model,
        model_spec={"input_shape": list(ds.input_shape), "num_classes": int(ds.num_outputs), "task": ds.task},
        loss_fn=loss_fn,
        batch_size=batch_size,
        drop_last=drop_last,
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        total_epochs=total_epochs,
        augment=augment,
        callbacks=cbs,
    )


def parse_probe_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"landscape(num=8, lo=0.5)"`` -> ``("landscape", {"num": 8, "lo": 0.5})``.

    Values are Python literals (numbers, strings, tuples, True/False; ``true``/``false``/``inf`` too).
    ``every=N`` overrides ``--probe-every`` for that probe.
    """
    import ast

    from bnlab.norms.registry import parse_spec

    name, raw = parse_spec(spec)
    options: dict[str, Any] = {}
    for key, text in raw.items():
        low = text.lower()
        if low in ("true", "false"):
            options[key] = low == "true"
        elif low in ("inf", "+inf", "-inf"):
            options[key] = float(low)
        else:
            try:
                options[key] = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                options[key] = text.strip("'\"")
    return name, options


def _check_forward(cfg: TrainConfig, model: nn.Module, ds: Any, loss_fn: Callable) -> None:
    """A model that does not fit the data fails here, with both shapes named, not at step 1."""
    probe = copy.deepcopy(model).eval()
    xb, yb = ds.x_train[:2], ds.y_train[:2]
    try:
        with torch.no_grad():
            out = probe(xb)
            loss_fn(out, yb)
    except (RuntimeError, ValueError, IndexError) as err:
        raise ValueError(
            f"model {cfg.model!r} does not fit data {cfg.data!r} (input shape {ds.input_shape}, "
            f"{ds.num_outputs} outputs, task {ds.task}): {err}"
        ) from None


# --------------------------------------------------------------------------------------------
# environment
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# the trainer
# --------------------------------------------------------------------------------------------


class RunLockedError(RuntimeError):
    """Another process is training this run right now."""


class _RunLock:
    """An advisory lock so two processes never train the same run at once (freed on SIGKILL)."""

    def __init__(self, path: Path):
        self.path = path
        self.handle = None

    def __enter__(self) -> _RunLock:
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


def _is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class _Trainer:
    def __init__(self, prep: Prepared, store: Store, run_id: str, progress: Any):
        self.prep = prep
        self.config = cfg = prep.config
        self.store = store
        self.run_id = run_id
        self.model = prep.model
        self.data = prep.data
        self.loss_fn = prep.loss_fn
        self.callbacks = prep.callbacks
        self.device = prep.device
        self.total_steps = prep.total_steps
        self.spe = prep.steps_per_epoch
        self.schedule = parse_schedule(cfg.schedule)
        self.classification = self.data.task == "classification"
        self.log_every = cfg.log_every or (1 if self.total_steps <= 20000 else self.total_steps // 10000)
        # Default: at epoch ends, but at most every CHECKPOINT_SECONDS of wall time (a full-batch
        # run has an "epoch" per step). Where checkpoints fall never changes the result.
        self.checkpoint_every = cfg.checkpoint_every
        self.last_checkpoint_time = time.monotonic()
        if cfg.eval_every is not None:
            self.eval_every = cfg.eval_every
        else:  # every epoch, but at most ~100 evaluations per run
            self.eval_every = self.spe * max(1, -(-prep.total_epochs // 100))
        self.ckpt_path = checkpoint_path(cfg.runs_dir, run_id)
        self.progress_mode = progress
        self.buffer: list[tuple[int, str, float]] = []
        self.step = 0
        self.data_gen = torch.Generator(device="cpu")
        self.data_gen.manual_seed(derive_seed(cfg.seed, "data-order"))
        self.epoch_start_state = self.data_gen.get_state()
        self.acc = {"loss_sum": 0.0, "correct": 0, "count": 0, "batches": 0}
        self.last_loss = math.nan
        self.resumed_from: int | None = None
        self.scale_invariant: dict[str, str] = {}
        self.optimizer: torch.optim.Optimizer | None = None
        self.projection: Projection | None = None
        self.final: dict[str, Any] | None = None

    # -- metrics -------------------------------------------------------------------------------

    def log(self, name: str, value: Any, step: int) -> None:
        if isinstance(value, torch.Tensor):
            value = value.detach().float().item()
        self.buffer.append((int(step), str(name), float(value)))
        if len(self.buffer) >= _FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            rows, self.buffer = self.buffer, []
            self.store.log_rows(self.run_id, rows)

    # -- setup ---------------------------------------------------------------------------------

    def _noise_layers(self) -> list[tuple[str, Any]]:
        out = []
        for name, module in self.model.named_modules():
            if hasattr(module, "generator_for"):
                out.append((name, module.generator_for(self.device)))
            elif isinstance(getattr(module, "generator", None), torch.Generator):
                out.append((name, module.generator))
        return out

    def setup(self) -> None:
        ckpt = load_checkpoint(self.ckpt_path, map_location="cpu")
        if ckpt is not None and ckpt.get("run_id") != self.run_id:
            raise ValueError(f"checkpoint {self.ckpt_path} belongs to run {ckpt.get('run_id')!r}")
        cfg = self.config
        if ckpt is None:
            if cfg.scale_invariant is not None:
                self.scale_invariant = resolve_override(self.model, cfg.scale_invariant)
            else:
                n = min(DETECTION_BATCH, self.data.n_train)
                batch = (self.data.x_train[:n], self.data.y_train[:n])
                self.scale_invariant = find_scale_invariant(
                    self.model, self.loss_fn, batch, seed=derive_seed(cfg.seed, "detection")
                )
        else:
            self.scale_invariant = dict(ckpt["scale_invariant"])
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
        # Whatever a previous attempt logged after its last checkpoint is replayed, so drop it.
        self.store.delete_metrics_after(self.run_id, ckpt["step"] if ckpt else -1)
        if ckpt is not None:
            self._restore(ckpt)

    def _restore(self, ckpt: dict[str, Any]) -> None:
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        if self.projection is not None:
            self.projection.load_state_dict(ckpt["projection"])
        torch.set_rng_state(ckpt["torch_rng"])
        if self.device.type == "cuda" and ckpt.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(ckpt["cuda_rng"], self.device)
        self.data_gen.set_state(ckpt["data_generator"])
        self.epoch_start_state = ckpt["data_generator"]
        noise = ckpt.get("noise_generators", {})
        for name, gen in self._noise_layers():
            if name in noise:
                gen.set_state(noise[name].to(gen.get_state().device))
        for index, cb in enumerate(self.callbacks):
            state = ckpt.get("callbacks", {}).get(str(index))
            if state is not None and hasattr(cb, "load_state_dict"):
                cb.load_state_dict(state)
        self.acc = dict(ckpt["accumulators"])
        self.last_loss = float(ckpt["last_loss"])
        self.step = int(ckpt["step"])
        self.final = ckpt.get("final_summary")
        self.resumed_from = self.step

    def _checkpoint_due(self) -> bool:
        if self.checkpoint_every is not None:
            return self.step % self.checkpoint_every == 0
        return self.step % self.spe == 0 and time.monotonic() - self.last_checkpoint_time >= CHECKPOINT_SECONDS

    def _checkpoint(self, *, final_summary: dict[str, Any] | None = None) -> None:
        self.flush()  # the store then holds every row up to this step, and none beyond it
        at_boundary = self.step % self.spe == 0
        state = {
            "run_id": self.run_id,
            "step": self.step,
            "model": self.model.state_dict(),
            "model_spec": self.prep.model_spec,
            "config": _primitive(self.config.to_dict()),
            "optimizer": self.optimizer.state_dict(),
            "projection": self.projection.state_dict() if self.projection else None,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
            # at an epoch boundary the next epoch starts from the current state; mid-epoch the
            # resumed run re-draws this epoch from its start and skips the batches already taken
            "data_generator": self.data_gen.get_state() if at_boundary else self.epoch_start_state,
            "noise_generators": {name: g.get_state().cpu() for name, g in self._noise_layers()},
            "callbacks": {
                str(i): cb.state_dict() for i, cb in enumerate(self.callbacks) if hasattr(cb, "state_dict")
            },
            "scale_invariant": dict(self.scale_invariant),
            "accumulators": dict(self.acc),
            "last_loss": self.last_loss,
            "final_summary": _primitive(final_summary) if final_summary is not None else None,
        }
        save_checkpoint(self.ckpt_path, state)
        self.last_checkpoint_time = time.monotonic()

    # -- training ------------------------------------------------------------------------------

    def _params_finite(self) -> bool:
        peaks = [p.detach().abs().amax() for p in self.model.parameters() if p.numel()]
        return bool(torch.isfinite(torch.stack(peaks)).all()) if peaks else True

    def evaluate(self) -> dict[str, float]:
        """Loss (and accuracy) on the test split in eval mode; non-finite outputs count as wrong."""
        x, y = self.data.x_test, self.data.y_test
        if x is None:
            return {}
        was_training = self.model.training
        self.model.eval()
        n = x.shape[0]
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        with torch.no_grad():
            for start in range(0, n, EVAL_CHUNK):
                xb, yb = x[start : start + EVAL_CHUNK], y[start : start + EVAL_CHUNK]
                out = self.model(xb)
                loss_sum += self.loss_fn(out, yb).double() * xb.shape[0]
                if self.classification:
                    ok = torch.isfinite(out).all(dim=1) & (out.argmax(dim=1) == yb)
                    correct += ok.sum()
        self.model.train(was_training)
        result = {"test_loss": float(loss_sum) / n}
        if self.classification:
            result["test_accuracy"] = int(correct) / n
        return result

    def _epoch_means(self) -> dict[str, float]:
        if self.acc["batches"] == 0:
            return {}
        out = {"train_loss": self.acc["loss_sum"] / self.acc["batches"]}
        if self.classification and self.acc["count"]:
            out["train_accuracy"] = self.acc["correct"] / self.acc["count"]
        return out

    def train(self) -> tuple[str, dict[str, Any]]:
        ctx = StepContext(self)
        _call(self.callbacks, "on_start", ctx)
        bar = self._progress_bar()
        last_line = 0.0
        started = time.perf_counter()
        start_step = self.step
        status = "finished"
        diverged_step = None
        last_eval: dict[str, float] = {}
        while self.step < self.total_steps and self.final is None:
            epoch = self.step // self.spe  # 0-based
            skip = self.step % self.spe
            if skip == 0:
                self.epoch_start_state = self.data_gen.get_state()
                self.acc = {"loss_sum": 0.0, "correct": 0, "count": 0, "batches": 0}
            from bnlab.data import batches

            epoch_batches = batches(
                self.data.x_train,
                self.data.y_train,
                self.prep.batch_size,
                generator=self.data_gen,
                shuffle=True,
                drop_last=self.prep.drop_last,
                augment=self.prep.augment,
            )
            for _ in range(skip):  # replay the draws of batches taken before the checkpoint
                next(epoch_batches)
            for xb, yb in epoch_batches:
                diverged = self._one_step(xb, yb, epoch, ctx)
                if diverged:
                    status, diverged_step = "diverged", self.step
                    break
                if bar is not None and (self.step % 10 == 0 or self.step == self.total_steps):
                    bar.update(self.step - bar.n)
                    bar.set_postfix(self._postfix(), refresh=False)
                epoch_end = self.step % self.spe == 0 or self.step == self.total_steps
                if epoch_end:
                    for name, value in self._epoch_means().items():
                        self.log(f"epoch_{name}", value, self.step)
                    self.log("lr", ctx.lr, self.step)
                    last_eval = {}  # the progress line shows only evaluations of this step
                if self.step % self.eval_every == 0 and self.step < self.total_steps:
                    last_eval = self.evaluate()
                    for name, value in last_eval.items():
                        self.log(name, value, self.step)
                if epoch_end and self.progress_mode == "lines":
                    now = time.perf_counter()
                    if now - last_line >= 5.0 or self.step == self.total_steps:
                        last_line = now
                        rate = (self.step - start_step) / max(now - started, 1e-9)
                        print(
                            f"[{self.run_id}] epoch {epoch + 1}/{self.prep.total_epochs} "
                            f"step {self.step}/{self.total_steps} "
                            + " ".join(f"{k} {v:.4g}" for k, v in {**self._postfix(), **last_eval}.items())
                            + f" {rate:.1f} steps/s",
                            file=sys.stderr,
                            flush=True,
                        )
                if self.step == self.total_steps:
                    break
                if self._checkpoint_due():
                    self._checkpoint()
            if status == "diverged":
                break
        if bar is not None:
            bar.update(self.step - bar.n)
            bar.close()

        if self.final is not None:  # killed after the final checkpoint, before the status update
            return self.final["status"], self.final["metrics"]
        metrics: dict[str, Any] = self._epoch_means()
        if status == "diverged":
            metrics["train_loss"] = self.last_loss
            metrics["diverged_step"] = diverged_step
            self.log("diverged_step", diverged_step, self.step)
        final_eval = self.evaluate()
        metrics.update(final_eval)
        for name, value in final_eval.items():
            self.log(name, value, self.step)
        metrics["epochs"] = self.step / self.spe
        ctx.step = self.step
        _call(self.callbacks, "on_end", ctx)
        summary = {"status": status, "metrics": metrics}
        if status == "finished":
            self._checkpoint(final_summary=summary)
        self.flush()
        return status, metrics

    def _one_step(self, xb: torch.Tensor, yb: torch.Tensor, epoch: int, ctx: StepContext) -> bool:
        """One SGD step; returns True if the run diverged (non-finite loss or parameter)."""
        cfg = self.config
        factor = self.schedule(self.step, epoch)
        set_lr_factor(self.optimizer, factor)
        lr = cfg.lr * factor
        number = self.step + 1
        ctx.batch, ctx.step, ctx.epoch, ctx.lr = (xb, yb), number, epoch + 1, lr
        try:
            from bnlab.norms import regularization_loss, set_progress
        except ImportError:  # pragma: no cover
            regularization_loss = set_progress = None
        if set_progress is not None:
            set_progress(self.model, lr=lr, epoch=epoch + 1, epochs=self.prep.total_epochs)
        self.model.train()
        out = self.model(xb)
        loss = self.loss_fn(out, yb)
        objective = loss
        if regularization_loss is not None:
            objective = objective + regularization_loss(self.model)
        ctx.loss = loss
        if self.classification:
            correct_t = (out.detach().argmax(dim=1) == yb).sum()
            loss_value, obj_value, correct = torch.stack(
                [loss.detach().double(), torch.as_tensor(objective).detach().double(), correct_t.double()]
            ).tolist()
            correct = int(correct)
        else:
            loss_value, obj_value = torch.stack(
                [loss.detach().double(), torch.as_tensor(objective).detach().double()]
            ).tolist()
            correct = 0
        self.last_loss = loss_value
        if not (math.isfinite(loss_value) and math.isfinite(obj_value)):
            self.step = number
            self.log("train_loss", loss_value, number)
            return True
        self.optimizer.zero_grad(set_to_none=True)
        objective.backward()
        _call(self.callbacks, "after_backward", ctx)
        self.optimizer.step()
        if self.projection is not None:
            self.projection.project()
        self.step = number
        self.acc["loss_sum"] += loss_value
        self.acc["batches"] += 1
        self.acc["correct"] += correct
        self.acc["count"] += int(yb.shape[0])
        if number % self.log_every == 0 or number == 1:
            self.log("train_loss", loss_value, number)
            if self.classification:
                self.log("train_accuracy", correct / yb.shape[0], number)
        if not self._params_finite():
            return True
        _call(self.callbacks, "after_step", ctx)
        return False

    def _postfix(self) -> dict[str, float]:
        out = {"loss": self.last_loss}
        means = self._epoch_means()
        if "train_accuracy" in means:
            out["acc"] = means["train_accuracy"]
        return out

    def _progress_bar(self):
        mode = self.progress_mode
        if mode is None:
            mode = "bar" if _is_tty() else None
        if mode is True or mode == "bar":
            from tqdm.auto import tqdm

            return tqdm(
                total=self.total_steps,
                initial=self.step,
                unit="step",
                desc=f"{self.config.model}/{self.config.norm}",
                file=sys.stderr,
                dynamic_ncols=True,
            )
        return None


def _primitive(value: Any) -> Any:
    """Config/summary values for a checkpoint: only primitives (weights_only loading)."""
    if isinstance(value, dict):
        return {str(k): _primitive(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_primitive(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


# --------------------------------------------------------------------------------------------
# public entry points
# --------------------------------------------------------------------------------------------


def run(
    config: TrainConfig | dict,
    *,
    callbacks: Iterable[Any] = (),
    progress: Any = None,
    model_factory: ModelFactory | None = None,
) -> RunRecord:
    """Train one run (or resume it, or return it if it already ended) and return its record.

    ``config`` is a :class:`TrainConfig` or a dict of its keys. Every check happens before
    training: a bad config raises ``ValueError`` naming the problem and the valid choices.
    ``callbacks`` are objects with any of ``on_start``, ``after_backward``, ``after_step``,
    ``on_end`` taking a :class:`StepContext`. ``model_factory(input_shape, num_outputs)`` builds a
    custom model instead of ``bnlab.models.create`` (``config.model`` is then its label). ``progress``: ``None`` = a tqdm bar when stderr is a
    terminal, else silent; ``"bar"``; ``"lines"`` (at most one line per epoch); ``False``.

    A diverged run is a result (status ``diverged``, ``metrics["diverged_step"]``), not an error.
    Any other exception marks the run ``failed`` in the store and is re-raised; running the same
    config again resumes it from its last checkpoint.
    """
    prep = prepare(config, callbacks, model_factory)
    cfg = prep.config
    run_id = cfg.run_id()
    runs_dir = Path(cfg.runs_dir)
    store = Store(runs_dir / "bnlab.db")
    try:
        existing = store.get_run(run_id)
        if existing is not None and existing["id"] == run_id and existing["status"] in ("finished", "diverged"):
            return RunRecord.from_store(existing)
        with _RunLock(checkpoint_path(runs_dir, run_id).with_suffix(".lock")):
            env = environment(prep.device)
            store.create_run(run_id, cfg.to_dict(), config_hash=cfg.config_hash(), env=env)
            trainer = _Trainer(prep, store, run_id, progress)
            try:
                trainer.setup()
                store.set_status(
                    run_id,
                    "running",
                    steps=trainer.step,
                    env=env,
                    summary={"scale_invariant": trainer.scale_invariant, "checkpoint": str(trainer.ckpt_path)},
                )
                status, metrics = trainer.train()
            except BaseException as err:
                try:
                    trainer.flush()
                finally:
                    store.set_status(
                        run_id,
                        "failed",
                        steps=trainer.step,
                        error=f"{type(err).__name__}: {err}",
                        summary={"scale_invariant": trainer.scale_invariant, "checkpoint": str(trainer.ckpt_path)},
                    )
                raise
            checkpoint = str(trainer.ckpt_path) if status == "finished" else None
            summary = {
                "metrics": metrics,
                "scale_invariant": trainer.scale_invariant,
                "checkpoint": checkpoint,
            }
            store.set_status(run_id, status, steps=trainer.step, summary=summary)
            record = RunRecord.from_store(store.get_run(run_id))
            record.resumed_from = trainer.resumed_from
            return record
    finally:
        store.close()


def load_model(
    run_id: str,
    runs_dir: str | os.PathLike[str] = "runs",
    *,
    device: str = "cpu",
    model_factory: ModelFactory | None = None,
) -> nn.Module:
    """Rebuild a run's model and load the weights of its last checkpoint (eval mode)."""
    path = checkpoint_path(runs_dir, run_id)
    ckpt = load_checkpoint(path, map_location=device)
    if ckpt is None:
        raise FileNotFoundError(f"no checkpoint for run {run_id!r} at {path}")
    cfg = TrainConfig.from_dict(ckpt["config"])
    spec = ckpt["model_spec"]
    model = build_model(cfg, spec["input_shape"], spec["num_classes"], model_factory)
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval()
