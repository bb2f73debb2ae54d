"""The Santurkar catalogue entries (figs 2, 6, 7, 8, 9, 10, 11–13, 14): wiring, plans, analysis
logic.

* every entry runs end to end in the suite's reduced form (``tiny``: 6 steps per run, one seed) and
  draws its figures;
* a longer reduced form (50 steps) makes every probe of the shared runs fire, so the analyses read
  the real metric names (ICS, moments, histograms, landscape, hessian) and produce finite numbers;
* the paper presets match App. A.1 (architectures, data, steps, rates, batch sizes) and each
  figure's runs; the smoke VGG sees digits at 16×16 and every arm runs 3 seeds;
* each verdict is a pure function of per-seed numbers and gives the known answer on synthetic values
  built to satisfy the claim, to break it, or to leave it unresolved (seeds too noisy:
  inconclusive);
* the DLN learning rate rule (module docstring): 30 × lr is where the standard DLN diverges, lr
  trains.
"""

from __future__ import annotations

import math

import pytest
import torch

import bnlab.experiments as E
from bnlab.experiments import runner
from bnlab.experiments import verdicts as VD
from bnlab.experiments.santurkar import common as SC
from bnlab.experiments.santurkar import dln as DL
from bnlab.experiments.santurkar import lp as LP
from bnlab.experiments.santurkar import lp_verdicts as LV
from bnlab.experiments.santurkar import predictiveness as PR
from bnlab.experiments.santurkar import moments as SM
from bnlab.experiments.santurkar import vgg as V
from bnlab.experiments.runner import AnalysisContext

