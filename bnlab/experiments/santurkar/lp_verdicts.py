"""The verdicts of Santurkar et al. 2018's ℓp-normalization entries (*How Does Batch Normalization
Help Optimization?*, §3.3 and App. Figs 11–14), each a pure function of per-seed numbers, under
every reading of the paper that can move them (:mod:`bnlab.experiments.readings`):

* ``santurkar-fig11`` (Figs 11–13): the DLN half at both readings of App. A.1's DLN rate, bnlab's
  1e-3 (primary, the module docstring of :mod:`bnlab.experiments.santurkar`) and the literal
  conversion 1e-2, each network trained at its own rate (the runs of ``santurkar-fig9`` for the
  standard and BN arms). The VGG half is the same runs in both.
* ``santurkar-fig14``: Fig. 14's caption compares the ℓp networks' distributional shift with that
  of "normal networks": the standard network (primary — the caption's "yet yield improved
  optimization performance" is Figs 11–12's claim against the standard network) or the BN network
  (BN fixes the moments that ℓp leaves free; against BN, the paper's Fig. 13 claims only that ℓp
  trains "comparably or even better", so that reading's loss check is Fig. 13's criterion).

The plans and analyses that feed them are in :mod:`bnlab.experiments.santurkar.lp`.
"""

from __future__ import annotations

import math
from typing import Hashable

from ..verdicts import checks, combine, ladder, tally
from ..common import CATALOGUE_PILOT as PILOT, RULE, Comparison, DesignSD, compare_arms
from ..readings import combine_readings, deciding, deciding_record
from ..verdict_data import Verdict
from .common import BN, DLN_LR, L1, L2, LINF, LITERAL_LR, STANDARD, compare_text, log_values
from .dln import LANDSCAPE, landscape_verdict
from .vgg import LITERAL_DLN

# Every arm the paper names (Figs 11–14: ℓ1, ℓ2 and ℓ∞ beside standard and BN), in both presets.
LP_LABELS = (STANDARD, BN, L1, L2, LINF)
NETS = (("VGG", "vgg", "Fig. 11"), ("DLN", "dln", "Fig. 12"))
NORMALIZED = (BN, L1, L2, LINF)  # Figs 11–12: every one against the standard network
LP = (L1, L2, LINF)              # Fig. 13 (against BN) and Fig. 14
# Fig. 13 "comparably or even better than BatchNorm": an ℓp network's mean training loss counts as
# comparable up to this factor above BN's (tested on ln values against ln(COMPARABLE_FACTOR × BN),
# as fig6's tolerance).
COMPARABLE_FACTOR = 1.25
# fig11's DLN trained at the literal rate: its arms are "<LITERAL_NET>: <label>" (the configs of
# fig9's and fig6's literal arms, so the store trains each once).
LITERAL_NET = LITERAL_DLN.removesuffix(": ")
# (reading, the net whose runs stand for the DLN in it), the primary first
FIG11_READINGS = ((f"DLN trained at lr {DLN_LR:g}", "DLN"),
                  (f"DLN trained at lr {LITERAL_LR:g}", LITERAL_NET))

# Per network (VGG's cross-entropy and the DLN's squared loss are different quantities) and per
# quantity, all on a ln scale: the root-mean-square of the pooled per-arm SDs of that quantity's
# comparisons in the pilot: "loss" pools Figs 11–12's four normalizations against standard, "loss
# vs BN" Fig. 13's three against 1.25× BN (in VGG the standard arm scatters four times as much as
# BN's); the landscape medians pool the four normalizations.
_FIG11_SDS = {"VGG loss": 0.24, "VGG loss vs BN": 0.049, "VGG loss_range": 2.2,
              "VGG grad_change_max": 1.1, "VGG beta_smoothness": 0.20, "DLN loss": 0.25,
              "DLN loss vs BN": 0.26, "DLN loss_range": 0.64, "DLN grad_change_max": 0.54,
              "DLN beta_smoothness": 0.26}
