"""Training configuration: one frozen dataclass, validated once, when it is built.

Every knob of a run is a field of :class:`TrainConfig`; the same keys are accepted from Python (a
dataclass or a dict), from a YAML file (``bnlab train --config run.yaml``) and from command-line
flags (which override the file). Building a ``TrainConfig`` is the one boundary where values are
checked and normalised (``__post_init__``): a bad value raises ``ValueError`` naming the key and its
valid values or range, and the object that comes out is immutable (``frozen=True``; lists are
tuples, option mappings read-only), so nothing downstream re-validates or changes it. What needs
data or a model (batch size against the data, the model's construction) is checked by
:func:`bnlab.train.prepare.prepare` before the first step.

Each field's metadata carries its command-line form (:class:`~bnlab.train.config_fields.CliOption`):
``bnlab train``'s options
are generated from it (:mod:`bnlab.cli.train`), so a new key is one field here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional, overload

import bnlab.data
import bnlab.models
import bnlab.norms
from bnlab.spec import check_choice
from bnlab.train.config_fields import CliOption, FrozenMap, key as _key, listed as _listed
from bnlab.train.config_fields import pairs as _pairs, switch as _switch
from bnlab.train.schedules import parse_schedule

# A loss a million times its starting value is no transient: cross-entropy that large means logits
# of ~1e6, a squared error that large means outputs ~1e3 times their scale.
DIVERGENCE_FACTOR = 1e6
OPTIMIZERS = ("sgd", "psgd")

# Keys that do not change what a run computes or records, so they are left out of its identity:
# where files live, integrity checking of input files, how often a checkpoint is written, and
# compiled_steps (speed and the last bits of float32, as the thread count: docs/readme/train.md).
COSMETIC_KEYS = frozenset({"runs_dir", "data_dir", "verify", "download", "checkpoint_every",
                           "compiled_steps"})



_OptStr, _OptInt, _OptFloat = Optional[str], Optional[int], Optional[float]
_OptBool, _OptList = Optional[bool], Optional[list[str]]


@dataclass(frozen=True)
class TrainConfig:
    """All settings of one training run (see ``docs/readme/train.md`` for each key).

    Immutable and valid by construction: ``TrainConfig(lr=-1, steps=1)`` raises ``ValueError: lr
    must be positive, got -1.0``. Use :func:`dataclasses.replace` for a changed copy (validated
    again: it is a new config)."""

    model: str = _key("model", "Model name (bnlab.models.MODELS), e.g. mlp, resnet20.", "mlp",
                      kind=_OptStr)
    norm: str = _key("norm", 'Norm spec, e.g. bn, none, "cbn(rho=2)".', "bn", kind=_OptStr)
    # None: the model's own default (relu; identity for dln)
    activation: str | None = _key("activation", "Activation, e.g. relu, sigmoid.", None,
                                  kind=_OptStr)
    placement: str = _key("placement", "Norm placement: pre_activation or pre_linear.",
                          "pre_activation", kind=_OptStr)
    model_options: Mapping[str, Any] = _key(
        "model_options", "KEY=VALUE for the model (repeatable).", flag="--model-option",
        kind=_OptList, to_config=_pairs("--model-option"), factory=FrozenMap)
    data: str = _key("data", "Data source: digits, cifar10, gaussian_regression, ...", "digits",
                     kind=_OptStr)
    data_options: Mapping[str, Any] = _key(
        "data_options", "KEY=VALUE for the data source (repeatable).", flag="--data-option",
        kind=_OptList, to_config=_pairs("--data-option"), factory=FrozenMap)
    data_dir: str | None = _key("data_dir", "Folder with data files (default $BNLAB_DATA).", None,
                                kind=_OptStr)
    verify: bool = _key("verify", "Skip checksum verification of data files.", True,
                        flag="--no-verify", kind=bool, to_config=_switch(False))
    download: bool = _key("download", "Download missing CIFAR files from the official URL.", False,
                          kind=bool, to_config=_switch(True))
    epochs: int | None = _key("epochs", "Epochs to train (or --steps).", None, kind=_OptInt)
    steps: int | None = _key("steps", "Steps to train (instead of --epochs).", None, kind=_OptInt)
    lr: float = _key("lr", "Learning rate (of the scale-variant parameters).", 0.1,
                     kind=_OptFloat)
    lr_scale_invariant: float | None = _key(
        "lr_scale_invariant", "Separate learning rate for scale-invariant weights (Arora D.1).",
        None, kind=_OptFloat)
    momentum: float = _key("momentum", "SGD momentum.", 0.0, kind=_OptFloat)
    weight_decay: float = _key("weight_decay", "L2 weight decay.", 0.0, kind=_OptFloat)
    batch_size: int | str = _key("batch_size", "Batch size N, or 'full' for full-batch GD.", 128,
                                 kind=_OptStr)
    optimizer: str = _key("optimizer", "sgd or psgd (projected SGD, Arora App. D Setting 2).",
                          "sgd", kind=_OptStr)
    schedule: str = _key("schedule", "constant | step:60,100 | exp:0.9999", "constant",
                         kind=_OptStr)
    seed: int = _key("seed", "Seed for init, data order, augmentation and layer noise.", 0,
                     kind=_OptInt)
    checkpoint_every: int | None = _key("checkpoint_every", "Checkpoint every N steps.", None,
                                        kind=_OptInt)
    eval_every: int | None = _key("eval_every", "Evaluate the test split every N steps.", None,
                                  kind=_OptInt)
    log_every: int | None = _key("log_every", "Record train_loss every N steps.", None,
                                 kind=_OptInt)
    augment: bool = _key("augment", "CIFAR crop+flip augmentation.", False,
                         flag="--augment/--no-augment", kind=_OptBool)
    device: str = _key("device", "cpu, cuda, cuda:1, ...", "cpu", kind=_OptStr)
    scale_invariant: tuple[str, ...] | None = _key(
        "scale_invariant", "Override detection: parameter name/pattern[:rows] (repeatable).", None,
        kind=_OptList, to_config=_listed)
    probes: tuple[str, ...] = _key("probes", "Probe to run during training (repeatable).",
                                   flag="--probe", kind=_OptList, to_config=_listed, factory=tuple)
    probe_every: int = _key("probe_every", "Run probes every N steps.", 1, kind=_OptInt)
    # diverged when a step's loss exceeds this multiple of the first step's loss (None: only
    # non-finite losses, parameters and buffers count)
    divergence_factor: float | None = _key(
        "divergence_factor",
        "Diverged when the loss exceeds this multiple of the first loss (default 1e6).",
        DIVERGENCE_FACTOR, kind=_OptFloat)
    compile: bool = _key("compile", "Compile the model's training step with torch.compile.", False,
                         kind=bool, to_config=_switch(True))
    compiled_steps: bool = _key(
        "compiled_steps", "Run the norm layers' steps on small CPU tensors as compiled functions "
        "(bnlab.norms.compiled_steps: the first step of each shape compiles).", False, kind=bool,
        to_config=_switch(True))
    # data parallel (bnlab.train.distributed): processes sharing each batch, norms' statistics
    nproc: int = _key("nproc", "Processes sharing each batch (DDP via torch.distributed's "
                      "launcher; gloo on CPU, nccl on CUDA).", 1, kind=_OptInt)
    sync_norms: bool = _key("sync_norms", "With --nproc > 1: norms' batch statistics over all "
                            "processes (default) or per process.", True,
                            flag="--sync-norms/--no-sync-norms", kind=_OptBool)
    runs_dir: str = _key("runs_dir", "Folder of the run store and checkpoints (default runs/).",
                         "runs", kind=_OptStr)

    def __post_init__(self) -> None:
        """The one validator: check every key that needs no data or model, normalise the values
        (numbers to float, ``"full"``, tuples, read-only mappings); ``ValueError`` names the key."""
        _validate(self)

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
        """``config`` itself (already valid and immutable), or the config built from a dict."""
        if isinstance(config, TrainConfig):
            return config
        if isinstance(config, Mapping):
            return cls.from_dict(config)
        raise TypeError(f"config must be a TrainConfig or a dict, not {type(config).__name__}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/YAML values: lists for the tuples, dicts for the option mappings."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

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


def cli_options() -> list[CliOption]:
    """Every config key's command-line form, in field order (``bnlab train`` is built from it)."""
    out = []
    for f in dataclasses.fields(TrainConfig):
        cli = f.metadata["cli"]
        out.append(CliOption(f.name, cli["flag"], cli["help"], cli["kind"], cli["to_config"]))
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


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


