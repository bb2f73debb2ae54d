"""Probes on compiled models: measure through the eager module a ``torch.compile`` wrapper holds.

``torch.compile(model)`` returns an ``OptimizedModule`` that shares ``model``'s parameters and
buffers and keeps ``model`` itself as ``_orig_mod``. Its forward runs through AOTAutograd, which
has no double backward (``RuntimeError: torch.compile with aot_autograd does not currently support
double backward``), and every new input shape or ``torch.func.functional_call`` substitution is a
recompile. Probes take Hessian–vector products (``hessian``, ``landscape``'s β-smoothness),
substitute parameters (``ics``, ``landscape``) and run extra forwards, so they measure through the
eager module: the same parameters, buffers and function, without the compiler. The training step
keeps the compiled forward; only the probes' own passes are eager (slower, never different).
"""

from __future__ import annotations

from torch import nn

__all__ = ["eager_module", "is_compiled"]


def is_compiled(model: object) -> bool:
    """Whether ``model`` is a ``torch.compile`` wrapper (checked without importing
    torch._dynamo)."""
    return isinstance(model, nn.Module) and isinstance(getattr(model, "_orig_mod", None), nn.Module)


def eager_module(model: nn.Module) -> nn.Module:
    """``model`` with every ``torch.compile`` wrapper removed (``_orig_mod``, repeatedly)."""
    while is_compiled(model):
        model = model._orig_mod  # type: ignore[assignment]
    return model
