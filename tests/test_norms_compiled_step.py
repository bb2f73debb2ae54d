"""The compiled training step (bnlab.norms.engine.compiled_step) computes what the eager layer
computes, runs only where it should, and keeps torch's behaviour around it.

The reference is the layer's own eager step on the same inputs (float64: agreement to rounding,
1e-12 relative; float32: inductor's reductions round differently, 1e-5). Each build compiles for
1–3 s, so the shapes are few and reused (the compiled steps are shared by key).
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import bnlab.norms as N
import bnlab.norms.engine.route as norms_route
from bnlab.norms.engine import compiled_step as cs
from bnlab.norms.engine import switches
from bnlab.norms.tools.opcount import count_ops

pytestmark = pytest.mark.filterwarnings("ignore:(mbn|cbn).*:UserWarning")

F64_SPECS = ["mean_only_bn", "var_only_bn", "mbn", "cbn", "cbn(decouple=false)",
             "cbn(center=false)", "cbn(eta=0.9)", "cbn(amat=false)",
             "brn(relax_from=1, r_max_at=3, d_max_at=3)", "lp_bn", "lp_bn(p=1)", "lp_bn(p=inf)",
             "mbn(momentum=none, affine=false)", "cbn(bias=false, track_running_stats=false)"]


def pair(spec: str, c: int, dtype=torch.float64):
    """Two equal layers (γ, β away from 1, 0), with training progress (mbn's λ, cbn's η > 0)."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = N.create(spec, c).to(dtype)
    compiled = N.create(spec, c).to(dtype)
    compiled.load_state_dict(eager.state_dict())
    for layer in (eager, compiled):
        with torch.no_grad():
            if layer.weight is not None:
                layer.weight.copy_(torch.linspace(0.5, 1.5, c))
            if layer.bias is not None:
                layer.bias.copy_(torch.linspace(-1, 1, c))
        N.set_progress(layer, lr=0.05, epoch=3, epochs=10)
    return eager, compiled


