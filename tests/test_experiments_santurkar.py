"""The Santurkar catalogue entries (fig2, fig6, fig7, fig8, fig9, fig11): wiring, plans, analysis logic.

* every entry runs end to end in the suite's reduced form (``tiny``: 6 steps per run) and draws its figures;
* a longer reduced form (50 steps) makes every probe of the shared runs fire, so the analyses read the
  real metric names (ICS, moments, histograms, landscape) and produce finite numbers;
* the paper presets match App. A.1 (architectures, data, steps, rates, batch sizes) and each figure's runs;
* each analysis gives the known verdict on synthetic stored runs built to satisfy or to break its claim;
* the DLN learning rate rule (module docstring): 30 × lr is where the standard DLN diverges, lr trains.
"""

from __future__ import annotations

import math

import pytest
import torch

import bnlab.experiments as E
from bnlab.experiments import runner
from bnlab.experiments import santurkar as S
from bnlab.experiments.runner import AnalysisContext

IDS = ["santurkar-fig2", "santurkar-fig6", "santurkar-fig7", "santurkar-fig8", "santurkar-fig9", "santurkar-fig11"]
PNG = b"\x89PNG\r\n\x1a\n"



@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    # One store for all entries: their shared configs are trained once (the runner skips finished runs).
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
def test_tiny_reproduce_draws_figures(experiment_id, tiny_dir):
    outcome = runner.reproduce(experiment_id, "smoke", runs_dir=tiny_dir, tiny=True, report=False, progress=False)
    _check_outcome(outcome)
    assert outcome.verdict == "inconclusive"  # six steps decide nothing, and the entries say so
    ctx = runner.analysis_context(experiment_id, "smoke", runs_dir=tiny_dir)
    assert all(r.status == "finished" for r in ctx.runs)
    assert len(ctx.runs) == len(E.get(experiment_id).plan("smoke").runs)


def test_probes_fire_and_analyses_read_them(tmp_path, monkeypatch):
    """50 steps per run: every probe of the shared VGG/DLN runs fires, the tables fill with finite numbers."""
    monkeypatch.setattr(runner, "TINY_STEPS", 50)
    numbers = {}
    for experiment_id in ("santurkar-fig7", "santurkar-fig6", "santurkar-fig8", "santurkar-fig9"):
        outcome = runner.reproduce(experiment_id, "smoke", runs_dir=tmp_path, tiny=True, report=False, progress=False)
        _check_outcome(outcome)
        numbers[experiment_id] = [row["ours"] for row in outcome.table]
    # fig7: per-step moment changes of all three networks; noisy BN's fresh noise dominates the change
    ctx = runner.analysis_context("santurkar-fig7", "smoke", runs_dir=tmp_path)
    by = {r.label: r for r in ctx.runs}
    assert S.probe_layers(by[S.BN], "moments", "mean_change")[0] == "features.0.1"      # BN outputs
    assert S.probe_layers(by[S.STANDARD], "moments", "mean_change")[0] == "features.0.0"  # conv outputs
    noisy = S._layer_medians(by[S.NOISY], "moments", "mean_change")
    plain = S._layer_medians(by[S.BN], "moments", "mean_change")
    assert noisy > 10 * plain  # means of U(−0.5, 0.5) redrawn each step vs β's drift at lr 0.1
    # fig6: ICS of every weight layer; the first layer has nothing before it, so G' = G exactly
    ctx = runner.analysis_context("santurkar-fig6", "smoke", runs_dir=tmp_path)
    vgg = next(r for r in ctx.runs if r.label == f"VGG: {S.BN}")
    layers = S.probe_layers(vgg, "ics", "l2")
    assert layers[0] == "features.0.0" and layers[-1] == "classifier.2" and len(layers) == 11
    assert S._first_layer_zero(vgg) == {"features.0.0"}
    dln = next(r for r in ctx.runs if r.label == f"DLN: {S.STANDARD}")
    assert len(S.probe_layers(dln, "ics", "cos")) == 25
    for row in numbers["santurkar-fig6"]:
        assert "—" not in row and "nan" not in row
    # fig9: landscape medians and the Fig. 10 replay are finite
    for row in numbers["santurkar-fig9"]:
        assert "—" not in row and "nan" not in row
    ctx = runner.analysis_context("santurkar-fig9", "smoke", runs_dir=tmp_path)
    pred = ctx.data["predictiveness"]
    assert set(pred["runs"]) == {S.STANDARD, S.BN}
    assert all(len(info["curves"]) == 2 for info in pred["runs"].values())
    # fig8: the distributions of 2 sampled units per BN layer were recorded every 10 steps
    ctx = runner.analysis_context("santurkar-fig8", "smoke", runs_dir=tmp_path)
    bn = next(r for r in ctx.runs if r.label == S.BN)
    assert len(S._hist_units(bn)) == 2 * 24
    assert S.distribution_drift(bn) is not None


