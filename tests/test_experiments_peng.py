"""Peng et al. (CBN) catalogue entries: plans against the paper, the transcribed tables, verdict
logic, tiny runs."""

from __future__ import annotations

import math
import re

import pytest
import torch

from bnlab.experiments import get, reproduce
from bnlab.experiments import verdicts as V
from bnlab.experiments.peng import common as PC
from bnlab.experiments.peng import components as PCo
from bnlab.experiments.peng import amat as PA
from bnlab.experiments.peng import figures as PF
from bnlab.experiments.peng import eta_tau as ET
from bnlab.experiments.peng import curves as P
from bnlab.experiments.peng import readings as PR
from bnlab.experiments.peng import verdict as PV
from bnlab.train import TrainConfig

IDS = ["peng-table1", "peng-table2", "peng-table3", "peng-table4", "peng-table6", "peng-fig2",
       "peng-fig8", "peng-fig10", "peng-fig4", "peng-fig4-vgg", "peng-fig5", "peng-fig5-vgg",
       "peng-fig7"]


def _run_id(config: dict) -> str:
    return TrainConfig.coerce(config).run_id()


# ---- the rows of Tables 1–4 ---------------------------------------------------------------------

@pytest.mark.parametrize("activation", PC.ACTIVATIONS)
def test_row_specs_build_layers_with_the_tables_features(activation):
    """Each row's spec, built into ResNet-20, has exactly the features ticked in the table's
    columns."""
    import bnlab.models as M
    from bnlab.norms import CompleteBatchNorm

    for row in PC.ROWS:
        norm, placement = PC.row_spec(row, activation)
        before, decouple, tune, amat = PC.ROW_FEATURES[row]
        assert placement == ("pre_linear" if before else "pre_activation")
        model = M.create("resnet20", norm=norm, activation=activation, placement=placement,
                         input_shape=(1, 8, 8), width=0.25, seed=0)
        layer = dict(model.named_modules())["stage1.0.unit1." + ("0" if before else "1")]
        if row == "①":
            assert not isinstance(layer, CompleteBatchNorm) and type(layer).__name__ == "BatchNorm"
            continue
        assert isinstance(layer, CompleteBatchNorm)
        assert layer.decouple == decouple and layer.amat == amat
        assert layer.rho == (PC.RHO_STAR[activation] if tune else 1.0)


def test_row_mapping_is_the_documented_one():
    assert PC.row_spec("②", "sigmoid") == ("cbn(rho=0.5,amat=true)", "pre_linear")
    assert PC.row_spec("③", "relu") == ("cbn(decouple=false,amat=false)", "pre_linear")
    assert PC.row_spec("④", "relu") == ("cbn(amat=false)", "pre_linear")
    assert PC.row_spec("⑤", "relu") == ("cbn(rho=2,amat=false)", "pre_linear")
    assert PC.row_spec("⑥", "swish") == ("cbn(decouple=false,rho=2,amat=false)", "pre_activation")
    assert PC.row_spec("⑦", "selu") == ("cbn(decouple=false,rho=2,amat=true)", "pre_activation")
    with pytest.raises(ValueError, match="valid rows"):
        PC.row_spec("⑧", "relu")
    with pytest.raises(ValueError, match="valid"):
        PC.row_spec("②", "gelu")


def test_rho_star_respects_section_6_4():
    """§6.4: the best ρ with Sigmoid is below 1; ordering Sigmoid < Tanh < ReLU (see the module
    docstring)."""
    assert PC.RHO_STAR["sigmoid"] < 1
    assert PC.RHO_STAR["sigmoid"] < PC.RHO_STAR["tanh"] < PC.RHO_STAR["relu"]
    assert all(r in PC.RHO_GRID for r in PC.RHO_STAR.values())


# ---- the transcribed tables ---------------------------------------------------------------------

def test_paper_tables_against_printed_improvements():
    """Each printed "(+x)" equals row − row ① up to rounding (0.01), except the documented slips."""
    found = set()
    for t, rows in PC.PRINTED_IMPROVEMENTS.items():
        base = PC.PAPER_TABLES[t]["①"]
        for row, printed in rows.items():
            for i, act in enumerate(PC.ACTIVATIONS):
                computed = PC.PAPER_TABLES[t][row][i][0] - base[i][0]
                if abs(printed[i] - computed) > 0.011:
                    found.add((t, row, act))
    assert found == PC.IMPROVEMENT_SLIPS


def test_paper_average_gains_match_section_6_2():
    """§6.2: CBN's gain over BN averages "more than 13%, 4%, 3.5%" for Sigmoid, Tanh, SELU over
    Tables 1–4."""
    def mean_gain(act):
        i = PC.ACTIVATIONS.index(act)
        return sum(PC.PAPER_TABLES[t]["②"][i][0] - PC.PAPER_TABLES[t]["①"][i][0]
                   for t in PC.PAPER_TABLES) / 4

    assert mean_gain("sigmoid") == pytest.approx(13.855, abs=1e-3) and mean_gain("sigmoid") > 13
    assert 4 < mean_gain("tanh") < 4.5 and 3.5 < mean_gain("selu") < 4.0
    # ReLU gains least among the five, as the paper says
    assert min(PC.ACTIVATIONS, key=mean_gain) == "relu"