IDS = ["santurkar-fig2", "santurkar-fig6", "santurkar-fig7", "santurkar-fig8", "santurkar-fig9",
       "santurkar-fig10", "santurkar-fig11", "santurkar-fig14"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def one_seed(monkeypatch):
    """The suite's reduced runs use one seed per arm (the smoke/paper presets use three)."""
    monkeypatch.setattr(SC, "SEEDS", (0,))
    monkeypatch.setattr(PR, "SEEDS", (0,))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    # One store for all entries: their shared configs are trained once (the runner skips finished
    # runs).
    return tmp_path_factory.mktemp("santurkar-tiny")


def _check_outcome(outcome):
    assert outcome.verdict in ("held", "not held", "inconclusive")
    assert isinstance(outcome.summary, str) and outcome.summary
    assert outcome.table and all({"quantity", "ours", "paper"} <= set(row) for row in outcome.table)
    assert outcome.figures
    for path in outcome.figures:
        data = path.read_bytes()
        assert data[:8] == PNG and len(data) > 5000, path


@pytest.mark.parametrize("experiment_id", IDS)
def test_tiny_reproduce_draws_figures(experiment_id, tiny_dir, one_seed):
    outcome = runner.reproduce(experiment_id, "smoke", runs_dir=tiny_dir, tiny=True,
                               report=False, progress=False)
    _check_outcome(outcome)
    assert outcome.verdict == "inconclusive"  # six steps decide nothing, and the entries say so
    ctx = runner.analysis_context(experiment_id, "smoke", runs_dir=tiny_dir)
    assert all(r.status == "finished" for r in ctx.runs)
    assert len(ctx.runs) == len(E.get(experiment_id).plan("smoke").runs)


def test_probes_fire_and_analyses_read_them(tmp_path, monkeypatch, one_seed):
    """50 steps per run: every probe of the shared VGG/DLN runs fires, the tables fill with finite
    numbers."""
    monkeypatch.setattr(runner, "TINY_STEPS", 50)
    monkeypatch.setattr(SC, "SMOKE_HESSIAN", "hessian(iters=3, samples=2, every=20)")
    monkeypatch.setattr(SC, "SMOKE_DLN_HESSIAN", "hessian(iters=3, samples=2, every=20)")
    numbers = {}
    for experiment_id in ("santurkar-fig7", "santurkar-fig6", "santurkar-fig8", "santurkar-fig9"):
        outcome = runner.reproduce(experiment_id, "smoke", runs_dir=tmp_path, tiny=True,
                                   report=False, progress=False)
        _check_outcome(outcome)
        numbers[experiment_id] = [row["ours"] for row in outcome.table]
    # fig7: per-step moment changes of all three networks; noisy BN's fresh noise dominates the
    # change
    ctx = runner.analysis_context("santurkar-fig7", "smoke", runs_dir=tmp_path)
    by = SC.runs_by_label(ctx)
    # BN outputs
    assert SC.probe_layers(by[SC.BN], "moments", "mean_change")[0] == "features.0.1"
    # conv outputs
    assert SC.probe_layers(by[SC.STANDARD], "moments", "mean_change")[0] == "features.0.0"
    noisy = SC.layer_medians(by[SC.NOISY], "moments", "mean_change")
    plain = SC.layer_medians(by[SC.BN], "moments", "mean_change")
    assert noisy > 10 * plain  # means of U(−0.5, 0.5) redrawn each step vs β's drift at lr 0.1
    # fig6: ICS of every weight layer; the first layer has nothing before it, so G' = G exactly
    ctx = runner.analysis_context("santurkar-fig6", "smoke", runs_dir=tmp_path)
    vgg = SC.runs_by_label(ctx)[f"VGG: {SC.BN}"]
    layers = SC.probe_layers(vgg, "ics", "l2")
    assert layers[0] == "features.0.0" and layers[-1] == "classifier.2" and len(layers) == 11
    assert SC.first_layer_zero(vgg) == {"features.0.0"}
    dln = SC.runs_by_label(ctx)[f"DLN: {SC.STANDARD}"]
    assert len(SC.probe_layers(dln, "ics", "cos")) == 25
    for row in numbers["santurkar-fig6"]:
        assert "—" not in row and "nan" not in row
    # fig9: landscape medians are finite; the hessian probe ran in train mode and its sharpness is
    # finite
    for row in numbers["santurkar-fig9"]:
        assert "—" not in row and "nan" not in row
    ctx = runner.analysis_context("santurkar-fig9", "smoke", runs_dir=tmp_path)
    for r in SC.runs_by_label(ctx).values():
        assert SC.sharpness_ratio(r, SC.DLN_LR) > 0
        lr = DL.LITERAL_LR if r.factors["arm"].startswith(DL.LITERAL_ARM) else SC.DLN_LR
        assert r.series("probe/hessian/threshold")[1][0] == pytest.approx(2 / lr)
    assert "sharpness λ_max / (2/lr)" in runner.reproduce("santurkar-fig9", "smoke",
                                                          runs_dir=tmp_path, tiny=True,
                                                          report=False, progress=False).summary
    vgg_runs = SC.runs_by_label(
        runner.analysis_context("santurkar-fig7", "smoke", runs_dir=tmp_path))
    assert all(SC.sharpness_ratio(r, 0.1) > 0 for r in vgg_runs.values())
    # fig8: the distributions of 2 sampled units per BN layer were recorded every 10 steps
    ctx = runner.analysis_context("santurkar-fig8", "smoke", runs_dir=tmp_path)
    bn = SC.runs_by_label(ctx)[SC.BN]
    assert len(SC.hist_units(bn)) == 2 * 24
    assert SC.distribution_drift(bn) is not None


# ---- plans ------------------------------------------------------------------------------------

def test_paper_presets_follow_appendix_a1():
    vgg = SC.vgg_config("paper", "bn")
    assert (vgg["model"], vgg["data"], vgg["steps"], vgg["lr"], vgg["batch_size"]) == \
        ("vgg_santurkar", "cifar10", 15000, 0.1, 128)
    # Glorot, full width
    assert vgg["momentum"] == 0.0 and vgg["augment"] is False and "model_options" not in vgg
    dln = SC.dln_config("paper", "none")
    assert (dln["model"], dln["data"], dln["steps"],
            dln["batch_size"]) == ("dln", "gaussian_regression", 10000, "full")
    assert dln["model_options"] == {"depth": 25, "width": 10} \
        and dln["data_options"] == {"d": 10, "n": 1000}
    plans = {i: E.get(i).plan("paper") for i in IDS}
    norms = {i: list(dict.fromkeys((r.factors["net"], r.config["norm"]) for r in p.runs))
             for i, p in plans.items()}
    assert norms["santurkar-fig2"] == norms["santurkar-fig7"] == [
        ("vgg", "none"), ("vgg", "bn"), ("vgg", "noisy_bn")]
    assert norms["santurkar-fig6"] == [("vgg", "none"), ("vgg", "bn"),
                                       ("dln", "none"), ("dln", "bn")]
    assert norms["santurkar-fig8"] == norms["santurkar-fig9"] == [("dln", "none"), ("dln", "bn")]
    lp = ["none", "bn", "lp_bn(p=1)", "lp_bn(p=2)", "lp_bn(p=inf)"]
    assert norms["santurkar-fig11"] == [("vgg", n) for n in lp] + [("dln", n) for n in lp]
    assert norms["santurkar-fig14"] == [("vgg", n) for n in lp]
    for i, plan in plans.items():  # every arm: three seeds
        seeds = {}
        for r in plan.runs:
            seeds.setdefault(r.factors["arm"], []).append(r.config["seed"])
        assert all(v == [0, 1, 2] for v in seeds.values()), i
    probes = {i: [{spec.split("(")[0] for spec in r.config["probes"]} for r in p.runs]
              for i, p in plans.items()}
    assert all("ics" in s for s in probes["santurkar-fig6"])
    assert all("moments" in s for s in probes["santurkar-fig7"])
    assert all("histograms" in s for s in probes["santurkar-fig8"])
    assert all("landscape" in s for s in probes["santurkar-fig9"] + probes["santurkar-fig11"])
    assert all("hessian" in s for s in probes["santurkar-fig9"] + probes["santurkar-fig2"])
    assert "predictiveness" in plans["santurkar-fig10"].compute \
        and not plans["santurkar-fig10"].runs


def test_smoke_vgg_sees_16x16_digits_and_probes_sharpness():
    vgg = SC.vgg_config("smoke", "bn", seed=2)
    assert vgg["data"] == "digits" and vgg["data_options"] == {"size": 16} and vgg["seed"] == 2
    assert any(p.startswith("hessian(") for p in vgg["probes"])
    assert any(p.startswith("hessian(") for p in SC.dln_config("smoke", "none")["probes"])


def test_noisy_bn_uses_algorithm_1_constants():
    from bnlab.norms.registry import lookup

    _, params = lookup(SC.NORMS[SC.NOISY])
    assert (params["n_mu"], params["n_sigma"], params["r_mu"],
            params["r_sigma"]) == (0.5, 1.25, 0.1, 0.1)


def test_landscape_probe_ranges_are_the_papers():
    import bnlab.models as M
    from bnlab.probes import default_range

    assert default_range(M.create("dln", norm="bn", input_shape=(10,),
                                  num_classes=10)) == SC.DLN_RANGE == (0.01, 30.0)
    assert default_range(
        M.create("vgg_santurkar", norm="bn", input_shape=(1, 8, 8), width=0.125)) == \
        SC.VGG_RANGE == (0.5, 4.0)


def test_shared_runs_have_identical_configs():
    # Identical configs give identical run ids: fig6/7/8/9/11 reuse what fig2/fig9 trained.
    for preset in ("smoke", "paper"):
        by_entry = {i: {
            (r.factors["net"], r.config["norm"], r.config["seed"], r.config["lr"]): r.config
            for r in E.get(i).plan(preset).runs} for i in IDS}
        vgg_lr = SC.vgg_config(preset, "bn")["lr"]
        for key in [("vgg", "none", seed, vgg_lr)
                    for seed in SC.SEEDS] + [("vgg", "bn", 2, vgg_lr)]:
            assert by_entry["santurkar-fig2"][key] == by_entry["santurkar-fig6"][key] == \
                by_entry["santurkar-fig7"][key] == by_entry["santurkar-fig11"][key] == \
                by_entry["santurkar-fig14"][key]
        for key in [("dln", "none", 0, SC.DLN_LR), ("dln", "bn", 1, SC.DLN_LR)]:
            assert by_entry["santurkar-fig6"][key] == by_entry["santurkar-fig8"][key] == \
                by_entry["santurkar-fig9"][key] == by_entry["santurkar-fig11"][key]


def test_dln_learning_rate_rule():
    """App. A.2.2: the largest landscape step, 30 × lr, sits at the rate where the standard DLN
    diverges."""
    import bnlab.models as M
    from bnlab import data as D

    cfg = SC.dln_config("smoke", "none")
    ds = D.load(cfg["data"], **cfg["data_options"], seed=cfg["seed"])

    def train(lr, steps):
        torch.manual_seed(cfg["seed"])  # as bnlab.train builds the model
        model = M.create("dln", norm="none", input_shape=ds.input_shape, num_classes=ds.num_outputs,
                         **cfg["model_options"])
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(ds.x_train), ds.y_train)
            losses.append(float(loss.detach()))
            if not math.isfinite(losses[-1]):
                break
            loss.backward()
            opt.step()
        return losses

    at_lr = train(SC.DLN_LR, 150)
    assert all(math.isfinite(v) for v in at_lr) and at_lr[-1] < 0.95 * at_lr[0]
    at_max = train(30 * SC.DLN_LR, 60)
    assert not math.isfinite(at_max[-1]) or at_max[-1] > 1e6


