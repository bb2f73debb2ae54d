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
``cbn_ratios``, ``batch_noise``, ``gamma``, ``bn_regularization``, ``hessian``. Search:
:func:`max_stable_lr`.
"""

from .lab import PROBES, Lab, available, create, describe  # isort: skip (registers in order)
from .activations import MomentsProbe
from .base import Probe, ProbeContext
from .batch_noise import BatchNoiseProbe
from .bn_regularization import BNRegularizationProbe
from .cbn_ratios import CBNRatiosProbe
from .effective_lr import EffectiveLRProbe
from .gamma import GammaProbe
from .gradients import GradStatsProbe
from .hessian import HessianProbe
from .histograms import HistogramsProbe
from .ics import ICSProbe
from .landscape import LandscapeProbe, LandscapeResult, evaluate_landscape
from .stable_lr import StableLRResult, max_stable_lr, max_stable_lr_for

# Helpers of the probes, reachable as attributes (``bnlab.probes.default_range``, as the API page
# documents them) but not part of ``__all__``: their home is the submodule named here.
from .base import bn_layers as bn_layers, weight_layers as weight_layers
from .effective_lr import scale_invariant_weights as scale_invariant_weights
from .hessian import hutchinson_trace as hutchinson_trace, lanczos_extremes as lanczos_extremes
from .lab import SEARCHES as SEARCHES
from .landscape import default_range as default_range, step_sizes as step_sizes
from .stable_lr import DEFAULT_CANDIDATES as DEFAULT_CANDIDATES, is_stable as is_stable
from .stable_lr import train_status as train_status
from .state import Snapshot as Snapshot, preserved as preserved, simulated_step as simulated_step

# What a user needs (torch.nn's style): attach probes (Lab, create, the registry), the probe
# classes, the base class and context for writing one, the searches/measurements and results.
__all__ = [
    "Lab", "PROBES", "available", "create", "describe",
    "BNRegularizationProbe", "BatchNoiseProbe", "CBNRatiosProbe", "EffectiveLRProbe", "GammaProbe",
    "GradStatsProbe", "HessianProbe", "HistogramsProbe", "ICSProbe", "LandscapeProbe",
    "MomentsProbe",
    "Probe", "ProbeContext",
    "LandscapeResult", "StableLRResult", "evaluate_landscape", "max_stable_lr", "max_stable_lr_for",
]
