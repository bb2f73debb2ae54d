"""The tools of docs/readme/tools.md run as a new user runs them, on a converted timm resnet18 for
every BatchNorm-family spec: ``swa_utils.AveragedModel`` then ``update_bn`` (torch's skips the
layers; bnlab's recomputes every one), timm's ``param_groups_weight_decay``, the no-decay rule
written with ``nn.BatchNorm2d`` and with ``_BatchNorm``, ``convert_sync_batchnorm``,
``torch.utils.checkpoint`` (reentrant and not) and the non-finite guard; Lightning's SWA in a real
CPU ``Trainer`` (2 steps). timm's freezing and the fusions have their own files
(test_freeze_unfreeze_routes.py, test_ecosystem_fusion.py)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim.swa_utils import AveragedModel
from torch.optim.swa_utils import update_bn as torch_update_bn
from torch.utils.checkpoint import checkpoint

import bnlab.norms as N
from bnlab.models.vision_compat import import_timm

SPECS = ["bn", "mean_only_bn", "var_only_bn", "noisy_bn", "lp_bn", "lp_bn(p=inf)", "mbn", "cbn",
         "brn", "native_bn"]


@pytest.fixture(scope="module")
def resnet18():
    timm = import_timm()
    torch.manual_seed(0)
    return timm.create_model("resnet18", num_classes=4)


def _batches(count: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 3, 32, 32, generator=g) * 2 + 1, torch.arange(4) % 4)
            for _ in range(count)]


def _converted(resnet18: nn.Module, spec: str) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = N.convert(copy.deepcopy(resnet18), spec)
        N.set_progress(model, lr=0.01, epoch=2, epochs=3)  # mbn's λ, cbn's η non-zero
        N.seed_layers(model, 1)
        model.train()(_batches(1, seed=9)[0][0])  # statistics away from their start values
    return model


def _norms(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if N.is_batch_norm(m)]


def _running(model: nn.Module) -> list[torch.Tensor]:
    return [m.running_mean.clone() for m in _norms(model)]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("spec", SPECS)
def test_averaged_model_then_update_bn(resnet18, spec):
    model = _converted(resnet18, spec)
    swa = AveragedModel(model)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.9)
    swa.update_parameters(model)
    loader = _batches(3)
    stale = _running(swa)
    torch_update_bn(loader, swa)  # finds layers by isinstance(m, _BatchNorm)
    skipped = [torch.equal(a, b) for a, b in zip(stale, _running(swa))]
    assert all(skipped) == (spec != "native_bn")  # native_bn is torch's BatchNorm itself
    seen: list[list[torch.Tensor]] = []
    for layer in _norms(swa):
        seen.append([])
        layer.register_forward_pre_hook(
            lambda m, args, s=seen[-1]: s.append(args[0].detach().double().mean((0, 2, 3))))
    N.update_bn(loader, swa)
    assert len(seen) == 20
    for layer, means in zip(_norms(swa), seen):  # running_mean = E_B[μ_B] (momentum=None)
        assert len(means) == 3
        torch.testing.assert_close(layer.running_mean.double(), torch.stack(means).mean(0),
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("spec", SPECS)
def test_weight_decay_rules(resnet18, spec):
    from timm.optim import param_groups_weight_decay
    model = _converted(resnet18, spec)

    def exempt(groups: list[dict]) -> set[int]:
        return {id(p) for g in groups if g["weight_decay"] == 0 for p in g["params"]}

    def rule(predicate) -> set[int]:
        return {id(p) for m in model.modules() if predicate(m) for p in m.parameters(recurse=False)}

    norm_params = {id(p) for m in _norms(model) for p in m.parameters(recurse=False)}
    assert len(norm_params) == 40
    assert exempt(param_groups_weight_decay(model, 1e-4)) >= norm_params  # by shape: 1-D
    assert exempt(N.param_groups_no_decay(model, 1e-4)) == norm_params
    assert rule(lambda m: isinstance(m, nn.BatchNorm2d)) == set()  # skipped: γ, β decayed
    assert rule(lambda m: isinstance(m, _BatchNorm)) == (norm_params if spec == "native_bn"
                                                         else set())


@pytest.mark.parametrize("spec", SPECS)
def test_convert_sync_batchnorm_keeps_every_variant(resnet18, spec):
    model = _converted(resnet18, spec)
    kinds = [type(m) for m in _norms(model)]
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    after = [type(m) for m in _norms(synced)]
    assert after == ([nn.SyncBatchNorm] * 20 if spec == "native_bn" else kinds)


def _checkpointed(model: nn.Module, x: torch.Tensor, reentrant: bool | None) -> torch.Tensor:
    x = model.maxpool(model.act1(model.bn1(model.conv1(x))))
    for stage in (model.layer1, model.layer2, model.layer3, model.layer4):
        x = stage(x) if reentrant is None else checkpoint(stage, x, use_reentrant=reentrant)
    return model.forward_head(x)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("spec", SPECS)
def test_checkpoint_updates_once_with_exact_gradients(resnet18, spec):
    plain = _converted(resnet18, spec)
    (x, y), = _batches(1, seed=3)
    N.seed_layers(plain, 5)
    F.cross_entropy(_checkpointed(plain, x, None), y).backward()
    for reentrant in (False, True):
        model = _converted(resnet18, spec)
        N.seed_layers(model, 5)
        F.cross_entropy(_checkpointed(model, x, reentrant), y).backward()
        for (name, a), b in zip(model.state_dict().items(), plain.state_dict().values()):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=name)  # one update
        for (name, p), q in zip(model.named_parameters(), plain.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("spec", SPECS)
def test_nonfinite_guard_leaves_every_buffer_untouched(resnet18, spec):
    model = _converted(resnet18, spec)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    (x, _), = _batches(1, seed=4)
    x[0, 0, 0, 0] = float("nan")
    previous = N.set_nonfinite_guard(True)
    try:
        model.train()(x)
    finally:
        N.set_nonfinite_guard(previous)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert len(N.nonfinite_batches(model)) == 20


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("spec", ["bn", "mbn", "cbn", "brn", "lp_bn", "noisy_bn"])
def test_lightning_swa_in_a_real_trainer(resnet18, spec):
    import lightning.pytorch as pl

    from bnlab.integrations.lightning import StochasticWeightAveraging

    class Module(pl.LightningModule):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, _):
            return F.cross_entropy(self(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    module = Module(_converted(resnet18, spec))
    data = _batches(1, seed=6)
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=1)])
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=None))
    assert trainer.global_step == 3  # 2 training steps, then the callback's statistics epoch
    reference = copy.deepcopy(module)
    N.update_bn(data, reference)  # the statistics are those of the final (averaged) weights
    for (name, ours), truth in zip(module.state_dict().items(), reference.state_dict().values()):
        torch.testing.assert_close(ours, truth, rtol=1e-5, atol=1e-6, msg=name)
