"""Mirror a run to the ecosystem's trackers: TensorBoard and MLflow (optional dependencies).

    bnlab train ... --log-to tensorboard:runs/tb --log-to mlflow:file:./mlruns

or ``train.run(config, callbacks=[TensorBoardLogger("runs/tb")])``. Each logger is a
:class:`bnlab.callbacks.Callback` that never changes training (``changes_training`` is
False, so the run id is the same with or without it). It mirrors the run's config (TensorBoard: a
text summary; MLflow: params, flattened as ``model_options.width``), every recorded scalar
and probe value (``on_log``: train loss/accuracy, epoch means, evaluations, learning rate,
``probe/...``), at the step they were recorded; the final status is a text summary (TensorBoard)
or the run's terminal status and the tag ``bnlab.status`` (MLflow). The run store stays the record:
a resumed run re-sends the steps it replays after its checkpoint (TensorBoard and MLflow keep both
points; the store keeps one).

Neither package is a dependency of bnlab: ``pip install 'bnlab[track]'`` installs ``tensorboard``
and ``mlflow-skinny`` (MLflow's client without its server: ``file:`` stores and HTTP servers). A
logger whose package is missing is a clear ``ValueError`` when it is built, before training.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from bnlab.callbacks import Callback, Loop
from bnlab.spec import split_tagged
from bnlab.train.callbacks import RunTrainer, trainer_of

LOG_TO_FORMS = {"tensorboard": "tensorboard:DIR", "mlflow": "mlflow:URI"}  # --log-to KIND:TARGET
_MLFLOW_BATCH = 1000  # metrics per log_batch call (MLflow's own limit)
_MLFLOW_STATUS = {"finished": "FINISHED", "diverged": "FINISHED", "failed": "FAILED",
                  "interrupted": "KILLED"}


def _need(module: str, package: str, flag: str):
    """Import an optional dependency, or say how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ValueError(
            f"{flag} needs the '{package}' package, which is not installed: pip install "
            f"'bnlab[track]' (or pip install {package})"
        ) from None


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model_options": {"width": 8}}`` -> ``{"model_options.width": 8}``."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _config_of(trainer: RunTrainer) -> dict[str, Any]:
    return trainer.config.to_dict()


class TensorBoardLogger(Callback):
    """Writes TensorBoard event files under ``log_dir/<run id>`` (``tensorboard --logdir
    log_dir``)."""

    name = "tensorboard"

    def __init__(self, log_dir: str | os.PathLike[str]):
        _need("tensorboard", "tensorboard", "--log-to tensorboard")
        self.log_dir = Path(log_dir)
        # a SummaryWriter from on_train_start (tensorboard: an optional dependency)
        self.writer: Any = None

    def on_train_start(self, loop: Loop) -> None:
        from torch.utils.tensorboard import SummaryWriter

        trainer = trainer_of(loop)
        self.writer = SummaryWriter(log_dir=str(self.log_dir / trainer.run_id))
        config = json.dumps(_config_of(trainer), indent=2, sort_keys=True, default=str)
        self.writer.add_text("config", f"```\n{config}\n```", global_step=trainer.step)

    def on_log(self, loop: Loop, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)

    def on_train_end(self, loop: Loop, status: str) -> None:
        if self.writer is None:
            return
        self.writer.add_text("status", status, global_step=loop.step)
        self.writer.close()
        self.writer = None


_MLFLOW_BAD = re.compile(r"[^A-Za-z0-9_\-. /]")


def mlflow_key(name: str) -> str:
    """A metric or param name MLflow accepts (letters, digits, ``_-. /``); others become ``_``."""
    return _MLFLOW_BAD.sub("_", name)


class MLflowLogger(Callback):
    """Logs to the MLflow tracking store at ``tracking_uri`` (``file:DIR``, ``http(s)://...``).

    One MLflow run per bnlab run, in experiment ``experiment`` (default ``bnlab``), named by the
    bnlab run id and tagged ``bnlab.run_id``; a resumed bnlab run continues its MLflow run.
    """

    name = "mlflow"

    def __init__(self, tracking_uri: str, experiment: str = "bnlab"):
        _need("mlflow", "mlflow-skinny", "--log-to mlflow")
        if "://" not in tracking_uri and not tracking_uri.startswith("file:"):
            tracking_uri = Path(tracking_uri).resolve().as_uri()  # a plain folder: a file store
        if tracking_uri.startswith("file:"):
            # MLflow 3 keeps its file store behind this opt-in; a file: URI given here is the opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        # an MlflowClient from on_train_start (mlflow: an optional dependency)
        self.client: Any = None
        self.mlflow_run_id: str | None = None
        self.pending: list[Any] = []

    def on_train_start(self, loop: Loop) -> None:
        from mlflow.tracking import MlflowClient

        trainer = trainer_of(loop)
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        found = self.client.get_experiment_by_name(self.experiment)
        experiment_id = (found.experiment_id if found
                         else self.client.create_experiment(self.experiment))
        runs = self.client.search_runs([experiment_id], f"tags.`bnlab.run_id` = '{trainer.run_id}'",
                                       max_results=1)
        if runs:
            self.mlflow_run_id = runs[0].info.run_id
            self.client.update_run(self.mlflow_run_id, status="RUNNING")
        else:
            run = self.client.create_run(experiment_id, run_name=trainer.run_id,
                                         tags={"bnlab.run_id": trainer.run_id})
            self.mlflow_run_id = run.info.run_id
            from mlflow.entities import Param

            params = [Param(mlflow_key(k), v if isinstance(v, str) else json.dumps(v, default=str))
                      for k, v in sorted(_flat(_config_of(trainer)).items())]
            for start in range(0, len(params), 100):
                self.client.log_batch(self.mlflow_run_id, params=params[start:start + 100])

    def on_log(self, loop: Loop, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.pending.extend(Metric(mlflow_key(k), float(v), now, int(step))
                            for k, v in metrics.items())
        if len(self.pending) >= _MLFLOW_BATCH:
            self._send()

    def on_train_epoch_end(self, loop: Loop, epoch: int) -> None:
        self._send()

    def _send(self) -> None:
        while self.pending:
            batch, self.pending = self.pending[:_MLFLOW_BATCH], self.pending[_MLFLOW_BATCH:]
            self.client.log_batch(self.mlflow_run_id, metrics=batch)

    def on_train_end(self, loop: Loop, status: str) -> None:
        if self.client is None:
            return
        self._send()
        self.client.set_tag(self.mlflow_run_id, "bnlab.status", status)
        self.client.set_terminated(self.mlflow_run_id, status=_MLFLOW_STATUS.get(status, "FAILED"))


def parse_log_to(spec: str) -> Callback:
    """``tensorboard:DIR`` or ``mlflow:URI`` (the ``--log-to`` flag) -> the logger callback."""
    kind, target = split_tagged(spec, "tracker", LOG_TO_FORMS)
    return TensorBoardLogger(target) if kind == "tensorboard" else MLflowLogger(target)
