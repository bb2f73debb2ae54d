"""stale-running-stats: running statistics far from the population statistics of the network as it
is now.

Ioffe & Szegedy (2015), Algorithm 2: at inference BN normalizes with the population statistics of
the *final* network, E[x] = E_B[μ_B] and Var[x] = m/(m−1)·E_B[σ²_B]. The running statistics kept
during training are an EMA over earlier networks; they lag when the momentum is too small for the
number of steps (torch's ``momentum`` is the weight of the *new* batch, 0.1 by default; Keras/TF's
``momentum=0.99`` is the weight of the *old* value, i.e. torch ``momentum=0.01``), or when the
weights changed after the statistics were collected (fine-tuning, pruning, loading weights only).

Measured: the population statistics are recollected over the given batches on a deep copy
(:func:`bnlab.norms.recollect_running_stats`, momentum None), and the eval loss is compared under
three choices — running statistics, population statistics, each batch's own statistics (train mode).
The value is the relative eval-loss excess of the running statistics over the population ones,
``(L_running − L_population) / max(L_population, 0.2)``, warning at 0.25 (so a gap under 0.05
nats, a few borderline examples of a well-trained network, never warns). Accuracy is reported, not
judged: a network near chance changes many argmaxes for a loss change of 1%. Layers are located by
the distance of each layer's running statistics from its population statistics — mean shift in
population SDs, mean_c |μ_run − μ_pop| / σ_pop, and half the mean absolute log variance ratio,
mean_c |½ log(σ²_run / σ²_pop)| (both in SD units) — and, for the most distant layers, by switching
that one layer to its population statistics and measuring how much of the loss excess it removes.

Cost: the batches' forward passes 3 times (recollection, eval with running and with population
statistics), once in train mode, and once more per switched layer (at most ``SWITCHED``).
"""

from __future__ import annotations

import copy

import torch

from .context import Checkup, tracking_layers
from .findings import Finding

THRESHOLD = 0.25
"""Relative eval-loss excess of the running over the population statistics that warns."""
LAYER_DISTANCE = 0.5
"""A layer whose running statistics are this many SDs from the population's is named."""
SWITCHED = 3
LOSS_FLOOR = 0.2
"""Below this eval loss the excess is measured in units of it: a gap under 0.05 nats never warns."""

PAPER = ("Ioffe & Szegedy, Batch Normalization (2015), Algorithm 2 (population statistics for "
         "inference)")
WHY = ("the running statistics cost 25% more eval loss than the population statistics of the "
       "same weights: beyond the EMA's own sampling noise"
       "; false alarms: 0 of 320 healthy networks, closest 0.14× the line "
       "(benchmarks/doctor_false_alarms.py)")


def layer_distances(model, population) -> dict[str, dict]:
    """Per tracking layer: running and population statistics and their distance in SD units."""
    out = {}
    for name, module in tracking_layers(model):
        if name not in population:
            continue
        mu_p, var_p = population[name]
        eps = float(getattr(module, "eps", 1e-5))
        mu_r = module.running_mean.detach().double()
        var_r = module.running_var.detach().double()
        shift = float(((mu_r - mu_p).abs() / (var_p + eps).sqrt()).mean())
        log_ratio = float((0.5 * torch.log((var_r + eps) / (var_p + eps))).abs().mean())
        out[name] = {"running_mean": mu_r.tolist(), "population_mean": mu_p.tolist(),
                     "running_var": var_r.tolist(), "population_var": var_p.tolist(),
                     "mean_shift_sd": shift, "log_var_ratio": 2.0 * log_ratio,
                     "distance_sd": max(shift, log_ratio)}
    return out


def switch_layers(checkup: Checkup, names: list[str]) -> dict[str, dict[str, float]]:
    """Eval loss with only one layer switched to population statistics, for each named layer."""
    population = dict(checkup.population_model().named_modules())
    out = {}
    for name in names:
        twin = copy.deepcopy(checkup.model)
        layer = dict(twin.named_modules())[name]
        with torch.no_grad():
            layer.running_mean.copy_(population[name].running_mean)
            layer.running_var.copy_(population[name].running_var)
        out[name] = checkup.evaluate(twin)
    return out


def momentum_advice(checkup: Checkup) -> str:
    momenta = {getattr(m, "momentum", None) for _, m in tracking_layers(checkup.model)}
    momenta.discard(None)
    text = ("torch's momentum is the new batch's weight (0.1 by default; Keras/TF's 0.99 is "
            "torch's 0.01)")
    if any(m > 0.5 for m in momenta):
        text += f"; this model uses momentum {max(momenta):g}: did a Keras value get in?"
    elif any(m < 0.01 for m in momenta):
        text += (f"; momentum {min(momenta):g} needs ~{3 / min(momenta):.0f} steps to forget "
                 "its start: use 0.1, or recollect after training")
    return text


def check(checkup: Checkup, report) -> None:
    if not tracking_layers(checkup.model):
        return
    modes = checkup.stat_modes()
    population = checkup.population_stats()
    distances = layer_distances(checkup.model, population)
    report.measurements["running_vs_population"] = distances
    run, pop = modes["running"]["loss"], modes["population"]["loss"]
    excess = (run - pop) / max(pop, LOSS_FLOOR)
    ranked = sorted(distances, key=lambda n: -distances[n]["distance_sd"])
    stale = excess >= THRESHOLD
    switched = switch_layers(checkup, ranked[:SWITCHED]) if stale else {}
    per_layer = {n: {"loss_running": run, "loss_population_here": v["loss"]}
                 for n, v in switched.items()}
    report.measurements["stat_modes"] = {**modes, "per_layer": per_layer}
    if not stale:
        return
    named = [n for n, v in switched.items() if run - v["loss"] >= 0.25 * (run - pop)]
    named += [n for n in ranked if distances[n]["distance_sd"] >= LAYER_DISTANCE
              and n not in named]
    acc = ""
    if "accuracy" in modes["running"]:
        acc = (f", accuracy {modes['running']['accuracy']:.3f} -> "
               f"{modes['population']['accuracy']:.3f}")
    detail = (f"eval loss {run:.4g} with running statistics, {pop:.4g} with population statistics "
              f"of {len(checkup.batches)} batches{acc}; farthest layer "
              f"{ranked[0]} at {distances[ranked[0]]['distance_sd']:.2f} SD")
    if all(int(getattr(m, "num_batches_tracked", 1) or 0) == 0
           for _, m in tracking_layers(checkup.model)):
        detail += ("; num_batches_tracked = 0 everywhere: no statistics were ever collected (a "
                   "fresh model, reset statistics, or weights loaded without the buffers)")
    report.add(Finding(
        "stale-running-stats", "warn", tuple(named or ranked[:1]), excess, THRESHOLD, WHY, PAPER,
        "bnlab.norms.recollect_running_stats(model, batches) before evaluating; "
        + momentum_advice(checkup), detail))