# ---- plans ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("table", [1, 2, 3, 4])
def test_table_plans(table):
    spec = PC.TABLES[table]
    paper = get(f"peng-table{table}").plan("paper")
    resnet = spec["model"] == "resnet20"
    # every row under the primary reading; the ResNet tables add rows ① and ② under Eq. 7's
    assert len(paper.runs) == 7 * 5 * 10 + (2 * 5 * 10 if resnet else 0)
    for run in paper.runs:
        c = run.config
        assert (c["model"], c["data"]) == (spec["model"], spec["data"])
        assert (c["epochs"], c["lr"], c["momentum"], c["weight_decay"], c["batch_size"],
                c["schedule"]) == \
            (120, 0.1, 0.9, 5e-4, 128, "step:60,100")
        assert c["augment"] is True
        assert (c["norm"], c["placement"]) == PC.row_spec(run.factors["row"], c["activation"])
    assert {r.factors["seed"] for r in paper.runs} == set(range(10))
    # tanh's ρ* = 1 merges ④/⑤ only
    assert len({_run_id(r.config) for r in paper.runs}) >= 5 * 10 * 6
    # the primary reading (peng.readings): He's block form for every row of the ResNet tables
    # (§6.1, "the original ResNet"), Eq. 7's form (activation before the sum) as the other
    primary = [r for r in paper.runs if r.factors["reading"] == PR.primary_reading(table)]
    assert len(primary) == 7 * 5 * 10
    assert all(r.config["model_options"].get("residual") == ("he" if resnet else None)
               for r in primary)
    assert all(r.config["model_options"]["residual"] == "peng" and r.factors["row"] in ("①", "②")
               for r in paper.runs if r not in primary)
    smoke = get(f"peng-table{table}").plan("smoke")
    main = [r for r in smoke.runs if PR.is_main(r.factors, table)]
    assert not [r for r in smoke.runs if r.factors["lr_reading"] == "half"]
    # smoke (the resolving design): rows ① and ②, 5 seeds on the primary comparison's
    # activations (ResNet: Sigmoid/Tanh/SELU, 2 seeds on ReLU/Swish; VGG: Tanh/SELU, 1 seed on
    # Sigmoid, ReLU/Swish in the paper preset only), on noisy 16×16 digits, width ½, 40 epochs on
    # the two-step schedule
    primary = PV.primary_activations(table)
    assert primary == (PC.NON_RELU if resnet else ("tanh", "selu"))
    assert PV.primary_activations(table, "paper") == PC.NON_RELU
    side = {"relu": {0, 1}, "swish": {0, 1}} if resnet else {"sigmoid": {0}}
    assert {r.factors["row"] for r in main} == {"①", "②"}
    assert len(main) == 2 * (5 * len(primary) + sum(len(s) for s in side.values()))
    for act in PC.ACTIVATIONS:
        seeds = {r.factors["seed"] for r in main if r.factors["activation"] == act}
        assert seeds == (set(range(5)) if act in primary else side.get(act, set())), act
    assert all(r.config["data"] == "digits" and r.config["data_options"]["size"] == 16
               and r.config["data_options"]["noise"] == 1.5 for r in smoke.runs)
    assert all(r.config["model_options"]["width"] >= 0.5 and r.config["epochs"] >= 40
               and r.config["schedule"] == "step:20,33" for r in smoke.runs)
    assert all(r.config["probes"] == ["cbn_ratios"] for r in smoke.runs)
    # the other readings, on Sigmoid/Tanh/SELU with the primary arms' 5 seeds: Eq. 7's form, Eq.
    # 7's form with the norm before the classifier, CBN in Algorithm 1's literal order (row ②)
    side = [r for r in smoke.runs if r not in main]
    expected = {"eq7": (2, 5), "eq7_head": (2, 5), "he_literal": (1, 5)} if resnet else {}
    assert {name: sum(r.factors["reading"] == name for r in side) for name in expected} == \
        {name: rows * seeds * 3 for name, (rows, seeds) in expected.items()}
    assert len(side) == sum(rows * seeds * 3 for rows, seeds in expected.values())
    for r in side:
        reading = PR.READINGS[r.factors["reading"]]
        options = r.config["model_options"]
        assert options["residual"] == reading.residual
        assert options.get("head_norm", False) == reading.head_norm
        assert ("order=literal" in r.config["norm"]) == (reading.order == "literal")
        assert r.factors["activation"] in PC.NON_RELU
    assert set(smoke.compute) == {"padding_shares"}


@pytest.mark.parametrize("table, n_train, steps", [(1, 1438, 480), (2, 1024, 320), (3, 896, 280),
                                                   (4, 896, 280)])
def test_table_smoke_splits_train_on_whole_batches(table, n_train, steps):
    """At test_fraction 0.5 (899 training images) every epoch of Tables 3–4 ended with a batch of 3,
    whose batch statistics decided cells of Table 4 (BN + ReLU 17 %, CBN + Tanh at chance); the
    splits now leave whole batches of 128 (Table 1: 11 and one of 30), checked on the real split."""
    from bnlab import data
    from bnlab.experiments.run_facts import settle_fraction
    from bnlab.train.prepare import prepare

    config = get(f"peng-table{table}").plan("smoke").runs[0].config
    options = config["data_options"]
    split = data.load("digits", test_fraction=options.get("test_fraction", 0.2))
    assert split.y_train.numel() == n_train
    assert n_train % 128 == 0 or n_train % 128 >= 16
    prep = prepare({**config, "runs_dir": "unused"})
    assert prep.total_steps == steps and not prep.drop_last
    # VGG-16's tables evaluate every 2 epochs (time): the settling reading (epoch 38 of 40) stays
    # inside the final lr phase (from epoch 33)
    vgg = PC.TABLES[table]["model"] == "vgg16"
    assert config.get("eval_every") == (2 * prep.steps_per_epoch if vgg else None)
    if vgg:
        readings = range(config["eval_every"], steps + 1, config["eval_every"])
        settle_at = next(r for r in readings if r >= steps * settle_fraction(config))
        assert 33 * prep.steps_per_epoch < settle_at < steps


def test_padding_shares_measure_cbn_with_amat_on():
    """The measurement pass ran CBN in training mode without a learning rate: AMAT off (η = 0) and a
    warning in every peng-table log; it now sets the first training step's progress."""
    import warnings

    from bnlab.experiments.peng import common as peng_common

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*without a learning rate.*")
        shares = peng_common.padding_shares("resnet20", {"width": 0.25}, sizes=(8,), n=16)
    assert set(shares) == {"① BN (baseline) · Sigmoid", "② CBN · Sigmoid"}
    assert all(0.0 <= v <= 1.0 for arm in shares.values() for v in arm["8×8"].values())


def test_cifar100_smoke_tables_differ_from_cifar10_ones():
    t1 = {_run_id(r.config) for r in get("peng-table1").plan("smoke").runs}
    t3 = {_run_id(r.config) for r in get("peng-table3").plan("smoke").runs}
    assert not t1 & t3


def _one_block(runs, reading="he"):
    """The runs of one block reading (peng.blocks), after checking that each reading's runs are
    the other's in its residual form."""
    form = {"he": "he", "eq7": "peng"}
    for r in runs:
        options = r.config["model_options"]
        assert options.get("residual", form[r.factors["reading"]]) == form[r.factors["reading"]]
    he, eq7 = ([r for r in runs if r.factors["reading"] == name] for name in ("he", "eq7"))
    strip = [{k: v for k, v in r.config.items() if k != "model_options"} for r in he]
    assert strip == [{k: v for k, v in r.config.items() if k != "model_options"} for r in eq7]
    return he if reading == "he" else eq7


@pytest.mark.parametrize("entry", ["peng-fig2", "peng-fig7", "peng-fig8", "peng-fig10",
                                   "peng-table6", "peng-table5", "peng-fig6"])
def test_the_figure_entries_train_both_block_forms(entry):
    """He's block (the primary reading) and Eq. 7's, the same runs otherwise."""
    for preset in ("smoke", "paper"):
        runs = get(entry).plan(preset).runs
        assert {r.factors["reading"] for r in runs} == {"he", "eq7"}
        assert len(_one_block(runs)) == len(runs) // 2


def test_table6_plan():
    paper = _one_block(get("peng-table6").plan("paper").runs)
    assert len(paper) == 4 * 5 * (5 * 3 + 7)  # the lr grid × 3 seeds, 10 trials at lr 0.1
    assert {r.config["norm"] for r in paper} == set(PCo.T6_APPROACHES.values())
    assert all(r.config["placement"] == "pre_linear" and r.config["model"] == "resnet20"
               for r in paper)
    seed0 = [r for r in paper if r.factors["seed"] == 0]
    assert sorted({r.config["lr"] for r in seed0}) == [1e-4, 1e-3, 1e-2, 1e-1, 1.0]
    assert {r.config["lr"] for r in paper if r.factors["seed"] > 2} == {0.1}
    smoke = _one_block(get("peng-table6").plan("smoke").runs)
    assert len(smoke) == 4 * 3 * 4 * 3 and 1e-4 not in {r.config["lr"] for r in smoke}
    assert {r.factors["seed"] for r in smoke} == {0, 1, 2}


