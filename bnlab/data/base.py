"""The `DataSource` record, the data errors, small option-parsing helpers shared by the loaders, and
`SOURCES`, the registry the `source` decorator on each loader fills."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field, replace

import torch

from bnlab.spec import Param, Registry

TASKS = ("classification", "regression")


class DataError(ValueError):
    """A data file is missing, corrupt, unsafe or not in the expected format.

    Subclasses ``ValueError`` so callers that validate configurations catch it with the other
    "bad input" errors; the message always says which file and what to do about it.
    """


class DataNotFoundError(DataError, FileNotFoundError):
    """A dataset was not found; the message lists every path searched and how to obtain it."""


class ChecksumError(DataError):
    """A file's MD5 differs from the published checksum (corrupt, truncated or not the release)."""


class UnsafePickleError(DataError, pickle.UnpicklingError):
    """A pickle asked for a global outside the small allow-list the CIFAR format needs."""


@dataclass
class DataSource:
    """A whole dataset held as tensors on one device.

    ``x_*`` are float tensors of shape ``(n, *input_shape)``. ``y_*`` are int64 class indices of
    shape ``(n,)`` for ``task == "classification"``, and float tensors of shape
    ``(n, num_outputs)`` for ``task == "regression"``. ``x_test``/``y_test`` are ``None`` when the
    source has no test split. ``meta`` carries source-specific facts (teacher vectors, the
    normalization constants, the split indices, ...); its tensors live on the same device.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor | None
    y_test: torch.Tensor | None
    task: str
    input_shape: tuple
    num_outputs: int
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}; got {self.task!r}")
        self.input_shape = tuple(int(s) for s in self.input_shape)
        if (self.x_test is None) != (self.y_test is None):
            raise ValueError("x_test and y_test must both be tensors or both be None")
        for split, x, y in (("train", self.x_train, self.y_train),
                            ("test", self.x_test, self.y_test)):
            if x is None:
                continue
            if tuple(x.shape[1:]) != self.input_shape:
                raise ValueError(
                    f"x_{split} has per-sample shape {tuple(x.shape[1:])}, "
                    f"expected input_shape {self.input_shape}"
                )
            if x.shape[0] != y.shape[0]:
                raise ValueError(f"x_{split} has {x.shape[0]} samples but y_{split} has "
                                 f"{y.shape[0]}")

    @property
    def n_train(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def n_test(self) -> int:
        return 0 if self.x_test is None else int(self.x_test.shape[0])

    @property
    def has_test(self) -> bool:
        return self.x_test is not None

    @property
    def device(self) -> torch.device:
        return self.x_train.device

    def to(self, device: str | torch.device) -> "DataSource":
        """A copy with every tensor (including those in ``meta``) on ``device``."""
        device = torch.device(device)

        def move(t):
            return t.to(device) if isinstance(t, torch.Tensor) else t

        return replace(
            self,
            x_train=move(self.x_train),
            y_train=move(self.y_train),
            x_test=move(self.x_test),
            y_test=move(self.y_test),
            meta={k: move(v) for k, v in self.meta.items()},
        )

    def __repr__(self) -> str:
        # The default dataclass repr would print every tensor element.
        test = "none" if self.x_test is None else f"{self.n_test}"
        return (
            f"DataSource(name={self.name!r}, task={self.task!r}, input_shape={self.input_shape}, "
            f"num_outputs={self.num_outputs}, n_train={self.n_train}, n_test={test}, "
            f"device={self.device}, meta_keys={sorted(self.meta)})"
        )


# ----------------------------------------------------------------------------- option parsing
# Options may arrive from Python (ints, floats) or from a YAML file / command line (strings), so the
# loaders convert them here and fail with a message that names the option.


def as_int(name: str, value, *, minimum: int | None = None) -> int:
    if isinstance(value, bool):
        raise ValueError(f"option {name} must be an integer, got {value!r}")
    try:
        if isinstance(value, float):
            if not value.is_integer():
                raise ValueError
            result = int(value)
        else:
            result = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"option {name} must be an integer, got {value!r}") from None
    if minimum is not None and result < minimum:
        raise ValueError(f"option {name} must be >= {minimum}, got {result}")
    return result


def as_float(name: str, value, *, minimum: float | None = None,
             strictly_positive: bool = False) -> float:
    if isinstance(value, bool):
        raise ValueError(f"option {name} must be a number, got {value!r}")
    try:
        result = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"option {name} must be a number, got {value!r}") from None
    if result != result or result in (float("inf"), float("-inf")):
        raise ValueError(f"option {name} must be finite, got {value!r}")
    if strictly_positive and result <= 0:
        raise ValueError(f"option {name} must be > 0, got {result}")
    if minimum is not None and result < minimum:
        raise ValueError(f"option {name} must be >= {minimum}, got {result}")
    return result


FLOAT_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def as_float_dtype(value) -> torch.dtype:
    """``torch.float32``/``torch.float64`` or their names (``"float32"``, ``"float64"``)."""
    if isinstance(value, torch.dtype) and value in FLOAT_DTYPES.values():
        return value
    if isinstance(value, str) and value.removeprefix("torch.") in FLOAT_DTYPES:
        return FLOAT_DTYPES[value.removeprefix("torch.")]
    raise ValueError(f"option dtype must be one of {', '.join(FLOAT_DTYPES)}; got {value!r}")


def cpu_generator(seed) -> torch.Generator:
    """The generator every loader draws from: on the CPU, so a seed gives the same data on any
    device."""
    seed = as_int("seed", seed)
    return torch.Generator(device="cpu").manual_seed(seed)


COMMON_ARGUMENTS = ("device", "seed", "data_dir", "verify", "download")


def _spelling(name: str) -> str:
    return name.strip().lower().replace("-", "_")


# name -> loader(*, device, seed, data_dir, verify, download, **options) -> DataSource; the options
# are the typed bnlab.spec Params each @source declares. Names are case-insensitive and '-' may
# stand for '_'.
SOURCES: Registry = Registry("data source", names_label="choices", key_label="option",
                             normalize=_spelling)


def source(name: str, params: dict[str, Param] | None = None):
    """Decorator: register a loader as data source ``name``. Its options are its keyword
    parameters beyond ``COMMON_ARGUMENTS``, typed from their annotations or defaults; ``params``
    declare some more precisely (same names and defaults, checked at import:
    :func:`bnlab.spec.signature_params`)."""
    return SOURCES.register(name, params, skip=COMMON_ARGUMENTS)


def count(default: int | None, minimum: int, help: str) -> Param:
    """An integer option (``None``: a default decided by the source)."""
    return Param(default, int, minimum=minimum, nullable=default is None, help=help)


DTYPE = Param("float32", str, help="float32 or float64 (the tensors' dtype)")