# ---- plans ------------------------------------------------------------------------------------

def test_paper_presets_follow_appendix_a1():
    vgg = S.vgg_config("paper", "bn")
    assert (vgg["model"], vgg["data"], vgg["steps"], vgg["lr"], vgg["batch_size"]) == \
        ("vgg_santurkar", "cifar10", 15000, 0.1, 128)
    assert vgg["momentum"] == 0.0 and vgg["augment"] is False and "model_options" not in vgg  # Glorot, full width
    dln = S.dln_config("paper", "none")
    assert (dln["model"], dln["data"], dln["steps"], dln["batch_size"]) == ("dln", "gaussian_regression", 10000, "full")
    assert dln["model_options"] == {"depth": 25, "width": 10} and dln["data_options"] == {"d": 10, "n": 1000}
    plans = {i: E.get(i).plan("paper") for i in IDS}
    norms = {i: [(r.factors["net"], r.config["norm"]) for r in p.runs] for i, p in plans.items()}
    assert norms["santurkar-fig2"] == norms["santurkar-fig7"] == [("vgg", "none"), ("vgg", "bn"), ("vgg", "noisy_bn")]
    assert norms["santurkar-fig6"] == [("vgg", "none"), ("vgg", "bn"), ("dln", "none"), ("dln", "bn")]
    assert norms["santurkar-fig8"] == norms["santurkar-fig9"] == [("dln", "none"), ("dln", "bn")]
    lp = ["none", "bn", "lp_bn(p=1)", "lp_bn(p=2)", "lp_bn(p=inf)"]
    assert norms["santurkar-fig11"] == [("vgg", n) for n in lp] + [("dln", n) for n in lp]
    probes = {i: [{spec.split("(")[0] for spec in r.config["probes"]} for r in p.runs] for i, p in plans.items()}
    assert all("ics" in s for s in probes["santurkar-fig6"])
    assert all("moments" in s for s in probes["santurkar-fig7"])
    assert all("histograms" in s for s in probes["santurkar-fig8"])
    assert all("landscape" in s for s in probes["santurkar-fig9"] + probes["santurkar-fig11"])
    assert "predictiveness" in plans["santurkar-fig9"].compute


def test_noisy_bn_uses_algorithm_1_constants():
    from bnlab.norms import lookup

    _, params = lookup(S.NORMS[S.NOISY])
    assert (params["n_mu"], params["n_sigma"], params["r_mu"], params["r_sigma"]) == (0.5, 1.25, 0.1, 0.1)


def test_landscape_probe_ranges_are_the_papers():
    import bnlab.models as M
    from bnlab.probes import default_range

    assert default_range(M.create("dln", norm="bn", input_shape=(10,), num_classes=10)) == S.DLN_RANGE == (0.01, 30.0)
    assert default_range(M.create("vgg_santurkar", norm="bn", input_shape=(1, 8, 8), width=0.125)) == \
        S.VGG_RANGE == (0.5, 4.0)


def test_shared_runs_have_identical_configs():
    # Identical configs give identical run ids: fig6/7/8/9/11 reuse what fig2/fig9 trained.
    for preset in ("smoke", "paper"):
        by_entry = {i: {(r.factors["net"], r.config["norm"]): r.config for r in E.get(i).plan(preset).runs}
                    for i in IDS}
        for key in [("vgg", "none"), ("vgg", "bn")]:
            assert by_entry["santurkar-fig2"][key] == by_entry["santurkar-fig6"][key] == \
                by_entry["santurkar-fig7"][key] == by_entry["santurkar-fig11"][key]
        for key in [("dln", "none"), ("dln", "bn")]:
            assert by_entry["santurkar-fig6"][key] == by_entry["santurkar-fig8"][key] == \
                by_entry["santurkar-fig9"][key] == by_entry["santurkar-fig11"][key]