def test_fig2_plan_probes_the_papers_layers():
    import bnlab.models as M
    from bnlab.norms import CompleteBatchNorm

    for preset in ("paper", "smoke"):
        runs = _one_block(get("peng-fig2").plan(preset).runs)
        assert [r.factors["seed"] for r in runs] == list(PF.FIG2_SEEDS)
        c = runs[0].config
        assert preset == "paper" or (c["model_options"]["width"] == 1.0 and c["lr"] == 0.05)
        assert c["probes"] == ["cbn_ratios"] and c["placement"] == "pre_linear" \
            and c["model"] == "resnet20"
        model = M.create("resnet20", norm=c["norm"], placement="pre_linear",
                         input_shape=(1, 8, 8), width=0.25)
        modules = dict(model.named_modules())
        for layer in ET.FIG2_LAYERS.values():
            assert isinstance(modules[layer + ".0"], CompleteBatchNorm) \
                and modules[layer + ".0"].rho == 1.0
    paper = _one_block(get("peng-fig2").plan("paper").runs)[0].config
    assert paper["data"] == "cifar10" and paper["lr"] == 0.1 and "width" not in paper[
        "model_options"]


def test_fig8_plan_and_sharing_with_table1():
    paper = _one_block(get("peng-fig8").plan("paper").runs)
    assert len(paper) == (2 * 5 + 3) * 7 and {r.config["model"] for r in paper} == {"vgg16"}
    assert {r.factors["rho"] for r in paper} == {None, *PC.RHO_GRID}
    plan = _one_block(get("peng-fig8").plan("smoke").runs)
    # the judged claim (Sigmoid, Tanh: worst ρ vs BN) 5 seeds per arm, the others one
    for act, seeds in (("sigmoid", set(range(5))), ("tanh", set(range(5))), ("relu", {0})):
        for rho in (None, *PC.RHO_GRID):
            assert {r.factors["seed"] for r in plan if r.factors["activation"] == act
                    and r.factors["rho"] == rho} == seeds
    smoke = {_run_id(r.config) for r in plan}
    table1 = {_run_id(r.config) for r in get("peng-table1").plan("smoke").runs}
    # Fig. 8 keeps the cheap 15-epoch, width-¼ recipe; Table 1's smoke moved to the resolving one
    # (noisy digits, width ½, 40 epochs), so they no longer share runs
    assert not smoke & table1


def test_fig10_plan_fixes_eta():
    import bnlab.models as M
    from bnlab.norms import CompleteBatchNorm

    for preset in ("paper", "smoke"):
        runs = _one_block(get("peng-fig10").plan(preset).runs)
        # the compared arms (AMAT, no AMAT) 5 seeds × 5 activations, BN and fixed η one seed each
        assert len(runs) == 60 and all(r.config["probes"] == ["grad_stats"] for r in runs)
        for variant, seeds in (("CBN with AMAT", set(range(5))),
                               ("CBN without AMAT", set(range(5))), ("BN", {0})):
            assert {r.factors["seed"] for r in runs if r.factors["variant"] == variant} == seeds
        lr = runs[0].config["lr"]
        for r in runs:
            if r.factors["variant"] == "BN":
                continue
            model = M.create("resnet20", norm=r.config["norm"], placement="pre_linear",
                             input_shape=(1, 8, 8), width=0.25)
            layer = next(m for m in model.modules() if isinstance(m, CompleteBatchNorm))
            # past the first batch, which initializes the averages
            layer.num_batches_tracked.fill_(1)
            for current_lr in (lr, lr / 10):  # the fixed η must survive a learning-rate decay
                layer.set_progress(lr=current_lr)
                if r.factors["variant"] != "CBN with AMAT":
                    assert layer.current_eta() == pytest.approx(
                        {"CBN without AMAT": 0.0, "CBN, fixed η = 0.9": 0.9}[r.factors["variant"]])
            layer.set_progress(lr=lr)
            eta = layer.current_eta()
            expected = {"CBN without AMAT": 0.0, "CBN, fixed η = 0.9": 0.9,
                        "CBN with AMAT": max(1 - 10 * lr, 0.0)}[r.factors["variant"]]
            assert eta == pytest.approx(expected, abs=1e-12)
    assert get("peng-fig10").plan("smoke").runs[0].config["schedule"] == "constant"


# ---- verdict logic on synthetic data -------------------------------------------------------------

def _cells(gains: dict[str, float], n: int = 1, spread: float = 0.0) -> dict:
    cells = {}
    for act, gain in gains.items():
        base = [0.80 + spread * (i - (n - 1) / 2) for i in range(n)]
        cells[("①", act)] = base
        cells[("②", act)] = [b + gain for b in base]
    return cells


def _noisy_cells(gains: dict[str, float], n: int = 3, sd: float = 0.01) -> dict:
    offsets = [-sd, 0.0, sd, -sd / 2, sd / 2][:n]
    cells = {}
    for act, gain in gains.items():
        cells[("①", act)] = [0.80 + o for o in offsets]
        cells[("②", act)] = [0.80 + gain - o / 2 for o in offsets]
    return cells


def test_table_verdict():
    """The primary comparison (mean over Sigmoid/Tanh/SELU) against the paper's effect, with a
    design that can resolve it: held / not held / inconclusive as the rule says
    (bnlab.experiments.verdicts)."""
    paper_like = {"sigmoid": 0.12, "tanh": 0.04, "relu": 0.01, "selu": 0.04, "swish": 0.01}
    sharp = V.Design("primary", 0.0608, 0.005, 3, "test", n_test=10_000)
    assert PV.table_verdict(_noisy_cells(paper_like), design=sharp)[0] == "held"
    assert PV.table_verdict(_noisy_cells(paper_like), tiny=True, design=sharp)[0] == "inconclusive"
    # one seed per arm cannot decide anything under the rule
    verdict, summary = PV.table_verdict(_cells(paper_like), design=sharp)
    assert verdict == "inconclusive" and "too few seeds" in summary
    # significantly worse with one activation (Holm over the five): not held even though the primary
    # holds
    worse = {**paper_like, "relu": -0.05}
    assert PV.table_verdict(_noisy_cells(worse), design=sharp)[0] == "not held"
    # no gain anywhere although the design resolves far smaller effects than the paper's: not held
    flat = {a: 0.0 for a in PC.ACTIVATIONS}
    assert PV.table_verdict(_noisy_cells(flat, sd=0.002), design=sharp)[0] == "not held"
    # the smoke design (noisy digits, width ½, 5 seeds: resolvable ≥ 5.3 points at 5 seeds) can
    # reject the paper's 6 points when the arms agree closely; with a 20-point spread it cannot
    assert PV.table_design(1).resolves_paper()
    assert PV.table_verdict(_noisy_cells(flat, n=5, sd=0.01), table=1)[0] == "not held"
    assert PV.table_verdict(_noisy_cells(paper_like, n=5, sd=0.01), table=1)[0] == "held"
    verdict, summary = PV.table_verdict(_noisy_cells(flat, n=5, sd=0.2), table=1)
    assert verdict == "inconclusive" and "resolvable ≥" in summary
    missing = _noisy_cells(paper_like)
    del missing[("②", "selu")]
    assert PV.table_verdict(missing)[0] == "inconclusive"
    assert PV.paper_gain(1, "sigmoid") == pytest.approx(91.20 - 78.97)
    assert PV.table_design(1).paper_effect == pytest.approx((12.23 + 4.14 + 1.88) / 300)


