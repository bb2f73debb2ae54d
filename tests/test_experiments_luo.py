"""Catalogue entries of Luo et al. 2019 (bnlab/experiments/luo.py): tiny end-to-end runs, the paper
presets' configurations, and each analysis on synthetic results whose verdict is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bnlab.experiments import get
from bnlab.experiments import luo
from bnlab.experiments import luo_table2
from bnlab.experiments.runner import AnalysisContext, RunView, reproduce

LUO_IDS = ["luo-fig2", "luo-fig3", "luo-fig4", "luo-fig5", "luo-fig6", "luo-fig7", "luo-table2"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"



def check_outcome(outcome):
    assert outcome.verdict in ("held", "not held", "inconclusive")
    assert isinstance(outcome.summary, str) and outcome.summary
    assert outcome.figures
    for path in outcome.figures:
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 2000
    assert outcome.table
    for row in outcome.table:
        assert {"quantity", "ours", "paper"} <= set(row)


@pytest.mark.parametrize("experiment_id", LUO_IDS)
def test_tiny_smoke_runs_end_to_end(experiment_id, tmp_path):
    outcome = reproduce(experiment_id, "smoke", runs_dir=tmp_path, tiny=True, report=False, progress=False)
    check_outcome(outcome)
    # a handful of steps can never settle a claim
    assert outcome.verdict == "inconclusive"


# ---- fakes for the analyses: real RunView / AnalysisContext over an in-memory metric store ------

class FakeStore:
    def __init__(self, series: dict[str, dict[str, list[tuple[int, float]]]]):
        self.series = series

    def metrics(self, run_id, names=None):
        rows = self.series.get(run_id, {})
        return {k: v for k, v in rows.items() if names is None or k in names}


def fake_context(experiment_id, runs, data=None, tmp_path=None, tiny=False):
    """``runs``: list of (label, factors, status, final metrics, {metric: [values]})."""
    store = FakeStore({f"r{i}": {name: list(enumerate(values, start=1)) for name, values in series.items()}
                       for i, (_, _, _, _, series) in enumerate(runs)})
    views = [RunView(label, factors, f"r{i}", status, {"status": status, "metrics": final}, store)
             for i, (label, factors, status, final, _) in enumerate(runs)]
    return AnalysisContext(get(experiment_id), "smoke", views, data or {}, tmp_path, tiny)


# ---- Fig. 2 ------------------------------------------------------------------------------------

def test_fig2_paper_preset_simulates_the_papers_bn_student(monkeypatch):
    from bnlab.theory import luo as theory

    calls = {}

    def fake_sim(alphas, **kwargs):
        calls.update(kwargs, alphas=list(alphas))
        a = np.asarray(alphas, dtype=float)
        return {"alpha": a, "gen_error": theory.gen_error_wn(a, 0.014, 0.25), "gen_error_sem": 0 * a, "gamma": 0 * a}

    monkeypatch.setattr(theory, "simulate_teacher_student", fake_sim)
    assert not get("luo-fig2").plan("paper").runs
    data = luo.fig2_data("paper")
    # §4.1: "SGD with batch size M = 32 ... the total number of input features is fixed at 4096", noise 0.25
    assert (calls["student"], calls["N"], calls["M"], calls["noise_var"]) == ("bn", 4096, 32, 0.25)
    assert 1.0 in calls["alphas"] and max(calls["alphas"]) >= 2
    assert data["fit_zeta"] == pytest.approx(0.014, rel=1e-3)   # the fit recovers the curve it was given
    assert data["zeta13"] == pytest.approx(0.0206, abs=5e-4)       # Eq. 13 at M = 32 ("≈ 0.02 λ")


def _fig2_data(errors_factor=1.0, fit=0.014):
    from bnlab.theory import luo as theory

    alphas = np.array([0.5, 0.75, 1.0, 1.5, 2.0, 3.0])
    curve = theory.gen_error_wn(alphas, fit, 0.25)
    return {"grid": [0.5, 1.0, 2.0], "curves": {"vanilla SGD (Eq. 14)": [1.0, None, 0.25]},
            "sim": {"alpha": alphas.tolist(), "gen_error": (curve * errors_factor).tolist()},
            "fitted_at_sim": curve.tolist(), "fit_zeta": fit, "zeta13": 0.0206, "zeta13_max": 0.0823,
            "settings": {"M": 32}}


def test_fig2_analysis_verdicts(tmp_path):
    ctx = fake_context("luo-fig2", [], {"fig2": _fig2_data()}, tmp_path)
    outcome = get("luo-fig2").analyze(ctx)
    check_outcome(outcome)
    assert outcome.verdict == "held"
    # a fitted ζ outside Eq. 13's range (λ ≤ 4) or points far off the fitted curve: not held
    assert luo.fig2_verdict(_fig2_data(fit=0.25), False)[0] == "not held"
    assert luo.fig2_verdict(_fig2_data(errors_factor=2.0), False)[0] == "not held"
    assert luo.fig2_verdict(_fig2_data(), True)[0] == "inconclusive"
    assert luo.fig2_verdict({"sim": {"gen_error": [0.5]}}, False)[0] == "inconclusive"


# ---- Fig. 3 ------------------------------------------------------------------------------------

def test_fig3_paper_preset():
    runs = get("luo-fig3").plan("paper").runs
    by_norm = {r.factors["norm"]: r.config for r in runs}
    assert set(by_norm) == {"none", "bn", "wn"}
    for config in by_norm.values():
        assert config["data"] == "teacher_student" and config["model"] == "perceptron"
        assert config["data_options"] == {"N": 4096, "alpha": 1.0, "noise_var": 0.25}
        assert config["batch_size"] == 32 and config["activation"] == "identity"
        assert config["model_options"] == {"bias": False}
    # ridge ζ = P·ζ_wn with P = N at α = 1: ζ = 0.014
    zeta_wn = float(by_norm["wn"]["norm"].split("=")[1].rstrip(")"))
    assert zeta_wn * 4096 == pytest.approx(0.014, rel=1e-4)


def test_population_statistics_eval_measures_without_changing_the_run():
    config = get("luo-fig3").plan("smoke").runs[1].config
    assert config["norm"] == "bn"
    config = {**config, "epochs": 3, "eval_every": 8}
    plain = luo.train_collecting(config)
    probed = luo.train_collecting(config, callbacks=[luo.PopulationStatisticsEval(8)])
    assert probed["series"]["test_loss"] == plain["series"]["test_loss"]
    assert probed["series"]["epoch_train_loss"] == plain["series"]["epoch_train_loss"]
    pop = [v for _, v in probed["series"]["test_loss_population"]]
    run = [v for _, v in plain["series"]["test_loss"]]
    assert len(pop) == len(run) == 3
    assert pop != run  # test-set statistics differ from the running averages


def _fig3_runs(sgd_values, bn_values, wn_values):
    labels = luo._FIG3_LABELS
    return [(labels[k], {"norm": k, "steps_per_epoch": 1}, "finished", {"test_loss": v[-1]}, {"test_loss": v})
            for k, v in (("none", sgd_values), ("bn", bn_values), ("wn", wn_values))]


def test_fig3_analysis_verdicts(tmp_path):
    rising, flat = [0.8, 1.5, 3.0, 6.0], [1.0, 1.3, 1.4, 1.45]
    data = {"bn_population": {"steps_per_epoch": 1, "series": {"test_loss_population": [[i, v] for i, v in
                                                                                           enumerate(flat, 1)]}}}
    outcome = get("luo-fig3").analyze(fake_context("luo-fig3", _fig3_runs(rising, [2, 3, 4, 5.0], flat), data, tmp_path))
    check_outcome(outcome)
    assert outcome.verdict == "held"
    outcome = get("luo-fig3").analyze(fake_context("luo-fig3", _fig3_runs(flat, flat, flat), data, tmp_path))
    assert outcome.verdict == "not held"  # SGD does not run away
    assert luo.fig3_verdict({"sgd": 6.0, "bn": 1.4, "wn": 3.5}, 0.8, False)[0] == "not held"  # BN ≠ WN
    assert luo.fig3_verdict({"sgd": None, "bn": 1.4, "wn": 1.4}, 0.8, False)[0] == "inconclusive"


# ---- Fig. 4 ------------------------------------------------------------------------------------

def test_fig4_paper_preset():
    runs = get("luo-fig4").plan("paper").runs
    assert sorted(r.config["norm"] for r in runs) == sorted(["none", "bn", "wn", "wn+mean_only_bn", "wn+var_only_bn"])
    for r in runs:
        c = r.config
        assert (c["model"], c["data"], c["momentum"], c["schedule"]) == ("luo_cnn", "cifar10", 0.9, "exp:0.9999")
        assert not c.get("weight_decay") and not c.get("augment") and not c.get("model_options")
    smoke = get("luo-fig4").plan("smoke").runs
    assert len(smoke) == 10 and all(r.config["data"] == "digits" for r in smoke)


def _fig4_runs(gaps):
    runs = []
    for arm, gap in gaps.items():
        for seed in (0, 1):
            train = [0.5, 0.1, 0.02, 0.01, 0.01]
            runs.append((arm if seed == 0 else f"{arm} (seed 1)", {"arm": arm, "seed": seed}, "finished",
                         {"test_accuracy": 0.9}, {"epoch_train_loss": train, "test_loss": [t + gap for t in train]}))
    return runs


def test_fig4_analysis_verdicts(tmp_path):
    good = {"vanilla SGD": 0.15, "BN": 0.05, "WN": 0.13, "WN + mean-only BN": 0.10, "WN + variance-only BN": 0.08}
    outcome = get("luo-fig4").analyze(fake_context("luo-fig4", _fig4_runs(good), None, tmp_path))
    check_outcome(outcome)
    assert outcome.verdict == "held"
    bad = {**good, "WN + mean-only BN": 0.2}
    assert get("luo-fig4").analyze(fake_context("luo-fig4", _fig4_runs(bad), None, tmp_path)).verdict == "not held"
    runs = _fig4_runs(good)
    runs[0] = (*runs[0][:2], "failed", {}, {})
    assert get("luo-fig4").analyze(fake_context("luo-fig4", runs, None, tmp_path)).verdict == "inconclusive"


# ---- Fig. 5 ------------------------------------------------------------------------------------

def test_fig5_paper_preset():
    runs = get("luo-fig5").plan("paper").runs
    sizes = [r.factors["batch_size"] for r in runs]
    assert sizes == sorted(sizes) and len(sizes) == 5
    for r in runs:
        assert r.config["norm"] == "bn" and "gamma" in r.config["probes"]
        assert r.config["lr"] == pytest.approx(0.01 * r.config["batch_size"] / 64)  # lr ∝ M (§5)


def _fig5_runs(trend):
    runs = []
    for i, M in enumerate((16, 32, 64, 128, 256)):
        series = {f"probe/gamma/sq_mean/features.{k}.1": [1.0, 1.0 + trend * i * (k + 1)] for k in range(3)}
        series.update({f"probe/bn_regularization/zeta/features.{k}.1": [0.5 / M] for k in range(3)})
        runs.append((f"BN, M = {M}", {"batch_size": M}, "finished", {"test_loss": 0.1 + 0.01 * i}, series))
    return runs


def test_fig5_analysis_verdicts(tmp_path):
    outcome = get("luo-fig5").analyze(fake_context("luo-fig5", _fig5_runs(0.01), None, tmp_path))
    check_outcome(outcome)
    assert outcome.verdict == "held"
    assert get("luo-fig5").analyze(fake_context("luo-fig5", _fig5_runs(-0.01), None, tmp_path)).verdict == "not held"


# ---- Fig. 6 ------------------------------------------------------------------------------------

def test_fig6_paper_preset():
    assert not get("luo-fig6").plan("paper").runs
    paper = luo._FIG6["paper"]
    assert paper["base"]["model"] == "luo_cnn" and paper["base"]["data"] == "cifar10"
    assert paper["finetune"]["lr"] == 1e-3  # §5.1: "a small learning rate (10⁻³ in this study)"


def _fig6_data(val_end):
    def branch(train, val, norms):
        series = {"epoch_train_loss": train, "test_loss": val}
        series.update({f"kernel_norm/features.{k}.0": [n + k for n in norms] for k in range(4)})
        return {"series": {k: [[i, v] for i, v in enumerate(vals, 1)] for k, vals in series.items()},
                "metrics": {"train_loss": train[-1], "test_loss": val[-1]}}

    return {"fig6": {"pretrain": {"metrics": {"test_loss": 0.06}}, "steps_per_epoch": 1, "branches": {
        "bn": branch([0.002] * 4, [0.06] * 4, [3.0, 3.01, 2.99, 3.0]),
        "frozen": branch([0.001, 0.0005, 0.0003, 0.0002], [0.06, 0.061, val_end, val_end], [3.0, 3.01, 3.02, 3.03])}}}


def test_fig6_analysis_verdicts(tmp_path):
    outcome = get("luo-fig6").analyze(fake_context("luo-fig6", [], _fig6_data(0.065), tmp_path))
    check_outcome(outcome)
    assert outcome.verdict == "held"
    assert get("luo-fig6").analyze(fake_context("luo-fig6", [], _fig6_data(0.05), tmp_path)).verdict == "not held"


# ---- Fig. 7 ------------------------------------------------------------------------------------

def test_fig7_plan_and_analysis(tmp_path):
    runs = {r.label: r.config for r in get("luo-fig7").plan("paper").runs}
    assert set(runs) == {"BN, M = 64", "BN, M = 256", "WN, M = 256", "BN + dropout 0.125, M = 256",
                         "WN + dropout 0.25, M = 256"}
    assert runs["BN, M = 256"]["lr"] == pytest.approx(4 * runs["BN, M = 64"]["lr"])  # lr ∝ M
    assert runs["BN + dropout 0.125, M = 256"]["model_options"]["dropout"] == 0.125
    assert runs["WN + dropout 0.25, M = 256"]["model_options"]["dropout"] == 0.25
    assert "dropout" not in (runs["BN, M = 256"].get("model_options") or {})

    def fake(bn_drop, wn_drop):
        values = (("BN, M = 64", 0.6, 0.80), ("BN, M = 256", 0.9, 0.76), ("WN, M = 256", 1.0, 0.73),
                  ("BN + dropout 0.125, M = 256", bn_drop, 0.79), ("WN + dropout 0.25, M = 256", wn_drop, 0.80))
        return [(label, {}, "finished", {"test_loss": loss, "test_accuracy": acc}, {"test_loss": [loss]})
                for label, loss, acc in values]

    outcome = get("luo-fig7").analyze(fake_context("luo-fig7", fake(0.7, 0.8), None, tmp_path))
    check_outcome(outcome)
    assert outcome.verdict == "held" and "(worse at the large batch)" in outcome.summary
    assert get("luo-fig7").analyze(fake_context("luo-fig7", fake(0.95, 0.8), None, tmp_path)).verdict == "not held"


def test_smoke_presets_stay_on_cpu_sized_data():
    for experiment_id in LUO_IDS:
        for run in get(experiment_id).plan("smoke").runs:
            assert run.config["data"] in ("digits", "teacher_student")
            assert run.config.get("model_options", {}).get("width", 0.25) <= 0.25
    assert luo._FIG6["smoke"]["base"]["data"] == "digits"
    assert math.isclose(luo._FIG2_SIZES["smoke"]["N"], 256)


@pytest.mark.parametrize("experiment_id", LUO_IDS)
def test_analysis_survives_missing_and_nan_results(experiment_id, tmp_path):
    nan = float("nan")
    runs = [(r.label, r.factors, "diverged", {"test_loss": nan, "test_accuracy": nan},
             {"test_loss": [nan, nan], "epoch_train_loss": [nan]}) for r in get(experiment_id).plan("smoke").runs]
    for data in ({}, {"fig2": {"sim": {"alpha": [1.0], "gen_error": [None]}}, "fig6": {"branches": {}}}):
        outcome = get(experiment_id).analyze(fake_context(experiment_id, runs, data, tmp_path))
        check_outcome(outcome)
        assert outcome.verdict == "inconclusive"


# ---- Table 2: fixed points, η_max, η_eff -----------------------------------------------------------

def test_table2_stability_edge_by_simulation():
    """The fixed-L ODE's largest stable η: WN's is Table 2's η_max^wn = 2 (γ₀ = 1); BN's sits within a few per
    cent of η_max^bn/γ₀, below it (the finite-η fixed point has R* < 1)."""
    from bnlab.theory import luo as theory

    assert luo_table2.simulated_threshold(0.0) == pytest.approx(2.0, rel=0.02)
    assert luo_table2.stable_at(1.8, 0.0, 1.0) and not luo_table2.stable_at(2.2, 0.0, 1.0)
    st = theory.stability(0.1, eta=1.0)
    edge = st["eta_max"] / st["gamma0"]
    simulated = luo_table2.simulated_threshold(0.1)
    assert 0.9 * edge < simulated < edge


def _table2_data(gamma_ode=None, edge_sim=None, eff=(0.7, 0.9, 0.95)):
    rows = []
    for zeta in (0.0, 0.1):
        g0 = 1 / (2 * zeta + 1)
        edge = 2.0 + 4 * zeta
        track = {"t": [0, 1], "gamma": [0.5, g0 if gamma_ode is None else gamma_ode], "R": [0.2, 0.999]}
        rows.append({"zeta": zeta, "gamma0": g0, "eta_max": 2 + 4 * zeta, "eta_max_printed": 2 + 4 * zeta,
                     "eta_max_wn": 2.0, "eta_max_sgd": 2.0, "edge": edge, "edge_printed": edge,
                     "edge_simulated": edge * 0.98 if edge_sim is None else edge_sim,
                     "ode": track, "sgd": {**track, "gamma": [0.5, g0]}})
    return {"rows": rows, "eta_eff_vs_M": [{"M": m, "zeta": 0.1, "eta_eff": e} for m, e in zip((8, 16, 32), eff)]}


def test_table2_verdict():
    assert luo_table2.table2_verdict(_table2_data())[0] == "held"
    verdict, summary = luo_table2.table2_verdict(_table2_data(gamma_ode=0.6))  # fixed point missed
    assert verdict == "not held" and "ode" in summary
    assert luo_table2.table2_verdict(_table2_data(edge_sim=1.5))[0] == "not held"  # edge 25 % off
    assert luo_table2.table2_verdict(_table2_data(eff=(0.9, 0.8, 0.95)))[0] == "not held"  # not monotone in M
    assert luo_table2.table2_verdict(_table2_data(), tiny=True)[0] == "inconclusive"
    assert luo_table2.table2_verdict({})[0] == "inconclusive"