def test_dln_learning_rate_rule():
    """App. A.2.2: the largest landscape step, 30 × lr, sits at the rate where the standard DLN diverges."""
    import bnlab.models as M
    from bnlab import data as D

    cfg = S.dln_config("smoke", "none")
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

    at_lr = train(S.DLN_LR, 150)
    assert all(math.isfinite(v) for v in at_lr) and at_lr[-1] < 0.95 * at_lr[0]
    at_max = train(30 * S.DLN_LR, 60)
    assert not math.isfinite(at_max[-1]) or at_max[-1] > 1e6


def test_fig10_grid_contains_both_range_ends():
    grid = [v / S.DLN_LR for v in S.fig10_grid()]
    assert grid == sorted(grid) and math.isclose(grid[0], 0.01) and math.isclose(grid[-1], 1000.0)
    assert any(math.isclose(v, 30.0) for v in grid) and any(math.isclose(v, 300.0) for v in grid)
    assert math.isclose(30 * S.LITERAL_LR / S.DLN_LR, 300.0)


# ---- helpers ----------------------------------------------------------------------------------

def test_layer_order_and_picks():
    names = ["classifier.2", "features.10.0", "features.2.0", "classifier.0.0", "features.0.0"]
    assert sorted(names, key=S.layer_key) == ["features.0.0", "features.2.0", "features.10.0", "classifier.0.0",
                                              "classifier.2"]
    assert sorted(["layers.10.1[3]", "layers.2.1[7]", "layers.2.1[1]"], key=S.layer_key) == \
        ["layers.2.1[1]", "layers.2.1[7]", "layers.10.1[3]"]
    assert S.pick(list(range(11)), (0.25, 0.75)) == [2, 8]
    assert S.pick([5], (0.1, 0.9)) == [5] and S.pick([], (0.5,)) == []


class FakeRun:
    """A stored run as ``RunView`` presents it, from a dict of metric series."""

    def __init__(self, label, metrics, status="finished", final=None):
        self.label, self.status, self.factors, self.id = label, status, {}, "fake"
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


def _const(value):
    return [(s, value) for s in STEPS]


def _loss(level):
    # a decaying curve whose mean is ∝ level
    return [(s, level * (1.0 + 1.0 / s)) for s in range(1, 201)]


def _ics(cos, l2, layers=("layers.0.0", "layers.1.0", "layers.2.0")):
    out = {}
    for i, layer in enumerate(layers):
        out[f"probe/ics/cos/{layer}"] = _const(1.0 if i == 0 else cos)
        out[f"probe/ics/l2/{layer}"] = _const(0.0 if i == 0 else l2)
    return out


def _moments(change, layers=("features.0.1", "features.2.1")):
    return {f"probe/moments/{q}/{layer}": _const(change) for q in ("mean_change", "var_change") for layer in layers}


def _hist(shift_per_step, widen_per_step, layers=("layers.0.1", "layers.1.1", "layers.2.1")):
    out = {}
    for layer in layers:
        unit = f"{layer}[0]"
        for q, z in (("q05", -1.645), ("q25", -0.674), ("q50", 0.0), ("q75", 0.674), ("q95", 1.645)):
            out[f"probe/histograms/{q}/{unit}"] = [(s, shift_per_step * s + z * (1 + widen_per_step * s))
                                                   for s in STEPS]
    return out


def _landscape(loss_range, grad_change, beta):
    return {"probe/landscape/loss": _const(5.0), "probe/landscape/loss_min": _const(5.0 - loss_range),
            "probe/landscape/loss_max": _const(5.0), "probe/landscape/loss_range": _const(loss_range),
            "probe/landscape/grad_change_min": _const(grad_change / 100),
            "probe/landscape/grad_change_max": _const(grad_change), "probe/landscape/beta_smoothness": _const(beta)}


def _ctx(experiment_id, runs, tmp_path, data=None, tiny=False):
    return AnalysisContext(E.get(experiment_id), "smoke", runs, data or {}, tmp_path / experiment_id, tiny)


