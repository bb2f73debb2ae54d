"""Half-precision inputs on the fused path (few operations per call, for every layer).

Under autocast a convolution hands a norm layer float16/bfloat16 activations while the layer keeps
float32 parameters, as ``nn.BatchNorm`` does. The fused operators used to take float32/float64
inputs only, so every half step ran the plain path: 45–131 dispatched operations (each a kernel
launch on a GPU, where mixed precision is how people train) instead of 4–10. Now the statistics,
coefficients and gradient factors are float32 and each full-size result is computed in float32 and
rounded to half once, as torch's own kernels do. The reference is a float64 run of the same layer
on the same half values: the fused output and input gradient are within half an ulp of it.
"""

from __future__ import annotations

import contextlib
import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

import bnlab.norms as N
import bnlab.norms.engine.route as norms_route
from bnlab.norms.engine import coef_compile, kernels
from bnlab.norms.engine.kernels import batch_statistics
from bnlab.norms.tools.bench import _layer
from bnlab.norms.tools.opcount import count_training_step
from bnlab.norms.variants.renorm import BatchRenorm

SHAPE = (32, 64, 16, 16)  # the shape, above the CPU's FUSED_MIN_NUMEL
HALF = [torch.bfloat16, torch.float16]
BN_FAMILY = ["mean_only_bn", "var_only_bn", "mbn", "cbn", "cbn(decouple=false)",
             "cbn(center=false)"]
LP = ["lp_bn(p=1)", "lp_bn(p=inf)"]
FUSED_NODE = {"lp_bn(p=1)": "_LpNormalizeBackward", "lp_bn(p=inf)": "_LpNormalizeBackward"}


