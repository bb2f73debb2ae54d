"""Mixed precision and sound statistics for every layer.

Every layer trains under CPU autocast (bfloat16) and takes float16/bfloat16 inputs; statistics are
two-pass and accumulated in float32 or better, checked against nn.BatchNorm2d and a float64
reference at large offsets and in half precision.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import bnlab.norms as N
import bnlab.norms.engine.route as norms_route

SPECS = ["bn", "native_bn", "mean_only_bn", "var_only_bn", "noisy_bn", "lp_bn(p=1)", "lp_bn(p=2)",
         "lp_bn(p=inf)", "mbn", "cbn", "cbn(amat=false)", "cbn(decouple=false, rho=2)",
         "cbn(center=false)", "cbn(eta=0.9)", "brn", "si_bn", "wn"]


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.fixture(params=["fused", "plain"])
def path(request, monkeypatch):
    monkeypatch.setattr(norms_route, "FUSED_MIN_NUMEL", 0 if request.param == "fused" else 1 << 62)
    return request.param


def block(spec: str, seed: int = 0) -> nn.Module:
    """conv → layer (the wrappers wrap the conv), progress set so AMAT and MBN's λ are active."""
    torch.manual_seed(seed)
    conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
    model = N.normalized(conv, spec) if spec in ("si_bn", "wn") \
        else nn.Sequential(conv, N.create(spec, 4))
    N.set_progress(model, lr=0.05, epoch=2, epochs=4)
    return model


@pytest.mark.parametrize("spec", SPECS)
def test_trains_under_bf16_autocast_like_a_float32_run(spec, path):
    x = torch.randn(8, 3, 6, 6, generator=gen(1))
    target = torch.randn(8, 4, 6, 6, generator=gen(2))
    grads, outputs = [], []
    for amp in (False, True):
        model = block(spec)
        for step in range(2):  # the second step uses moving statistics (cbn, mbn, brn)
            model.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                y = model(x + step)
            ((y.float() - target) ** 2).mean().backward()
        outputs.append(y)
        grads.append([p.grad.clone() for p in model.parameters()])
        for b in model.buffers():
            assert b.dtype in (torch.float32, torch.long)  # running buffers stay float32
    # nn.BatchNorm2d under the same autocast returns the conv's dtype: bfloat16
    assert outputs[1].dtype == torch.bfloat16 and outputs[0].dtype == torch.float32
    torch.testing.assert_close(outputs[1].float(), outputs[0], atol=0.1, rtol=0.05)
    for g32, g16 in zip(*grads):
        assert ((g16 - g32).norm() / g32.norm()) < 0.1  # bf16 conv backward alone is ~1e-2 off


def test_output_dtype_matches_native_under_autocast():
    torch.manual_seed(0)
    conv, native, ours = nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), N.create("bn", 4)
    x = torch.randn(8, 3, 4, 4, generator=gen(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = conv(x)
        assert ours(h).dtype == native(h).dtype == torch.bfloat16
        assert ours(h.float()).dtype == native(h.float()).dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("spec", [s for s in SPECS if s not in ("si_bn", "wn")])
def test_half_inputs_with_float32_and_half_modules(spec, dtype, path):
    x64 = torch.randn(16, 4, 5, 5, generator=gen(4), dtype=torch.float64) * 3 + 2
    ref = N.create(spec, 4).double()
    want = ref(x64.to(dtype).double())
    for half_module in (False, True):
        layer = N.create(spec, 4)
        if half_module:
            layer = layer.to(dtype)
        y = layer(x64.to(dtype))
        assert y.dtype == dtype
        if spec != "noisy_bn":  # (noise drawn in the input's dtype)
            torch.testing.assert_close(y.double(), want, atol=0.05, rtol=0.02)
        if not half_module:
            torch.testing.assert_close(layer.running_mean.double(), ref.running_mean,
                                       atol=2e-3, rtol=1e-3)
            assert layer.running_mean.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_large_half_batch_does_not_overflow(dtype):
    """(128, 16, 32, 32) in float16 through the default path: Σx² once overflowed (zeros, inf
    running_var)."""
    x = torch.randn(128, 16, 32, 32, generator=gen(5)).to(dtype)
    layer = N.create("bn", 16).to(dtype)
    y = layer(x)
    assert torch.isfinite(layer.running_var).all()
    assert abs(float(y.float().std()) - 1) < 0.02
    native = nn.BatchNorm2d(16).to(dtype)
    torch.testing.assert_close(y.float(), native(x).float(), atol=0.02, rtol=0.01)


@pytest.mark.parametrize("offset", [1e3, 1e4])
@pytest.mark.parametrize(
    "spec", ["bn", "mean_only_bn", "var_only_bn", "mbn", "cbn", "brn", "lp_bn(p=2)"])
def test_large_means_keep_the_variance(spec, offset, path):
    """At an offset of up to 1e4, float32 outputs, input gradients and running_var are as close to
    the same layer in float64 as nn.BatchNorm2d's float32 kernel is to float64 (its x·a + b rounds
    at |x|: 1e-4..1e-3 there). The old fused statistics (Σx² in float32) were off by 1.4e3 at offset
    3000."""
    x64 = torch.randn(32, 4, 8, 8, generator=gen(6), dtype=torch.float64) * 2 + offset
    g = torch.randn(x64.shape, generator=gen(7), dtype=torch.float64)

    def run(make, dt):
        torch.manual_seed(0)
        layer = make().to(dt)
        N.set_progress(layer, lr=0.05, epoch=2, epochs=4)
        xi = x64.to(dt).requires_grad_()
        y = layer(xi)
        rv = [b for k, b in layer.named_buffers() if k.endswith("running_var")][0]
        return y.double(), torch.autograd.grad(y, xi, g.to(dt))[0].double(), rv.double()

    def err(a, b):  # largest deviation in units of the reference's spread
        return float((a - b).abs().max() / b.std())

    make = lambda: N.create(spec, 4)  # noqa: E731
    (y64, g64, rv64), (y32, g32, rv32) = run(make, torch.float64), run(make, torch.float32)
    (ny64, ng64, _), (ny32, ng32, _) = (run(lambda: nn.BatchNorm2d(4), dt)
                                        for dt in (torch.float64, torch.float32))
    assert err(y32, y64) <= 3 * err(ny32, ny64) + 1e-6
    # var_only_bn keeps the mean, so its gradient carries Σg·x/σ³ terms of size |x|/σ: float32
    # rounds there
    conditioning = 1e-7 * offset if spec == "var_only_bn" else 0.0
    assert err(g32, g64) <= 3 * err(ng32, ng64) + conditioning + 1e-6
    torch.testing.assert_close(rv32, rv64, atol=1e-6, rtol=2e-5)
    if spec == "bn":
        torch.testing.assert_close(y32, ny32, atol=3e-3, rtol=0)