def test_fig10_grid_contains_both_range_ends():
    grid = [v / SC.DLN_LR for v in PR.fig10_grid()]
    assert grid == sorted(grid) and math.isclose(grid[0], 0.01) and math.isclose(grid[-1], 1000.0)
    assert any(math.isclose(v, 30.0) for v in grid) and any(math.isclose(v, 300.0) for v in grid)
    assert math.isclose(30 * DL.LITERAL_LR / SC.DLN_LR, 300.0)


# ---- helpers ----------------------------------------------------------------------------------

def test_layer_order_and_picks():
    names = ["classifier.2", "features.10.0", "features.2.0", "classifier.0.0", "features.0.0"]
    assert sorted(names, key=SC.layer_key) == ["features.0.0", "features.2.0", "features.10.0",
                                               "classifier.0.0", "classifier.2"]
    assert sorted(["layers.10.1[3]", "layers.2.1[7]", "layers.2.1[1]"], key=SC.layer_key) == \
        ["layers.2.1[1]", "layers.2.1[7]", "layers.10.1[3]"]
    assert SC.pick(list(range(11)), (0.25, 0.75)) == [2, 8]
    assert SC.pick([5], (0.1, 0.9)) == [5] and SC.pick([], (0.5,)) == []


class FakeRun:
    """A stored run as ``RunView`` presents it, from a dict of metric series."""

    def __init__(self, label, metrics, status="finished", final=None, seed=0):
        self.label, self.status, self.id = f"{label} · seed {seed}", status, "fake"
        self.factors = {"arm": label, "seed": seed}
        self.record = {"metrics": final or {}}
        self._metrics = metrics

    def series(self, name):
        rows = self._metrics.get(name, [])
        return [s for s, _ in rows], [v for _, v in rows]

    def final(self, name, default=None):
        return self.record["metrics"].get(name, default)

    def metric_names(self, prefix=""):
        return sorted(n for n in self._metrics if n.startswith(prefix))


