"""Optimizers of the papers: SGD (momentum, weight decay, full batch), separate learning rates for
scale-invariant parameters, and projected SGD; plus the numerical scale-invariance check.

Arora, Li & Lyu, "Theoretical analysis of auto rate-tuning by batch normalization" (ICLR 2019):

* Definition 2.1: ``w`` is scale-invariant if ``F(c w, θ') = F(w, θ')`` for all ``c > 0``.
  :func:`find_scale_invariant` tests it numerically on a fixed batch in train mode (the mode the
  gradient is taken in), scaling by exactly 2 and 0.5. Those factors are powers of two, so in
  floating point the pre-normalization activations scale *exactly*; the loss then changes only
  through what truly breaks invariance (e.g. BN's ``eps``, which Arora eq. 7 notes), and the
  relative tolerance 1e-4 can stay far above float32 rounding yet far below any real dependence.
* Eq. 4 / Appendix D.1: separate learning rates ``η_w`` (scale-invariant) and ``η_g`` (the rest),
  realised as two parameter groups of one ``torch.optim.SGD``.
* Appendix D, Setting 2 (projected SGD): after each step, every scale-invariant parameter is
  rescaled to the norm it had before the step. By induction that norm is the initial one, so we
  keep the initial norms (float64) and project onto them; this is the same map but free of the
  float32 drift that re-measuring the norm every step would accumulate.
* Lemma 2.4: for plain SGD ``‖w_{t+1}‖² = ‖w_t‖² + η²‖∇_w F‖²`` -- the norm of a scale-invariant
  weight only grows. Tested in ``tests/test_train_optim.py`` against this identity.

Scale invariance of a weight feeding a BN layer holds per output unit (each row of a linear
weight, each filter of a convolution: Arora Sec. 2.1). The check therefore also scales rows by
alternating factors 2 / 0.5; if the loss is still unchanged the parameter is recorded with
granularity ``rows`` and projected row by row (which also fixes the whole tensor's norm),
otherwise with granularity ``tensor``.

Joint groups (Arora Sec. 2.1, App. D): with a positively homogeneous activation (ReLU) between a BN
layer and the next normalized layer, the concatenation (γ, β) of that BN is scale-invariant although
neither vector is alone. Each module with 1-D ``weight`` and ``bias`` is tested by scaling both
together; an invariant pair is recorded as granularity ``joint:<module>`` and projected (and given
the scale-invariant learning rate) as one vector.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping
from typing import cast

import torch
from torch import nn

GRANULARITIES = ("tensor", "rows", "joint")  # "joint" is written "joint:<group>"
RELATIVE_TOLERANCE = 1e-4
# Loss values below this are treated as this for the relative comparison, so a loss of ~0 does not
# make every parameter look invariant through the absolute floor alone.
_LOSS_FLOOR = 1e-6


# nn.Module's own bookkeeping (hook, child, parameter, buffer tables): not state a forward changes
_MODULE_TABLES = frozenset(vars(nn.Module()))


class _ModelState:
    """Everything a training-mode forward may change in ``model``, saved once and restored exactly,
    in place: parameter and buffer values (and which tensor each name is bound to), every module's
    other attributes (rebound to the saved objects), the values of tensors and the states of
    ``torch.Generator`` s held as attributes; the modules' modes by :meth:`restore_modes`.

    Objects are restored in place, never replaced by copies: a trainer that holds a layer's noise
    generator (to seed or checkpoint it) keeps holding the one the layer draws from. The
    scale-invariance test evaluates the model in place between :meth:`restore` calls instead of on
    a deep copy per evaluation: deep-copying a 25-layer network 75 times took 6–12 s of a set-up.
    """

    def __init__(self, model: nn.Module) -> None:
        self.modules = list(model.modules())
        self.modes = [m.training for m in self.modules]
        self.tables = [(m, dict(m._parameters), dict(m._buffers)) for m in self.modules]
        self.attrs = [(m, {k: v for k, v in vars(m).items() if k not in _MODULE_TABLES})
                      for m in self.modules]
        held = [*_tensors(model)] + [v for _, attrs in self.attrs for v in attrs.values()]
        self.values = {id(t): (t, t.detach().clone()) for t in held if isinstance(t, torch.Tensor)}
        self.generators = {id(g): (g, g.get_state())
                           for g in held if isinstance(g, torch.Generator)}

    def restore_modes(self) -> None:
        for m, mode in zip(self.modules, self.modes):
            m.training = mode

    def restore(self) -> None:
        for m, params, buffers in self.tables:
            m._parameters.clear()
            m._parameters.update(params)
            m._buffers.clear()
            m._buffers.update(buffers)
        for m, attrs in self.attrs:
            for k in [k for k in vars(m) if k not in _MODULE_TABLES and k not in attrs]:
                del vars(m)[k]  # set during the forward: not there before
            vars(m).update(attrs)
        with torch.no_grad():
            for tensor, saved in self.values.values():
                tensor.copy_(saved)
        for generator, state in self.generators.values():
            generator.set_state(state)


def _tensors(model: nn.Module) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen.setdefault(id(t), t)
    return list(seen.values())


def _loss_in_place(
    model: nn.Module,
    state: _ModelState,
    loss_fn: Callable,
    batch: tuple[torch.Tensor, torch.Tensor],
    seed: int,
    edit: Callable[[dict[str, nn.Parameter]], None] | None,
) -> float:
    """Loss of ``model`` (train mode) after ``edit``, then ``state`` restored: nothing leaks back.

    The model is in train mode (set once by the caller). Each evaluation starts from exactly the
    saved state (running statistics, layer noise), and the global RNG (dropout) is re-seeded
    identically inside a fork.
    """
    xb, yb = batch
    devices = [xb.device.index or 0] if xb.device.type == "cuda" else []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            if edit is not None:
                edit(dict(model.named_parameters()))
            return float(loss_fn(model(xb), yb))
    finally:
        state.restore()


def _same(reference: float, value: float, rtol: float) -> bool:
    if reference != reference or value != value:  # NaN: invariance cannot be judged
        return False
    return abs(value - reference) <= rtol * max(abs(reference), _LOSS_FLOOR)


def find_scale_invariant(
    model: nn.Module,
    loss_fn: Callable,
    batch: tuple[torch.Tensor, torch.Tensor],
    *,
    rtol: float = RELATIVE_TOLERANCE,
    seed: int = 0,
) -> dict[str, str]:
    """Names of the scale-invariant weights (every parameter with ≥ 2 dimensions is tried).

    Returns ``{name: granularity}`` with granularity ``"rows"`` (each slice along dim 0 is
    invariant on its own) or ``"tensor"`` (only the whole tensor). See the module docstring.
    """
    state = _ModelState(model)

    def loss(edit: Callable[[dict[str, nn.Parameter]], None] | None) -> float:
        return _loss_in_place(model, state, loss_fn, batch, seed, edit)

    model.train()
    try:
        return _detect(model, loss, rtol)
    finally:
        state.restore_modes()


def _detect(model: nn.Module, loss: Callable, rtol: float) -> dict[str, str]:
    """Per-parameter and joint (γ, β) invariance by :func:`find_scale_invariant`'s tests."""
    reference = loss(None)
    found: dict[str, str] = {}
    for name, param in model.named_parameters():
        if param.dim() < 2 or not param.requires_grad:
            continue

        def scale(factor, name=name):
            def edit(params):
                params[name].mul_(factor)

            return edit

        # Per-row invariance (rows scaled by 2 and 0.5 alternately) implies whole-tensor
        # invariance, so it is tried first: one evaluation settles the usual BN case.
        if param.shape[0] >= 2:
            shape = (param.shape[0],) + (1,) * (param.dim() - 1)
            factors = torch.where(
                torch.arange(param.shape[0], device=param.device) % 2 == 0, 2.0, 0.5
            ).to(param.dtype).reshape(shape)
            if _same(reference, loss(scale(factors)), rtol):
                found[name] = "rows"
                continue
        if all(
            _same(reference, loss(scale(c)), rtol)
            for c in (2.0, 0.5)
        ):
            found[name] = "tensor"
    found.update(_joint_affine_groups(model, loss, reference, rtol))
    return found


