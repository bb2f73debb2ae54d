"""Count the aten operations a piece of code dispatches: the measure behind the op-count limits.

Each dispatched operation is a kernel launch on a GPU and a few microseconds of dispatch on a CPU,
so for small tensors (and for every tensor on a GPU) their number, not the arithmetic, sets a
layer's speed. :func:`count_ops` runs a callable under a ``TorchDispatchMode`` and counts every
operation that reaches the dispatcher below autograd, views excluded (they launch nothing). A custom
operator registered with ``torch.library`` counts once: what runs inside it is not seen, so a count
says how many operations the dispatcher, autocast and ``torch.compile`` see, not how many kernels
run. With ``inside=True`` a call of the compiled per-channel coefficients (:mod:`.coef_compile`)
counts as one, ``compiled::coefficients`` (its generated code is a kernel or two, not aten
operations).

    >>> from bnlab.norms.tools.opcount import count_ops, training_step
    >>> count_ops(training_step(bnlab.norms.create("bn", 64), (32, 64, 16, 16))).total
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..engine.fused import KERNELS

# Ops that neither compute nor allocate a result of their own (views, metadata).
FREE = frozenset({"detach", "alias", "lift_fresh", "_unsafe_view"})  # views not marked as such


def is_view(func) -> bool:
    """True for aten view ops (their schema's result aliases an input), which launch no kernel."""
    schema = func._schema
    return bool(schema.returns) and all(r.alias_info is not None and not r.alias_info.is_write
                                        for r in schema.returns)


@dataclass
class OpCount:
    """The non-view operations one call dispatched, by name, in order."""

    names: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.names)

    def by_name(self) -> Counter:
        return Counter(self.names)


class _Counter(TorchDispatchMode):
    def __init__(self, record: OpCount, inside: bool) -> None:
        super().__init__()
        self.record, self.inside = record, inside

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name, ns = func.overloadpacket.__name__, func.namespace
        # count what the operator's kernel runs instead of the operator
        if self.inside and ns == "bnlab":
            with self:
                return KERNELS[name](*args, **(kwargs or {}))
        if not is_view(func) and name not in FREE:
            self.record.names.append(name if ns == "aten" else f"{ns}::{name}")
        return func(*args, **(kwargs or {}))

    def record_compiled_call(self) -> None:
        """Called by :mod:`.coef_compile` for one call of a compiled per-channel function (run with
        this mode off: dynamo refuses user dispatch modes), counted as one operation."""
        if self.inside:
            self.record.names.append("compiled::coefficients")


def count_ops(fn: Callable[[], object], inside: bool = False) -> OpCount:
    """Run ``fn()`` once and return the non-view operations it dispatched (forward and backward).

    ``inside=True`` counts the aten operations that non-aten operators (``bnlab::…``) run in their
    kernels instead of the operators themselves: on a GPU, about the number of kernel launches."""
    record = OpCount()
    with _Counter(record, inside):
        fn()
    return record


def training_step(module: torch.nn.Module, shape: tuple[int, ...], seed: int = 0,
                  device: torch.device | str = "cpu",
                  dtype: torch.dtype = torch.float32) -> Callable[[], None]:
    """One training-mode forward + backward of ``module`` on a fixed random input of ``shape``
    and ``dtype`` (a half dtype: as a convolution under autocast hands it on to a float32 layer),
    the gradient of the output given (so the loss adds no operations): what the limits count."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen).to(device, dtype)
    g = torch.randn(shape, generator=gen).to(device, dtype)
    module.to(device).train()

    def step() -> None:
        module(x.detach().requires_grad_()).backward(g)

    return step


def count_training_step(module: torch.nn.Module, shape: tuple[int, ...],
                        inside: bool = False, dtype: torch.dtype = torch.float32) -> OpCount:
    """The operations of one :func:`training_step` of ``module`` after a first, uncounted one
    (which allocates the parameters' ``.grad``; the counted step accumulates into them, as training
    does)."""
    step = training_step(module, shape, dtype=dtype)
    step()
    return count_ops(step, inside)
