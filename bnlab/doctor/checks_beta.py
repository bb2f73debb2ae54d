"""beta-swamping: β dominates what a BN layer hands to a saturating activation.

Peng, Yu & Yu, Re-Thinking the Effectiveness of Batch Normalization and Beyond, Eq. 5: with a
saturating activation δ after y = γ x̂ + β, the normalized signal's share of the activation's input
power is var_B(y)/(var_B(y) + β²) (for CBN, var_B/(var_B + β²) of the decoupled divisor). When β
dominates, δ sits on its flat part for the whole batch: the signal passes through δ'(β) ≈ 0 and the
layer's gradient vanishes.

Measured: one train-mode forward on a copy finds each BN layer whose output tensor goes straight
(or through dropout or an identity) into a saturating activation (``nn.Sigmoid``, ``nn.Tanh``,
``nn.Hardtanh``, ``nn.Hardsigmoid``, ``nn.Softsign``, ``nn.LogSigmoid``; also a norm-act layer
such as timm's ``BatchNormAct2d`` whose ``act`` is one), and per channel the share
var(y)/(var(y) + mean(y)²) of the BN output y (for a norm-act layer, γ²/(γ² + β²)). The value is
the median over channels of the worst layer; it warns below 0.1, i.e. |β| ≥ 3|γ| for the median
channel, where tanh'(3) = 0.01 and σ'(3)/σ'(0) = 0.18. Every CBN layer is examined whatever follows
it: its output's share is exactly Peng's var_B/(var_B + β²) (y = γ/ρ·(x − μ_B + β)/√(var_B + β²)
has mean ∝ β and variance ∝ var_B), and a small share means β shrinks the signal itself.

Cost: one forward pass of the first batch (on a copy).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from bnlab.norms import CompleteBatchNorm
from bnlab.probes.base import bn_layers, capture_inputs, channels_first

from .context import Checkup, as_trained, dataflow
from .findings import Finding

SATURATING = (nn.Sigmoid, nn.Tanh, nn.Hardtanh, nn.Hardsigmoid, nn.Softsign, nn.LogSigmoid)
PASS_THROUGH = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.Identity)
THRESHOLD = 0.1
PAPER = ("Peng, Yu & Yu, Re-Thinking the Effectiveness of Batch Normalization and Beyond, Eq. 5 "
         "(var_B/(var_B + β²))")
WHY = ("a share of 0.1 means |β| = 3|γ| for the median channel, where tanh'(3) = 0.01: the "
       "activation is flat for the whole batch"
       "; false alarms: 0 of 320 healthy networks, closest 0.14× the line "
       "(benchmarks/doctor_false_alarms.py)")
REMEDY = ("keep β from dominating: weight decay on β, β initialised at 0; before a saturating "
          "activation, normalize after it instead, before the next layer, as Peng's CBN does "
          "(bnlab.norms.create('cbn'), bnlab.models placement='pre_linear')")


def _share(y: torch.Tensor) -> torch.Tensor:
    rows = channels_first(y.double())
    var, mean = torch.var_mean(rows, dim=1, correction=0)
    return var / (var + mean.pow(2) + 1e-30)


def shares(checkup: Checkup) -> dict[str, dict]:
    twin = copy.deepcopy(checkup.model)
    modules = dict(twin.named_modules())
    x = checkup.batches[0][0]
    feeding = {}
    norms = dict(bn_layers(twin))
    edges = dataflow(twin, x)
    after: dict[str, list[str]] = {}
    for producer, consumer in edges:
        after.setdefault(producer, []).append(consumer)
    for name in norms:
        # follow the BN output through modules that do not change it in eval (dropout, identity)
        frontier, seen = list(after.get(name, [])), set()
        while frontier:
            consumer = frontier.pop()
            if consumer in seen:
                continue
            seen.add(consumer)
            if isinstance(modules[consumer], SATURATING):
                feeding[name] = f"before {type(modules[consumer]).__name__}"
            elif isinstance(modules[consumer], PASS_THROUGH):
                frontier.extend(after.get(consumer, []))
    for name, module in bn_layers(twin):
        act = getattr(module, "act", None)
        if isinstance(act, SATURATING) and name not in feeding:
            feeding[name] = f"before {type(act).__name__} (inside {type(module).__name__})"
        elif isinstance(module, CompleteBatchNorm) and name not in feeding:
            # CBN divides x − μ_B + β by √(var_B + β²) (Eq. 5): β in the divisor shrinks the
            # signal whatever follows the layer
            feeding[name] = "in its own divisor (CBN, Eq. 5)"
    out = {}
    inside = {n for n, a in feeding.items() if "(inside" in a}
    captured = [(n, modules[n]) for n in feeding if n not in inside]
    with capture_inputs(captured, outputs=True) as cap, torch.no_grad():
        as_trained(twin)
        twin(x)
    for name, activation in feeding.items():
        if name in inside:
            module = modules[name]
            gamma, beta = module.weight.detach().double(), module.bias.detach().double()
            share = gamma.pow(2) / (gamma.pow(2) + beta.pow(2) + 1e-30)
        elif name in cap.values:
            share = _share(cap.values[name])
        else:
            continue
        out[name] = {"share": float(share.median()), "share_min": float(share.min()),
                     "activation": activation}
    return out


def check(checkup: Checkup, report) -> None:
    found = shares(checkup)
    report.measurements["beta_share"] = found
    low = {n: v for n, v in found.items() if v["share"] < THRESHOLD}
    if not low:
        return
    worst = min(low, key=lambda n: low[n]["share"])
    detail = (f"median channel share var/(var + β²) = {low[worst]['share']:.3g} at {worst}, "
              f"{low[worst]['activation']}")
    report.add(Finding("beta-swamping", "warn", tuple(sorted(low, key=lambda n: low[n]["share"])),
                       low[worst]["share"], THRESHOLD, WHY, PAPER, REMEDY, detail))