def test_vgg_smoke_verdict_is_judged_over_tanh_and_selu_with_relu_and_swish_not_run():
    """The VGG tables' smoke: primary declared over Tanh/SELU (design SD 3/√2 points), Sigmoid with
    one seed (its BN cell decided by the proxy), no ReLU/Swish runs: the verdict needs only the
    primary's cells, names what was not run, and a left-out cell outside the primary does not
    repeat the primary's text as the verdict "with" it."""
    design = PV.table_design(2)
    assert design.quantity.endswith("mean over Tanh/SELU")
    assert design.design_sd == pytest.approx(0.03 / math.sqrt(2))
    assert design.paper_effect == pytest.approx(
        (PV.paper_gain(2, "tanh") + PV.paper_gain(2, "selu")) / 200)
    primary = PV.primary_activations(2)
    cells = _noisy_cells({"tanh": 0.06, "selu": 0.06}, n=5, sd=0.01)
    cells[("①", "sigmoid")], cells[("②", "sigmoid")] = [0.10], [0.85]
    verdict, summary = PV.table_verdict(cells, design=design, table=2, primary=primary)
    assert verdict == "held" and "not run in this preset: ReLU, Swish" in summary
    proxy = {("①", "sigmoid"): "test accuracy 10.0 % in eval mode"}
    verdict, summary = PV.table_verdict(cells, design=design, table=2, proxy=proxy,
                                        primary=primary)
    assert verdict == "held" and "with Sigmoid the verdict would be 'held'" in summary
    assert summary.count("mean over Tanh/SELU") == 1
    # a primary activation without runs is unusable, not silently dropped
    del cells[("②", "selu")]
    assert PV.table_verdict(cells, design=design, table=2, primary=primary)[0] == "inconclusive"


def test_fig_primary_panels_follow_the_tables_primary_activations():
    """Fig. 4's primary is the per-seed mean over the panels of each table's primary activations:
    Table 2's one-seed Sigmoid panel (VGG smoke) must not cut every seed's mean to one seed."""
    lower = {a: [2.0 + 0.01 * i for i in range(5)] for a in PC.NON_RELU}
    losses = {(1, a): {"①": v, "②": [x - 0.3 for x in v]} for a, v in lower.items()}
    losses.update({(2, a): {"①": lower[a], "②": [x - 0.3 for x in lower[a]]}
                   for a in ("tanh", "selu")})
    losses[(2, "sigmoid")] = {"①": [2.3], "②": [0.5]}
    primary = {1: PV.primary_activations(1), 2: PV.primary_activations(2)}
    verdict, summary = P.loss_curve_verdict(losses, primary=primary)
    assert verdict == "held" and "n=5/5" in summary
    # without the tables' primaries the Sigmoid panel's single seed leaves one seed to judge
    assert P.loss_curve_verdict(losses)[0] == "inconclusive"


def test_table_verdict_must_settle():
    """A verdict that changed within the final lr phase is inconclusive: table 4's smoke said "not
    held" at the end where the same rule earlier said "inconclusive"."""
    paper_like = {"sigmoid": 0.12, "tanh": 0.04, "relu": 0.01, "selu": 0.04, "swish": 0.01}
    sharp = V.Design("primary", 0.0608, 0.005, 3, "test", n_test=10_000)
    worse = {**paper_like, "tanh": -0.6}
    held = PV.settled_table_verdict(_noisy_cells(paper_like),
                                    _noisy_cells(paper_like), design=sharp)
    assert held[0] == "held" and "settled: the verdict at 2/3 of training is also 'held'" in held[1]
    verdict, summary = PV.settled_table_verdict(_noisy_cells(worse),
                                                _noisy_cells(paper_like), design=sharp)
    assert verdict == "inconclusive" and "NOT settled: the verdict would be 'not held'" in summary


def test_loss_curve_verdict():
    def losses(delta, sd=0.01):
        out = {}
        for t in (1, 2):
            for act in PC.ACTIVATIONS:
                out[(t, act)] = {"①": [0.5 - sd, 0.5, 0.5 + sd],
                                 "②": [0.5 + delta[act] - sd, 0.5 + delta[act],
                                       0.5 + delta[act] + sd / 2]}
        return out

    lower = {a: -0.2 for a in PC.ACTIVATIONS}
    assert P.loss_curve_verdict(losses(lower))[0] == "held"
    # one panel a little higher (not significant after Holm over the ten panels): still held
    assert P.loss_curve_verdict(losses({**lower, "relu": 0.015}))[0] == "held"
    assert P.loss_curve_verdict(losses(lower), tiny=True)[0] == "inconclusive"
    assert P.loss_curve_verdict(losses({**lower, "relu": 0.2}))[0] == "not held"
    assert P.loss_curve_verdict(losses({a: 0.0 for a in PC.ACTIVATIONS}))[0] == "inconclusive"
    one_seed = {k: {r: v[:1] for r, v in d.items()} for k, d in losses(lower).items()}
    assert P.loss_curve_verdict(one_seed)[0] == "inconclusive"


def test_fig4_fig5_entries_share_their_tables_runs():
    """One entry per network and figure, each planning exactly its table's compared runs under
    every reading: nothing of its own to train beside the table."""
    assert P.PANELS == {"peng-fig4": (4, 1), "peng-fig4-vgg": (4, 2), "peng-fig5": (5, 3),
                        "peng-fig5-vgg": (5, 4)}
    # ResNet: the primary reading's 38, and 5 seeds × Sigmoid/Tanh/SELU of rows ① and ② under
    # Eq. 7, Eq. 7 + the norm before the classifier, and of row ② in the literal order
    smoke = {1: 2 * (3 * 5 + 2 * 2) + 5 * 3 * 5, 2: 2 * (2 * 5 + 1),
             3: 2 * (3 * 5 + 2 * 2) + 5 * 3 * 5, 4: 2 * (2 * 5 + 1)}
    for entry, (_fig, table) in P.PANELS.items():
        resnet = PC.TABLES[table]["model"] == "resnet20"
        assert resnet == (not entry.endswith("-vgg"))
        for preset in ("smoke", "paper"):
            runs = {_run_id(r.config) for r in get(entry).plan(preset).runs}
            compared = {_run_id(r.config) for r in get(f"peng-table{table}").plan(preset).runs
                        if r.factors["row"] in ("①", "②")}
            assert runs == compared
            assert len(runs) == (smoke[table] if preset == "smoke"
                                 else 2 * 5 * 10 * (2 if resnet else 1))


def test_a_vgg_entry_is_judged_on_its_tables_primary_panels():
    """VGG-16's smoke primary is Tanh/SELU (Table 2's): its Sigmoid panel (one seed, the proxy's
    eval collapse) neither enters the primary nor blocks it."""
    seeds = range(5)
    losses = {(2, a): {"①": [1.0 + 0.01 * s for s in seeds], "②": [0.5 + 0.01 * s for s in seeds]}
              for a in ("tanh", "selu")}
    losses[(2, "sigmoid")] = {"①": [2.3], "②": [0.1]}
    verdict, summary = P.loss_curve_verdict(losses, primary={2: PV.primary_activations(2)})
    assert verdict == "held" and summary.startswith(P.FIG_DESIGN.quantity) and "-0.5" in summary