STEPS = list(range(10, 210, 10))
JITTER = (0.97, 1.0, 1.03)  # three seeds: a small, fixed spread around each arm's value


def _const(value):
    return [(s, value) for s in STEPS]


def _loss(level):
    # a decaying curve whose mean is ∝ level
    return [(s, level * (1.0 + 1.0 / s)) for s in range(1, 201)]


def _hist(shift_per_step, widen_per_step, layers=("layers.0.1", "layers.1.1", "layers.2.1")):
    out = {}
    for layer in layers:
        unit = f"{layer}[0]"
        for q, z in (("q05", -1.645), ("q25", -0.674), ("q50", 0.0),
                     ("q75", 0.674), ("q95", 1.645)):
            out[f"probe/histograms/{q}/{unit}"] = [
                (s, shift_per_step * s + z * (1 + widen_per_step * s)) for s in STEPS]
    return out


def _landscape(loss_range, grad_change, beta):
    return {
        "probe/landscape/loss": _const(5.0), "probe/landscape/loss_min": _const(5.0 - loss_range),
        "probe/landscape/loss_max": _const(5.0), "probe/landscape/loss_range": _const(loss_range),
        "probe/landscape/grad_change_min": _const(grad_change / 100),
        "probe/landscape/grad_change_max": _const(grad_change),
        "probe/landscape/beta_smoothness": _const(beta)}


def _ctx(experiment_id, runs, tmp_path, data=None, tiny=False):
    return AnalysisContext(E.get(experiment_id), "smoke", runs, data or {},
                           tmp_path / experiment_id, tiny)


def seeds(value, spread=JITTER):
    return [value * j for j in spread]


# ---- the shared decision rule ------------------------------------------------------------------

def test_decide_and_combine():
    from bnlab.experiments.common import compare_arms

    assert VD.decide(compare_arms(seeds(1.0), seeds(0.5)), "lower") == "held"
    assert VD.decide(compare_arms(seeds(0.5), seeds(1.0)), "lower") == "not held"
    noisy = compare_arms([1.0, 0.2, 1.8], [0.9, 1.7, 0.1])
    assert VD.decide(noisy, "lower") == "inconclusive" and noisy.mde > 0.5
    assert VD.decide(compare_arms([1.0], [0.5]), "lower") == "inconclusive"  # one seed: too few
    assert VD.combine(["held", "held"]) == "held"
    assert VD.combine(["held", "inconclusive"]) == "inconclusive"
    assert VD.combine(["inconclusive", "not held"]) == "not held"