def _inputs(dtype: torch.dtype, shape=SHAPE, mean: float = 50.0) -> tuple[torch.Tensor, ...]:
    """Half input with a large mean (the centred forms must not cancel) and a half gradient."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=gen) * 3 + mean
    return x.to(dtype), torch.randn(shape, generator=gen).to(dtype)


def _run(spec: str, x: torch.Tensor, g: torch.Tensor, dtype=torch.float32, steps: int = 3,
         memory_format=torch.contiguous_format):
    """``steps`` training steps of a freshly built layer (γ, β drawn in float32, then cast to
    ``dtype``), so buffers the step reads (moving moments, AMAT, running statistics) have moved."""
    gen = torch.Generator().manual_seed(0)
    layer = _layer(spec, x.shape)
    with torch.no_grad():
        layer.weight.copy_(torch.rand(layer.num_features, generator=gen) + 0.5)
        layer.bias.copy_(torch.rand(layer.num_features, generator=gen) * 2 - 1)
    if hasattr(layer, "epochs"):
        N.set_progress(layer, epoch=3, epochs=10)
    if hasattr(layer, "amat"):
        N.set_progress(layer, lr=0.1)
    layer = layer.to(dtype)
    for _ in range(steps):
        xx = x.detach().to(dtype if dtype == torch.float64 else x.dtype)
        xx = xx.contiguous(memory_format=memory_format).clone().requires_grad_()
        y = layer(xx)
        y.backward(g.to(y.dtype).contiguous(memory_format=memory_format))
    return SimpleNamespace(y=y.detach(), gx=xx.grad, node=type(y.grad_fn).__name__,
                           gw=layer.weight.grad, gb=layer.bias.grad,
                           buffers={k: v for k, v in layer.state_dict().items()
                                    if v.is_floating_point()})


def _within_half_an_ulp(got: torch.Tensor, truth: torch.Tensor) -> None:
    """|got − truth| ≤ ½ eps·|truth| elementwise (half an ulp of a correctly rounded result), plus
    a float32-sized allowance for the rounding of what precedes the final rounding."""
    eps = torch.finfo(got.dtype).eps
    t = truth.double()
    err = (got.double() - t).abs()
    bound = 0.5 * eps * t.abs() + 1e-3 * eps * t.abs().max()
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"{worst:.2f}× the half-ulp bound"


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("spec", BN_FAMILY + LP)
def test_half_inputs_dispatch_as_few_operations_as_float32(spec, dtype):
    """Before: 45–131 operations a half step (the plain path); now the float32 count."""
    torch.manual_seed(0)
    half = count_training_step(_layer(spec, SHAPE), SHAPE, dtype=dtype)
    torch.manual_seed(0)
    full = count_training_step(_layer(spec, SHAPE), SHAPE)
    assert half.total <= (24 if spec in LP else 16), half.by_name()
    assert half.total == full.total, (half.by_name(), full.by_name())


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("spec", BN_FAMILY + LP)
def test_half_fused_step_is_within_half_an_ulp_of_float64(spec, dtype):
    """Output and input gradient against the float64 layer on the same half values; the float32
    parameter gradients and buffers against it to float32 accuracy."""
    x, g = _inputs(dtype)
    fused = _run(spec, x, g)
    truth = _run(spec, x, g, dtype=torch.float64)
    assert fused.node == FUSED_NODE.get(spec, "_StatsAffineBackward")
    assert fused.y.dtype == fused.gx.dtype == dtype
    _within_half_an_ulp(fused.y, truth.y)
    _within_half_an_ulp(fused.gx, truth.gx)
    for got, want in [(fused.gw, truth.gw), (fused.gb, truth.gb)]:
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4 * want.abs().max())
    for name, value in fused.buffers.items():
        want = truth.buffers[name]
        torch.testing.assert_close(value.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max(),
                                   msg=name)


@pytest.mark.parametrize("spec", ["mbn", "lp_bn(p=1)", "lp_bn(p=inf)"])
def test_half_channels_last_keeps_its_layout_and_values(spec):
    x, g = _inputs(torch.bfloat16)
    dense = _run(spec, x, g, steps=1)
    last = _run(spec, x, g, steps=1, memory_format=torch.channels_last)
    assert last.node == dense.node
    for got, want in [(last.y, dense.y), (last.gx, dense.gx)]:
        assert got.is_contiguous(memory_format=torch.channels_last)
        eps = torch.finfo(torch.bfloat16).eps
        torch.testing.assert_close(got.float(), want.float(), rtol=eps,
                                   atol=eps * want.float().abs().max().item())


def test_ties_put_the_linf_gradient_where_the_plain_path_does():
    """Integer-valued half activations tie everywhere: the top-k entries (and so the scale's
    gradient) are chosen lowest index first on both paths (bnlab.norms.engine.sync.topk_first)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(-3, 4, SHAPE, generator=gen).to(torch.bfloat16)
    g = torch.randn(SHAPE, generator=gen).to(torch.bfloat16)
    fused = _run("lp_bn(p=inf)", x, g, steps=1)
    with N.plain_autograd():
        plain = _run("lp_bn(p=inf)", x, g, steps=1)
    assert fused.node == "_LpNormalizeBackward" and plain.node != fused.node
    eps = torch.finfo(torch.bfloat16).eps
    for got, want in [(fused.y, plain.y), (fused.gx, plain.gx)]:
        torch.testing.assert_close(got.float(), want.float(), rtol=eps,
                                   atol=eps * want.float().abs().max().item())


@pytest.mark.parametrize("no_grad", [torch.no_grad, torch.inference_mode])
def test_half_forward_without_grad_is_the_training_forward(no_grad):
    x, _ = _inputs(torch.float16)
    with_grad, without = N.create("mbn", 64), N.create("mbn", 64)
    for layer in (with_grad, without):
        N.set_progress(layer, epoch=2, epochs=5)
    y = with_grad(x.requires_grad_())
    with no_grad():
        y_off = without(x.detach())
    assert torch.equal(y.detach(), y_off)
    for name, value in with_grad.state_dict().items():
        assert torch.equal(value, without.state_dict()[name]), name