def rel(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    if a is None or b is None:
        assert a is None and b is None
        return 0.0
    return ((a.double() - b.double()).abs().max() / (a.double().abs().max() + 1e-30)).item()


def train_both(eager, compiled, shape, steps=3, dtype=torch.float64, x_grad=True) -> float:
    """The largest relative difference over ``steps`` training steps: output, input and parameter
    gradients, every buffer; asserts the compiled step ran each time."""
    gen, worst = torch.Generator().manual_seed(1), 0.0
    for _ in range(steps):
        x = torch.randn(shape, generator=gen, dtype=dtype) * 2 + 1
        xe, xc = x.clone().requires_grad_(x_grad), x.clone().requires_grad_(x_grad)
        before = dict(cs.CALLS)
        ye = eager(xe)
        with N.compiled_steps():
            yc = compiled(xc)
        grad = torch.randn(shape, generator=gen, dtype=dtype)
        ye.backward(grad)
        yc.backward(grad)
        assert cs.CALLS["forward"] == before["forward"] + 1
        assert cs.CALLS["backward"] == before["backward"] + 1
        worst = max(worst, rel(ye, yc), rel(xe.grad, xc.grad),
                    *(rel(p.grad, q.grad) for p, q in zip(eager.parameters(),
                                                          compiled.parameters())),
                    *(rel(b, c) for b, c in zip(eager.buffers(), compiled.buffers())))
    return worst


@pytest.mark.parametrize("spec", F64_SPECS)
def test_compiled_step_is_the_eager_step_in_float64(spec):
    assert train_both(*pair(spec, 6), (64, 6)) < 1e-12


@pytest.mark.parametrize("spec", ["mean_only_bn", "cbn", "brn", "lp_bn(p=inf)"])
def test_compiled_step_in_float32_on_a_conv_shape(spec):
    eager, compiled = pair(spec, 4, torch.float32)
    assert train_both(eager, compiled, (8, 4, 3, 3), dtype=torch.float32) < 1e-5


def test_linf_compiled_step_on_long_rows_picks_the_eager_entries():
    """float32, 300 values per channel: the traced top-k takes sync.stable_sort_key (one key, one
    topk; the IEEE bits viewed as int32), the eager step its untied shortcut — the same entries."""
    eager, compiled = pair("lp_bn(p=inf)", 4, torch.float32)
    assert train_both(eager, compiled, (300, 4), dtype=torch.float32) < 1e-5


def test_frozen_weight_and_an_input_without_grad():
    eager, compiled = pair("var_only_bn", 6)
    for layer in (eager, compiled):
        layer.weight.requires_grad_(False)
    assert train_both(eager, compiled, (64, 6), x_grad=False) < 1e-12
    assert compiled.weight.grad is None and compiled.bias.grad is not None


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_a_training_step_without_grad_is_forward_only(mode):
    """Lightning's validate/predict with batch statistics, BN recalibration: one compiled forward,
    the buffers updated as the eager step updates them."""
    eager, compiled = pair("mbn", 6)
    x = torch.randn(64, 6, dtype=torch.float64)
    before = dict(cs.CALLS)
    with mode():
        ye = eager(x)
        with N.compiled_steps():
            yc = compiled(x)
    assert cs.CALLS["forward"] == before["forward"] + 1
    assert cs.CALLS["backward"] == before["backward"]
    assert rel(ye, yc) < 1e-12 and not yc.requires_grad
    assert all(rel(b, c) < 1e-12 for b, c in zip(eager.buffers(), compiled.buffers()))


def test_hyperparameters_are_part_of_the_key():
    """Changing ε or the momentum after a step recompiles; equal layers share one compiled step."""
    eager, compiled = pair("var_only_bn", 6)
    train_both(eager, compiled, (64, 6), steps=1)
    for layer in (eager, compiled):
        layer.eps, layer.momentum = 0.5, None
    assert train_both(eager, compiled, (64, 6), steps=2) < 1e-12
    keys = len(cs._BUILT)
    other_eager, other = pair("var_only_bn", 6)
    other.eps, other_eager.eps, other.momentum, other_eager.momentum = 0.5, 0.5, None, None
    train_both(other_eager, other, (64, 6), steps=1)
    assert len(cs._BUILT) == keys


class MyMeanOnly(N.MeanOnlyBatchNorm):
    pass


def not_routed_cases():
    big = (cs.MAX_NUMEL // 4, 4)
    return {
        "eval mode": lambda: (N.create("cbn", 4).eval(), (16, 4)),
        "a user's subclass": lambda: (MyMeanOnly(4), (16, 4)),
        "a method set on the layer": lambda: (_with_method(N.create("mean_only_bn", 4)), (16, 4)),
        "a large input (the fused operators)": lambda: (N.create("mean_only_bn", 4), big),
        "bn (torch's kernel)": lambda: (N.create("bn", 4), (16, 4)),
        "noisy_bn (its own generator)": lambda: (N.create("noisy_bn", 4), (16, 4)),
    }


def _with_method(layer):
    layer.coefficients = lambda mean, var, gamma, beta: (gamma, beta - mean * gamma)
    return layer


@pytest.mark.parametrize("case", list(not_routed_cases()))
def test_where_the_compiled_step_does_not_run(case):
    layer, shape = not_routed_cases()[case]()
    before = dict(cs.CALLS)
    with N.compiled_steps():
        layer(torch.randn(shape, requires_grad=True)).sum().backward()
    assert cs.CALLS == before


@pytest.mark.parametrize("context", ["plain_autograd", "count_ops", "torch.compile",
                                     "torch.func.grad"])
def test_contexts_that_keep_the_eager_step(context):
    # no running statistics: torch.func refuses a step that writes buffers (eager too)
    layer, x = N.create("mean_only_bn(track_running_stats=false)", 4), torch.randn(16, 4)
    before = dict(cs.CALLS)
    with N.compiled_steps():
        if context == "plain_autograd":
            with N.plain_autograd():
                layer(x.requires_grad_()).sum().backward()
        elif context == "count_ops":
            assert count_ops(lambda: layer(x)).total > 1
        elif context == "torch.compile":
            torch.compile(layer, backend="aot_eager", fullgraph=True)(x)
        else:
            torch.func.grad(lambda t: layer(t).pow(2).sum())(x)
    assert cs.CALLS == before


def test_double_backward_is_refused_with_the_remedy():
    layer, x = N.create("var_only_bn", 6), torch.randn(64, 6, requires_grad=True)
    with N.compiled_steps():
        y = layer(x)
    with pytest.raises(RuntimeError, match="plain_autograd"):
        torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)


def test_input_errors_are_the_eager_layers():
    layer = N.create("mean_only_bn", 4)
    with N.compiled_steps(), pytest.raises(ValueError, match="more than 1 value per channel"):
        layer(torch.randn(1, 4))
    with N.compiled_steps(), pytest.raises(ValueError, match="built for 4 channels"):
        layer(torch.randn(8, 5))


def test_a_step_that_cannot_be_compiled_warns_once_and_runs_eagerly(monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("no compiler here")
    monkeypatch.setattr(cs, "_graph", fail)
    eager, compiled = pair("mean_only_bn", 7)
    x = torch.randn(48, 7, dtype=torch.float64)
    with N.compiled_steps():
        with pytest.warns(RuntimeWarning, match="could not be compiled.*no compiler here"):
            y = compiled(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compiled(x)
    assert torch.equal(y, eager(x))


def test_checkpointed_layer_gets_the_eager_gradients():
    eager, compiled = pair("lp_bn(p=1)", 6)
    x = torch.randn(64, 6, dtype=torch.float64)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    checkpoint(eager, xe, use_reentrant=False).pow(2).sum().backward()
    with N.compiled_steps():
        checkpoint(compiled, xc, use_reentrant=False).pow(2).sum().backward()
    assert rel(xe.grad, xc.grad) < 1e-12 and rel(eager.weight.grad, compiled.weight.grad) < 1e-12


def test_under_autocast_as_the_eager_layer():
    eager, compiled = pair("cbn", 4, torch.float32)
    x = torch.randn(8, 4, 3, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ye = eager(x)
        with N.compiled_steps():
            yc = compiled(x)
    assert yc.dtype == ye.dtype == torch.float32 and rel(ye, yc) < 1e-5


def test_a_buffer_the_backward_reads_is_saved_before_its_update():
    """The forward graph writes the buffers in place; where the partitioner has the backward
    recompute from a buffer itself (here ∂y/∂x = 2·buffer, eager autograd saves the product), it
    is saved as a copy taken first, or the backward would read the new value."""
    class ScaleThenGrow(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.full((3,), 2.0))

        def forward(self, x):
            y = x * (self.scale * 2.0)
            with torch.no_grad():
                self.scale.add_(1.0)
            return y

    module, x = ScaleThenGrow(), torch.randn(5, 3, requires_grad=True)
    step = cs._build(module, (x,), (True,))
    y = step((x,), [], [module.scale])
    y.backward(torch.ones_like(y))
    assert torch.equal(module.scale, torch.full((3,), 3.0))
    assert torch.equal(x.grad, torch.full((5, 3), 4.0))


def test_switches():
    assert not switches.compiled_steps_enabled()
    with N.compiled_steps():
        assert switches.compiled_steps_enabled()
        with N.compiled_steps(False):
            assert not switches.compiled_steps_enabled()
        assert switches.compiled_steps_enabled()
    assert not switches.compiled_steps_enabled()
    N.set_compiled_steps(True)
    try:
        assert switches.compiled_steps_enabled()
    finally:
        N.set_compiled_steps(False)
    code = "import bnlab.norms.engine.switches as s; print(s.compiled_steps_enabled())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "BNLAB_COMPILED_STEPS": "1"})
    assert out.stdout.strip() == "True"


@pytest.mark.parametrize("layer, shape", [(lambda: nn.Linear(6, 6, bias=False), (64, 6)),
                                          (lambda: nn.Conv2d(6, 6, 3, padding=1, bias=False),
                                           (8, 6, 5, 5))])
def test_si_bn_takes_the_step_with_its_layer_weight_as_an_input(layer, shape):
    """si_bn (Arora et al. 2019, Eq. 8): the normalization inside the wrapper takes two tensors,
    z and the layer's weight, whose ‖w‖² per channel is computed inside the compiled step; the
    gradient reaches the weight through both."""
    torch.manual_seed(0)
    eager = N.ScaleInvariantBN(layer()).double()
    compiled = N.ScaleInvariantBN(layer()).double()
    compiled.load_state_dict(eager.state_dict())
    assert train_both(eager, compiled, shape) < 1e-12
    assert rel(eager.layer.weight.grad, compiled.layer.weight.grad) < 1e-12


@pytest.mark.parametrize("spec", ["mean_only_bn", "mbn", "cbn"])
def test_written_buffers_bump_their_version_as_an_eager_update_does(spec):
    """Inductor's code writes the buffers through pointers; the step bumps their version counters
    itself, the same buffers as the eager step, with grad and without."""
    eager, compiled = pair(spec, 6)
    x = torch.randn(64, 6, dtype=torch.float64, requires_grad=True)

    def bumps(layer, grad):
        before = [b._version for b in layer.buffers()]
        with torch.set_grad_enabled(grad), N.compiled_steps(layer is compiled):
            layer(x)
        return [b._version - v for b, v in zip(layer.buffers(), before)]
    for grad in (True, False):
        assert bumps(compiled, grad) == bumps(eager, grad)
        assert any(bumps(compiled, grad))


def test_a_graph_that_saved_a_buffer_fails_as_eager_after_the_step():
    layer, x = N.create("mean_only_bn", 6), torch.randn(64, 6)
    w = torch.ones(6, requires_grad=True)
    penalty = (w * layer.running_mean).sum()  # autograd saves running_mean
    with N.compiled_steps():
        layer(x)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        penalty.backward()


def test_new_shapes_beyond_the_limit_run_eagerly_with_one_warning(monkeypatch):
    """Variable batch sizes would compile at every new shape: after SHAPES_PER_LAYER keys of one
    class and hyper-parameters, new shapes run eagerly (same values), with one warning."""
    eager, compiled = pair("mean_only_bn(eps=0.003)", 3)
    family = sum(1 for key in cs._BUILT if key[0] is type(compiled) and 0.003 in key[1])
    monkeypatch.setattr(cs, "SHAPES_PER_LAYER", family + 1)
    first = torch.randn(20, 3, dtype=torch.float64)
    with N.compiled_steps():
        compiled(first)  # the one more shape it may compile
        before = dict(cs.CALLS)
        with pytest.warns(RuntimeWarning, match="compiled for .* input shapes already"):
            y = compiled(x := torch.randn(21, 3, dtype=torch.float64))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compiled(torch.randn(22, 3, dtype=torch.float64))
    assert cs.CALLS == before
    eager(first)
    assert rel(eager(x), y) < 1e-12


def test_a_mid_size_input_takes_the_step_instead_of_the_fused_operators():
    """Between FUSED_MIN_NUMEL and MAX_NUMEL the eager layer runs the fused operators; the compiled
    step agrees with them (float32, over 16 384 values per channel)."""
    shape = (64, 4, 16, 16)
    assert norms_route.FUSED_MIN_NUMEL <= torch.Size(shape).numel() < cs.MAX_NUMEL
    eager, compiled = pair("cbn", 4, torch.float32)
    assert train_both(eager, compiled, shape, steps=2, dtype=torch.float32) < 1e-5


def _full_size_sums(graph: torch.fx.GraphModule, numel: int) -> int:
    """The reductions in ``graph`` whose input has ``numel`` elements (passes over full size)."""
    sums = (torch.ops.aten.sum.dim_IntList, torch.ops.aten.mean.dim,
            torch.ops.aten.var_mean.correction)
    return sum(1 for node in graph.graph.nodes if node.op == "call_function"
               and node.target in sums and node.args[0].meta["val"].numel() == numel)


@pytest.mark.parametrize("spec", ["mean_only_bn", "var_only_bn", "mbn", "cbn", "brn"])
def test_the_backward_is_factored_as_the_fused_formula(spec):
    """∂L/∂x = a·g + ∂L/∂μ/n + (2/n)·∂L/∂σ²·(x − μ): the traced backward reduces full-size tensors
    twice (Σg, Σg·(x − μ)), not also Σ(g·a) and Σ 2(x − μ)·∂L/∂σ²/n, which are per-channel numbers
    in closed form (bnlab.norms.written_grad; the plain ops' backward had 4: cbn 28.6 → 14 µs a
    backward call on (1000, 10))."""
    eager, compiled = pair(spec, 6, torch.float32)
    assert train_both(eager, compiled, (48, 6), steps=1, dtype=torch.float32) < 1e-5
    step = next(s for k, s in cs._BUILT.items() if k[0] is type(compiled) and s is not None
                and k[2][0][0] == torch.Size((48, 6)) and k[5])
    forward, backward = step.graphs
    assert _full_size_sums(backward, 48 * 6) == 2


@pytest.mark.parametrize("shape", [(400, 6), (40, 6, 5, 5)])
def test_linf_compiled_step_breaks_ties_as_the_eager_step(shape):
    """Integer inputs tie the k-th largest |x − μ| many times: the compiled ℓ∞ step (one stable
    key) puts the scale's gradient on the entries the eager step picks (a different tied entry
    would move the input gradient by ∂L/∂s·C(n)/k, far above rounding)."""
    eager, compiled = pair("lp_bn(p=inf)", 6, torch.float32)
    gen = torch.Generator().manual_seed(3)
    for _ in range(2):
        x = torch.randint(-2, 3, shape, generator=gen).float()
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        grad = torch.randn(shape, generator=gen)
        eager(xe).backward(grad)
        before = cs.CALLS["backward"]
        with N.compiled_steps():
            compiled(xc).backward(grad)
        assert cs.CALLS["backward"] == before + 1
        torch.testing.assert_close(xc.grad, xe.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("spec", ["cbn", "lp_bn(p=inf)"])
def test_compiled_step_with_two_threads(spec):
    """Inductor's parallel code (two threads; the suite runs one) computes the eager step too."""
    torch.set_num_threads(2)  # the one_thread fixture restores
    eager, compiled = pair(spec, 4, torch.float32)
    assert train_both(eager, compiled, (300, 4), dtype=torch.float32) < 1e-5