FIG11_DESIGN_SD = DesignSD(_FIG11_SDS, f"{PILOT}; ln scale")
# The DLN at the literal rate: the landscape medians at fig9's lr 1e-2 SDs (the same pilot's
# standard and BN arms at that rate, whose standard arm scatters eight to twenty times as much as
# at 1e-3); the losses, without a pilot at that rate, at the 1e-3 SDs (assumed; the observed
# spread is in each comparison's SE).
FIG11_LITERAL_DESIGN_SD = DesignSD(
    {**_FIG11_SDS, "DLN loss_range": 5.2, "DLN grad_change_max": 5.0,
     "DLN beta_smoothness": 4.7},
    f"{PILOT}; ln scale; the DLN at lr 1e-2: its landscape at fig9's lr 1e-2 pilot SDs, its "
    "losses at the lr 1e-3 pilot's, assumed")


def fig11_comparisons(losses: dict[str, list[float]], landscapes: dict[str, list[dict]], *,
                      design_sd: DesignSD = FIG11_DESIGN_SD) -> dict:
    """Every check of Figs 11–13 (keys ``"<net>: <label>"`` in ``losses``/``landscapes``, VGG and
    DLN): ``(arm, "loss")`` and ``(arm, quantity)`` of each normalized arm against the standard
    network, ``(net, label)`` for each ℓp arm's ln loss against ln(1.25 × BN's). All "lower"."""
    comps: dict[Hashable, Comparison] = {}
    for net, _, _ in NETS:
        std = f"{net}: {STANDARD}"
        for label in NORMALIZED:
            key = f"{net}: {label}"
            comps[(key, "loss")] = compare_arms(log_values(losses.get(std, [])),
                                                log_values(losses.get(key, [])),
                                                design_sd=design_sd.of(f"{net} loss"))
            pair = {STANDARD: landscapes.get(std, []), label: landscapes.get(key, [])}
            _, landscape, _ = landscape_verdict(pair, label, design_sd=design_sd,
                                                key_prefix=f"{net} ")
            comps.update({(key, k): landscape[k] for k in LANDSCAPE})
        bn = [v + math.log(COMPARABLE_FACTOR) for v in log_values(losses.get(f"{net}: {BN}", []))]
        for label in LP:
            comps[(net, label)] = compare_arms(bn, log_values(losses.get(f"{net}: {label}", [])),
                                               design_sd=design_sd.of(f"{net} loss vs BN"))
    return comps


def fig11_verdict(losses: dict[str, list[float]], landscapes: dict[str, list[dict]],
                  tiny: str | None = None, *,
                  design_sd: DesignSD = FIG11_DESIGN_SD) -> tuple[str, str]:
    """Figs 11–13 for every arm the paper names (keys ``"<net>: <label>"``, per-seed values; a
    missing arm leaves its checks undecided). Figs 11–12: BN, ℓ1, ℓ2 and ℓ∞ each train better (ln
    mean training loss) and have a smoother landscape (:func:`dln.landscape_verdict`: all three
    medians) than the standard network. Fig. 13: each ℓp network trains "comparably or even better
    than BatchNorm" — its ln mean training loss detectably below ln(COMPARABLE_FACTOR × BN's).
    Primary, pre-declared: the conjunction of these checks (:func:`verdicts.checks`): held when
    every check detects the claim, not held when one detects the opposite after Holm's correction
    over all of them (22 uncorrected checks gave a spurious opposite result 43 % of the time), else
    inconclusive (each check's resolvable effect at ``design_sd``: keys "<net> loss" and "<net>
    <landscape quantity>")."""
    if tiny:
        return ladder(unusable=True), tiny
    comps = fig11_comparisons(losses, landscapes, design_sd=design_sd)
    outcome = checks(comps, "lower")
    arms = list(dict.fromkeys(key for key, what in comps if what == "loss"))
    parts = [f"{key}: loss {comps[(key, 'loss')].decision}, "
             + ", ".join(f"{LANDSCAPE[k]} {comps[(key, k)].decision}" for k in LANDSCAPE)
             for key in arms]
    fig13 = [(net, label) for net, _, _ in NETS for label in LP]
    parts13 = [f"{net}: " + compare_text(comps[(net, label)], f"{label} − "
                                         f"{COMPARABLE_FACTOR:g}× BN, mean training loss", log=True)
               for net, label in fig13]
    # per arm, as in the figures: the loss check and the landscape check (all three medians)
    per_arm = [v for key in arms
               for v in (outcome[(key, "loss")], combine([outcome[(key, k)] for k in LANDSCAPE]))]
    # the DLN's BN checks with their numbers: the part the rate's readings change
    dln_bn = f"DLN: {BN}"
    numbers = "; ".join(compare_text(comps[(dln_bn, k)], "mean training loss" if k == "loss"
                                     else f"median {LANDSCAPE[k]}", log=True)
                        for k in ("loss", *LANDSCAPE))
    summary = ("Figs 11–12, against the standard network (training loss; landscape = all three "
               f"medians): {tally(per_arm)} — " + "; ".join(parts)
               + f". DLN, {BN} − standard: {numbers}"
               + f". Fig. 13, ℓp comparable to BN (loss below {COMPARABLE_FACTOR:g}× BN's): "
               f"{tally(outcome[k] for k in fig13)} — " + "; ".join(parts13)
               + f". Holm over all {len(outcome)} checks for 'against'. Resolution: "
               f"{design_sd.text()}. {RULE}")
    return combine(list(outcome.values())), summary


