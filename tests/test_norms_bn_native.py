"""``bn`` trains through torch's BatchNorm kernel; the shared tensor-op path stays its equal.

:meth:`bnlab.norms.BatchNorm.native_batch_norm` (small tensors at native speed) must give
the same outputs, gradients and buffers as the shared path the variants use
(:meth:`~bnlab.norms.variants.base.ChannelNorm.normalize_with_batch_stats`, reached here through a
subclass), in every option combination, and support double backward without ``plain_autograd``
(checked against finite differences in float64).
"""

from __future__ import annotations

import pytest
import torch

import bnlab.norms as N
from bnlab.norms.tools.opcount import count_ops


class SharedPathBatchNorm(N.BatchNorm):
    """``bn`` on the shared path: a subclass overriding ``coefficients`` leaves torch's kernel."""

    def coefficients(self, mean, var, gamma, beta):  # overridden: the shared path
        return super().coefficients(mean, var, gamma, beta)


def _pair(**options):
    torch.manual_seed(0)
    native = N.BatchNorm(6, **options)
    shared = SharedPathBatchNorm(6, **options)
    shared.load_state_dict(native.state_dict())
    if native.weight is not None:
        with torch.no_grad():
            for layer in (native, shared):
                layer.weight.copy_(torch.linspace(0.5, 1.5, 6))
                if layer.bias is not None:
                    layer.bias.copy_(torch.linspace(-0.2, 0.3, 6))
    return native, shared


def _steps(layer, dtype, steps=3):
    """Three training steps on (8, 6, 4, 4) inputs: outputs, input and parameter grads, buffers."""
    out = []
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x = (torch.randn(8, 6, 4, 4, generator=g) * 3 + 2).to(dtype).requires_grad_()
        y = layer(x)
        params = [p for p in layer.parameters()]
        grads = torch.autograd.grad(y.float().pow(2).sum(), [x, *params])
        out += [y.detach().float(), *(g.float() for g in grads)]
    return out + [b.clone().float() for b in layer.buffers()]


OPTIONS = [{}, {"momentum": None}, {"affine": False}, {"bias": False},
           {"track_running_stats": False}, {"eps": 1e-3, "momentum": 0.3}]


@pytest.mark.parametrize("options", OPTIONS,
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_path_equals_the_shared_path(options, dtype):
    native, shared = _pair(**options)
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 0.1, "rtol": 0.02}
    for a, b in zip(_steps(native, dtype), _steps(shared, dtype)):
        torch.testing.assert_close(a, b, **tol)


def test_buffers_kept_without_tracking_stay_untouched_in_training():
    """torch's rule: track_running_stats=False with buffers present trains on batch statistics and
    leaves the buffers (and the counter) alone."""
    layer = N.BatchNorm(4)
    layer.track_running_stats = False
    layer(torch.randn(16, 4))
    assert torch.equal(layer.running_mean, torch.zeros(4)) and int(layer.num_batches_tracked) == 0


def test_double_backward_without_plain_autograd_matches_finite_differences():
    layer = N.create("bn", 3).double()
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(4),
                    dtype=torch.float64).requires_grad_()
    (g,) = torch.autograd.grad(layer(x).pow(3).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.pow(2).sum(), x)  # Σg ≡ 0 for BN (shift invariance): use ‖g‖²

    def grad_sq(z):
        z = z.detach().requires_grad_()
        (gz,) = torch.autograd.grad(layer(z).pow(3).sum(), z)
        return gz.pow(2).sum()

    bump = torch.zeros_like(x)
    bump[0, 0] = 1e-6
    fd = (grad_sq(x + bump) - grad_sq(x - bump)) / 2e-6
    assert float(h[0, 0]) == pytest.approx(float(fd), rel=1e-5)


def test_a_training_step_is_torch_batchnorm_kernels():
    layer = N.BatchNorm(8)
    x = torch.randn(32, 8, requires_grad=True)
    names = count_ops(lambda: layer(x).sum().backward()).by_name()
    assert names.get("native_batch_norm") == 1 and names.get("native_batch_norm_backward") == 1
    assert sum(names.values()) <= 8, names
