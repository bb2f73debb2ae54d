"""Every layer where torch's BatchNorm runs: under ``torch.inference_mode`` and ``torch.no_grad``,
and with its affine parameters frozen.

``nn.BatchNorm2d`` runs in training mode under ``torch.inference_mode`` (BN recalibration, a
Lightning ``validate``/``predict`` loop with ``track_running_stats=False`` layers, which use batch
statistics in eval mode too). bnlab's fused path used to build its per-channel coefficient graph
there and failed ("Inference tensors cannot be saved for backward") for every variant on tensors of
65,536 elements or more. Where no backward can follow, the coefficients are now taken without a
graph; the output and the buffers must be exactly those of a call with grad enabled (to rounding on
the plain path, whose statistics without grad come from torch's kernel).
"""

from __future__ import annotations

import contextlib
import copy
import warnings

import pytest
import torch

from bnlab.norms import plain_autograd
from bnlab.norms.tools.bench import _layer
from bnlab.norms.registry import REGISTRY

SPECS = sorted(name for name, info in REGISTRY.items()
               if info.kind == "channel" and name not in ("none", "si_bn", "wn")) + [
    "cbn(decouple=false)", "lp_bn(p=1)", "lp_bn(p=inf)", "si_bn"]
# 131,072 elements: the fused path on the CPU; 1,000: the plain one
FUSED, PLAIN = (32, 64, 8, 8), (100, 10)


def _pair(spec: str, shape, mode: str):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer = _layer(spec, shape)
    if mode == "eval_batch_stats":  # eval with batch statistics: track_running_stats=False
        layer.track_running_stats = False
        layer.eval()
    return layer, copy.deepcopy(layer)


@pytest.mark.parametrize("shape", [FUSED, PLAIN], ids=["fused", "plain"])
@pytest.mark.parametrize("mode", ["train", "eval_batch_stats"])
@pytest.mark.parametrize("context", ["inference_mode", "no_grad"])
@pytest.mark.parametrize("spec", SPECS)
def test_a_layer_runs_without_grad_as_it_runs_with_it(spec, context, mode, shape):
    if spec == "noisy_bn":
        pytest.skip("its noise draws differ between the two copies' calls by design")
    without, with_grad = _pair(spec, shape, mode)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 2 + 1
    guard = torch.inference_mode if context == "inference_mode" else torch.no_grad
    with guard():
        y = without(x)
    expected = with_grad(x.clone().requires_grad_())
    # the fused path: bit for bit. The plain one takes its statistics from torch's
    # double-accumulating kernel when grad is off (one call, not a two-pass graph): to rounding
    same = torch.equal if shape == FUSED else torch.testing.assert_close
    assert same(y, expected.detach()) is not False
    for (name, a), (_, b) in zip(without.named_buffers(), with_grad.named_buffers()):
        assert same(a, b) is not False, name
    # the layer trains afterwards: nothing it keeps became an inference tensor
    assert not any(t.is_inference() for t in [*without.parameters(), *without.buffers()])
    without.train()
    out = without(x.clone().requires_grad_())
    out.square().sum().backward()
    assert all(p.grad is not None for p in without.parameters() if p.requires_grad)


@pytest.mark.parametrize("frozen", [("weight",), ("bias",), ("weight", "bias")],
                         ids=["weight", "bias", "both"])
@pytest.mark.parametrize("spec", SPECS)
def test_frozen_affine_parameters_train_as_on_the_plain_path(spec, frozen):
    """Fine-tuning with BN's γ and/or β frozen (``requires_grad_(False)``). ``mean_only_bn``'s scale
    is γ itself and ``var_only_bn``'s shift β itself: with them frozen the fused backward handed the
    autograd engine an output without a graph and failed ("element 0 of tensors does not require
    grad"). Every layer's gradients must equal the plain autograd path's."""
    if spec == "noisy_bn":
        pytest.skip("its noise draws differ between the two copies' calls by design")
    fused_layer, plain_layer = _pair(spec, FUSED, "train")
    grads = []
    for layer, context in ((fused_layer, contextlib.nullcontext), (plain_layer, plain_autograd)):
        for name, p in layer.named_parameters():
            if name.rsplit(".", 1)[-1] in frozen:
                p.requires_grad_(False)
        x = (torch.randn(FUSED, generator=torch.Generator().manual_seed(1)) * 2 + 1
             ).requires_grad_()
        with context():
            y = layer(x)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        grads.append([x.grad] + [p.grad for p in layer.parameters() if p.requires_grad])
    assert len(grads[0]) == len(grads[1])
    # to float32 rounding on each gradient's scale (si_bn's conv weight: ~160)
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("spec", ["mbn", "cbn", "brn"])
def test_compiled_under_inference_mode_then_trained(spec):
    """Under torch.compile the layers that write buffers their graph reads (mbn's moving moments,
    cbn's AMAT statistics, brn's running ones) rebind them to new tensors
    (``ChannelNorm.write_buffer``). Under ``inference_mode`` a rebound buffer was an inference
    tensor, and the next compiled training step failed to save it for backward. Now: in place
    there, and every buffer equals the eager layer's after both calls."""
    compiled_layer, eager_layer = _pair(spec, FUSED, "train")
    compiled = torch.compile(compiled_layer, backend="aot_eager", fullgraph=True)
    x = torch.randn(FUSED, generator=torch.Generator().manual_seed(1)) * 2 + 1
    for layer in (compiled, eager_layer):
        with torch.inference_mode():
            layer(x)
        layer(x.clone().requires_grad_()).square().sum().backward()
    assert not any(t.is_inference() for t in compiled_layer.buffers())
    for (name, a), (_, b) in zip(compiled_layer.named_buffers(), eager_layer.named_buffers()):
        torch.testing.assert_close(a, b, msg=name)


STATEFUL = ("mbn", "cbn", "cbn(decouple=false)", "brn")  # their training step reads what it updates


class _ForwardInBackward(torch.autograd.Function):
    """Runs a layer's training forward inside backward: a recomputation that is not
    torch.utils.checkpoint's, so no record of the first pass exists."""

    @staticmethod
    def forward(ctx, x, layer):
        ctx.layer = layer
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        ctx.layer(torch.ones(g.shape))
        return g, None


@pytest.mark.parametrize("spec", [*STATEFUL, "noisy_bn"])
def test_an_unknown_recomputation_in_backward_is_still_refused(spec):
    """torch.utils.checkpoint's recomputation replays the first pass's state (test_norms_checkpoint
    .py); a training forward run inside backward by anything else has no such record, and for a
    layer whose step reads what it updates (or draws from its own generator) it raises, naming the
    remedy, rather than giving silently wrong gradients."""
    layer, _ = _pair(spec, (16, 8, 4, 4), "train")
    x = torch.randn(16, 8, 4, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="outside checkpointed regions"):
        _ForwardInBackward.apply(x, layer).sum().backward()


@pytest.mark.parametrize("spec", [s for s in SPECS if s != "noisy_bn" and s not in STATEFUL])
def test_checkpointed_layers_give_the_gradients_of_the_plain_forward(spec):
    from torch.utils.checkpoint import checkpoint

    checkpointed, plain = _pair(spec, FUSED, "train")
    x = torch.randn(FUSED, generator=torch.Generator().manual_seed(1)) * 2 + 1
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    checkpoint(checkpointed, xa, use_reentrant=False).square().sum().backward()
    plain(xb).square().sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad)