def validate_static(config: TrainConfig | Mapping[str, Any], *,
                    check_model: bool = True) -> TrainConfig:
    """The config (built, hence validated, from a dict), with its model name checked against
    ``bnlab.models`` (``check_model=False`` when the caller supplies its own model factory)."""
    cfg = TrainConfig.coerce(config)
    if check_model:
        check_model_name(cfg.model)
    return cfg


def check_model_name(name: str) -> None:
    """A model name the registry knows (a ``model_factory`` run's label need not be one)."""
    bnlab.models.MODEL_INFO.entry(name)  # raises naming the valid models


# --------------------------------------------------------------------------------------------
# the one validator (TrainConfig.__post_init__)
# --------------------------------------------------------------------------------------------


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


def _set(c: TrainConfig, name: str, value: Any) -> None:
    object.__setattr__(c, name, value)  # normalising a frozen dataclass while it is being built


def _validate(c: TrainConfig) -> None:
    """Check and normalise every key that needs no data or model; raises ``ValueError``."""
    if (c.epochs is None) == (c.steps is None):
        raise ValueError("give exactly one of epochs or steps (e.g. epochs=10 or steps=1000)")
    _positive_int("epochs", c.epochs)
    _positive_int("steps", c.steps)
    _check_optimization(c)
    if isinstance(c.seed, bool) or not isinstance(c.seed, int) or not 0 <= c.seed < 2**63:
        raise ValueError(f"seed must be an integer in [0, 2**63), got {c.seed!r}")
    for name in ("checkpoint_every", "eval_every", "log_every"):
        _positive_int(name, getattr(c, name))
    _positive_int("probe_every", c.probe_every, allow_none=False)
    for name in ("model_options", "data_options"):
        if not isinstance(getattr(c, name), Mapping):
            raise ValueError("model_options and data_options must be mappings of keyword arguments")
        _set(c, name, FrozenMap({str(k): v for k, v in getattr(c, name).items()}))
    if c.scale_invariant is not None:
        names = c.scale_invariant
        if isinstance(names, str):
            names = [s for s in names.split(",") if s]
        if not isinstance(names, (list, tuple)) or not all(isinstance(s, str) for s in names):
            raise ValueError("scale_invariant must be a list of parameter names or patterns")
        _set(c, "scale_invariant", tuple(names))
    probes = [c.probes] if isinstance(c.probes, str) else c.probes
    if not isinstance(probes, (list, tuple)) or not all(isinstance(p, str) for p in probes):
        raise ValueError(f"probes must be a list of probe specs, got {c.probes!r}")
    _set(c, "probes", tuple(probes))
    if c.divergence_factor is not None:
        _set(c, "divergence_factor", _float("divergence_factor", c.divergence_factor))
        if c.divergence_factor <= 1:
            raise ValueError(f"divergence_factor must be > 1 (or null to disable), "
                             f"got {c.divergence_factor}")
    for flag in ("augment", "verify", "download", "compile", "compiled_steps", "sync_norms"):
        if getattr(c, flag) not in (True, False):
            raise ValueError(f"{flag} must be true or false, got {getattr(c, flag)!r}")
        _set(c, flag, bool(getattr(c, flag)))
    _set(c, "device", str(c.device))
    _check_data_parallel(c)
    _check_registries(c)


