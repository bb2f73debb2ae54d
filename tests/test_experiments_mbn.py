"""Catalogue entry mbn-batch-size (bnlab/experiments/mbn/entries.py): tiny end-to-end run, plan,
analysis verdicts."""

from __future__ import annotations

import pytest

from bnlab.experiments import get
from bnlab.experiments.mbn import entries as mbn
from bnlab.experiments.runner import reproduce

from .test_experiments_luo import check_outcome, fake_context



def test_tiny_smoke_runs_end_to_end(tmp_path, monkeypatch):
    # the multi-process arms start 2 processes a run (~10 s each here): test_experiments_mbn_arms
    # runs one synced-BN run; this test covers the one-process arms and the recollected one
    monkeypatch.setattr(mbn, "synced_runs", lambda base, sizes: [])
    monkeypatch.setattr(mbn, "ddp_runs", lambda base, processes: [])
    outcome = reproduce("mbn-batch-size", "smoke", runs_dir=tmp_path, tiny=True,
                        report=False, progress=False)
    check_outcome(outcome)
    assert outcome.verdict == "inconclusive"
    # every finished BN run also gave the recollected arm its value, kept beside the store
    bn_runs = [r for r in get("mbn-batch-size").plan("smoke").runs if r.factors["norm"] == "BN"]
    assert len(list((tmp_path / "recollected").glob("*.json"))) == len(bn_runs)
    row = next(r for r in outcome.table if r["quantity"].startswith("M = 2:"))
    assert "recollected" in row["quantity"] and "—" not in row["ours"].split(" (")[0]
    assert "BN, running statistics recollected" in outcome.summary


ONE_PROCESS = ("BN", "MBN", "BRN", "GN")


def test_plan_has_every_arm_at_every_batch_size():
    for preset in ("smoke", "paper"):
        runs = get("mbn-batch-size").plan(preset).runs
        one = [r for r in runs if not r.factors.get("nproc")]
        pairs = {(r.factors["norm"], r.factors["batch_size"]) for r in one}
        assert pairs == {(n, m) for n in (*ONE_PROCESS, "synced BN") for m in (2, 4, 8, 16, 32)}
        for n in ONE_PROCESS:  # the compared ends get 3 seeds, the middle one
            seeds = {m: {r.factors["seed"] for r in one if r.factors["norm"] == n
                         and r.factors["batch_size"] == m}
                     for m in (2, 8, 32)}
            assert seeds == {2: {0, 1, 2}, 8: {0}, 32: {0, 1, 2}}
        specs = {"BN": "bn", "MBN": "mbn", "BRN": "brn", "synced BN": "bn",
                 "GN": "gn(num_groups=4)" if preset == "smoke" else "gn"}
        for r in runs:
            assert r.config["norm"] == specs[r.factors["norm"]]
            # linear scaling with the global batch
            assert r.config["lr"] == pytest.approx(0.1 * r.config["batch_size"] / 32)
            assert r.config["epochs"] >= 2  # MBN's λ schedule needs more than one epoch
    paper = get("mbn-batch-size").plan("paper").runs[0].config
    assert paper["data"] == "cifar10"
    assert all(r.config["data"] == "digits" for r in get("mbn-batch-size").plan("smoke").runs)


def test_normalizer_noise_matches_the_equivalent_batch():
    data = mbn.normalizer_noise_data((2, 8, 32), epochs=6, n_steps=20_000)
    # λ(T) = 1 − m/m0: no smoothing at the ideal batch, so MBN's noise is BN's there
    assert data["lambda_final"] == pytest.approx([1 - 2 / 32, 1 - 8 / 32, 0.0])
    assert data["mbn"][2] == pytest.approx(data["bn"][2], rel=0.05)
    # at m = 2 the moving mean is as noisy as a batch of m(1+λ)/(1−λ) = 62 (20 % ≈ 3.5 s.e.: ~650
    # effective samples)
    assert data["equivalent_batch"][0] == pytest.approx(62.0)
    assert data["mbn"][0] == pytest.approx(data["mbn_theory"][0], rel=0.2)
    assert data["mbn"][0] < data["bn"][0] / 20


def _runs(bn_acc, mbn_acc, seeds=3, jitter=0.002, brn_acc=None, gn_acc=(0.9,) * 5):
    """BN, MBN, BRN (BN's accuracies unless given) and GN at M = 2 … 32; the compared ends (M = 2,
    32) with ``seeds`` seeds, a little apart."""
    runs = []
    for label, accs in (("BN", bn_acc), ("MBN", mbn_acc), ("BRN", brn_acc or bn_acc),
                        ("GN", gn_acc)):
        for M, acc in zip((2, 4, 8, 16, 32), accs):
            for seed in range(seeds if M in (2, 32) else 1):
                a = acc + jitter * seed * (1 if M == 2 else -1)
                runs.append((f"{label}, M = {M}, seed {seed}",
                             {"norm": label, "batch_size": M, "seed": seed}, "finished",
                             {"test_accuracy": a, "test_loss": 1 - a}, {"test_accuracy": [a]}))
    return runs


