"""The worked example of docs/readme/writing-a-variant.md (docs/examples/my_variant.py) runs as the
page says: train/eval, autocast (bf16, CPU), torch.compile, synced statistics and fold, each held
to a reference the example does not define — torch's BatchNorm2d where the variant reduces to it,
the float64 formula of its running-statistics update, the unsynced layer on the whole batch, and
the unfolded model."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import bnlab.norms as N
from tests.distributed_harness import run_ranks

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "my_variant.py"
SHAPE = (6, 3, 4, 4)


def _example():
    """The example's class, its file imported as the module ``my_variant`` (once: dynamo looks
    the module up by name)."""
    if "my_variant" not in sys.modules:
        spec = importlib.util.spec_from_file_location("my_variant", EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        sys.modules["my_variant"] = module
        spec.loader.exec_module(module)
    return sys.modules["my_variant"].WarmStartBatchNorm


def _batches(count: int, seed: int = 0, shape=SHAPE) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) * (1 + k) + k for k in range(count)]


def _warm_start_truth(batches, momentum: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The running statistics by the docstring's rule, in float64."""
    mean = torch.zeros(SHAPE[1], dtype=torch.float64)
    var = torch.ones(SHAPE[1], dtype=torch.float64)
    for t, x in enumerate(batches, start=1):
        xd = x.double().transpose(0, 1).flatten(1)
        m = max(momentum, 1 / t)
        mean = (1 - m) * mean + m * xd.mean(1)
        var = (1 - m) * var + m * xd.var(1, unbiased=True)
    return mean, var


def test_train_and_eval_against_torch_batchnorm_and_the_float64_update():
    torch.manual_seed(0)
    layer, ref = _example()(3), nn.BatchNorm2d(3)
    with torch.no_grad():
        for p in (layer.weight, ref.weight):
            p.copy_(torch.linspace(0.5, 2.0, 3))
    batches = _batches(4)
    for x in batches:  # training: output and gradients are BatchNorm's
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = layer(xa), ref(xb)
        torch.testing.assert_close(ya, yb, rtol=1e-5, atol=1e-5)
        w = torch.cos(torch.arange(x.numel(), dtype=x.dtype)).view_as(x)
        (ya * w).sum().backward()
        (yb * w).sum().backward()
        torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(layer.weight.grad, ref.weight.grad, rtol=1e-4, atol=1e-5)
    mean, var = _warm_start_truth(batches, 0.1)
    torch.testing.assert_close(layer.running_mean.double(), mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(layer.running_var.double(), var, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ref.running_mean, layer.running_mean, atol=1e-2)  # the update differs
    with torch.no_grad():  # eval: BN with the running statistics (torch's, given ours)
        ref.running_mean.copy_(layer.running_mean)
        ref.running_var.copy_(layer.running_var)
    layer.eval(), ref.eval()
    x = _batches(1, seed=5)[0]
    torch.testing.assert_close(layer(x), ref(x), rtol=0, atol=0)


def test_autocast_bf16_on_the_cpu_keeps_the_input_dtype_and_bn_values():
    torch.manual_seed(0)
    conv, layer = nn.Conv2d(3, 3, 1), _example()(3)
    x = _batches(1)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = conv(x)
        y = layer(h)
    assert h.dtype == y.dtype == torch.bfloat16 and layer.running_mean.dtype == torch.float32
    hd = h.double()
    truth = (hd - hd.mean((0, 2, 3), keepdim=True)) / (hd.var((0, 2, 3), unbiased=False,
                                                            keepdim=True) + 1e-5).sqrt()
    torch.testing.assert_close(y.double(), truth, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(layer.running_mean.double(), hd.mean((0, 2, 3)), rtol=1e-5,
                               atol=1e-5)


def test_torch_compile_matches_eager_outputs_gradients_and_buffers():
    torch.manual_seed(0)
    eager = _example()(3)
    compiled_layer = _example()(3)
    compiled_layer.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_layer, backend="aot_eager")
    for x in _batches(3):
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = eager(xa), compiled(xb)
        torch.testing.assert_close(yb, ya, rtol=1e-5, atol=1e-5)
        ya.pow(2).sum().backward()
        yb.pow(2).sum().backward()
        torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-4, atol=1e-5)
    for name, buffer in eager.named_buffers():
        torch.testing.assert_close(compiled_layer.get_buffer(name), buffer, rtol=1e-6, atol=1e-6)


def _synced_rank(rank: int, world: int) -> dict[str, float]:
    """This rank's rows of the batch through a synced layer, against the unsynced layer on the
    whole batch (one process: the reference)."""
    cls = _example()
    split = [4, 8]  # uneven: an unsynced layer on either part would be off
    x = _batches(1, shape=(sum(split), 3, 2, 2))[0]
    torch.manual_seed(0)
    whole, synced = cls(3), cls(3, sync=True)
    synced.load_state_dict(whole.state_dict())
    lo = sum(split[:rank])
    part = x[lo:lo + split[rank]].clone().requires_grad_()
    y_part, y_whole = synced(part), whole(x)
    y_part.sum().backward()
    return {"output": (y_part - y_whole[lo:lo + split[rank]]).abs().max().item(),
            "running_var": (synced.running_var - whole.running_var).abs().max().item(),
            "alone": (cls(3)(part.detach()) - y_whole[lo:lo + split[rank]]).abs().max().item()}


def test_synced_statistics_equal_one_process_on_the_whole_batch():
    ranks = run_ranks(2, _synced_rank, timeout=120)
    for result in ranks:
        assert result["output"] < 1e-5 and result["running_var"] < 1e-5, result
        assert result["alone"] > 1e-2  # without the sync the parts are normalized differently


def test_fold_into_the_convolution_gives_the_eval_output():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), _example()(4), nn.ReLU())
    for x in _batches(3):
        model(x)
    folded, report = N.fold(model, report=True)
    assert len(report.folded) == 1 and not report.unfolded, str(report)
    x = _batches(1, seed=9)[0]
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(folded(x), model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("momentum", [None, 0.5])
def test_momentum_none_and_large_momentum_follow_the_rule(momentum):
    layer = _example()(3, momentum=momentum)
    batches = _batches(3)
    for x in batches:
        layer(x)
    mean, _ = _warm_start_truth(batches, momentum or 0.0)
    torch.testing.assert_close(layer.running_mean.double(), mean, rtol=1e-5, atol=1e-6)
