"""Luo et al. 2019's conjunctive entries (Figs. 5, 6, 7): each judged
comparison states its resolvable effect from a design SD declared before the runs (the
pilot named in the entry), not from the scatter of this run's seeds; the decisions are unchanged.
Also: a diverged run left out of Fig. 5's γ² comparisons (or a diverged Fig. 6 seed) is counted in
the summary."""

import re

import pytest

from bnlab.experiments import get
from bnlab.experiments.common import DesignSD, design_mde
from bnlab.experiments.luo import fig5 as LF5
from bnlab.experiments.luo import dropout as LDR
from bnlab.experiments.luo import fold as LFD

from .test_experiments_luo import _fig5_runs, _fig6_data, _fig6_seed, fake_context

RESOLVABLE = re.compile(r"resolvable ≥ ([0-9.e+-]+)")
BATCHES = (16, 32, 64, 128, 256)


def _spread(centre: float, sd: float, n: int = 3) -> list[float]:
    return [centre + sd * (i - (n - 1) / 2) for i in range(n)]


def _stated(text: str) -> list[float]:
    return [float(x) for x in RESOLVABLE.findall(text)]


@pytest.mark.parametrize("design", [LF5.FIG5_DESIGN_SD, LFD.FIG6_DESIGN_SD, LDR.FIG7_DESIGN_SD])
def test_designs_name_the_pilot(design):
    assert isinstance(design, DesignSD) and "pilot" in design.source


# ---- luo-fig5: γ² against M, per layer -------------------------------------------------------

def _fig5_flat(sd: float) -> dict:
    """Two layers whose γ² does not move with M: the largest-vs-smallest comparison is
    unresolved."""
    flat = {m: _spread(1.05, sd) for m in BATCHES}
    return {"conv": flat, "fc": flat}


def test_fig5_resolution_comes_from_the_design_not_the_seeds():
    texts = [LF5.fig5_verdict(_fig5_flat(sd))[1] for sd in (0.01, 0.1)]
    assert all("unresolved" in t for t in texts)
    stated = [_stated(t) for t in texts]
    # the old rule printed (t + t)·observed SE: ten times the spread, ten times the number
    assert stated[0] and len(stated[0]) == len(stated[1])
    assert stated[0] == pytest.approx(stated[1], rel=0.05)
    expected = design_mde(LF5.FIG5_DESIGN_SD.of(), 3, 3)
    assert stated[0] == pytest.approx([expected] * len(stated[0]), rel=0.05)
    assert all(LF5.FIG5_DESIGN_SD.source in t and "at the design SD" in t for t in texts)
    # another design, another stated resolution: the keyword reaches every layer's comparison
    other = DesignSD(0.31, "pilot: synthetic")
    text = LF5.fig5_verdict(_fig5_flat(0.01), design_sd=other)[1]
    assert _stated(text) == pytest.approx([design_mde(0.31, 3, 3)] * len(stated[0]), rel=0.05)


def test_fig5_decisions_are_unchanged():
    rising = {m: _spread(1.0 + 0.02 * i, 0.002) for i, m in enumerate(BATCHES)}
    falling = {m: _spread(1.1 - 0.02 * i, 0.002) for i, m in enumerate(BATCHES)}
    dip = {**rising, 64: _spread(0.98, 0.002)}
    for design in (LF5.FIG5_DESIGN_SD, DesignSD(10.0, "pilot: synthetic, huge")):
        assert LF5.fig5_verdict({"conv": rising, "fc": rising}, design_sd=design)[0] == "held"
        assert LF5.fig5_verdict({"conv": rising, "fc": falling},
                                design_sd=design)[0] == "not held"
        assert LF5.fig5_trend(dip, design_sd=design)[0] == "dips"


def test_fig5_summary_counts_the_diverged_runs_it_leaves_out(tmp_path):
    runs = _fig5_runs(0.01)
    clean = get("luo-fig5").analyze(fake_context("luo-fig5", runs, None, tmp_path))
    assert clean.verdict == "held" and "left out" not in clean.summary
    # one M = 256 seed diverged: no γ² to compare, left out (no failure value), and said so
    label, factors, _, final, series = runs[-1]
    runs[-1] = (label, factors, "diverged", final, series)
    outcome = get("luo-fig5").analyze(fake_context("luo-fig5", runs, None, tmp_path))
    assert "1 of 15 runs left out of the γ² comparisons (1 diverged)" in outcome.summary
    assert "n=3/2" in outcome.summary  # the diverged seed is not in the comparison


# ---- luo-fig6: changes over frozen fine-tuning, against 0 --------------------------------------

def _fig6_changes(val: float, sd: float) -> list[dict]:
    """Per seed: 4 kernel norms that grow clearly, a training loss that falls clearly, and a
    validation-loss change ``val`` ± ``sd``."""
    return [{"norms": {f"features.{k}": 0.05 + 0.001 * (s - 1) for k in range(4)},
             "train": -0.001 + 1e-5 * (s - 1), "val": v}
            for s, v in enumerate(_spread(val, sd))]


