"""The models' dropout option (Luo et al. Fig. 7: dropout after each BN/WN block)."""

import pytest
import torch
import torch.nn as nn

import bnlab.models as M


def test_dropout_follows_every_normalized_block_and_only_acts_in_training():
    model = M.create("luo_cnn", norm="bn", input_shape=(1, 8, 8), num_classes=10, width=0.25,
                     dropout=0.25, seed=0)
    drops = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    norms = [m for m in model.modules() if type(m).__name__ == "BatchNorm"]
    assert len(drops) == len(norms) == 5 and all(d.p == 0.25 for d in drops)
    assert model.spec["dropout"] == 0.25
    x = torch.randn(16, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    model.eval()
    torch.testing.assert_close(model(x), model(x))
    model.train()
    torch.manual_seed(1)
    a = model(x)
    torch.manual_seed(2)
    assert not torch.allclose(a, model(x))
    assert not any(isinstance(m, nn.Dropout)
                   for m in M.create("mlp", input_shape=(4,), num_classes=2).modules())


@pytest.mark.parametrize("bad", [-0.1, 1.0, True, "0.5"])
def test_bad_dropout_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="dropout must be a probability"):
        M.create("mlp", input_shape=(4,), num_classes=2, dropout=bad)