def test_fig2_verdicts(tmp_path):
    def runs(noisy_level):
        return [FakeRun(S.STANDARD, {"train_loss": _loss(1.0)}), FakeRun(S.BN, {"train_loss": _loss(0.1)}),
                FakeRun(S.NOISY, {"train_loss": _loss(noisy_level), **_hist(0.01, 0.0, ("features.4.1",))})]
    held = S._fig2_analyze(_ctx("santurkar-fig2", runs(0.2), tmp_path))
    _check_outcome(held)
    assert held.verdict == "held"
    assert S._fig2_analyze(_ctx("santurkar-fig2", runs(2.0), tmp_path)).verdict == "not held"
    assert S._fig2_analyze(_ctx("santurkar-fig2", runs(0.2), tmp_path, tiny=True)).verdict == "inconclusive"
    # a diverged standard run trains worse than anything finite
    diverged = runs(0.2)
    diverged[0] = FakeRun(S.STANDARD, {"train_loss": [(1, 2.3), (2, float("nan"))]}, status="diverged")
    assert S._fig2_analyze(_ctx("santurkar-fig2", diverged, tmp_path)).verdict == "held"


def test_fig6_verdicts(tmp_path):
    def runs(cos_std, cos_bn):
        return [FakeRun(f"VGG: {S.STANDARD}", _ics(cos_std, 0.1)), FakeRun(f"VGG: {S.BN}", _ics(cos_bn, 0.2)),
                FakeRun(f"DLN: {S.STANDARD}", _ics(cos_std, 0.1)), FakeRun(f"DLN: {S.BN}", _ics(cos_bn, 0.2))]
    out = S._fig6_analyze(_ctx("santurkar-fig6", runs(0.99, 0.90), tmp_path))
    _check_outcome(out)
    assert out.verdict == "held"          # BN's gradients change more: the paper's "even worse"
    assert S._fig6_analyze(_ctx("santurkar-fig6", runs(0.95, 0.96), tmp_path)).verdict == "held"  # similar
    assert S._fig6_analyze(_ctx("santurkar-fig6", runs(0.5, 0.9), tmp_path)).verdict == "not held"
    # the first layer (cos 1, l2 0 by definition) does not enter the medians
    assert S._ics_summary(FakeRun("x", _ics(0.3, 0.5))) == (0.3, 0.5)


def test_fig7_verdicts(tmp_path):
    def runs(noisy_change, noisy_level=0.2):
        return [FakeRun(S.STANDARD, {"train_loss": _loss(1.0), **_moments(0.05, ("features.0.0", "features.2.0"))}),
                FakeRun(S.BN, {"train_loss": _loss(0.1), **_moments(0.001)}),
                FakeRun(S.NOISY, {"train_loss": _loss(noisy_level), **_moments(noisy_change)})]
    out = S._fig7_analyze(_ctx("santurkar-fig7", runs(0.3), tmp_path))
    _check_outcome(out)
    assert out.verdict == "held"
    assert S._fig7_analyze(_ctx("santurkar-fig7", runs(0.06), tmp_path)).verdict == "not held"  # < 2× standard
    assert S._fig7_analyze(_ctx("santurkar-fig7", runs(0.3, 3.0), tmp_path)).verdict == "not held"  # trains worse


def test_fig8_verdicts_and_drift(tmp_path):
    # the drift measure: a pure shift of the median by half the initial 5–95 % spread gives 0.5,
    # a pure doubling of the spread gives ln 2
    span = STEPS[-1] - STEPS[0]
    shifted = FakeRun("x", _hist(0.5 * 2 * 1.645 / span, 0.0))
    assert S.distribution_drift(shifted) == pytest.approx(0.5, rel=1e-9)
    widen = 1.0 / (STEPS[-1] - 2 * STEPS[0])  # (1 + w·s_last) / (1 + w·s_first) = 2
    widened = FakeRun("z", _hist(0.0, widen))
    assert S.distribution_drift(widened) == pytest.approx(math.log(2), rel=1e-9)
    steady = FakeRun("y", _hist(0.0, 0.0))
    assert S.distribution_drift(steady) == 0.0
    out = S._fig8_analyze(_ctx("santurkar-fig8", [FakeRun(S.STANDARD, _hist(0.02, 0.01)),
                                                  FakeRun(S.BN, _hist(0.0, 0.0005))], tmp_path))
    _check_outcome(out)
    assert out.verdict == "held"
    out = S._fig8_analyze(_ctx("santurkar-fig8", [FakeRun(S.STANDARD, _hist(0.0, 0.0)),
                                                  FakeRun(S.BN, _hist(0.02, 0.0))], tmp_path))
    assert out.verdict == "not held"


