"""``brn`` on small eager inputs trains through torch's BatchNorm kernel (small shapes).

Batch Renormalization's corrections r and d are stop-gradient (Ioffe 2017, Alg. 1), so
``γ((x − μ_B)/σ_B · r + d) + β`` is BN's output with weight ``γ r`` and bias ``β + γ d``, and its
gradient is torch's BatchNorm backward through that weight and bias. Where the fused operators do
not run (small CPU batches), :meth:`bnlab.norms.BatchRenorm.renorm_with_torch_kernel` takes that
route instead of the shared path's ~100 plain operations. Here it is held equal to the shared path
(``plain_autograd``), step by step through the r_max / d_max warm-up with the clips active.
"""

from __future__ import annotations

import pytest
import torch

import bnlab.norms as N
from bnlab.norms.tools.opcount import count_training_step

SPEC = "brn(relax_from=1, r_max_at=3, d_max_at=3, r_max=1.5, d_max=0.5)"
OPTIONS = [{}, {"momentum": None}, {"affine": False}, {"track_running_stats": False},
           {"momentum": 0.5, "eps": 1e-3}]


def _trace(layer, shape, plain: bool, dtype=torch.float32):
    """Five training steps on inputs whose mean and scale drift (so r and d clip), then one eval
    step: outputs, gradients of x and the parameters, and every buffer."""
    out = []
    for step in range(5):
        g = torch.Generator().manual_seed(step)
        x = (torch.randn(shape, generator=g) * (1 + step) + 2 * step).to(dtype).requires_grad_()
        grad = torch.randn(shape, generator=torch.Generator().manual_seed(50 + step)).to(dtype)
        if plain:
            with N.plain_autograd():
                y = layer(x)
        else:
            y = layer(x)
        params = list(layer.parameters())
        grads = torch.autograd.grad(y, [x, *params], grad)
        out += [y.detach().float(), *(t.float() for t in grads)]
    layer.eval()
    out.append(layer(torch.randn(shape, generator=torch.Generator().manual_seed(9))).detach())
    return out + [b.clone().float() for b in layer.buffers()]


@pytest.mark.parametrize("shape", [(64, 5), (8, 5, 3, 3)])
@pytest.mark.parametrize("options", OPTIONS,
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults")
def test_torch_kernel_route_equals_the_shared_path(shape, options):
    torch.manual_seed(0)
    a = N.create(SPEC, shape[1], **options)
    if a.weight is not None:
        with torch.no_grad():
            a.weight.copy_(torch.linspace(0.5, 1.5, shape[1]))
            a.bias.copy_(torch.linspace(-0.3, 0.2, shape[1]))
    b = N.create(SPEC, shape[1], **options)
    b.load_state_dict(a.state_dict())
    assert a.takes_torch_kernel(torch.empty(shape))
    for got, want in zip(_trace(a, shape, plain=False), _trace(b, shape, plain=True), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_clips_are_active_in_the_trace():
    """The comparison above means something only if r and d leave 1 and 0 and hit their limits."""
    layer = N.create(SPEC, 5)
    seen_r, seen_d = [], []
    for step in range(5):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(64, 5, generator=g) * (1 + step) + 2 * step
        mean_b, var_b = x.mean(0), x.var(0, unbiased=False)
        r, d = layer.corrections(mean_b, torch.sqrt(var_b + layer.eps))
        seen_r.append(r), seen_d.append(d)
        layer(x)
    r, d = torch.stack(seen_r), torch.stack(seen_d)
    assert (r - 1).abs().max() > 0.3 and (d.abs() - 0.5).abs().min() < 1e-6


def test_bf16_inputs_take_the_route_and_match():
    shape = (64, 4)
    a, b = N.create(SPEC, 4), N.create(SPEC, 4)
    for got, want in zip(_trace(a, shape, False, torch.bfloat16),
                         _trace(b, shape, True, torch.bfloat16), strict=True):
        torch.testing.assert_close(got, want, rtol=0.02, atol=0.05)


def test_plain_autograd_keeps_the_shared_path():
    """The torch-kernel route's operation count is pinned in tests/test_norms_opcount.py."""
    with N.plain_autograd():
        names = count_training_step(N.create("brn", 10), (1000, 10)).by_name()
    assert "native_batch_norm" not in names, names


def test_large_inputs_keep_the_fused_operators():
    x = torch.empty(32, 64, 16, 16)
    assert not N.create("brn", 64).takes_torch_kernel(x)