def _check_optimization(c: TrainConfig) -> None:
    """Check and normalise the optimization keys: learning rates, momentum, weight decay, batch
    size, optimizer and schedule."""
    _set(c, "lr", _float("lr", c.lr))
    if c.lr <= 0:
        raise ValueError(f"lr must be positive, got {c.lr}")
    if c.lr_scale_invariant is not None:
        _set(c, "lr_scale_invariant", _float("lr_scale_invariant", c.lr_scale_invariant))
        if c.lr_scale_invariant <= 0:
            raise ValueError(f"lr_scale_invariant must be positive, got {c.lr_scale_invariant}")
    _set(c, "momentum", _float("momentum", c.momentum))
    if not 0 <= c.momentum < 1:
        raise ValueError(f"momentum must be in [0, 1), got {c.momentum}")
    _set(c, "weight_decay", _float("weight_decay", c.weight_decay))
    if c.weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {c.weight_decay}")
    if isinstance(c.batch_size, str):
        if c.batch_size.strip().lower() == "full":
            _set(c, "batch_size", "full")
        else:
            try:
                _set(c, "batch_size", int(c.batch_size))
            except ValueError:
                raise ValueError(
                    f"batch_size must be a positive integer or 'full', got {c.batch_size!r}"
                ) from None
    if c.batch_size != "full":
        _positive_int("batch_size", c.batch_size, allow_none=False)
    check_choice("optimizer", c.optimizer, OPTIMIZERS)
    parse_schedule(c.schedule)  # raises with the valid forms


def _check_data_parallel(c: TrainConfig) -> None:
    """nproc and sync_norms (bnlab.train.distributed)."""
    _positive_int("nproc", c.nproc, allow_none=False)
    if c.nproc == 1 and not c.sync_norms:
        raise ValueError("sync_norms=false (--no-sync-norms) needs nproc > 1: one process has no "
                         "other ranks")
    if c.nproc > 1 and c.probes:
        raise ValueError(f"probes run in one process only; drop the probes or use nproc 1 "
                         f"(got nproc {c.nproc})")


def _check_registries(c: TrainConfig) -> None:
    """Names against the registries of ``bnlab.data`` and ``bnlab.norms`` (the model's name is
    checked by :func:`check_model_name` unless the run brings its own model factory)."""
    # the registry's spelling rules, as in bnlab.data.load: case-insensitive, '-' for '_'
    bnlab.data.SOURCES.entry(c.data)
    check_choice("placement", c.placement, bnlab.norms.PLACEMENTS)
    try:
        bnlab.norms.validate(c.norm)
    except ValueError as err:
        raise ValueError(f"bad norm spec {c.norm!r}: {err}") from None