def _joint_affine_groups(model, loss, reference, rtol) -> dict[str, str]:
    """(γ, β) pairs of normalization layers that are scale-invariant together (see module
    docstring)."""
    params = dict(model.named_parameters())
    found: dict[str, str] = {}
    for module_name, module in model.named_modules():
        w, b = getattr(module, "weight", None), getattr(module, "bias", None)
        if not (isinstance(w, nn.Parameter) and isinstance(b, nn.Parameter) and w.dim() == 1
                and w.shape == b.shape and w.requires_grad and b.requires_grad):
            continue
        names = [f"{module_name}.weight" if module_name else "weight",
                 f"{module_name}.bias" if module_name else "bias"]
        if any(n not in params or n in found for n in names):
            continue

        def scale(factor, names=names):
            def edit(p):
                for n in names:
                    p[n].mul_(factor)

            return edit

        if all(_same(reference, loss(scale(c)), rtol) for c in (2.0, 0.5)):
            for n in names:
                found[n] = f"joint:{module_name}"
    return found


def resolve_override(model: nn.Module, patterns: Iterable[str]) -> dict[str, str]:
    """Explicit scale-invariant parameters: names or shell patterns, optionally ``name:rows``.

    Each pattern must match at least one parameter; the error lists the parameter names.
    """
    names = [n for n, _ in model.named_parameters()]
    chosen: dict[str, str] = {}
    for raw in patterns:
        pattern, _, granularity = raw.partition(":")
        granularity = granularity or "tensor"
        if granularity not in GRANULARITIES:
            raise ValueError(
                f"scale_invariant entry {raw!r}: granularity must be one of "
                f"{', '.join(GRANULARITIES)}"
            )
        if granularity == "joint":  # every parameter the pattern matches forms one group
            granularity = f"joint:{pattern}"
        matches = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not matches:
            shown = ", ".join(names[:40]) + (" ..." if len(names) > 40 else "")
            raise ValueError(
                f"scale_invariant entry {pattern!r} matches no parameter; parameters: {shown}"
            )
        for n in matches:
            chosen[n] = granularity
    return chosen