def test_fig7_plan_and_verdict():
    smoke = _one_block(get("peng-fig7").plan("smoke").runs)
    assert len(smoke) == 4 * 3 * 3 and all(r.config["probes"] == ["grad_stats"] for r in smoke)
    assert {r.config["norm"] for r in smoke} == set(PCo.T6_APPROACHES.values())
    assert all(r.config["placement"] == "pre_linear" for r in smoke)
    assert len(_one_block(get("peng-fig7").plan("paper").runs)) == 4 * 5 * 10

    def sq(mr, l2):
        return {act: {"no normalization": [2.0, 2.1, 1.9],
                      "mean removal": [2.0 + mr, 2.1 + mr, 1.95 + mr],
                      "ℓ2 normalization": [2.0 + l2, 2.05 + l2, 1.9 + l2], "CBN": [0.5, 0.6, 0.55]}
                for act in ("sigmoid", "tanh", "relu")}

    assert PCo.fig7_verdict(sq(-0.5, -1.0))[0] == "held"
    assert PCo.fig7_verdict(sq(-0.5, -1.0), tiny=True)[0] == "inconclusive"
    assert PCo.fig7_verdict(sq(+0.5, -1.0))[0] == "not held"
    assert PCo.fig7_verdict(sq(0.0, -1.0))[0] == "inconclusive"


class _SeriesRun:
    """One series for every metric; no micro-batch sizes recorded (every probe reading kept)."""

    def __init__(self, values, status="finished"):
        self.values, self.status = values, status

    def series(self, name):
        if name == PC.MICRO_BATCH_METRIC:
            return [], []
        return list(range(1, len(self.values) + 1)), list(self.values)


def test_mean_train_loss_and_gradient_measure():
    from bnlab.experiments.common import mean_over_run

    assert mean_over_run(_SeriesRun([2.0, 1.0, float("nan"), 0.0])) == pytest.approx(1.0)
    assert mean_over_run(_SeriesRun([2.0, 1.0, float("nan"), 0.0]),
                         fraction=0.5) == pytest.approx(1.5)
    assert mean_over_run(_SeriesRun([1.0], status="diverged")) is None
    import math

    assert PCo.mean_sq_grad_norm(_SeriesRun([1e6, 10.0, 10.0, 1000.0])) == pytest.approx(
        math.log10(340.0))
    assert PCo.mean_sq_grad_norm(_SeriesRun([])) is None
    # the probes on an epoch's short last batch (micro-batches of 3, not 16) are left out
    short = _SeriesRun([1e6, 10.0, 10.0, 1000.0, 50.0])
    sizes = ([1, 2, 3, 4, 5], [16.0, 16.0, 16.0, 16.0, 3.0])
    short.series = lambda name: (sizes if name == PC.MICRO_BATCH_METRIC
                                 else _SeriesRun.series(short, name))
    assert PCo.mean_sq_grad_norm(short) == pytest.approx(math.log10(340.0))


def test_table6_verdict():
    """Each step of none ≤ mean removal ≤ ℓ2 ≤ CBN by Welch's rule on per-seed log10 maximal lr (was
    one seed)."""
    ordered = {}
    for act in ("sigmoid", "relu"):
        for name, lr in zip(PCo.T6_ORDER, (0.01, 0.1, 1.0, 1.0)):
            ordered[(name, act)] = [lr] * 3
    assert PCo.table6_verdict(ordered)[0] == "held"
    assert PCo.table6_verdict(ordered, tiny=True)[0] == "inconclusive"
    broken = {**ordered, ("mean removal", "relu"): [1e-3] * 3}
    assert PCo.table6_verdict(broken)[0] == "not held"
    same = {k: [0.1] * 3 for k in ordered}
    verdict, summary = PCo.table6_verdict(same)
    assert verdict == "inconclusive" and "no approach significantly changes" in summary
    assert PCo.table6_verdict({**same, ("no normalization", "sigmoid"): [None] * 3})[0] == "held"
    # seeds that disagree: nothing resolved
    mixed = {**same, ("ℓ2 normalization", "relu"): [1.0, 0.01, 0.1],
             ("CBN", "relu"): [1.0, 0.01, 0.1]}
    assert PCo.table6_verdict(mixed)[0] == "inconclusive"
    # one seed per candidate (the old smoke preset) cannot decide
    verdict, summary = PCo.table6_verdict({k: v[:1] for k, v in ordered.items()})
    assert verdict == "inconclusive" and "fewer than 3 seeds" in summary


def _shares(**changes):
    """Per (layer, ratio) per-seed shares: 0.97–0.99 everywhere unless ``changes`` say otherwise
    (keys like ``l1_tau``: layer index, ratio)."""
    layers = list(ET.FIG2_LAYERS)
    out = {(layer, ratio): [0.97, 0.98, 0.99] for layer in layers for ratio in ("eta", "tau")}
    for key, values in changes.items():
        i, ratio = key[1:].split("_")
        out[(layers[int(i)], ratio)] = list(values)
    return out


def test_fig2_verdict():
    """Seed means against 0.9 and 0.75 by a one-sample t (SE floored at 0.01), Holm over the six
    shares for "against"; one run's share against the thresholds was the old rule."""
    assert PF.fig2_verdict(_shares())[0] == "held"
    assert PF.fig2_verdict(_shares(l0_eta=[1.0, 1.0, 1.0]))[0] == "held"  # SD 0: the floor
    # layer #8's τ far below 75 % in every seed
    verdict, text = PF.fig2_verdict(_shares(l1_tau=[0.06, 0.1, 0.13]))
    assert verdict == "not held" and "layer#8 tau" in text
    # the resolution stated in the entry: a mean of 0.30 with SD 0.05 is against, one of 1.00 held
    assert PF.fig2_verdict(_shares(l0_tau=[0.25, 0.30, 0.35]))[0] == "not held"
    # a seed mean below 0.75 that the seeds cannot resolve from it, or between the thresholds
    assert PF.fig2_verdict(_shares(l1_tau=[0.3, 0.9, 0.95]))[0] == "inconclusive"
    assert PF.fig2_verdict(_shares(l1_eta=[0.8, 0.82, 0.84]))[0] == "inconclusive"
    # missing data, too few seeds, tiny runs
    assert PF.fig2_verdict(_shares(l2_eta=[None, 0.95, 0.95]))[0] == "inconclusive"
    assert PF.fig2_verdict({k: v[:2] for k, v in _shares().items()})[0] == "inconclusive"
    assert PF.fig2_verdict(_shares(), tiny=True)[0] == "inconclusive"


def test_fig2_seed_shares_count_a_diverged_run_as_failure():
    layer = ET.FIG2_LAYERS["layer#2 (stage1.0.cbn1)"]

    class Diverged(_FakeProbedRun):
        status = "diverged"

    class Crashed(_FakeProbedRun):
        status = "failed"

    series = {f"probe/cbn_ratios/{q}_in_range/{layer}.0": [1.0, 1.0] for q in ("eta", "tau")}
    shares = ET.seed_shares([_FakeProbedRun(series), Diverged(series), Crashed(series)])
    assert shares[("layer#2 (stage1.0.cbn1)", "eta")] == [1.0, 0.0]
    assert shares[("layer#8 (stage2.0.cbn1)", "tau")] == [None, 0.0]


