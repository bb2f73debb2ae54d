"""After weight averaging, every layer's statistics are recomputed: ``bnlab.norms.update_bn`` (the
signature of ``torch.optim.swa_utils.update_bn``) and bnlab's Lightning SWA callback.

torch's ``update_bn`` and Lightning's ``StochasticWeightAveraging`` find BatchNorm layers by
``isinstance(m, _BatchNorm)``, which bnlab's layers are not (docs/readme/tools.md), so they leave
them with the last network's statistics. The equivalents are checked against torch's tool on
torch's own BN (equal), and on every bnlab layer against a float64 recomputation from the inputs
each layer saw (the batch averages of bnlab.norms.tools.population), mbn's and cbn's moving
statistics included; on a converted timm resnet18 as a user runs it; inside a real Lightning
``Trainer``.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
from torch.optim.swa_utils import AveragedModel
from torch.optim.swa_utils import update_bn as torch_update_bn

import bnlab.norms as N
from bnlab.models.vision_compat import import_timm

SPECS = ["bn", "mean_only_bn", "var_only_bn", "noisy_bn", "lp_bn", "mbn", "cbn",
         "cbn(decouple=false)", "cbn(center=false)", "cbn(amat=false)", "cbn(order=literal)",
         "brn(relax_from=0)"]


def _batches(count: int = 4, shape=(8, 3, 6, 6), seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) * 2 + 3 for _ in range(count)]


class _Inputs:
    """A forward pre-hook recording, in float64, every training-mode input a layer sees."""

    def __init__(self, layer: nn.Module) -> None:
        self.seen: list[torch.Tensor] = []
        layer.register_forward_pre_hook(self)

    def __call__(self, module, args):
        if module.training:
            self.seen.append(args[0].detach().double().transpose(0, 1).flatten(1))  # (C, n)


def _expected(layer: nn.Module, seen: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The float64 truth for each buffer, from the inputs (module docstring of population)."""
    means = torch.stack([z.mean(1) for z in seen])
    variances = torch.stack([z.var(1, unbiased=False) for z in seen])
    n = seen[0].shape[1]
    mu = means.mean(0)
    out = {"running_mean": mu, "running_var": (variances * n / (n - 1)).mean(0)}
    if isinstance(layer, N.MomentumBatchNorm):
        out.update(train_mean=mu, train_var=variances.mean(0))
    elif isinstance(layer, N.CompleteBatchNorm):
        beta = layer.bias.detach().double()
        pooled = torch.cat(seen, dim=1)  # the whole pass as one batch: equal batch sizes
        centre = mu if layer.center else torch.zeros_like(mu)
        if layer.decouple:
            second = (pooled - centre[:, None] + beta[:, None]).pow(2).mean(1)
        else:
            second = (pooled - centre[:, None]).pow(2).mean(1) if not layer.center else \
                variances.mean(0)
        k = (mu - centre) + beta if layer.decouple else (mu - centre)
        out.update(amat_mean=centre, amat_var=second, running_mean=mu, running_var=second - k**2)
    elif isinstance(layer, N.BatchRenorm):  # Ioffe 2017: an average of σ_B, stored as σ² − ε
        sigma = (variances + layer.eps).sqrt().mean(0)
        out["running_var"] = sigma**2 - layer.eps
    elif isinstance(layer, N.LpBatchNorm):  # p = 2: the average scale σ_B, stored squared
        out["running_var"] = variances.sqrt().mean(0) ** 2
    elif isinstance(layer, N.MeanOnlyBatchNorm):
        del out["running_var"]
    return out