def _norms(param: torch.Tensor, granularity: str) -> torch.Tensor:
    flat = param.detach().to(torch.float64)
    if granularity == "rows":
        return flat.reshape(flat.shape[0], -1).norm(dim=1)
    return flat.norm()


def _group_norms(members: list[torch.Tensor], granularity: str) -> torch.Tensor:
    if granularity == "joint":
        # members: not empty
        return torch.sqrt(cast(torch.Tensor, sum(_norms(p, "tensor") ** 2 for p in members)))
    return _norms(members[0], granularity)


class Projection:
    """Projected SGD (Arora App. D, Setting 2): keep each scale-invariant norm at its initial value.

    Targets are single parameters (``tensor``/``rows``) or joint groups (``joint:<group>``), whose
    members are rescaled together to keep the norm of their concatenation.
    """

    def __init__(self, model: nn.Module, invariant: Mapping[str, str]):
        params = dict(model.named_parameters())
        self.targets: dict[str, tuple[list[torch.Tensor], str]] = {}
        for name, gran in invariant.items():
            if gran.startswith("joint:"):
                self.targets.setdefault(gran, ([], "joint"))[0].append(params[name])
            else:
                self.targets[name] = ([params[name]], gran)
        self.radii = {key: _group_norms(ps, g) for key, (ps, g) in self.targets.items()}

    @torch.no_grad()
    def project(self) -> None:
        for key, (members, granularity) in self.targets.items():
            current = _group_norms(members, granularity)
            radius = self.radii[key]
            # a zero slice has no direction to keep; leave it at zero instead of dividing by 0
            factor = torch.where(current > 0, radius / current.clamp_min(1e-300),
                                 torch.ones_like(current))
            for param in members:
                f = (factor.reshape((param.shape[0],) + (1,) * (param.dim() - 1))
                     if granularity == "rows" else factor)
                param.copy_((param.to(torch.float64) * f).to(param.dtype))

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: r.clone() for name, r in self.radii.items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        missing = set(self.radii) - set(state)
        if missing:
            raise ValueError(f"checkpoint lacks projection radii for {sorted(missing)}")
        self.radii = {name: state[name].to(torch.float64) for name in self.radii}


def build_optimizer(
    model: nn.Module,
    invariant: Mapping[str, str],
    *,
    lr: float,
    lr_scale_invariant: float | None,
    momentum: float,
    weight_decay: float,
) -> torch.optim.SGD:
    """SGD with two parameter groups (Arora eq. 4): scale-invariant ones at ``lr_scale_invariant``
    (``lr`` if None), the rest at ``lr``. Each group keeps its ``base_lr`` for the schedule."""
    invariant_params: list[nn.Parameter] = []
    other_params: list[nn.Parameter] = []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (invariant_params if name in invariant else other_params).append(param)
    lr_w = lr if lr_scale_invariant is None else lr_scale_invariant
    groups = []
    if invariant_params:
        groups.append({"params": invariant_params, "lr": lr_w, "base_lr": lr_w,
                       "group": "scale_invariant"})
    if other_params:
        groups.append({"params": other_params, "lr": lr, "base_lr": lr, "group": "scale_variant"})
    if not groups:
        raise ValueError("the model has no trainable parameters")
    return torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay)


def set_lr_factor(optimizer: torch.optim.Optimizer, factor: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = group["base_lr"] * factor