def test_analysis_verdicts(tmp_path):
    good = _runs([0.50, 0.90, 0.95, 0.97, 0.98], [0.93, 0.96, 0.97, 0.98, 0.98])
    outcome = get("mbn-batch-size").analyze(fake_context("mbn-batch-size", good, None, tmp_path))
    check_outcome(outcome)
    assert outcome.verdict == "held"
    worse = _runs([0.90, 0.93, 0.95, 0.97, 0.98], [0.85, 0.93, 0.95, 0.97, 0.98])
    assert get("mbn-batch-size").analyze(
        fake_context("mbn-batch-size", worse, None, tmp_path)).verdict == "not held"
    # within the seeds
    noisy = _runs([0.90, 0.93, 0.95, 0.97, 0.98], [0.91, 0.93, 0.95, 0.97, 0.98], jitter=0.03)
    outcome = get("mbn-batch-size").analyze(fake_context("mbn-batch-size", noisy, None, tmp_path))
    assert outcome.verdict == "inconclusive" and "resolvable" in outcome.summary
    # one seed per arm (the old smoke preset, decided by a 0.02 margin) cannot decide under the rule
    one = _runs([0.50, 0.90, 0.95, 0.97, 0.98], [0.93, 0.96, 0.97, 0.98, 0.98], seeds=1)
    outcome = get("mbn-batch-size").analyze(fake_context("mbn-batch-size", one, None, tmp_path))
    assert outcome.verdict == "inconclusive" and "fewer than 3 seeds" in outcome.summary
    failed = good[:]
    failed[0] = (*failed[0][:2], "failed", {}, {})
    assert get("mbn-batch-size").analyze(
        fake_context("mbn-batch-size", failed, None, tmp_path)).verdict == "inconclusive"


def test_the_claim_needs_mbn_to_beat_brn_too(tmp_path):
    """The paper's claim is the conjunction: MBN loses less than BN and than BRN."""
    bn, mbn_acc = [0.50, 0.90, 0.95, 0.97, 0.98], [0.93, 0.96, 0.97, 0.98, 0.98]
    brn_better = _runs(bn, mbn_acc, brn_acc=[0.98, 0.98, 0.98, 0.98, 0.98])
    outcome = get("mbn-batch-size").analyze(
        fake_context("mbn-batch-size", brn_better, None, tmp_path))
    assert outcome.verdict == "not held"
    assert "MBN's − BN's" in outcome.summary and "MBN's − BRN's" in outcome.summary
    # BRN as bad as BN: both comparisons significant in the paper's direction
    brn_worse = _runs(bn, mbn_acc, brn_acc=[0.60, 0.90, 0.95, 0.97, 0.98])
    assert get("mbn-batch-size").analyze(
        fake_context("mbn-batch-size", brn_worse, None, tmp_path)).verdict == "held"
    # no BRN runs: the claim cannot be decided, and the summary says why
    no_brn = [r for r in brn_worse if r[1]["norm"] != "BRN"]
    outcome = get("mbn-batch-size").analyze(fake_context("mbn-batch-size", no_brn, None, tmp_path))
    assert outcome.verdict == "inconclusive" and "no finished BRN runs" in outcome.summary
    # GN is reported beside the judged arms, never judged
    assert "reported, not judged: GN 0.898 → 0.902 (n=3)" in outcome.summary


def test_data_parallel_arms_planned_and_reported_next_to_the_runs_they_mirror(tmp_path):
    for preset, p in mbn.PROCESSES.items():
        ddp = [r for r in get("mbn-batch-size").plan(preset).runs if r.factors.get("nproc")]
        assert {(r.config["norm"], r.config["sync_norms"])
                for r in ddp} == {("bn", False), ("bn", True), ("mbn", False)}
        assert all(r.config["nproc"] == p
                   and r.config["batch_size"] == p * mbn.PER_DEVICE for r in ddp)
    runs = _runs([0.50, 0.90, 0.95, 0.97, 0.98], [0.93, 0.96, 0.97, 0.98, 0.98])
    for arm, acc in (("unsynced BN", 0.89), ("synced BN", 0.95), ("unsynced MBN", 0.96)):
        runs.append((arm, {"norm": "BN", "batch_size": 8, "nproc": 2, "arm": arm}, "finished",
                     {"test_accuracy": acc, "test_loss": 1 - acc}, {"test_accuracy": [acc]}))
    outcome = get("mbn-batch-size").analyze(fake_context("mbn-batch-size", runs, None, tmp_path))
    assert outcome.verdict == "held"  # the one-process arms alone decide the paper's claim
    rows = {row["quantity"].split(": test")[0]: row["ours"] for row in outcome.table
            if row["quantity"].startswith("2 processes")}
    assert rows == {"2 processes, global batch 8 (4 each), unsynced BN": "0.89 (0.9)",
                    "2 processes, global batch 8 (4 each), synced BN": "0.95 (0.95)",
                    "2 processes, global batch 8 (4 each), unsynced MBN": "0.96 (0.96)"}
    assert "unsynced BN 0.89" in outcome.summary