def test_fig6_resolution_comes_from_the_design_not_the_seeds():
    design = LFD.FIG6_DESIGN_SD
    texts = [LFD.fig6_verdict(_fig6_changes(0.0, sd))[1] for sd in (0.01, 0.1)]
    stated = [_stated(t) for t in texts]
    # the training-loss change (significant) and the validation-loss change (not), each at its own
    assert len(stated[0]) == 2 and stated[0] == pytest.approx(stated[1], rel=0.05)
    expected = [design_mde(design.of(k), 3, 3)
                for k in ("training-loss change", "validation-loss change")]
    assert stated[0] == pytest.approx(expected, rel=0.05)
    # the inconclusive sentence names the same validation-loss resolution
    for t in texts:
        rise = re.search(r"at the design SD resolve a validation-loss rise ≥ ([0-9.e+-]+)", t)
        assert rise and float(rise.group(1)) == pytest.approx(expected[1], rel=0.05)
        assert design.source in t
    # each quantity has its own design SD: the kernel norms and training loss get theirs
    wide = DesignSD({"kernel-norm growth": 1.0, "training-loss change": 1.0,
                     "validation-loss change": 0.0031}, "pilot: synthetic")
    with pytest.raises(KeyError, match="declared for"):
        LFD.fig6_verdict(_fig6_changes(0.0, 0.01), design_sd=DesignSD({"x": 1.0}, "pilot"))
    assert LFD.fig6_verdict(_fig6_changes(0.0, 0.01), design_sd=wide)[0] == "inconclusive"


def test_fig6_decisions_are_unchanged():
    for design in (LFD.FIG6_DESIGN_SD,
                   DesignSD({"kernel-norm growth": 9.0, "training-loss change": 9.0,
                             "validation-loss change": 9.0}, "pilot: synthetic, huge")):
        assert LFD.fig6_verdict(_fig6_changes(0.01, 0.001), design_sd=design)[0] == "held"
        assert LFD.fig6_verdict(_fig6_changes(-0.01, 0.001), design_sd=design)[0] == "not held"


def test_fig6_summary_names_a_diverged_seed_it_leaves_out(tmp_path):
    data = _fig6_data(0.065, seeds=4)
    data["fig6"]["seeds"]["3"] = {"pretrain": {"status": "diverged", "metrics": {}},
                                  "branches": {}}
    outcome = get("luo-fig6").analyze(fake_context("luo-fig6", [], data, tmp_path))
    assert outcome.verdict == "held"  # the 3 good seeds still decide
    assert "1 of 4 seeds left out: seed 3 diverged" in outcome.summary
    frozen_died = _fig6_seed(0.065)
    frozen_died["branches"]["frozen"] = {"status": "diverged", "series": {}, "metrics": {}}
    data["fig6"]["seeds"]["3"] = frozen_died
    outcome = get("luo-fig6").analyze(fake_context("luo-fig6", [], data, tmp_path))
    assert "seed 3 diverged" in outcome.summary


# ---- luo-fig7: dropout against no dropout at M = 256 -------------------------------------------

def _fig7_losses(bn_drop: float, wn_drop: float, sd: float) -> dict:
    centres = {"BN, M = 64": 0.6, "BN, M = 256": 0.9, "WN, M = 256": 1.0,
               "BN + dropout 0.125, M = 256": bn_drop, "WN + dropout 0.25, M = 256": wn_drop}
    return {arm: _spread(c, sd) for arm, c in centres.items()}


def test_fig7_resolution_comes_from_the_design_not_the_seeds():
    design = LDR.FIG7_DESIGN_SD
    # no dropout effect: both judged comparisons and the premise unresolved
    texts = [LDR.fig7_summary(_fig7_losses(0.9, 1.0, sd) | {"BN, M = 64": _spread(0.9, sd)})[1]
             for sd in (0.03, 0.3)]
    stated = [_stated(t) for t in texts]
    assert len(stated[0]) == 3  # the premise and the two dropout pairs
    assert stated[0] == pytest.approx(stated[1], rel=0.05)
    expected = design_mde(design.of(), 3, 3)
    assert stated[0] == pytest.approx([expected] * 3, rel=0.05)
    for t in texts:
        open_ = re.search(r"at the design SD resolve differences ≥ ([0-9.e+-]+)", t)
        assert open_ and float(open_.group(1)) == pytest.approx(expected, rel=0.05)
        assert design.source in t


def test_fig7_decisions_are_unchanged():
    for design in (LDR.FIG7_DESIGN_SD, DesignSD(10.0, "pilot: synthetic, huge")):
        assert LDR.fig7_summary(_fig7_losses(0.7, 0.8, 0.01), design_sd=design)[0] == "held"
        assert LDR.fig7_summary(_fig7_losses(0.95, 0.8, 0.01), design_sd=design)[0] == "not held"
        assert LDR.fig7_summary(_fig7_losses(0.85, 0.8, 0.3),
                                design_sd=design)[0] == "inconclusive"