def _trained(spec: str) -> nn.Sequential:
    """conv → layer → ReLU → conv, trained a few steps with λ, η > 0, so every buffer is stale."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = nn.Sequential(nn.Conv2d(3, 4, 3), N.create(spec, 4), nn.ReLU(), nn.Conv2d(4, 2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        N.set_progress(model, lr=0.01, epoch=3, epochs=4)
        for x in _batches(3, seed=7):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    return model


@pytest.mark.parametrize("spec", SPECS)
def test_update_bn_recomputes_every_buffer_of_every_layer(spec):
    model = _trained(spec)
    layer = model[1]
    lam = getattr(layer, "_lambda_exponent", torch.tensor(0.0)).clone()
    eta = getattr(layer, "_eta", torch.tensor(0.0)).clone()
    inputs = _Inputs(layer)
    stale = {k: v.clone() for k, v in layer.state_dict().items()}
    N.update_bn([(x, 0) for x in _batches()], model)
    assert len(inputs.seen) == 4 and int(layer.num_batches_tracked) == 4
    for name, truth in _expected(layer, inputs.seen).items():
        torch.testing.assert_close(getattr(layer, name).double(), truth, rtol=1e-5, atol=1e-5,
                                   msg=f"{spec} {name}")
        if truth.abs().max() > 0:  # cbn(center=false)'s centre is 0 by definition
            assert not torch.allclose(stale[name].double(), truth), f"{name} was already right"
    # the training schedule (λ, η) and momentum are the layer's own again
    assert torch.equal(getattr(layer, "_lambda_exponent", torch.tensor(0.0)), lam)
    assert torch.equal(getattr(layer, "_eta", torch.tensor(0.0)), eta)
    assert layer.momentum == 0.1


def test_torch_update_bn_leaves_mbn_and_cbn_stale_the_reason_for_ours():
    for spec in ("mbn", "cbn"):
        model = _trained(spec)
        before = copy.deepcopy(model[1].state_dict())
        torch_update_bn(_batches(), model)
        for name, value in model[1].state_dict().items():
            assert torch.equal(value, before[name]), name


def test_cbn_eval_after_update_bn_is_the_full_data_normalization():
    """What eval computes after the pass: cbn's Eq. 4-5 map with the full data's centre and
    second moment (the moving statistics' limit), in float64."""
    model = _trained("cbn")
    layer = model[1]
    inputs = _Inputs(layer)
    N.update_bn(_batches(), model)
    z = torch.cat([x for x in inputs.seen], dim=1)  # (C, all)
    beta, gamma = layer.bias.detach().double(), layer.weight.detach().double()
    shifted = z - z.mean(1, keepdim=True) + beta[:, None]
    truth = gamma[:, None] * shifted / (shifted.pow(2).mean(1, keepdim=True) + layer.eps).sqrt()
    x = model[0](_batches()[0]).detach()
    got = layer.eval()(x).double().transpose(0, 1).flatten(1)
    torch.testing.assert_close(got, truth[:, :got.shape[1]], rtol=1e-4, atol=1e-4)


def test_update_bn_equals_torch_on_torch_layers_inside_averaged_model():
    torch.manual_seed(0)
    ref = AveragedModel(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                                      nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4, momentum=None)))
    ours = copy.deepcopy(ref)
    torch_update_bn(_batches(), ref)
    N.update_bn(_batches(), ours)
    for (name, a), b in zip(ref.state_dict().items(), ours.state_dict().values()):
        assert torch.equal(a, b), name
    assert ours.module[4].momentum is None


@pytest.fixture(scope="module")
def resnet18():
    timm = import_timm()
    torch.manual_seed(0)
    return timm.create_model("resnet18", num_classes=10, pretrained=False)