def test_sharpness_ratio_reads_the_second_half():
    run = FakeRun("x", {
        "probe/hessian/top_eigenvalue": [(0, 100.0), (100, 5.0), (200, 20.0), (300, 40.0)]})
    assert SC.sharpness_ratio(run, lr=0.1) == pytest.approx(
        statistics_median([20.0, 40.0]) * 0.1 / 2)
    assert SC.sharpness_ratio(run, lr=0.1, half=False) == pytest.approx(
        statistics_median([100, 5, 20, 40]) * 0.05)
    assert "x 1.5" in SC.sharpness_line({"x": [run]}, 0.1)
    assert SC.sharpness_line({"x": [FakeRun("x", {})]}, 0.1) == "sharpness not measured"


def statistics_median(values):
    import statistics

    return statistics.median(values)


# ---- verdicts as pure functions ------------------------------------------------------------------

def test_fig2_verdict():
    losses = {SC.STANDARD: seeds(1.0), SC.BN: seeds(0.1), SC.NOISY: seeds(0.1)}
    assert V.fig2_verdict(losses)[0] == "held"
    assert V.fig2_verdict({**losses, SC.NOISY: seeds(2.0)})[0] == "not held"
    # the claim's second half: faster than standard but 2× BN's loss (measured ≈ 1.8×) is
    # not "as well as BN" (the old verdict tested only the first half and said held)
    verdict, text = V.fig2_verdict({**losses, SC.NOISY: seeds(0.2)})
    assert verdict == "not held" and "(1) noisy BN − standard" in text and "→ held" in text
    verdict, text = V.fig2_verdict({**losses, SC.NOISY: [0.3, 1.5, 3.0]})
    assert verdict == "inconclusive" and "resolvable" in text
    assert V.fig2_verdict(losses, "tiny")[0] == "inconclusive"
    # one seed decides nothing
    assert V.fig2_verdict({**losses, SC.NOISY: [0.2]})[0] == "inconclusive"


def test_fig6_verdict():
    def cos(std, bn):
        return {(net, SC.STANDARD): seeds(std, (0.99, 1.0, 1.01)) for net in ("VGG", "DLN")} | \
               {(net, SC.BN): seeds(bn, (0.99, 1.0, 1.01)) for net in ("VGG", "DLN")}
    assert V.fig6_verdict(cos(0.99, 0.90))[0] == "held"   # BN's gradients change more: "even worse"
    assert V.fig6_verdict(cos(0.5, 0.9))[0] == "not held"  # BN clearly less ICS
    # right at the tolerance: undecidable
    assert V.fig6_verdict(cos(0.6, 0.62))[0] == "inconclusive"


def test_fig7_verdict():
    def changes(noisy):
        return {SC.STANDARD: {"mean_change": seeds(0.05), "var_change": seeds(0.05)},
                SC.NOISY: {"mean_change": seeds(noisy), "var_change": seeds(noisy)}}
    losses = {SC.STANDARD: seeds(1.0), SC.NOISY: seeds(0.2)}
    assert SM.fig7_verdict(changes(0.3), losses)[0] == "held"
    assert SM.fig7_verdict(changes(0.06), losses)[0] == "not held"  # < 2× standard
    # trains worse
    assert SM.fig7_verdict(changes(0.3), {**losses, SC.NOISY: seeds(3.0)})[0] == "not held"


def test_fig8_verdict_and_drift():
    # the drift measure: a pure shift of the median by half the initial 5–95 % spread gives 0.5,
    # a pure doubling of the spread gives ln 2
    span = STEPS[-1] - STEPS[0]
    assert SC.distribution_drift(
        FakeRun("x", _hist(0.5 * 2 * 1.645 / span, 0.0))) == pytest.approx(0.5, rel=1e-9)
    widen = 1.0 / (STEPS[-1] - 2 * STEPS[0])  # (1 + w·s_last) / (1 + w·s_first) = 2
    assert SC.distribution_drift(FakeRun("z", _hist(0.0, widen))) == pytest.approx(
        math.log(2), rel=1e-9)
    assert SC.distribution_drift(FakeRun("y", _hist(0.0, 0.0))) == 0.0
    assert DL.fig8_verdict({SC.STANDARD: seeds(0.8), SC.BN: seeds(0.1)})[0] == "held"
    assert DL.fig8_verdict({SC.STANDARD: seeds(0.1), SC.BN: seeds(0.8)})[0] == "not held"


