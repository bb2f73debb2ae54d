"""Probes: the papers' measurements, taken on any PyTorch training loop without changing it.

Each probe is a small class with one job and a documented cost (``PROBES[name].cost``) and a
:class:`bnlab.callbacks.Callback`: it runs under ``bnlab train`` (``--probe landscape --probe-every
50``, built by :func:`create`), from a plain loop through :class:`Lab`, and in a PyTorch Lightning
``Trainer`` through :class:`bnlab.integrations.lightning.BnlabCallback`. Results are metrics
``probe/<probe>/<quantity>[/<layer>]`` plus ``probe/<probe>/seconds`` per call. Parameters,
gradients, buffers (BN running statistics, ``num_batches_tracked``, MBN/CBN moving statistics),
optimizer state, torch's global RNG, the
generators of stochastic layers and train/eval flags are restored after every call
(:mod:`bnlab.probes.state`), so a run with probes is bitwise identical to one without.

Step probes: ``ics``, ``moments``, ``histograms``, ``landscape``, ``effective_lr``, ``grad_stats``,
``cbn_ratios``, ``batch_noise``, ``gamma``, ``bn_regularization``, ``hessian``. Search: :func:`max_stable_lr`.
"""

from .lab import PROBES, SEARCHES, Lab, available, create, describe  # isort: skip (registers in order)
from .activations import MomentsProbe
from .base import Probe, ProbeContext, bn_layers, weight_layers
from .batch_noise import BatchNoiseProbe
from .bn_regularization import BNRegularizationProbe
from .cbn_ratios import CBNRatiosProbe
from .effective_lr import EffectiveLRProbe, scale_invariant_weights
from .gamma import GammaProbe
from .gradients import GradStatsProbe
from .hessian import HessianProbe, hutchinson_trace, lanczos_extremes
from .histograms import HistogramsProbe
from .ics import ICSProbe
from .landscape import LandscapeProbe, LandscapeResult, default_range, evaluate_landscape, step_sizes
from .stable_lr import (
    DEFAULT_CANDIDATES,
    StableLRResult,
    is_stable,
    max_stable_lr,
    max_stable_lr_for,
    train_status,
)
from .state import Snapshot, preserved, simulated_step

__all__ = [
    "BNRegularizationProbe", "BatchNoiseProbe", "CBNRatiosProbe", "DEFAULT_CANDIDATES", "EffectiveLRProbe",
    "GammaProbe", "GradStatsProbe", "HessianProbe", "HistogramsProbe", "ICSProbe", "Lab", "LandscapeProbe",
    "LandscapeResult", "MomentsProbe", "PROBES", "Probe", "ProbeContext", "SEARCHES", "Snapshot", "StableLRResult",
    "available",
    "bn_layers", "create", "default_range", "describe", "evaluate_landscape", "hutchinson_trace", "is_stable",
    "lanczos_extremes",
    "max_stable_lr", "max_stable_lr_for", "preserved", "scale_invariant_weights", "simulated_step",
    "step_sizes", "train_status", "weight_layers",
]
