"""torch.compile for every layer, small shapes, few compiles.

A model holding every layer is compiled once with ``fullgraph=True`` (so bnlab causes no graph
break) through dynamo and AOTAutograd (the ``aot_eager`` backend: the layers' graphs, their
functionalized buffer updates and their backward, without inductor's code generation, which would
cost minutes here) and trained for three steps next to an eager copy: outputs, every parameter
gradient and every buffer agree to 1e-5. Forced onto the fused path (FUSED_MIN_NUMEL = 0) so that a
traced fused function — which once silently lost its backward under compile — would show. The CPU
inductor backend compiles every layer next to native BN in one graph, compared with eager and with a
float64 reference.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import bnlab.norms as N
import bnlab.norms.engine.route as norms_route
from bnlab.norms.engine.fused import fused_normalize

SPECS = ["bn", "native_bn", "mean_only_bn", "var_only_bn", "lp_bn(p=1)", "lp_bn(p=inf)", "mbn",
         "cbn", "cbn(decouple=false, rho=2)", "cbn(center=false, eta=0.9)",
         "brn(relax_from=1, r_max_at=3)", "bn(momentum=none)", "si_bn", "wn"]
WIDTH = 4


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def zoo(specs) -> nn.Module:
    """conv → layer → tanh for each spec in turn (the wrappers wrap their conv)."""
    torch.manual_seed(0)
    blocks = []
    for spec in specs:
        conv = nn.Conv2d(WIDTH, WIDTH, 3, padding=1, bias=False)
        norm = N.normalized(conv, spec) if spec in ("si_bn", "wn") \
            else nn.Sequential(conv, N.create(spec, WIDTH))
        blocks += [norm, nn.Tanh()]
    model = nn.Sequential(*blocks)
    N.set_progress(model, lr=0.05, epoch=2, epochs=4)  # AMAT's η and MBN's λ in play
    return model


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def train_steps(model, inputs):
    outs = []
    for x in inputs:
        model.zero_grad()
        y = model(x)
        y.square().mean().backward()
        outs.append((y.detach(), [p.grad.clone() for p in model.parameters()]))
    return outs


@pytest.fixture(scope="module")
def compiled_zoo():
    torch._dynamo.reset()
    saved, norms_route.FUSED_MIN_NUMEL = norms_route.FUSED_MIN_NUMEL, 0
    torch.set_num_threads(1)
    try:
        eager = zoo(SPECS)
        compiled_model = copy.deepcopy(eager)
        # fails on any graph break
        compiled = torch.compile(compiled_model, fullgraph=True, backend="aot_eager")
        inputs = [torch.randn(6, WIDTH, 5, 5, generator=gen(i)) * (1 + i) + i for i in range(3)]
        yield eager, compiled_model, compiled, train_steps(eager, inputs), \
            train_steps(compiled, inputs)
    finally:
        norms_route.FUSED_MIN_NUMEL = saved
        torch._dynamo.reset()


def test_every_layer_compiles_fullgraph_and_trains_like_eager(compiled_zoo):
    eager, compiled_model, _, want, got = compiled_zoo
    for (ye, ge), (yc, gc) in zip(want, got):
        assert relative(yc, ye) < 1e-5
        for a, b in zip(gc, ge):
            assert relative(a, b) < 1e-5
    for (name, b), (_, c) in zip(eager.named_buffers(), compiled_model.named_buffers()):
        if b.is_floating_point():
            assert relative(c, b) < 1e-5, name
        else:
            assert torch.equal(c, b), name


def test_compiled_eval_mode_equals_eager(compiled_zoo):
    eager, compiled_model, compiled, _, _ = compiled_zoo
    eager.eval(), compiled_model.eval()
    x = torch.randn(3, WIDTH, 5, 5, generator=gen(9))
    with torch.no_grad():
        assert relative(compiled(x), eager(x)) < 1e-5
    eager.train(), compiled_model.train()


class _Side(nn.Module):
    """Several layers, each on its own copy of the input: one inductor graph for all of them."""

    def __init__(self, specs, dtype=torch.float32):
        super().__init__()
        torch.manual_seed(0)
        self.norms = nn.ModuleList(N.normalized(nn.Conv2d(3, 3, 1, bias=False), spec)
                                   if spec in ("si_bn", "wn")
                                   else N.create(spec, 3) for spec in specs).to(dtype)
        N.set_progress(self, lr=0.05, epoch=2, epochs=4)

    def forward(self, xs):
        return [norm(x) for norm, x in zip(self.norms, xs)]


@pytest.mark.parametrize("threads", [1, 2])
def test_inductor_matches_eager_and_float64_as_closely_as_native_bn(threads):
    """Every layer but noisy_bn (its draws are not traced; its compiled run is checked above), in
    one inductor graph: the generated C++ kernels (Welford statistics under compile) against eager
    and float64; with two threads too (inductor's parallel code: a transposed index view once went
    wrong there and not with one thread, tests/test_norms_linf_compiled.py)."""
    specs = ["native_bn"] + [s for s in SPECS if s != "native_bn"]
    torch.set_num_threads(threads)  # the one_thread fixture restores
    torch._dynamo.reset()
    eager, reference = _Side(specs), _Side(specs, torch.float64)
    compiled = torch.compile(copy.deepcopy(eager), fullgraph=True)
    for step in range(2):
        x = torch.randn(8, 3, 4, 4, generator=gen(10 + step), dtype=torch.float64) * 2 + 1
        g = torch.randn(x.shape, generator=gen(20 + step), dtype=torch.float64)
        results = []
        for model, dt in ((eager, torch.float32), (compiled, torch.float32),
                          (reference, torch.float64)):
            xs = [x.to(dt).requires_grad_() for _ in specs]
            ys = model(xs)
            grads = torch.autograd.grad(sum((y * g.to(dt)).sum() for y in ys), xs)
            results.append([(y.double(), gx.double()) for y, gx in zip(ys, grads)])
        for i, spec in enumerate(specs):
            (ye, ge), (yc, gc), (yr, gr) = results[0][i], results[1][i], results[2][i]
            assert relative(yc, ye) < 1e-5 and relative(gc, ge) < 1e-5, spec
            native_y, native_g = relative(results[1][0][0], results[2][0][0]), \
                relative(results[1][0][1], results[2][0][1])
            assert relative(yc, yr) < 3 * native_y + 1e-6 \
                and relative(gc, gr) < 3 * native_g + 1e-6, spec
    torch._dynamo.reset()


def test_the_fused_function_is_never_traced():
    """Dynamo once inlined the fused function's forward and dropped its backward (input gradient
    1e-2 off on (32, 8, 16, 16)); called under compile it must run eagerly and stay exact."""
    torch._dynamo.reset()
    layer = N.create("bn", 3).double()
    x = torch.randn(8, 3, 4, 4, generator=gen(1), dtype=torch.float64)

    def through_fused(x):
        return fused_normalize(x, layer.batch_moments, layer.coefficients, layer.weight,
                               layer.bias)[0]

    grads = []
    for fn in (through_fused, torch.compile(through_fused, backend="aot_eager")):
        xi = x.clone().requires_grad_()
        grads.append(torch.autograd.grad(fn(xi).pow(3).sum(), xi)[0])
    with N.plain_autograd():
        xi = x.clone().requires_grad_()
        plain = torch.autograd.grad(layer(xi).pow(3).sum(), xi)[0]
    torch.testing.assert_close(grads[0], plain, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grads[1], plain, rtol=1e-10, atol=1e-12)


def test_noisy_bn_compiles_with_its_noise_drawn_eagerly():
    """noisy_bn's draws from its own torch.Generator are the one part excluded from compile."""
    torch._dynamo.reset()
    eager = N.create("noisy_bn", 3)
    compiled_layer = copy.deepcopy(eager)
    compiled = torch.compile(compiled_layer)  # inductor: the two graphs around the eager draws
    x = torch.randn(8, 3, 2, 2, generator=gen(2))
    for _ in range(2):
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        ye, yc = eager(xe), compiled(xc)
        torch.testing.assert_close(yc, ye, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.autograd.grad(yc.sum(), xc)[0],
                                   torch.autograd.grad(ye.sum(), xe)[0], rtol=1e-5, atol=1e-6)
    explanation = torch._dynamo.explain(copy.deepcopy(eager))(x)
    assert explanation.graph_break_count == 1


def test_changing_lr_and_epoch_does_not_recompile():
    """AMAT's η, MBN's λ, BRN's warm-up and momentum=None's 1/t live in tensors: one graph for a
    whole schedule (Python floats would be guarded on, recompiling every step until dynamo gives
    up)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = nn.Sequential(N.create("cbn", 3), N.create("mbn", 3),
                          N.create("brn(relax_from=1, r_max_at=5)", 3),
                          N.create("bn(momentum=none)", 3))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    counters.clear()
    for step in range(5):
        N.set_progress(model, lr=0.1 / (step + 1), epoch=step + 1, epochs=5)
        compiled(torch.randn(8, 3, 2, 2, generator=gen(step))).sum().backward()
    assert counters["stats"]["unique_graphs"] == 1
    assert float(model[0]._eta) == pytest.approx(1 - 10 * 0.1 / 5)
    torch._dynamo.reset()