def test_fig9_verdict_and_analysis(tmp_path):
    def summaries(loss_range, change, beta):
        return [{"loss_range": loss_range * j, "grad_change_max": change * j,
                 "beta_smoothness": beta * j}
                for j in JITTER]
    smooth = {SC.STANDARD: summaries(5.0, 50.0, 500.0), SC.BN: summaries(0.5, 5.0, 50.0)}
    assert DL.landscape_verdict(smooth, SC.BN)[0] == "held"
    rough = {SC.STANDARD: summaries(0.5, 5.0, 500.0), SC.BN: summaries(5.0, 50.0, 50.0)}
    verdict, comps, _ = DL.landscape_verdict(rough, SC.BN)
    assert verdict == "not held" and comps["beta_smoothness"].decision == "lower"
    # end to end on synthetic stored runs, 3 seeds per arm, with a sharpness series
    def fig9_runs(literal_bn_scale):
        arms = ((SC.STANDARD, 10.0, 5.0), (SC.BN, 5.0, 0.5),
                (DL.LITERAL_ARM + SC.STANDARD, 10.0, 5.0),
                (DL.LITERAL_ARM + SC.BN, 5.0, literal_bn_scale))
        return [FakeRun(
            label, {"train_loss": _loss(lvl), **_landscape(r * j, 10 * r * j, 100 * r * j),
                    "probe/hessian/top_eigenvalue": _const(1500.0 * j)}, seed=i)
                for label, lvl, r in arms for i, j in enumerate(JITTER)]

    out = DL._fig9_analyze(_ctx("santurkar-fig9", fig9_runs(0.5), tmp_path))
    assert out.verdict == "held" and "λ_max / (2/lr)" in out.summary \
        and "Standard 0.75" in out.summary
    assert "lr 0.001: held" in out.summary and "lr 0.01: held" in out.summary
    assert any("β × lr / 2" in row["quantity"] and "0.01" in row["quantity"] for row in out.table)
    # the literal rate reverses the comparison: the verdict is decided by the rate, so inconclusive
    out = DL._fig9_analyze(_ctx("santurkar-fig9", fig9_runs(50.0), tmp_path))
    assert out.verdict == "inconclusive" and "lr 0.01: not held" in out.summary
    bare = [FakeRun(SC.STANDARD, {"train_loss": _loss(10.0)}),
            FakeRun(SC.BN, {"train_loss": _loss(5.0)})]
    out = DL._fig9_analyze(_ctx("santurkar-fig9", bare, tmp_path))
    assert out.verdict == "inconclusive" and all(p.stat().st_size > 1000 for p in out.figures)


def _replays(lr, std_scale, bn_scale, spread):
    sizes = PR.fig10_grid(lr)

    def replay(scale):
        return {"status": "finished", "curves": [
            {"step": step, "grad_norm": 1.0, "loss_at_theta": 5.0,
             "grad_change": [scale * s for s in sizes],
             "loss": [5.0 + scale * s for s in sizes]} for step in (0, 200)]}
    return {"at_steps": [0, 200], "lr": lr, "step_sizes": sizes,
            "runs": {SC.STANDARD: [replay(std_scale * j) for j in spread],
                     SC.BN: [replay(bn_scale * j) for j in spread]}}


def _pred(std_scale, bn_scale, spread=JITTER, literal=None):
    """Fig. 10 replays at lr 1e-3 and, trained at 1e-2, with the scales ``literal`` (default the
    same as at 1e-3; False: no replay at 1e-2)."""
    out = _replays(SC.DLN_LR, std_scale, bn_scale, spread)
    if literal is not False:
        out[PR.LITERAL_KEY] = _replays(DL.LITERAL_LR, *(literal or (std_scale, bn_scale)), spread)
    return {"predictiveness": out}


def test_fig10_verdict(tmp_path):
    out = PR._fig10_analyze(_ctx("santurkar-fig10", [], tmp_path, data=_pred(100.0, 10.0)))
    _check_outcome(out)
    assert out.verdict == "held" and "(30, 1000]" in out.summary
    assert "trained at lr 0.01" in out.summary and "β·lr/2" in out.summary
    assert any("β × lr / 2" in row["quantity"] and "0.01" in row["quantity"] for row in out.table)
    assert PR._fig10_analyze(
        _ctx("santurkar-fig10", [], tmp_path, data=_pred(10.0, 100.0))).verdict == "not held"
    noisy = _pred(10.0, 9.0, (0.3, 1.0, 3.0))
    assert PR._fig10_analyze(
        _ctx("santurkar-fig10", [], tmp_path, data=noisy)).verdict == "inconclusive"
    # the readings disagree: decided by the rate, not by BN
    split = _pred(10.0, 100.0, literal=(100.0, 10.0))
    out = PR._fig10_analyze(_ctx("santurkar-fig10", [], tmp_path, data=split))
    assert out.verdict == "inconclusive" and "lr 0.001, [1/100, 30] × 0.001: not held" in \
        out.summary and "lr 0.01, [1/100, 30] × 0.01: held" in out.summary
    # the second reading never trained: not measured, so not decided
    one = _pred(100.0, 10.0, literal=False)
    assert PR._fig10_analyze(_ctx("santurkar-fig10", [], tmp_path, data=one)).verdict == \
        "inconclusive"
    # no replay
    assert PR._fig10_analyze(_ctx("santurkar-fig10", [], tmp_path)).verdict == "inconclusive"


