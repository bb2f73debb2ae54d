"""Training engine: optimizers of the papers, schedules, checkpoints, and the run store glue.

    from bnlab import train
    record = train.run({"model": "mlp", "norm": "bn", "data": "digits", "epochs": 5, "lr": 0.1})
    print(record.status, record.metrics["test_accuracy"])

See ``docs/readme/train.md``.
"""

from bnlab.callbacks import Callback
from bnlab.train.config import (
    COSMETIC_KEYS, OPTIMIZERS, TrainConfig, load_config_file, validate_static,
)
from bnlab.train.loop import RunInterrupted, RunRecord, load_model, prepare, run
from bnlab.train.optim import Projection, build_optimizer, find_scale_invariant, resolve_override
from bnlab.train.schedules import SCHEDULE_FORMS, Schedule, parse_schedule

__all__ = [
    "Callback",
    "COSMETIC_KEYS",
    "OPTIMIZERS",
    "SCHEDULE_FORMS",
    "Projection",
    "RunInterrupted",
    "RunRecord",
    "Schedule",
    "TrainConfig",
    "build_optimizer",
    "find_scale_invariant",
    "load_config_file",
    "load_model",
    "parse_schedule",
    "prepare",
    "resolve_override",
    "run",
    "validate_static",
]
