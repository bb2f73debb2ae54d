"""Catalogue entry mbn-batch-size (bnlab/experiments/mbn.py): tiny end-to-end run, plan, analysis verdicts."""

from __future__ import annotations

import pytest

from bnlab.experiments import get
from bnlab.experiments import mbn
from bnlab.experiments.runner import reproduce

from .test_experiments_luo import check_outcome, fake_context



def test_tiny_smoke_runs_end_to_end(tmp_path):
    outcome = reproduce("mbn-batch-size", "smoke", runs_dir=tmp_path, tiny=True, report=False, progress=False)
    check_outcome(outcome)
    assert outcome.verdict == "inconclusive"


def test_plan_pairs_bn_and_mbn_at_every_batch_size():
    for preset in ("smoke", "paper"):
        runs = get("mbn-batch-size").plan(preset).runs
        pairs = {(r.factors["norm"], r.factors["batch_size"]) for r in runs}
        assert pairs == {(n, m) for n in ("BN", "MBN") for m in (2, 4, 8, 16, 32)}
        for r in runs:
            assert r.config["norm"] == {"BN": "bn", "MBN": "mbn"}[r.factors["norm"]]
            assert r.config["lr"] == pytest.approx(0.1 * r.config["batch_size"] / 32)  # linear scaling
            assert r.config["epochs"] >= 2  # MBN's λ schedule needs more than one epoch
    paper = get("mbn-batch-size").plan("paper").runs[0].config
    assert paper["data"] == "cifar10"
    assert all(r.config["data"] == "digits" for r in get("mbn-batch-size").plan("smoke").runs)


def test_normalizer_noise_matches_the_equivalent_batch():
    data = mbn.normalizer_noise_data((2, 8, 32), epochs=6, n_steps=20_000)
    # λ(T) = 1 − m/m0: no smoothing at the ideal batch, so MBN's noise is BN's there
    assert data["lambda_final"] == pytest.approx([1 - 2 / 32, 1 - 8 / 32, 0.0])
    assert data["mbn"][2] == pytest.approx(data["bn"][2], rel=0.05)
    # at m = 2 the moving mean is as noisy as a batch of m(1+λ)/(1−λ) = 62 (20 % ≈ 3.5 s.e.: ~650 effective samples)
    assert data["equivalent_batch"][0] == pytest.approx(62.0)
    assert data["mbn"][0] == pytest.approx(data["mbn_theory"][0], rel=0.2)
    assert data["mbn"][0] < data["bn"][0] / 20


def _runs(bn_acc, mbn_acc):
    runs = []
    for label, accs in (("BN", bn_acc), ("MBN", mbn_acc)):
        for M, acc in zip((2, 4, 8, 16, 32), accs):
            runs.append((f"{label}, M = {M}", {"norm": label, "batch_size": M}, "finished",
                         {"test_accuracy": acc, "test_loss": 1 - acc}, {"test_accuracy": [acc]}))
    return runs


def test_analysis_verdicts(tmp_path):
    good = _runs([0.50, 0.90, 0.95, 0.97, 0.98], [0.93, 0.96, 0.97, 0.98, 0.98])
    outcome = get("mbn-batch-size").analyze(fake_context("mbn-batch-size", good, None, tmp_path))
    check_outcome(outcome)
    assert outcome.verdict == "held"
    same = _runs([0.90, 0.93, 0.95, 0.97, 0.98], [0.89, 0.93, 0.95, 0.97, 0.98])
    assert get("mbn-batch-size").analyze(fake_context("mbn-batch-size", same, None, tmp_path)).verdict == "not held"
    close = _runs([0.90, 0.93, 0.95, 0.97, 0.98], [0.91, 0.93, 0.95, 0.97, 0.98])  # 1 point better: within noise
    assert mbn.batch_size_verdict({"BN": {2: 0.90, 32: 0.98}, "MBN": {2: 0.91, 32: 0.98}}, False)[0] == "inconclusive"
    assert get("mbn-batch-size").analyze(fake_context("mbn-batch-size", close, None, tmp_path)).verdict == "inconclusive"
    failed = good[:]
    failed[0] = (*failed[0][:2], "failed", {}, {})
    assert get("mbn-batch-size").analyze(fake_context("mbn-batch-size", failed, None, tmp_path)).verdict == "inconclusive"


def test_data_parallel_arms_planned_and_reported_next_to_the_runs_they_mirror(tmp_path):
    for preset, p in mbn.PROCESSES.items():
        ddp = [r for r in get("mbn-batch-size").plan(preset).runs if r.config.get("nproc")]
        assert {(r.config["norm"], r.config["sync_norms"]) for r in ddp} == {("bn", False), ("bn", True), ("mbn", False)}
        assert all(r.config["nproc"] == p and r.config["batch_size"] == p * mbn.PER_DEVICE for r in ddp)
    runs = _runs([0.50, 0.90, 0.95, 0.97, 0.98], [0.93, 0.96, 0.97, 0.98, 0.98])
    for arm, acc in (("unsynced BN", 0.89), ("synced BN", 0.95), ("unsynced MBN", 0.96)):
        runs.append((arm, {"norm": "BN", "batch_size": 8, "nproc": 2, "arm": arm}, "finished",
                     {"test_accuracy": acc, "test_loss": 1 - acc}, {"test_accuracy": [acc]}))
    outcome = get("mbn-batch-size").analyze(fake_context("mbn-batch-size", runs, None, tmp_path))
    assert outcome.verdict == "held"  # the one-process arms alone decide the paper's claim
    rows = {row["quantity"].split(": test")[0]: row["ours"] for row in outcome.table if "processes" in row["quantity"]}
    assert rows == {"2 processes, global batch 8 (4 each), unsynced BN": "0.89 (0.9)",
                    "2 processes, global batch 8 (4 each), synced BN": "0.95 (0.95)",
                    "2 processes, global batch 8 (4 each), unsynced MBN": "0.96 (0.96)"}
    assert "unsynced BN 0.89" in outcome.summary
