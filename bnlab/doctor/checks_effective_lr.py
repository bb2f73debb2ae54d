"""effective-lr: scale-invariant weights whose effective step has collapsed or exploded.

Arora, Li & Lyu, Theoretical Analysis of Auto Rate-Tuning by Batch Normalization: a weight w
followed by BN is scale-invariant, L(cw) = L(w), so ∇L(cw) = ∇L(w)/c (Lemma 2.4) and SGD with rate
η moves its direction as SGD with the effective rate η/‖w‖² on the unit sphere (Theorem 2.5).
Without weight decay ‖w‖ only grows (‖w_{t+1}‖² = ‖w_t‖² + η²‖∇w‖², Lemma 2.4), so η/‖w‖² only
falls; weight decay shrinks ‖w‖ and holds the effective rate up.

Measured, per scale-invariant weight (a Linear/Conv whose output tensor goes straight into a BN
layer that divides by σ, found by one forward on a copy; ``ScaleInvariantBN``'s weight): the
effective-rate factor f = ‖w_ref‖²/‖w‖², with ‖w_ref‖² = 2·out_channels the expected squared norm
under He initialisation, i.e. η/‖w‖² in units of its value at a standard init. f < 10⁻³ (‖w‖ 30×
its init scale: the layer has all but stopped turning) warns "collapsed", f > 10³ warns "exploded".
With an optimizer, one step is taken on the real optimizer inside a snapshot
(:func:`bnlab.probes.state.simulated_step`, then rewound) and the angle the step turns each
weight, ‖Δw‖/‖w‖ (radians, small-angle), is measured; above 0.3 rad per step warns "exploded"
(the direction decorrelates within a few steps).

Cost: one forward and backward on the first batch (with an optimizer), one forward on a copy.
"""

from __future__ import annotations

import copy

import torch

from bnlab.norms import MeanOnlyBatchNorm
from bnlab.probes.base import WEIGHT_LAYER_TYPES, bn_layers
from bnlab.probes.effective_lr import scale_invariant_weights
from bnlab.probes.state import simulated_step

from .context import Checkup, as_trained, dataflow
from .findings import Finding

COLLAPSED = 1e-3
EXPLODED = 1e3
ANGLE = 0.3
PAPER = ("Arora, Li & Lyu, Theoretical Analysis of Auto Rate-Tuning by Batch Normalization (ICLR "
         "2019), Lemma 2.4 and Theorem 2.5: effective rate η/‖w‖²")
WHY_FACTOR = ("η/‖w‖² 1000× away from its value at a standard init is beyond what auto rate-tuning "
              "(‖w‖ growth) produces in a healthy run"
       "; false alarms: 0 of 320 healthy networks, closest 0.12× the line "
       "(benchmarks/doctor_false_alarms.py)")
WHY_ANGLE = ("a step turning the weight by 0.3 rad decorrelates its direction within a few steps; "
             "false alarms: 0 of 320 healthy networks, closest 0.12× the line "
             "(benchmarks/doctor_false_alarms.py)")


def invariant_weights(checkup: Checkup) -> list[str]:
    """Names of scale-invariant weights (weight layer output → a BN layer that divides by σ)."""
    twin = copy.deepcopy(checkup.model)
    modules = dict(twin.named_modules())
    norms = {n for n, m in bn_layers(twin) if not isinstance(m, MeanOnlyBatchNorm)}
    names = set(scale_invariant_weights(twin))
    for producer, consumer in dataflow(twin, checkup.batches[0][0]):
        if consumer in norms and isinstance(modules[producer], WEIGHT_LAYER_TYPES):
            names.add(f"{producer}.weight" if producer else "weight")
    params = dict(checkup.model.named_parameters())
    return [n for n in sorted(names) if n in params and params[n].requires_grad]


def angles(checkup: Checkup, snapshot, names: list[str]) -> dict[str, float]:
    """‖Δw‖/‖w‖ of one real optimizer step on the first batch, per weight (state rewound)."""
    model = checkup.model
    params = dict(model.named_parameters())
    snapshot.reset_forward_state()
    as_trained(model)
    model.zero_grad(set_to_none=True)
    x, y = checkup.batches[0]
    with torch.enable_grad():
        checkup.loss_fn(model(x), y).backward()
    updated = simulated_step(snapshot)
    out = {}
    for name in names:
        w = params[name].detach().double()
        new = updated[id(params[name])].double()
        out[name] = float((new - w).norm() / w.norm().clamp_min(1e-30))
    return out


def check(checkup: Checkup, report, snapshot) -> None:
    names = invariant_weights(checkup)
    if not names:
        return
    params = dict(checkup.model.named_parameters())
    factor = {}
    for name in names:
        w = params[name].detach().double()
        factor[name] = float(2.0 * w.shape[0] / w.pow(2).sum().clamp_min(1e-30))
    lr = checkup.lr
    if lr is not None:
        report.measurements["effective_lr"] = {
            n: [(0, lr / float(params[n].detach().double().pow(2).sum()))] for n in names}
    report.measurements["effective_lr_factor"] = factor
    turned = angles(checkup, snapshot, names) if checkup.optimizer is not None else {}
    report.measurements["relative_update"] = turned
    wd = (checkup.optimizer.param_groups[0].get("weight_decay", 0.0)
          if checkup.optimizer is not None else None)
    decay = ("" if wd is None else
             f"; weight decay {wd:g}" + (" (none: ‖w‖ only grows)" if not wd else ""))
    collapsed = [n for n in names if factor[n] < COLLAPSED]
    exploded = [n for n in names if factor[n] > EXPLODED or turned.get(n, 0.0) > ANGLE]
    if collapsed:
        worst = min(collapsed, key=factor.get)
        report.add(Finding(
            "effective-lr", "warn", tuple(collapsed), factor[worst], COLLAPSED, WHY_FACTOR, PAPER,
            "collapsed: rescale these weights to their init norm (the function is unchanged: they "
            "are scale-invariant) or train with weight decay; bnlab.norms.ScaleInvariantBN makes "
            "the invariance exact",
            f"η/‖w‖² at {factor[worst]:.3g}× its init value at {worst}{decay}"))
    if exploded:
        worst = max(exploded, key=lambda n: turned.get(n, 0.0) / ANGLE + factor[n] / EXPLODED)
        by_angle = turned.get(worst, 0.0) > ANGLE
        value = turned[worst] if by_angle else factor[worst]
        report.add(Finding(
            "effective-lr", "warn", tuple(exploded), value, ANGLE if by_angle else EXPLODED,
            WHY_ANGLE if by_angle else WHY_FACTOR, PAPER,
            "exploded: lower the learning rate of these weights (a parameter group) or let ‖w‖ "
            "grow (less weight decay); bnlab.probes.max_stable_lr measures the stable range",
            f"one step turns {worst} by {turned.get(worst, float('nan')):.3g} rad; η/‖w‖² at "
            f"{factor[worst]:.3g}× its init value{decay}"))