def test_autocast_network_hands_the_layers_half_inputs_on_the_fused_path():
    """The way people train: conv → norm → ReLU under autocast; each norm layer sees bfloat16 and
    takes the fused operators, and the weights' gradients are the plain path's (the old half
    route) to 0.5 % (a float32 step differs from either by 4–11 %: bfloat16 convolutions)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), N.create("cbn", 16), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1), N.create("lp_bn(p=1)", 16))
    reference = copy.deepcopy(model)
    seen = []

    def record(module, args, out):
        seen.append((args[0].dtype, type(out.grad_fn).__name__))
    for layer in (model[1], model[4]):
        layer.register_forward_hook(record)
    x = torch.randn(32, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x).float().square().mean().backward()
        with N.plain_autograd():
            reference(x).float().square().mean().backward()
    assert seen == [(torch.bfloat16, "_StatsAffineBackward"),
                    (torch.bfloat16, "_LpNormalizeBackward")]
    for (name, got), want in zip(model.named_parameters(), reference.parameters()):
        assert torch.isfinite(got.grad).all(), name
        if name.endswith("weight"):  # (a conv bias before a norm layer has gradient 0: noise)
            assert (got.grad - want.grad).norm() <= 5e-3 * want.grad.norm(), name


def test_brn_takes_torchs_kernel_for_half_on_the_cpu_and_the_fused_path_elsewhere():
    """On the CPU torch's half BatchNorm kernel is fast and the fused operators' fixed cost is
    not (1.2–1.7× against 1.9–5.6× native BN, docs: benchmarks): brn keeps its torch-kernel route
    there.
    On a GPU kernel launches count, and half inputs take the fused operators; that route, run on
    the CPU, is as exact as the other variants'."""
    layer = N.create("brn", 64)
    half_cpu = torch.empty(SHAPE, dtype=torch.bfloat16)
    assert layer.takes_torch_kernel(half_cpu)
    for dtype in HALF:  # r, d and the running update inside one operator
        torch.manual_seed(0)
        assert count_training_step(_layer("brn", SHAPE), SHAPE, dtype=dtype).total <= 16
    assert not layer.takes_torch_kernel(torch.empty(SHAPE))
    on_cuda = SimpleNamespace(numel=lambda: half_cpu.numel(), device=torch.device("cuda"),
                              dtype=torch.bfloat16)
    assert not layer.takes_torch_kernel(on_cuda)
    x, g = _inputs(torch.bfloat16)
    original = BatchRenorm.takes_torch_kernel
    try:
        BatchRenorm.takes_torch_kernel = lambda self, x: False  # the GPU's route, on the CPU
        fused = _run("brn(relax_from=0, r_max_at=1, d_max_at=1)", x, g)
        counted = count_training_step(_layer("brn", SHAPE), SHAPE, dtype=torch.bfloat16)
    finally:
        BatchRenorm.takes_torch_kernel = original
    truth = _run("brn(relax_from=0, r_max_at=1, d_max_at=1)", x, g, dtype=torch.float64)
    assert fused.node == "_StatsAffineBackward" and counted.total <= 16
    _within_half_an_ulp(fused.y, truth.y)
    _within_half_an_ulp(fused.gx, truth.gx)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_batch_statistics_of_half_inputs_are_float32(dtype):
    """torch's statistics kernel returns half statistics for a half input unless handed float32
    running buffers; bnlab hands it scratch ones and gets float32 statistics of the half values."""
    x, _ = _inputs(dtype, mean=1e3)
    mean, var = batch_statistics(x)
    assert mean.dtype == var.dtype == torch.float32
    exact = x.double()
    torch.testing.assert_close(mean.double(), exact.mean((0, 2, 3)), rtol=1e-6, atol=0)
    # float accumulation (the kernel's, as in nn.BatchNorm's half path), stable at a mean of 1e3
    # with σ = 3: a float32-sized error, where Σx² − (Σx)²/n would lose ~1e-2
    torch.testing.assert_close(var.double(), exact.var((0, 2, 3), unbiased=False), rtol=1e-4,
                               atol=0)
    full = x.float()
    assert all(torch.equal(a, b) for a, b in zip(batch_statistics(full),
                                                 torch.batch_norm_update_stats(full, None, None,
                                                                               0.0)))