def test_fig10_beta_edge_is_beta_times_half_the_rate():
    windows = {SC.STANDARD: {"ours": [{"beta_smoothness": 20.0}, {"beta_smoothness": None}]},
               SC.BN: {"ours": [{"beta_smoothness": 2000.0}]}}
    assert PR.beta_edge(windows, 1e-3) == {SC.STANDARD: [pytest.approx(0.01)],
                                           SC.BN: [pytest.approx(1.0)]}


def test_fig10_window_summary():
    sizes = [1e-3, 1e-2, 1e-1]
    curve = {"grad_norm": 2.0, "loss": [5.0, 4.0, 9.0], "grad_change": [0.01, 0.4, None]}
    assert PR.window_summary(curve, sizes, 1e-3, 1e-2) == {
        "loss_range": 1.0, "grad_change_max": 0.4,
        "beta_smoothness": pytest.approx(max(0.01 / 2e-3, 0.4 / 2e-2))}
    assert PR.window_summary(curve, sizes, 1e-2, 1e-1)["loss_range"] == 5.0


def _lp_runs(bad=None, factor=2.0, without=None):
    """Per-seed fake VGG and DLN runs (the DLN at both rates) of every ℓp arm: normalized arms 5×
    better than standard in loss and landscape; the ``bad`` (net, label) ``factor`` × standard
    instead (net "DLN": at both rates); the ``without`` label left out."""
    out = []
    for net in ("VGG", "DLN", LV.LITERAL_NET):
        for label in LV.LP_LABELS:
            if label == without:
                continue
            hit = bad is not None and label == bad[1] and net.startswith(bad[0])
            f = 1.0 if label == SC.STANDARD else (factor if hit else 0.2)
            for i, j in enumerate(JITTER):
                out.append(FakeRun(f"{net}: {label}", {
                    "train_loss": _loss(f * j),
                    **_landscape(2.0 * f * j, 20.0 * f * j, 100.0 * f * j),
                    **_hist(0.01, 0.0, ("features.4.1",))}, seed=i))
    return out


def test_fig11_verdict(tmp_path):
    out = LP._fig11_analyze(_ctx("santurkar-fig11", _lp_runs(), tmp_path))
    _check_outcome(out)
    assert out.verdict == "held" and len(out.figures) == 3  # VGG, DLN at 1e-3 and at 1e-2
    assert ("against the standard network (training loss; landscape = all three medians): "
            "16 of 16 checks held" in out.summary)
    assert "Fig. 13, ℓp comparable to BN (loss below 1.25× BN's): 6 of 6 checks held" in out.summary
    assert "the readings agree" in out.summary and out.record.verdict == "held"
    out = LP._fig11_analyze(_ctx("santurkar-fig11", _lp_runs(("DLN", SC.LINF)), tmp_path))
    assert out.verdict == "not held" and "14 of 16 checks held, 2 against" in out.summary \
        and "5 of 6 checks held, 1 against" in out.summary
    # the record: the primary reading's first check against the claim, ℓ∞'s DLN loss
    assert out.record.verdict == "not held" and out.record.primary.startswith(
        f"DLN: {SC.LINF} − standard, ln mean training loss") and out.record.effect > 0


