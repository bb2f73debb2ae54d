"""The doctor on a real PyTorch Lightning ``Trainer`` (CPU) through bnlab's adapter: gradient
accumulation (``accumulate_grad_batches``) and activation checkpointing are named, a healthy fit
gets no warning, and the watched fit ends bitwise where the fit without the doctor ends."""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bnlab.doctor import Doctor

if importlib.util.find_spec("torchvision") is not None:
    # lightning imports torchmetrics, which imports torchvision (see tests/vision_shim.py)
    from tests.vision_shim import import_or_skip

    import_or_skip("torchvision")
pl = pytest.importorskip("lightning.pytorch")
from bnlab.integrations.lightning import BnlabCallback  # noqa: E402 (needs lightning)

STEPS = 32


class Module(pl.LightningModule):
    def __init__(self, checkpointed: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.checkpointed = checkpointed
        self.block = nn.Sequential(nn.Linear(6, 16, bias=False), nn.BatchNorm1d(16), nn.ReLU())
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = (checkpoint(self.block, x, use_reentrant=False) if self.checkpointed
             else self.block(x))
        return self.head(h)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(32 * count, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return [(x[i:i + 32], y[i:i + 32]) for i in range(0, 32 * count, 32)]


def fit(module: Module, accumulate: int = 1, doctor: Doctor | None = None) -> pl.Trainer:
    loader = torch.utils.data.DataLoader(batches(STEPS * accumulate), batch_size=None,
                                         shuffle=False)
    callbacks = [] if doctor is None else [BnlabCallback(doctor, loss_fn=F.cross_entropy)]
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=STEPS, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=callbacks,
                         accumulate_grad_batches=accumulate)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the dataloader does not have many workers" and the like
        trainer.fit(module, loader)
    return trainer


def test_gradient_accumulation_in_lightning_is_micro_batch_statistics():
    doc = Doctor(every=4)
    trainer = fit(Module(), accumulate=2, doctor=doc)
    assert trainer.global_step == STEPS and doc.steps == STEPS
    report = doc.report(examine=False)
    assert report.codes("warn") == ["micro-batch-statistics"], str(report)
    assert (report.findings[0].value, report.findings[0].threshold) == (32, 64)


def test_activation_checkpointing_in_lightning_is_a_double_update():
    doc = Doctor(every=4)
    module = Module(checkpointed=True)
    fit(module, doctor=doc)
    report = doc.report(examine=False)
    assert report.codes("warn") == ["double-update"], str(report)
    # torch's own count: two updates per optimizer step
    assert int(module.block[1].num_batches_tracked) == 2 * STEPS
    assert report.findings[0].value == 2.0 and report.findings[0].layers == ("block.1",)


def test_a_healthy_lightning_fit_is_unchanged_by_the_doctor_and_gets_no_warning():
    doc = Doctor(every=4, sharpness_every=16)
    watched, plain = Module(), Module()
    fit(watched, doctor=doc)  # (its warning that sharpness every 16 steps is over budget: ignored)
    fit(plain)
    a, b = watched.state_dict(), plain.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    report = doc.report()
    assert report.warnings == [], str(report)
    assert [s for s, _, _ in report.measurements["sharpness"][:2]] == [16, 32]
    assert doc.model is watched  # the LightningModule the loop trained