def as_dln(values: dict, net: str) -> dict:
    """fig11's per-arm values with ``net``'s arms (the DLN trained at another rate) in the DLN's
    place; the VGG's stay."""
    return {**values, **{f"DLN: {label}": values.get(f"{net}: {label}", []) for label in LP_LABELS}}


def fig11_readings(losses: dict[str, list[float]], landscapes: dict[str, list[dict]],
                   tiny: str | None = None) -> tuple[str, str]:
    """Figs 11–13 at both readings of the paper's DLN rate (:data:`FIG11_READINGS`: the DLN
    trained at 1e-3, primary, and at the literal 1e-2), each :func:`fig11_verdict` on the same VGG
    runs; combined by :func:`readings.combine_readings`: the entry holds or fails only where both
    agree, else it is reading-dependent (inconclusive) with both readings' numbers."""
    if tiny:
        return ladder(unusable=True), tiny
    sds = {"DLN": FIG11_DESIGN_SD, LITERAL_NET: FIG11_LITERAL_DESIGN_SD}
    return combine_readings([(name, *fig11_verdict(as_dln(losses, net), as_dln(landscapes, net),
                                                   design_sd=sds[net]))
                             for name, net in FIG11_READINGS])


def _fig11_name(key) -> str:
    arm, what = key
    if what in LP:  # Fig. 13: (net, label)
        return f"{arm}: {what} − {COMPARABLE_FACTOR:g}× BN, ln mean training loss"
    rate = f" (DLN at lr {DLN_LR:g})" if arm.startswith("DLN") else ""
    quantity = "mean training loss" if what == "loss" else f"median {LANDSCAPE[what]}"
    return f"{arm} − standard, ln {quantity}{rate}"


def fig11_record(verdict: str, losses: dict[str, list[float]],
                 landscapes: dict[str, list[dict]]) -> Verdict:
    """The verdict as data: the check of the primary reading (the DLN at lr 1e-3) it rests on
    (:func:`readings.deciding`)."""
    comps = fig11_comparisons(losses, landscapes)
    return deciding_record(verdict, checks(comps, "lower"), comps, _fig11_name,
                           paper="lower (direction only)", unit=" (ln)")


# ---- Fig. 14 ----------------------------------------------------------------------------------

# Two quantities (the drift, the ln mean training loss): one design SD each, the root-mean-square
# over the three ℓp arms of the pooled per-arm SDs in the pilot.
FIG14_DESIGN_SD = DesignSD({"drift": 0.17, "loss": 0.24}, f"{PILOT}; loss on a ln scale")
# "Normal networks" = BN: the drift at the standard comparison's SD (assumed: no pilot pooled the
# ℓp arms against BN's drift), the loss against 1.25× BN at fig11's "VGG loss vs BN" (the same
# runs and quantity).
FIG14_BN_DESIGN_SD = DesignSD({"drift": 0.17, "loss": FIG11_DESIGN_SD.of("VGG loss vs BN")},
                              f"{PILOT}; loss on a ln scale; the drift against BN at the "
                              "drift-against-standard SD, assumed")
# (reading of the caption's "normal networks", the reference arm, its design SD), primary first
FIG14_READINGS = (("“normal networks” = the standard network", STANDARD, FIG14_DESIGN_SD),
                  ("“normal networks” = the BN network", BN, FIG14_BN_DESIGN_SD))