def test_converted_timm_resnet18_bn_equals_torch_update_bn(resnet18):
    ref = copy.deepcopy(resnet18)
    ours = N.convert(copy.deepcopy(resnet18), "bn")
    data = [(x, torch.zeros(4)) for x in _batches(3, (4, 3, 32, 32))]
    torch_update_bn(data, ref)
    N.update_bn(data, ours)
    theirs = ref.state_dict()
    for name, value in ours.state_dict().items():
        torch.testing.assert_close(value, theirs[name], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("spec", ["mbn", "cbn", "brn(relax_from=0)"])
def test_converted_timm_resnet18_every_layer_recomputed(resnet18, spec):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = N.convert(copy.deepcopy(resnet18), spec)
        N.set_progress(model, lr=0.01, epoch=2, epochs=3)
        model.train()(_batches(1, (4, 3, 32, 32), seed=5)[0])  # stale statistics
    layers = [m for m in model.modules() if isinstance(m, N.ChannelNorm)]
    assert len(layers) == 20
    seen = [_Inputs(m) for m in layers]
    N.update_bn(_batches(3, (4, 3, 32, 32)), model)
    for layer, inputs in zip(layers, seen):
        assert len(inputs.seen) == 3
        for name, truth in _expected(layer, inputs.seen).items():
            torch.testing.assert_close(getattr(layer, name).double(), truth, rtol=1e-4,
                                       atol=1e-4, msg=name)


# ---- Lightning's StochasticWeightAveraging ----------------------------------------------------

def _lightning_run(norms: tuple[str, str], callback_cls):
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            make = (lambda s, c: nn.BatchNorm2d(c)) if norms[0] == "torch" else N.create
            self.net = nn.Sequential(nn.Conv2d(3, 4, 3), make(norms[0], 4), nn.ReLU(),
                                     nn.Conv2d(4, 4, 1), make(norms[1], 4), nn.ReLU(),
                                     nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, _):
            x, y = batch
            return nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    xs = _batches(4, (8, 3, 6, 6))
    data = [(x, torch.arange(8) % 2) for x in xs]
    loader = torch.utils.data.DataLoader(data, batch_size=None, shuffle=False)
    module = Module()
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[callback_cls(swa_lrs=0.02, swa_epoch_start=1)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, loader)
    return module, data


def _consistent(module) -> None:
    """The model's statistics are those of its own final weights: recomputed from the same batches
    (torch's update_bn for torch's layers, bnlab's for the rest) they do not move."""
    data = [(x, torch.arange(8) % 2) for x in _batches(4, (8, 3, 6, 6))]
    reference = copy.deepcopy(module)
    N.update_bn(data, reference)
    for (name, ours), truth in zip(module.state_dict().items(), reference.state_dict().values()):
        torch.testing.assert_close(ours, truth, rtol=1e-5, atol=1e-6, msg=name)


def test_lightning_swa_callback_recomputes_bnlab_layers():
    from bnlab.integrations.lightning import StochasticWeightAveraging
    module, _ = _lightning_run(("mbn", "cbn"), StochasticWeightAveraging)
    _consistent(module)
    assert module.net[1].momentum == 0.1 and int(module.net[4].num_batches_tracked) == 4


def test_lightning_swa_callback_on_torch_layers():
    """Lightning's own statistics, bitwise, and the weights they were computed with."""
    from lightning.pytorch.callbacks import StochasticWeightAveraging as Theirs

    from bnlab.integrations.lightning import StochasticWeightAveraging
    ours, _ = _lightning_run(("torch", "torch"), StochasticWeightAveraging)
    theirs, _ = _lightning_run(("torch", "torch"), Theirs)
    for name, value in theirs.state_dict().items():
        if "running" in name or "num_batches" in name:
            assert torch.equal(ours.state_dict()[name], value), name
    _consistent(ours)


@pytest.mark.parametrize("spec", ["mbn", "cbn", "bn"])
def test_update_bn_under_the_nonfinite_guard_skips_a_nan_batch(spec):
    """With ``N.set_nonfinite_guard(True)`` a batch with non-finite statistics leaves every buffer
    untouched: the pass then equals one over the finite batches alone."""
    good = _batches(3)
    bad = good[1].clone()
    bad[0, 0, 0, 0] = float("nan")
    guarded, reference = _trained(spec), _trained(spec)
    previous = N.set_nonfinite_guard(True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            N.update_bn([good[0], bad, good[2]], guarded)
    finally:
        N.set_nonfinite_guard(previous)
    N.update_bn([good[0], good[2]], reference)
    for (name, a), b in zip(guarded[1].state_dict().items(), reference[1].state_dict().values()):
        assert torch.equal(a, b), name


def test_lightning_swa_callback_writes_cbn_statistics_with_the_averaged_beta():
    """cbn's second moment (Peng et al., Eq. 9) holds β. Lightning's statistics epoch ends with an
    optimizer step on stale gradients, so β must be the averaged one again before it is read."""
    from bnlab.integrations.lightning import StochasticWeightAveraging
    module, _ = _lightning_run(("cbn(center=false)", "cbn"), StochasticWeightAveraging)
    _consistent(module)