def test_fig11_verdict_checks_every_arm_the_paper_names(tmp_path):
    """The ℓ2 arm counts. An ℓ2 arm that contradicts the claim makes the verdict
    "not held"; a missing ℓ2 arm leaves it undecided (the old verdict checked only the arms that
    were run)."""
    # ℓ2 trains worse than the standard VGG, with a rougher landscape
    runs = _lp_runs(("VGG", SC.L2))
    out = LP._fig11_analyze(_ctx("santurkar-fig11", runs, tmp_path))
    assert out.verdict == "not held" and f"VGG: {SC.L2}: loss higher" in out.summary
    out = LP._fig11_analyze(_ctx("santurkar-fig11", _lp_runs(without=SC.L2), tmp_path))
    assert out.verdict == "inconclusive" and f"VGG: {SC.L2}: loss too few seeds" in out.summary
    # Fig. 13: an ℓp network better than standard but at 2.5× BN's loss is not "comparable to BN"
    losses = {f"{net}: {label}": seeds(1.0 if label == SC.STANDARD else 0.1)
              for net in ("VGG", "DLN") for label in LV.LP_LABELS}
    landscapes = {key: [
        {"loss_range": v, "grad_change_max": v, "beta_smoothness": v} for v in values]
                  for key, values in losses.items()}
    assert LV.fig11_verdict(losses, landscapes)[0] == "held"
    verdict, summary = LV.fig11_verdict({**losses, f"DLN: {SC.L1}": seeds(0.25)}, landscapes)
    assert verdict == "not held" and "5 of 6 checks held, 1 against" in summary
    assert LV.fig11_verdict({**losses, f"DLN: {SC.L1}": [0.05, 0.3, 0.12]},
                            landscapes)[0] == "inconclusive"


def test_fig14_verdict(tmp_path):
    drift = {SC.STANDARD: seeds(0.2), SC.BN: seeds(0.1), SC.L1: seeds(0.6), SC.L2: seeds(0.4),
             SC.LINF: seeds(0.5)}
    losses = {SC.STANDARD: seeds(1.0), SC.BN: seeds(0.3), SC.L1: seeds(0.2), SC.L2: seeds(0.1),
              SC.LINF: seeds(0.3)}
    assert LV.fig14_verdict(drift, losses)[0] == "held"
    assert LV.fig14_verdict({**drift, SC.LINF: seeds(0.05)}, losses)[0] == "not held"
    assert LV.fig14_verdict(drift, {**losses, SC.L1: [0.2, 1.5, 3.0]})[0] == "inconclusive"
    # every ℓp arm the paper names counts: ℓ2 drifting less than standard contradicts the caption,
    # a missing ℓ2 arm leaves the claim undecided
    verdict, summary = LV.fig14_verdict({**drift, SC.L2: seeds(0.05)}, losses)
    assert verdict == "not held" and f"{SC.L2}: drift − standard" in summary
    assert "5 of 6 checks held, 1 against" in summary
    missing = {k: v for k, v in drift.items() if k != SC.L2}
    assert LV.fig14_verdict(missing, losses)[0] == "inconclusive"

    def runs(labels):
        return [FakeRun(f"VGG: {label}", {"train_loss": _loss(losses[label][i]),
                                          **_hist(
                                              drift[label][i] * 2 * 1.645 / (STEPS[-1] - STEPS[0]),
                                              0.0, ("features.2.1", "features.4.1"))}, seed=i)
                for label in labels for i in range(3)]
    out = LP._fig14_analyze(_ctx("santurkar-fig14", runs(LV.LP_LABELS), tmp_path))
    _check_outcome(out)
    assert out.verdict == "held"
    assert LP._fig14_analyze(
        _ctx("santurkar-fig14", runs((SC.STANDARD, SC.BN, SC.L1, SC.LINF)), tmp_path)
        ).verdict == "inconclusive"


def test_smoke_plans_run_every_lp_arm_the_paper_names():
    """Figs 11–14 compare ℓ1, ℓ2 and ℓ∞ (Santurkar §3.3): the smoke preset runs the ℓ2 arm too, for
    the VGG and the DLN, with the seeds of the other arms and the configs the paper preset scales
    up."""
    vgg_lr = SC.vgg_config("smoke", "none")["lr"]
    dln = (("dln", SC.DLN_LR), ("dln", SC.LITERAL_LR))  # fig11's DLN at both readings of its rate
    for entry, nets in (("santurkar-fig11", (("vgg", vgg_lr),) + dln),
                        ("santurkar-fig14", (("vgg", vgg_lr),))):
        runs = E.get(entry).plan("smoke").runs
        for net, lr in nets:
            l2 = [r for r in runs if r.factors["net"] == net and r.config["norm"] == "lp_bn(p=2)"
                  and r.config["lr"] == lr]
            assert [r.config["seed"] for r in l2] == list(SC.SEEDS) == [0, 1, 2], (entry, net)
            config = (SC.vgg_config("smoke", "lp_bn(p=2)", 1) if net == "vgg" else
                      SC.dln_config("smoke", "lp_bn(p=2)", 1, lr))
            assert l2[1].config == config
        assert {r.config["norm"] for r in runs} == {"none", "bn", "lp_bn(p=1)",
                                                    "lp_bn(p=2)", "lp_bn(p=inf)"}
