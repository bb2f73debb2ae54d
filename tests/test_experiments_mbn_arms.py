"""The arms of mbn-batch-size beyond BN and MBN (bnlab/experiments/mbn/arms.py): the ``gn`` spec
against torch's GroupNorm, the synced-BN runs (2 processes, gloo), and the recollected arm against
torch's own ``swa_utils.update_bn``."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import bnlab.norms as N
from bnlab.data import batches
from bnlab.experiments import get
from bnlab.experiments.base import shrink
from bnlab.experiments.mbn import arms
from bnlab.experiments.mbn import entries as mbn
from bnlab.train import launcher, load_model, prepare, run
from bnlab.train.prepare import derive_seed
from bnlab.train.record import evaluate

TINY = 6  # steps: the catalogue's tiny preset (bnlab.experiments.runner.TINY_STEPS)


def test_gn_is_torchs_group_norm_with_its_groups_clipped_to_the_channels():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 64, 5, 5, generator=g)
    ours = N.create("gn", 64)
    reference = nn.GroupNorm(32, 64)  # Wu & He's default G
    with torch.no_grad():
        for p in (*ours.parameters(), *reference.parameters()):
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    torch.testing.assert_close(ours(x), reference(x), rtol=0, atol=0)
    # per-sample statistics: a sample's output does not depend on the batch it comes in
    torch.testing.assert_close(ours(x[:1]), ours(x)[:1])
    assert N.create("gn", 16).num_groups == 16  # 32 clipped to 16 channels: one each
    assert N.create("gn(num_groups=4)", 64).num_groups == 4
    with pytest.raises(ValueError, match="valid num_groups for this layer: 1, 2, 3, 4, 6, 12"):
        N.create("gn(num_groups=5)", 12)
    with pytest.raises(ValueError, match="num_groups"):
        N.create("gn(groups=4)", 12)
    assert not N.removes_mean("gn")  # a per-channel bias before it is not redundant


def test_synced_runs_are_two_processes_of_m_each_and_share_the_data_parallel_arms_run():
    for preset in ("smoke", "paper"):
        runs = get("mbn-batch-size").plan(preset).runs
        synced = {r.factors["batch_size"]: r.config for r in runs
                  if r.factors.get("norm") == arms.SYNCED}
        assert sorted(synced) == list(mbn.BATCH_SIZES)
        for M, config in synced.items():
            assert (config["nproc"], config["sync_norms"], config["norm"]) == (2, True, "bn")
            assert config["batch_size"] == 2 * M  # M samples in each process
            assert config["lr"] == pytest.approx(0.1 * 2 * M / 32)
    # at 2 processes the data-parallel "synced BN" arm (4 each) is the synced run at M = 4: one run
    smoke = get("mbn-batch-size").plan("smoke").runs
    ddp = next(r for r in smoke if r.factors.get("arm") == "synced BN")
    synced_4 = next(r for r in smoke if r.factors.get("norm") == arms.SYNCED
                    and r.factors["batch_size"] == mbn.PER_DEVICE)
    assert ddp.config == synced_4.config


def test_a_synced_bn_run_trains_over_two_processes_at_the_tiny_preset(tmp_path):
    spec = next(r for r in get("mbn-batch-size").plan("smoke").runs
                if r.factors.get("norm") == arms.SYNCED and r.factors["batch_size"] == 2)
    # ~6 s on a busy 2-core machine (2026-12-06): within the suite's budget for one gloo run
    record = launcher.train({**shrink(spec.config, TINY), "runs_dir": str(tmp_path)},
                            progress=False)
    assert record.status == "finished" and record.steps == TINY
    assert record.config["nproc"] == 2 and record.config["sync_norms"]
    assert 0.0 <= record.metrics["test_accuracy"] <= 1.0


def test_recollected_arm_matches_torchs_update_bn(tmp_path):
    """The recollected value against torch's own tool: ``swa_utils.update_bn`` on torch's BN
    (``native_bn``, an ``nn.modules.batchnorm._BatchNorm``) over the same batches."""
    config = {"model": "mlp", "model_options": {"depth": 3, "width": 16}, "data": "digits",
              "norm": "native_bn", "batch_size": 4, "lr": 0.05, "steps": 40, "seed": 0,
              "runs_dir": str(tmp_path)}
    record = run(config, progress=False)
    view = type("View", (), {"id": record.id, "status": record.status,
                             "record": {"config": record.config}})()
    ours = arms.recollected_metrics(view, tmp_path)
    assert (tmp_path / arms.RECOLLECT_DIR / f"{record.id}.json").exists()
    assert arms.recollected_metrics(view, tmp_path) == ours  # read back, not measured again

    model, prep = load_model(record.id, tmp_path), prepare(config)
    generator = torch.Generator().manual_seed(derive_seed(0, "recollect"))
    loader = [x for x, _ in batches(prep.data.x_train, prep.data.y_train, 4,
                                    generator=generator, shuffle=True,
                                    drop_last=prep.drop_last)]
    before = copy.deepcopy(model)
    torch.optim.swa_utils.update_bn(loader, model)
    reference = evaluate(model, prep.data, prep.loss_fn, True)
    assert ours["test_accuracy"] == pytest.approx(reference["test_accuracy"], abs=1e-12)
    assert ours["test_loss"] == pytest.approx(reference["test_loss"], rel=1e-5)
    # and it is not the run's own evaluation (the EMA of 40 steps): recollection changed something
    assert evaluate(before, prep.data, prep.loss_fn, True) != reference
    # a run without a checkpoint (fake or deleted) gives no value instead of failing the analysis
    view.id = "0" * 12
    assert arms.recollected_metrics(view, tmp_path) is None
