"""Training configuration: one dataclass, its validation, and the run identity derived from it.

Every knob of a run lives in :class:`TrainConfig`; the same keys are accepted from Python (a
dataclass or a dict), from a YAML file (``bnlab train --config run.yaml``) and from command-line
flags (which override the file). :func:`validate_static` checks everything that can be checked
without data or models; the engine then checks the rest (batch size against the data, norm spec,
model construction) before the first step, so a bad combination never starts training.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

import bnlab.data
import bnlab.models
import bnlab.norms
from bnlab.train.schedules import parse_schedule

OPTIMIZERS = ("sgd", "psgd")
# A loss a million times its starting value is no transient: cross-entropy that large means logits
# of ~1e6, a squared error that large means outputs ~1e3 times their scale.
DIVERGENCE_FACTOR = 1e6

# Keys that do not change what a run computes or records, so they are left out of its identity:
# where files live, integrity checking of input files, and how often a checkpoint is written.
COSMETIC_KEYS = frozenset({"runs_dir", "data_dir", "verify", "download", "checkpoint_every"})


@dataclass
class TrainConfig:
    """All settings of one training run (see ``docs/readme/train.md`` for each key)."""

    model: str = "mlp"
    norm: str = "bn"
    activation: str | None = None  # None: the model's own default (relu; identity for dln)
    placement: str = "pre_activation"
    model_options: dict[str, Any] = field(default_factory=dict)
    data: str = "digits"
    data_options: dict[str, Any] = field(default_factory=dict)
    data_dir: str | None = None
    verify: bool = True
    download: bool = False
    epochs: int | None = None
    steps: int | None = None
    lr: float = 0.1
    lr_scale_invariant: float | None = None
    momentum: float = 0.0
    weight_decay: float = 0.0
    batch_size: int | str = 128
    optimizer: str = "sgd"
    schedule: str = "constant"
    seed: int = 0
    checkpoint_every: int | None = None
    eval_every: int | None = None
    log_every: int | None = None
    augment: bool = False
    device: str = "cpu"
    scale_invariant: list[str] | None = None
    probes: list[str] = field(default_factory=list)
    probe_every: int = 1
    # diverged when a step's loss exceeds this multiple of the first step's loss (None: only
    # non-finite losses, parameters and buffers count)
    divergence_factor: float | None = DIVERGENCE_FACTOR
    compile: bool = False  # torch.compile the model for the training step
    # data parallel (bnlab.train.distributed): processes sharing each batch, norms' statistics over all
    nproc: int = 1
    sync_norms: bool = True
    runs_dir: str = "runs"

    # -- construction ----------------------------------------------------------------------

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainConfig:
        """Build from a mapping; unknown keys are an error that lists the valid ones."""
        names = [f.name for f in dataclasses.fields(cls)]
        values = {k.replace("-", "_"): v for k, v in dict(values).items()}
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ValueError(
                f"unknown config key(s) {', '.join(unknown)}; valid keys: {', '.join(names)}"
            )
        return cls(**values)

    @classmethod
    def coerce(cls, config: TrainConfig | Mapping[str, Any]) -> TrainConfig:
        if isinstance(config, TrainConfig):
            return dataclasses.replace(config)
        if isinstance(config, Mapping):
            return cls.from_dict(config)
        raise TypeError(f"config must be a TrainConfig or a dict, not {type(config).__name__}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # -- identity --------------------------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        """The keys that define what the run computes (and hence its id)."""
        return {k: v for k, v in self.to_dict().items() if k not in COSMETIC_KEYS}

    def config_hash(self) -> str:
        blob = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    def run_id(self) -> str:
        """A prefix of the config hash: the id of the config alone. A stored run's id
        (:func:`bnlab.train.prepare.run_identity`) also covers the model's architecture, the
        callbacks that change training and the bnlab version; it equals neither this nor a prefix
        of it. Two configs with equal ``run_id()`` and the same model train the same run."""
        return self.config_hash()[:12]


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (or JSON) file of config keys; a clear error if it is not a mapping."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ValueError(f"cannot read config file {path}: {err.strerror or err}") from None
    _check_nesting(path, text)
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"config file {path} is not valid YAML: {err}") from None
    except RecursionError:  # the parser recurses per level: a hostile file nests 50,000 deep
        raise ValueError(f"config file {path} nests too deep to be a config") from None
    except ValueError as err:  # more digits than Python converts (a 100,000-digit integer)
        raise ValueError(f"config file {path}: {err}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ValueError(f"config file {path} must hold a mapping of keys to values")
    return {str(k).replace("-", "_"): v for k, v in values.items()}


def _check_nesting(path: Path, text: str, limit: int = 64) -> None:
    """Refuse flow collections nested deeper than ``limit`` before YAML's recursive parser spends
    seconds on a hostile 50,000-deep file (and ends in a RecursionError)."""
    depth = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            if depth > limit:
                raise ValueError(f"config file {path} nests more than {limit} brackets deep; "
                                 "not a config")
        elif ch in "]}":
            depth -= 1


@overload
def _positive_int(name: str, value: Any, *, allow_none: Literal[False]) -> int: ...
@overload
def _positive_int(name: str, value: Any, *, allow_none: bool = True) -> int | None: ...
def _positive_int(name: str, value: Any, *, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _float(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return number


def validate_static(config: TrainConfig, *, check_model: bool = True) -> TrainConfig:
    """Check and normalise every key that needs no data or model; raises ``ValueError``.

    Names of models, data sets and norm specs are checked against the registries of
    ``bnlab.models``, ``bnlab.data`` and ``bnlab.norms``
    (``check_model=False`` when the caller supplies its own model factory).
    """
    c = config
    if (c.epochs is None) == (c.steps is None):
        raise ValueError("give exactly one of epochs or steps (e.g. epochs=10 or steps=1000)")
    _positive_int("epochs", c.epochs)
    _positive_int("steps", c.steps)
    _check_optimization(c)
    if isinstance(c.seed, bool) or not isinstance(c.seed, int) or not 0 <= c.seed < 2**63:
        raise ValueError(f"seed must be an integer in [0, 2**63), got {c.seed!r}")
    _positive_int("checkpoint_every", c.checkpoint_every)
    _positive_int("eval_every", c.eval_every)
    _positive_int("log_every", c.log_every)
    _positive_int("probe_every", c.probe_every, allow_none=False)
    if not isinstance(c.model_options, dict) or not isinstance(c.data_options, dict):
        raise ValueError("model_options and data_options must be mappings of keyword arguments")
    if c.scale_invariant is not None:
        if isinstance(c.scale_invariant, str):
            c.scale_invariant = [s for s in c.scale_invariant.split(",") if s]
        if not all(isinstance(s, str) for s in c.scale_invariant):
            raise ValueError("scale_invariant must be a list of parameter names or patterns")
        c.scale_invariant = list(c.scale_invariant)
    if isinstance(c.probes, str):
        c.probes = [c.probes]
    c.probes = list(c.probes)
    if c.divergence_factor is not None:
        c.divergence_factor = _float("divergence_factor", c.divergence_factor)
        if c.divergence_factor <= 1:
            raise ValueError(f"divergence_factor must be > 1 (or null to disable), got {c.divergence_factor}")
    for flag in ("augment", "verify", "download", "compile", "sync_norms"):
        if getattr(c, flag) not in (True, False):
            raise ValueError(f"{flag} must be true or false, got {getattr(c, flag)!r}")
    c.device = str(c.device)
    _check_data_parallel(c)
    _check_registries(c, check_model)
    return c


def _check_optimization(c: TrainConfig) -> None:
    """Check and normalise the optimization keys: learning rates, momentum, weight decay, batch size,
    optimizer and schedule."""
    c.lr = _float("lr", c.lr)
    if c.lr <= 0:
        raise ValueError(f"lr must be positive, got {c.lr}")
    if c.lr_scale_invariant is not None:
        c.lr_scale_invariant = _float("lr_scale_invariant", c.lr_scale_invariant)
        if c.lr_scale_invariant <= 0:
            raise ValueError(f"lr_scale_invariant must be positive, got {c.lr_scale_invariant}")
    c.momentum = _float("momentum", c.momentum)
    if not 0 <= c.momentum < 1:
        raise ValueError(f"momentum must be in [0, 1), got {c.momentum}")
    c.weight_decay = _float("weight_decay", c.weight_decay)
    if c.weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {c.weight_decay}")
    if isinstance(c.batch_size, str):
        if c.batch_size.strip().lower() == "full":
            c.batch_size = "full"
        else:
            try:
                c.batch_size = int(c.batch_size)
            except ValueError:
                raise ValueError(
                    f"batch_size must be a positive integer or 'full', got {c.batch_size!r}"
                ) from None
    if c.batch_size != "full":
        _positive_int("batch_size", c.batch_size, allow_none=False)
    if c.optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {c.optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
    parse_schedule(c.schedule)  # raises with the valid forms


def _check_data_parallel(c: TrainConfig) -> None:
    """nproc and sync_norms (bnlab.train.distributed)."""
    c.nproc = _positive_int("nproc", c.nproc, allow_none=False)
    if c.nproc == 1 and not c.sync_norms:
        raise ValueError("sync_norms=false (--no-sync-norms) needs nproc > 1: one process has no other ranks")
    if c.nproc > 1 and c.probes:
        raise ValueError(f"probes run in one process only; drop the probes or use nproc 1 (got nproc {c.nproc})")


def _check_registries(c: TrainConfig, check_model: bool = True) -> None:
    """Names against the registries of ``bnlab.models``, ``bnlab.data`` and ``bnlab.norms``."""
    if check_model and c.model not in bnlab.models.MODELS:
        raise ValueError(f"unknown model {c.model!r}; valid: {', '.join(sorted(bnlab.models.MODELS))}")
    try:  # the registry's spelling rules, as in bnlab.data.load: case-insensitive, '-' for '_'
        bnlab.data.SOURCES.entry(c.data)
    except ValueError:
        raise ValueError(f"unknown data {c.data!r}; valid: {', '.join(sorted(bnlab.data.SOURCES))}") from None
    if c.placement not in bnlab.norms.PLACEMENTS:
        raise ValueError(f"unknown placement {c.placement!r}; valid: {', '.join(bnlab.norms.PLACEMENTS)}")
    try:
        bnlab.norms.validate(c.norm)
    except ValueError as err:
        raise ValueError(f"bad norm spec {c.norm!r}: {err}") from None