FIG14_WANTED = {"drift": "higher", "loss": "lower"}


def fig14_comparisons(drift: dict[str, list[float]], losses: dict[str, list[float]],
                      reference: str = STANDARD, *,
                      design_sd: DesignSD = FIG14_DESIGN_SD) -> dict[tuple[str, str], Comparison]:
    """Fig. 14's checks per ℓp arm against the ``reference`` network (STANDARD or BN): its drift
    against the reference's, ``(label, "drift")``, and its ln mean training loss,
    ``(label, "loss")``: against the standard network's, or, with BN as the reference, against
    ln(COMPARABLE_FACTOR × BN's) (Fig. 13's "comparably or even better than BatchNorm")."""
    if reference not in (STANDARD, BN):
        raise ValueError(f"reference must be {STANDARD!r} or {BN!r}, not {reference!r}")
    ref = log_values(losses.get(reference, []))
    if reference == BN:
        ref = [v + math.log(COMPARABLE_FACTOR) for v in ref]
    comps = {}
    for label in LP:
        comps[(label, "drift")] = compare_arms(drift.get(reference, []), drift.get(label, []),
                                               design_sd=design_sd.of("drift"))
        comps[(label, "loss")] = compare_arms(ref, log_values(losses.get(label, [])),
                                              design_sd=design_sd.of("loss"))
    return comps


def fig14_verdict(drift: dict[str, list[float]], losses: dict[str, list[float]],
                  tiny: str | None = None, *, reference: str = STANDARD,
                  design_sd: DesignSD = FIG14_DESIGN_SD) -> tuple[str, str]:
    """Fig. 14 for every ℓp arm the paper names (ℓ1, ℓ2, ℓ∞; a missing arm leaves its checks
    undecided): each shifts the activation distributions more than the ``reference`` network does
    (per-seed median drift, :func:`common.distribution_drift`), yet trains better
    (:func:`fig14_comparisons`). Pre-declared: the conjunction of the six checks
    (:func:`verdicts.checks`, Holm over them for "against"); resolvable effects at ``design_sd``."""
    if tiny:
        return ladder(unusable=True), tiny
    comps = fig14_comparisons(drift, losses, reference, design_sd=design_sd)
    outcome = checks(comps, {key: FIG14_WANTED[key[1]] for key in comps})
    name = "standard" if reference == STANDARD else "BN"
    ref = "standard" if reference == STANDARD else f"{COMPARABLE_FACTOR:g}× BN"
    parts = [f"{label}: {compare_text(comps[(label, 'drift')], f'drift − {name}')}, "
             + compare_text(comps[(label, "loss")], f"mean training loss − {ref}", log=True)
             for label in LP]
    return combine(list(outcome.values())), (
        f"per seed, {tally(outcome.values())} (Holm over the checks for 'against'): "
        + "; ".join(parts) + f". Resolution: {design_sd.text()}. {RULE}")


def fig14_readings(drift: dict[str, list[float]], losses: dict[str, list[float]],
                   tiny: str | None = None) -> tuple[str, str]:
    """Fig. 14 under both readings of the caption's "normal networks" (:data:`FIG14_READINGS`, the
    standard network first), combined by :func:`readings.combine_readings`."""
    if tiny:
        return ladder(unusable=True), tiny
    return combine_readings([(name, *fig14_verdict(drift, losses, reference=ref, design_sd=sd))
                             for name, ref, sd in FIG14_READINGS])


def fig14_record(verdict: str, drift: dict[str, list[float]],
                 losses: dict[str, list[float]]) -> Verdict:
    """The verdict as data: the check of the primary reading (against the standard network) it
    rests on (:func:`readings.deciding`)."""
    typed = fig14_comparisons(drift, losses)
    comps: dict[Hashable, Comparison] = {k: v for k, v in typed.items()}
    outcome = checks(comps, {key: FIG14_WANTED[key[1]] for key in typed})
    key = deciding(outcome, comps)
    what = key[1] if isinstance(key, tuple) else "drift"
    return deciding_record(
        verdict, outcome, comps,
        lambda k: f"{k[0]} − standard, " + ("median drift" if k[1] == "drift" else
                                             "ln mean training loss"),
        paper=f"{FIG14_WANTED[what]} (direction only)", unit=" (ln)" if what == "loss" else "")