def test_fig8_verdict():
    """Worst ρ against BN for Sigmoid and Tanh by Welch's rule over ≥ 3 seeds (was one run and a
    0.05 margin)."""
    def curve(bn, values, seeds=3, spread=0.002):
        jitter = [spread * (k - 1) for k in range(seeds)]
        return {None: [bn + j for j in jitter],
                **{rho: [v + j for j in jitter] for rho, v in zip(PC.RHO_GRID, values)}}

    acc = {"sigmoid": curve(0.70, [0.75, 0.85, 0.90, 0.88, 0.80, 0.76]),
           "tanh": curve(0.85, [0.86, 0.90, 0.92, 0.91, 0.88, 0.87]),
           "relu": curve(0.93, [0.93, 0.94, 0.94, 0.94, 0.93, 0.93], seeds=1)}
    verdict, summary = PF.fig8_verdict(acc)
    assert verdict == "held" and "Sigmoid (ρ = 0.25)" in summary and "ReLU/SELU/Swish" in summary
    assert PF.fig8_verdict(
        {**acc, "sigmoid": curve(0.95, [0.75, 0.85, 0.9, 0.88, 0.8, 0.76])})[0] == "not held"
    # the worst ρ within the seeds' spread of BN: not resolved
    verdict, summary = PF.fig8_verdict({**acc, "tanh": curve(0.86, [0.86] * 6, spread=0.05)})
    assert verdict == "inconclusive" and "resolvable ≥" in summary
    # one seed per arm (the old smoke preset) cannot decide
    assert PF.fig8_verdict(
        {a: curve(0.7, [0.9] * 6, seeds=1) for a in ("sigmoid", "tanh")})[0] == "inconclusive"
    assert PF.fig8_verdict({**acc, "tanh": {None: [0.8]}})[0] == "inconclusive"
    # seeds that agree to the image: a 2-image gain on 359 test images is "held" at p ≈ 0 without
    # the binomial floor, unresolved with it (the catalogue's rule 3)
    two_images = {a: curve(0.80, [0.80 + 2 / 359] * 6, spread=0.0) for a in ("sigmoid", "tanh")}
    assert PF.fig8_verdict(two_images)[0] == "held"
    assert PF.fig8_verdict(two_images, n_test=359)[0] == "inconclusive"


def test_fig10_verdict():
    """Primary: per seed, the mean over activations of log10 variance, AMAT against no AMAT
    (Welch's t, ≥ 3 seeds); secondary: nowhere significantly higher (Holm)."""
    def variance(ratio, spread=0.02, seeds=3):
        off = [1.0 * (1 + spread * k) for k in range(seeds)]
        on = None if ratio is None else [ratio * (1 - spread * k) for k in range(seeds)]
        return {"BN": [1.0], "CBN without AMAT": off, "CBN, fixed η = 0.9": [1.1],
                "CBN with AMAT": on}

    lower = {a: variance(0.7) for a in PC.ACTIVATIONS}
    verdict, summary = PA.fig10_verdict(lower)
    assert verdict == "held" and "fixed η = 0.9 / without" in summary
    expected = sum(math.log10(0.7 * (1 - 0.02 * k)) - math.log10(1 + 0.02 * k)
                   for k in range(3)) / 3
    assert summary.startswith(f"{PA.FIG10_DESIGN.quantity} {expected:+.3g} dex")
    # 4 of 5 lower, one unchanged: the mean still is
    assert PA.fig10_verdict({**lower, "relu": variance(1.0)})[0] == "held"
    # significantly higher once
    assert PA.fig10_verdict({**lower, "relu": variance(1.5)})[0] == "not held"
    # within the seeds' spread: nothing decided, the resolvable effect is stated
    verdict, summary = PA.fig10_verdict({a: variance(0.9, spread=0.3) for a in PC.ACTIVATIONS})
    # at the design's 5 seeds: (t_0.975 + t_0.8 at 8 df) · 0.11 · √(2/5)
    assert verdict == "inconclusive" and "resolvable ≥ 0.22 dex (design SD" in summary
    # one seed per arm (the old smoke preset) cannot decide
    verdict, summary = PA.fig10_verdict({a: variance(0.5, seeds=1) for a in PC.ACTIVATIONS})
    assert verdict == "inconclusive" and "fewer than 3 seeds" in summary
    assert PA.fig10_verdict({**lower, "tanh": variance(None)})[0] == "inconclusive"


def test_fig10_primary_pools_what_single_activations_cannot_resolve():
    """The old count rule ("significantly lower for ≥ 4 of 5") missed a uniform effect that each
    activation alone resolves only sometimes; the mean over activations resolves it. Seeds drawn
    with a seeded generator: per activation AMAT −0.24 dex (the mean of a stored run), seed SD
    0.1 dex, shared per seed across activations (one data order), 3 seeds."""
    gen = torch.Generator().manual_seed(0)
    held = counts = 0
    trials = 200
    for _ in range(trials):
        shared = torch.randn(2, 3, generator=gen) * 0.07
        noise = torch.randn(5, 2, 3, generator=gen) * 0.07
        data = {a: {"CBN without AMAT": [10 ** float(shared[0, s] + noise[i, 0, s])
                                         for s in range(3)],
                    "CBN with AMAT": [10 ** float(-0.24 + shared[1, s] + noise[i, 1, s])
                                      for s in range(3)]}
                for i, a in enumerate(PC.ACTIVATIONS)}
        verdict, summary = PA.fig10_verdict(data)
        held += verdict == "held"
        found = re.search(r"lower per activation for (\d) of 5", summary)
        counts += bool(found) and int(found.group(1)) >= 4
    assert held / trials > 0.6 and counts / trials < held / trials


