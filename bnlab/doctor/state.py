"""Save and restore everything the doctor's checks could change.

The checks run forwards in train mode (BN buffers, ``num_batches_tracked``, bnlab's moving
statistics), backwards (``.grad``), a trial optimizer step (parameters, optimizer state), and draw
from torch's RNG (dropout, noisy layers). :class:`bnlab.probes.state.Snapshot` records all of it
and writes it back into the same tensor objects; :func:`kept` wraps it for the doctor and also
puts back what a consumed data loader drew from torch's CPU RNG (the snapshot is taken before the
batches are read), and the autograd mode.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from bnlab.probes.state import Snapshot


@contextmanager
def kept(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> Iterator[Snapshot]:
    """``with kept(model, optimizer) as snap:`` — on exit the model (parameters, ``.grad``,
    buffers, train/eval flags, layer generators), the optimizer state and torch's CPU and CUDA RNG
    are as they were on entry, bitwise."""
    grad_mode = torch.is_grad_enabled()
    snap = Snapshot(model, optimizer)
    try:
        yield snap
    finally:
        snap.restore()
        torch.set_grad_enabled(grad_mode)


def state_digest(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Every tensor of the model (parameters, grads, buffers), the optimizer state and the RNG
    states as CPU copies, for bitwise comparisons in tests."""
    out = {f"param/{n}": p.detach().cpu().clone() for n, p in model.named_parameters()}
    out.update({f"grad/{n}": p.grad.detach().cpu().clone() for n, p in model.named_parameters()
                if p.grad is not None})
    out.update({f"buffer/{n}": b.detach().cpu().clone() for n, b in model.named_buffers()})
    out["modes"] = torch.tensor([m.training for m in model.modules()])
    for name, module in model.named_modules():
        generator = getattr(module, "_generator", None)
        if isinstance(generator, torch.Generator):  # stochastic layers' own streams
            out[f"generator/{name}"] = generator.get_state()
    out["rng/cpu"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            out[f"rng/cuda{i}"] = state
    if optimizer is not None:
        for i, (p, state) in enumerate(optimizer.state.items()):
            for key, value in state.items():
                if torch.is_tensor(value):
                    out[f"opt/{i}/{key}"] = value.detach().cpu().clone()
        for i, group in enumerate(optimizer.param_groups):
            for key, value in group.items():
                if key != "params":
                    out[f"group/{i}/{key}"] = torch.tensor(
                        value if isinstance(value, (int, float)) else hash(str(value)),
                        dtype=torch.float64)
    return out


def same_state(a: dict, b: dict) -> list[str]:
    """Keys where two :func:`state_digest` results differ (bitwise; NaNs compare equal)."""
    keys = set(a) | set(b)
    return sorted(k for k in keys if k not in a or k not in b or a[k].shape != b[k].shape
                  or a[k].dtype != b[k].dtype or not torch.equal(
                      a[k].view(-1).view(torch.uint8) if a[k].is_floating_point()
                      else a[k], b[k].view(-1).view(torch.uint8) if b[k].is_floating_point()
                      else b[k]))
