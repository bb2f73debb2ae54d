"""bnlab's layers in a real PyTorch Lightning ``Trainer``: fit, validate and predict (CPU).

Lightning validates and predicts under ``torch.inference_mode``. A layer that normalizes with batch
statistics there (``track_running_stats=False``, as in eval mode) once failed on bnlab's fused path
("Inference tensors cannot be saved for backward"); ``nn.BatchNorm2d`` does not. The reference is
the same module with torch's BatchNorm: every bnlab layer must get through the same three calls,
and a layer computing BN (``bn``) must predict what torch's predicts.
"""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import bnlab.norms as N

if importlib.util.find_spec("torchvision") is not None:
    from tests.vision_shim import import_or_skip  # lightning → torchmetrics → torchvision

    import_or_skip("torchvision")
pl = pytest.importorskip("lightning.pytorch")


class Net(pl.LightningModule):
    """A conv layer of 32 channels on 16×16 inputs, batch 64: 524,288 elements, the fused path."""

    def __init__(self, spec: str, track: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        norm = (nn.BatchNorm2d(32, track_running_stats=track) if spec == "torch"
                else N.create(spec, 32, track_running_stats=track))
        self.net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), norm, nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

    def training_step(self, batch, _):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, _):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

    def predict_step(self, batch, _):
        return self.net(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit_validate_predict(spec: str, track: bool) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(128, 3, 16, 16, generator=gen),
                         torch.randint(0, 10, (128,), generator=gen))
    loader = DataLoader(data, batch_size=64)
    module = Net(spec, track)
    trainer = pl.Trainer(max_epochs=1, limit_val_batches=1, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, loader, loader)
        trainer.validate(module, loader, verbose=False)
        return torch.cat(trainer.predict(module, loader))


@pytest.mark.parametrize("track", [True, False], ids=["running_stats", "batch_stats_in_eval"])
@pytest.mark.parametrize("spec", ["bn", "mean_only_bn", "mbn", "cbn", "brn", "lp_bn", "noisy_bn"])
def test_a_layer_fits_validates_and_predicts_in_lightning(spec, track):
    predictions = fit_validate_predict(spec, track)
    assert predictions.shape == (128, 10) and torch.isfinite(predictions).all()
    if spec == "bn":
        torch.testing.assert_close(predictions, fit_validate_predict("torch", track))