def test_fig10_variance_reads_the_usual_micro_batch_only():
    """An epoch's short last batch (30 of 1,438 images) gives micro-batches of 3, not 16: ≈ 5× the
    variance, a different quantity, left out of the mean (steps 60, 120 with probes every 5)."""
    class Run:
        def series(self, name):
            steps = list(range(5, 125, 5))
            if name == PC.MICRO_BATCH_METRIC:
                return steps, [3.0 if s % 60 == 0 else 16.0 for s in steps]
            return steps, [50.0 if s % 60 == 0 else 2.0 for s in steps]

    assert PA._mean_variance(Run()) == pytest.approx(2.0)
    # a run recorded without micro-batch sizes: every probe, as before
    bare = Run()
    bare.series = lambda name: ([], []) if name == PC.MICRO_BATCH_METRIC else Run().series(name)
    steps, values = Run().series(PA.VARIANCE_METRIC)
    kept = values[len(values) // 4:]
    assert PA._mean_variance(bare) == pytest.approx(sum(kept) / len(kept))


class _FakeRun:
    def __init__(self, status, losses, final):
        self.status, self._losses, self._final = status, losses, final

    def final(self, name):
        return self._final if name == "train_loss" else None

    def series(self, name):
        return list(range(len(self._losses))), list(self._losses)


def test_run_trains():
    assert PCo.run_trains(_FakeRun("finished", [2.4, 1.0], 0.5))
    assert not PCo.run_trains(_FakeRun("diverged", [2.4, float("nan")], float("nan")))
    # stuck at chance (ln 10 = 2.303)
    assert not PCo.run_trains(_FakeRun("finished", [2.4, 2.3], 2.30))
    assert not PCo.run_trains(_FakeRun("finished", [1.0, 2.0], 2.0))       # got worse
    assert not PCo.run_trains(_FakeRun("finished", [2.4], None))


class _FakeProbedRun:
    """A stored run with given metric series (what RunView offers the analysis)."""

    status = "finished"

    def __init__(self, series: dict[str, list[float]]):
        self._series = series

    def series(self, name):
        values = self._series.get(name, [])
        return list(range(1, len(values) + 1)), list(values)

    def metric_names(self, prefix=""):
        return sorted(n for n in self._series if n.startswith(prefix))


def test_ratio_fractions_find_the_papers_layers():
    series = {}
    for i, layer in enumerate(ET.FIG2_LAYERS.values()):
        series[f"probe/cbn_ratios/eta_in_range/{layer}.0"] = [1.0, 0.5 + 0.1 * i]
        series[f"probe/cbn_ratios/tau_in_range/{layer}.0"] = [0.25, float("nan"), 0.75]
    # a similarly named layer of another block must not be picked up
    series["probe/cbn_ratios/eta_in_range/stage1.0.unit10.0"] = [0.0]
    fractions = ET.ratio_fractions(_FakeProbedRun(series), skip=0.0)
    assert [d["eta"] for d in fractions.values()] == pytest.approx([0.75, 0.8, 0.85])
    assert all(d["tau"] == pytest.approx(0.5) for d in fractions.values())
    assert ET.ratio_fractions(_FakeProbedRun({}))["layer#2 (stage1.0.cbn1)"] == {
        "eta": None, "tau": None}


def test_ratio_fractions_skip_the_start_up_transient():
    """The verdict reads the second half of training (averaging in the start-up transient
    made the fraction in range differ run to run)."""
    layer = ET.FIG2_LAYERS["layer#2 (stage1.0.cbn1)"]
    series = {f"probe/cbn_ratios/eta_in_range/{layer}.0": [0.0, 0.0, 1.0, 1.0]}
    assert ET.ratio_fractions(
        _FakeProbedRun(series))["layer#2 (stage1.0.cbn1)"]["eta"] == pytest.approx(1.0)
    assert ET.ratio_fractions(_FakeProbedRun(series),
                              skip=0.0)["layer#2 (stage1.0.cbn1)"]["eta"] == 0.5


def test_mean_variance_skips_the_transient():
    run = _FakeProbedRun({"probe/grad_stats/variance": [100.0, 4.0, 2.0, float("inf"), 3.0]})
    # 4 finite values, first quarter (1) skipped
    assert PA._mean_variance(run) == pytest.approx(3.0)
    assert PA._mean_variance(_FakeProbedRun({})) is None


# ---- every entry end to end, tiny ----------------------------------------------------------------

@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    # one runs dir for all entries, as a user's: peng-fig8 reuses peng-table1's BN and ρ* runs
    return tmp_path_factory.mktemp("peng_runs")


@pytest.fixture
def two_steps(monkeypatch):
    # 250 tiny runs: 2 steps each exercise every code path (training, probes at step 2, analysis of
    # one-point series) at a third of the runner's default 6 steps' cost.
    from bnlab.experiments import runner

    monkeypatch.setattr(runner, "TINY_STEPS", 2)


# Entries that read other entries' runs go in one test after them, so that they reuse those runs as
# in a user's runs dir (parametrized apart, pytest-xdist could give them separate workers and runs
# dirs, and Fig. 5 retrained Tables 3–4's 76 runs: 100 s of the suite).
SHARING = (("peng-table1", "peng-table2", "peng-fig4", "peng-fig4-vgg", "peng-fig8"),
           ("peng-table3", "peng-table4", "peng-fig5", "peng-fig5-vgg"))
GROUPS = list(SHARING) + [(i,) for i in IDS if not any(i in group for group in SHARING)]


def test_the_tiny_groups_cover_every_entry_once():
    assert sorted(i for group in GROUPS for i in group) == sorted(IDS)


@pytest.fixture
def few_arms(monkeypatch):
    """The fewest arms that still run every reading and every analysis path: one seed, one
    primary activation per table (Sigmoid in ResNet-20, Tanh in VGG-16) under each of its
    readings, no side activations; the figure entries with Sigmoid (and Tanh, Fig. 8's judged
    pair), two ρ and two candidate rates — in both block forms."""
    tables = {"resnet20": ("sigmoid",), "vgg16": ("tanh",)}
    for module, name, value in (
            (PC, "TABLE_SMOKE_SEEDS", (0,)), (PC, "SMOKE_PRIMARY", tables),
            (PV, "SMOKE_PRIMARY", tables), (PC, "SMOKE_SIDE", {"resnet20": {}, "vgg16": {}}),
            (PF, "FIG2_SEEDS", (0,)), (PF, "FIG8_SEEDS", (0,)), (PF, "RHO_GRID", (0.5, 8.0)),
            (PF, "ACTIVATIONS", ("sigmoid", "tanh")), (PCo, "T6_SEEDS", (0,)),
            (PCo, "T6_SMOKE_ACTIVATIONS", ("sigmoid",)),
            (PCo, "SMOKE_LR_CANDIDATES", (0.01, 0.1)), (PCo, "SMOKE_SEEDS", (0,)),
            (PCo, "F7_SMOKE_ACTIVATIONS", ("sigmoid",)), (PA, "FIG10_SEEDS", (0,)),
            (PA, "ACTIVATIONS", ("sigmoid",))):
        monkeypatch.setattr(module, name, value)


@pytest.mark.parametrize("group", GROUPS, ids="+".join)
def test_tiny_reproduce(group, runs_dir, two_steps, few_arms):
    stored = []
    for experiment_id in group:
        outcome = reproduce(experiment_id, "smoke", runs_dir=runs_dir, tiny=True,
                            report=False, progress=False)
        assert outcome.figures
        for fig in outcome.figures:
            assert fig.suffix == ".png" and fig.stat().st_size > 2000
        assert outcome.table
        assert all({"quantity", "ours", "paper"} <= set(row) for row in outcome.table)
        assert outcome.verdict == "inconclusive"  # tiny runs never decide a claim
        assert "tiny" in outcome.summary
        # the verdict as data: the entry's verdict, with the numbers of its summary
        assert outcome.record.verdict == outcome.verdict and outcome.record.structured
        if "block" in outcome.summary:  # every reading judged, the primary first
            assert outcome.summary.index("He's block") < outcome.summary.index("Eq. 7's block")
        stored.append(set(_stored_run_ids(runs_dir)))
    # Fig. 5's two entries read Tables 3–4's runs and train none of their own
    if group[-1] == "peng-fig5-vgg":
        assert stored[-1] == stored[-2] == stored[-3]


def _stored_run_ids(runs_dir) -> list[str]:
    from bnlab.store import Store

    store = Store(runs_dir / "bnlab.db")
    try:
        return [r["id"] for r in store.list_runs()]
    finally:
        store.close()


class _FinalRun:
    status = "finished"

    def __init__(self, accuracy, train_loss, train_accuracy=None):
        self._final = {"test_accuracy": accuracy, "train_loss": train_loss,
                       "train_accuracy": train_accuracy}

    def final(self, name):
        return self._final.get(name)


def test_tables_find_the_cells_whose_arm_fits_but_scores_chance():
    """Table 2's BN + Sigmoid on the proxy: training accuracy 100 % in train mode, test accuracy
    10–18 % in eval mode (its 1×1-map BN layers); Table 4's: 57–79 % against 10 %, with a training
    loss (0.74–1.84) that the old loss-only test missed. Such a cell is named with its numbers; a
    cell that fails to train (accuracy at chance in both modes) or that generalizes is not."""
    arms = {(2, "①", "sigmoid"): [_FinalRun(0.103, 0.029, 1.0), _FinalRun(0.10, 0.009, 1.0)],
            (2, "②", "sigmoid"): [_FinalRun(0.855, 0.011, 0.999), _FinalRun(0.87, 0.013, 0.998)],
            (4, "①", "tanh"): [_FinalRun(0.10, 1.07, 0.735), _FinalRun(0.101, 1.84, 0.566)],
            (1, "②", "sigmoid"): [_FinalRun(0.11, 2.30, 0.113), _FinalRun(0.12, 2.29, 0.109)]}
    flagged = PV.proxy_cells(arms)
    assert set(flagged) == {("①", "sigmoid"), ("①", "tanh")}
    assert "training accuracy 100.0 %" in flagged[("①", "sigmoid")]
    assert "inference-statistics failure" in flagged[("①", "tanh")]
    # runs that log no training accuracy are read by their training loss
    no_acc = {(2, "①", "sigmoid"): [_FinalRun(0.103, 0.029), _FinalRun(0.10, 0.009)],
              (4, "①", "tanh"): [_FinalRun(0.10, 1.07), _FinalRun(0.101, 1.84)]}
    assert set(PV.proxy_cells(no_acc)) == {("①", "sigmoid")}
    # CIFAR-100's chance is 1 %: 10 % test accuracy there is not chance
    assert PV.proxy_cells({(3, "①", "tanh"): [_FinalRun(0.10, 1.0, 0.7)]}, 0.01) == {}


def test_table_verdict_leaves_out_a_cell_the_proxy_decides_and_reports_the_verdict_with_it():
    """Table 2 on the proxy said "held" by +26 points, 74 of them from BN + Sigmoid's eval-mode
    collapse; with that cell left out the primary is the mean over Tanh/SELU against the paper's
    mean gain over the same two, and the verdict with the cell is reported beside it."""
    gains = {"sigmoid": 0.74, "tanh": 0.0, "relu": 0.0, "selu": 0.0, "swish": 0.0}
    cells = _noisy_cells(gains, n=5, sd=0.002)
    sharp = V.Design("primary", PV.table_design(2).paper_effect, 0.005, 5, "test", n_test=10_000)
    assert PV.table_verdict(cells, design=sharp, table=2)[0] == "held"
    proxy = {("①", "sigmoid"): "test accuracy 10 % in eval mode, 100 % in train mode"}
    verdict, summary = PV.table_verdict(cells, design=sharp, table=2, proxy=proxy)
    assert verdict == "not held"  # no gain where both arms work, the design resolves the paper's
    assert "mean over Tanh/SELU" in summary
    assert "with Sigmoid the verdict would be 'held'" in summary
    narrowed = PV.restrict_design(sharp, 2, ("tanh", "selu"))
    assert narrowed.paper_effect == pytest.approx(
        (PV.paper_gain(2, "tanh") + PV.paper_gain(2, "selu")) / 200)
    assert narrowed.design_sd == pytest.approx(0.005 * math.sqrt(3 / 2))
    # every primary cell decided by the proxy: nothing left to judge
    everywhere = {("①", a): "proxy" for a in PC.NON_RELU}
    verdict, summary = PV.table_verdict(cells, design=sharp, table=2, proxy=everywhere)
    assert verdict == "inconclusive" and "every primary cell is decided by the proxy" in summary
    # the settling reading uses the same cells
    settled = PV.settled_table_verdict(cells, cells, design=sharp, table=2, proxy=proxy)
    assert settled[0] == "not held"


def test_a_diverged_run_scores_the_chance_of_its_task():
    """CIFAR-100 (the paper preset of Tables 3–4) has 100 classes: a diverged run scores 1 %,
    not the 10 % of ten classes (which would have credited a diverged arm with 9 points)."""
    assert PV.chance(3, "paper") == PV.chance(4, "paper") == pytest.approx(0.01)
    assert PV.chance(1, "paper") == PV.chance(3, "smoke") == pytest.approx(0.1)
    with pytest.raises(ValueError, match=r"Tables 1–4 are \[1, 2, 3, 4\]"):
        PV.chance(5)
    with pytest.raises(ValueError, match="valid: smoke, paper"):
        PV.table_design(1, "papr")


def test_fig2_eta_panels_clip_the_axis_around_the_bounds():
    """η = (μ_B − β)/μ_A reaches 10⁴–10⁵ in channels whose moving mean is near 0: the η panels show
    [−1, 4] (and say so), the τ panels scale to their data."""
    import matplotlib.pyplot as plt

    from bnlab.plots import panel_figure

    series = {}
    for layer in ET.FIG2_LAYERS.values():
        for ratio in ("eta", "tau"):
            for q, v in (("q05", 0.5), ("q50", 1.0), ("q95", 8e4)):
                series[f"probe/cbn_ratios/{ratio}_{q}/{layer}.0"] = [v, v]
    specs = PF._band_specs([_FakeProbedRun(series), _FakeProbedRun(series)])
    fig = panel_figure(specs, ncols=3)
    try:
        etas, taus = fig.axes[:3], fig.axes[3:6]
        assert all(ax.get_ylim() == (-1.0, 4.0) and "clipped" in ax.get_title() for ax in etas)
        assert all(ax.get_ylim()[1] > 1e4 and "clipped" not in ax.get_title() for ax in taus)
    finally:
        plt.close(fig)


def test_fig5_counts_a_diverged_cifar100_run_at_the_loss_of_chance_on_100_classes():
    """Fig. 5 reads Tables 3–4, CIFAR-100 in the paper preset: a diverged run's training loss is
    ln 100 there (ln 10 credited it with a loss below chance); the smoke's digits keep ln 10."""

    class Diverged:
        status, label = "diverged", "diverged run"

        def __init__(self, table):
            self.factors = {"table": table, "activation": "tanh", "row": "②"}

    runs = [Diverged(3), Diverged(1)]
    paper = P._mean_losses(runs, 1.0, "paper")
    assert paper[(3, "tanh")]["②"] == [pytest.approx(math.log(100))]
    assert paper[(1, "tanh")]["②"] == [pytest.approx(math.log(10))]
    assert P._mean_losses(runs, 1.0, "smoke")[(3, "tanh")]["②"] == [pytest.approx(math.log(10))]


def test_fig8_counts_a_diverged_run_at_chance_not_as_missing():
    """ReLU, SELU and Swish diverge at ρ = 0.25 in the smoke; dropping those runs made the
    ReLU-like activations look insensitive to ρ (range 0.38 instead of 0.89)."""

    class Run:
        def __init__(self, status, accuracy):
            self.status, self.label, self._acc = status, status, accuracy

        def final(self, name):
            return self._acc

    accs = PF.fig8_accuracies({None: [Run("finished", 0.9)],
                               0.25: [Run("diverged", 0.0), Run("finished", 0.8),
                                      Run("failed", None)]})
    assert accs == {None: [0.9], 0.25: [pytest.approx(0.1), 0.8]}
