"""After stochastic weight averaging: the running statistics of the averaged network.

torch's ``torch.optim.swa_utils.update_bn`` finds BatchNorm layers by ``isinstance(m, _BatchNorm)``.
bnlab's layers are not ``_BatchNorm`` on purpose (torch's ``convert_sync_batchnorm`` would turn a
variant into plain SyncBatchNorm), so ``update_bn`` skips them — with none of torch's layers in the
model it returns without running a batch, and their statistics stay those of the last network.
``bnlab.norms.recollect_running_stats`` is the drop-in: it must compute what ``update_bn`` computes
for torch's BatchNorm (the cumulative average over the batches, Ioffe & Szegedy's Alg. 2).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
from torch.optim.swa_utils import AveragedModel, update_bn

import bnlab.norms as N


def batches():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(64, 3, 6, 6, generator=gen) * 3 + 5 for _ in range(6)]


def network(norm: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), norm, nn.ReLU(), nn.Conv2d(8, 4, 1))


def test_update_bn_skips_bnlab_layers_as_documented():
    model = network(N.create("bn", 8))
    before = model[1].running_mean.clone()
    update_bn(batches(), model)
    assert torch.equal(model[1].running_mean, before)  # torch's behaviour, not ours: the reason
    # for the drop-in below


# the layers whose running statistics follow torch's rule (brn's and mbn's follow their papers')
@pytest.mark.parametrize("spec", ["bn", "noisy_bn"])
def test_recollect_running_stats_is_update_bn_for_bnlab_layers(spec):
    reference = AveragedModel(network(nn.BatchNorm2d(8)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = AveragedModel(network(N.create(spec, 8)))
    ours.module.load_state_dict(reference.module.state_dict(), strict=True)
    update_bn(batches(), reference)
    N.recollect_running_stats(ours, batches())
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(ours.module[1], name),
                                   getattr(reference.module[1], name), msg=name)
    x = batches()[0][:4]
    torch.testing.assert_close(ours.eval()(x), reference.eval()(x))