def _pred(std_scale, bn_scale):
    sizes = S.fig10_grid()
    def curve(scale):
        return {"step": 0, "grad_norm": 1.0, "loss_at_theta": 5.0,
                "grad_change": [scale * s for s in sizes], "loss": [5.0 + scale * s for s in sizes]}
    return {"predictiveness": {"at_steps": [0], "lr": S.DLN_LR, "step_sizes": sizes,
                               "runs": {S.STANDARD: {"status": "finished", "curves": [curve(std_scale)]},
                                        S.BN: {"status": "finished", "curves": [curve(bn_scale)]}}}}


def test_fig9_verdicts(tmp_path):
    smooth_bn = [FakeRun(S.STANDARD, {"train_loss": _loss(10.0), **_landscape(5.0, 50.0, 500.0)}),
                 FakeRun(S.BN, {"train_loss": _loss(5.0), **_landscape(0.5, 5.0, 50.0)})]
    out = S._fig9_analyze(_ctx("santurkar-fig9", smooth_bn, tmp_path, data=_pred(100.0, 10.0)))
    _check_outcome(out)
    assert out.verdict == "held" and len(out.figures) == 2
    assert "BN smaller on 3 of 3" in out.summary
    rough_bn = [FakeRun(S.STANDARD, {"train_loss": _loss(10.0), **_landscape(0.5, 5.0, 500.0)}),
                FakeRun(S.BN, {"train_loss": _loss(5.0), **_landscape(5.0, 50.0, 50.0)})]
    out = S._fig9_analyze(_ctx("santurkar-fig9", rough_bn, tmp_path, data=_pred(10.0, 100.0)))
    assert out.verdict == "not held" and "loss range" in out.summary and "BN smaller on 0 of 3" in out.summary
    # missing replay data and missing probes: still figures, inconclusive
    bare = [FakeRun(S.STANDARD, {"train_loss": _loss(10.0)}), FakeRun(S.BN, {"train_loss": _loss(5.0)})]
    out = S._fig9_analyze(_ctx("santurkar-fig9", bare, tmp_path))
    assert out.verdict == "inconclusive" and all(p.stat().st_size > 1000 for p in out.figures)


def test_fig10_window_summary():
    sizes = [1e-3, 1e-2, 1e-1]
    curve = {"grad_norm": 2.0, "loss": [5.0, 4.0, 9.0], "grad_change": [0.01, 0.4, None]}
    assert S.window_summary(curve, sizes, 1e-3, 1e-2) == {
        "loss_range": 1.0, "grad_change_max": 0.4, "beta_smoothness": pytest.approx(max(0.01 / 2e-3, 0.4 / 2e-2))}
    assert S.window_summary(curve, sizes, 1e-2, 1e-1)["loss_range"] == 5.0


def test_fig11_verdicts(tmp_path):
    def runs(bad=None):
        out = []
        for net in ("VGG", "DLN"):
            for label in S.LP_LABELS:
                worse = label == S.STANDARD or (net, label) == bad
                out.append(FakeRun(f"{net}: {label}", {
                    "train_loss": _loss(1.0 if worse else 0.2),
                    **_landscape(2.0 if worse else 0.2, 20.0 if worse else 2.0, 100.0 if worse else 10.0),
                    **_hist(0.01, 0.0, ("features.4.1",))}))
        return out
    out = S._fig11_analyze(_ctx("santurkar-fig11", runs(), tmp_path))
    _check_outcome(out)
    assert out.verdict == "held" and len(out.figures) == 3
    out = S._fig11_analyze(_ctx("santurkar-fig11", runs(("DLN", S.LINF)), tmp_path))
    assert out.verdict == "not held"
    assert out.summary.startswith("21 of 24") and "DLN training loss 3/4, loss range 3/4, β 3/4" in out.summary