@pytest.mark.parametrize("dtype", HALF + [torch.float32], ids=str)
@pytest.mark.parametrize("spec", ["mbn", "lp_bn(p=1)", "lp_bn(p=inf)"])
def test_other_devices_affine_formulas_agree_with_the_cpu_kernels(spec, dtype, monkeypatch):
    """Off the CPU the affine passes are ``addcmul`` (promoting half x to float32, rounding once)
    instead of torch's inference BatchNorm kernel: those formulas, run on the CPU, give the CPU's
    values to an ulp and half-precision results within half an ulp of float64."""
    x, g = _inputs(dtype)
    cpu = _run(spec, x, g)
    monkeypatch.setattr(kernels, "BATCH_NORM_AFFINE_DEVICES", ())
    generic = _run(spec, x, g)
    eps = torch.finfo(dtype).eps
    for got, want in [(generic.y, cpu.y), (generic.gx, cpu.gx)]:
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), want.double(), rtol=eps,
                                   atol=eps * want.abs().max().item())
    if dtype != torch.float32:
        truth = _run(spec, x, g, dtype=torch.float64)
        _within_half_an_ulp(generic.y, truth.y)
        _within_half_an_ulp(generic.gx, truth.gx)


@pytest.mark.parametrize("spec", ["mbn", "cbn"])
def test_half_inputs_with_compiled_coefficients(spec, monkeypatch):
    """CUDA's default (``BNLAB_COMPILE_COEFFICIENTS=auto``): the per-channel math compiled, here
    with dynamo's ``aot_eager`` backend on the CPU. Half inputs give what the eager per-channel
    path gives, and the compiled functions ran."""
    monkeypatch.setenv("BNLAB_COEF_BACKEND", "aot_eager")
    monkeypatch.setattr(norms_route, "FUSED_MIN_NUMEL", 0)
    x, g = _inputs(torch.bfloat16, shape=(8, 16, 4, 4))
    monkeypatch.setenv("BNLAB_COMPILE_COEFFICIENTS", "0")
    eager = _run(spec, x, g)
    monkeypatch.setenv("BNLAB_COMPILE_COEFFICIENTS", "1")
    coef_compile.reset()
    before = dict(coef_compile.CALLS)
    compiled = _run(spec, x, g)
    calls = {k: v - before.get(k, 0) for k, v in coef_compile.CALLS.items()}
    coef_compile.reset()
    assert calls == {"forward": 3, "backward": 3}, calls
    eps = torch.finfo(torch.bfloat16).eps
    for got, want in [(compiled.y, eager.y), (compiled.gx, eager.gx)]:
        torch.testing.assert_close(got.double(), want.double(), rtol=eps,
                                   atol=eps * want.abs().max().item())
    for got, want in [(compiled.gw, eager.gw), (compiled.gb, eager.gb)]:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    truth = _run(spec, x, g, dtype=torch.float64)
    _within_half_an_ulp(compiled.y, truth.y)
    _within_half_an_ulp(compiled.gx, truth.gx)


@pytest.mark.parametrize("spec", ["mean_only_bn", "mbn", "cbn", "lp_bn(p=inf)"])
def test_half_step_saves_only_its_half_input_for_backward(spec):
    """The fused step keeps x itself (half) for backward; the plain path it replaces kept float32
    copies of the input and the centred input: 4× the bytes (5.3× for ℓ∞)."""
    x, _ = _inputs(torch.bfloat16)

    def saved_bytes(plain: bool) -> int:
        layer, storages = _layer(spec, SHAPE), {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with N.plain_autograd() if plain else contextlib.nullcontext():
                layer(x.detach().requires_grad_())
        return sum(storages.values())
    x_bytes = x.numel() * x.element_size()
    per_channel_allowance = 8 * 8 * SHAPE[1]  # a few (C,) statistics and parameters
    assert x_bytes <= saved_bytes(plain=False) <= x_bytes + per_channel_allowance
    assert saved_bytes(plain=True) >= 4 * x_bytes


@pytest.mark.parametrize("shape", [(8192, 8), (4, 16, 8, 16, 16)], ids=["2d", "5d"])
@pytest.mark.parametrize("spec", ["cbn", "lp_bn(p=1)", "lp_bn(p=inf)"])
def test_half_inputs_of_other_ranks(spec, shape):
    """(N, C) and (N, C, D, H, W) half inputs (ℓ∞'s one-value-per-row search on the former)."""
    x, g = _inputs(torch.float16, shape=shape)
    fused, truth = _run(spec, x, g), _run(spec, x, g, dtype=torch.float64)
    assert fused.node == FUSED_NODE.get(spec, "_StatsAffineBackward")
    _within_half_an_ulp(fused.y, truth.y)
    _within_half_an_ulp(fused.gx, truth.gx)
