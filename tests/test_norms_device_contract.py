"""Contracts of the CUDA kernels the fused path calls, checked on the CPU.

The GPU benchmark (benchmarks/gpu.py, H100, torch 2.11) found every BN-family layer crashing in fp32
eager mode on CUDA with "tensor does not have a device": ``native_batch_norm_backward`` accepts
``weight=None`` on the CPU but not on CUDA. No GPU runs the tests, so the CUDA contract is imposed
here on the CPU kernel: ``centred_reductions`` must pass a weight tensor.
"""

from __future__ import annotations

import torch

import bnlab.norms as N
import bnlab.norms.variants.base as norms_base
import bnlab.norms.engine.route as norms_route
from bnlab.norms.engine import kernels


def test_fused_backward_passes_a_weight_tensor_as_cuda_requires(monkeypatch):
    real = torch.ops.aten.native_batch_norm_backward

    class StrictOps:  # the CUDA kernel's behaviour: a None weight has no device
        @staticmethod
        def native_batch_norm_backward(g, x, weight, *rest):
            if weight is None:
                raise RuntimeError("tensor does not have a device")
            return real(g, x, weight, *rest)

    monkeypatch.setattr(norms_base.torch.ops, "aten", StrictOps)
    monkeypatch.setattr(norms_route, "FUSED_MIN_NUMEL", 0)
    layer = N.create("bn", 3).double()
    x = torch.randn(8, 3, 4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64,
                    requires_grad=True)
    grad = torch.autograd.grad(layer(x).pow(3).sum(), x)[0]
    monkeypatch.undo()
    with N.plain_autograd():
        xp = x.detach().requires_grad_()
        want = torch.autograd.grad(N.create("bn", 3).double()(xp).pow(3).sum(), xp)[0]
    torch.testing.assert_close(grad, want, rtol=1e-10, atol=1e-12)


def test_centred_reductions_equal_the_plain_sums():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 3, 6, generator=gen, dtype=torch.float64) * 3 + 100
    g = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    mean = x.mean((0, 2))
    total, dot = kernels.centred_reductions(g, x, mean)
    torch.testing.assert_close(total, g.sum((0, 2)))
    torch.testing.assert_close(dot, (g * (x - mean.view(1, -1, 1))).sum((0, 2)))
