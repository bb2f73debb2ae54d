"""lp_bn(p=inf) under torch.compile: the written-out gradient of bnlab.norms.lp_compiled.

Held against the eager plain-autograd path (the reference every other path is tested against), a
float64 gradcheck of the function itself, and the backward graph AOTAutograd hands to the backend:
it must not build the full-size zero tensor that autograd's scatter of the top-k gradient needed.
"""

from __future__ import annotations

import copy

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

import bnlab.norms as N
from bnlab.norms.engine.lp_compiled import LinfNormalize


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def recording_backend(graphs: dict[str, list]):
    """An AOTAutograd backend that keeps the forward and backward graphs and runs them as they
    are."""

    def compiler(kind):
        def compile_graph(gm, _inputs):
            graphs.setdefault(kind, []).append(gm)
            return make_boxed_func(gm.forward)
        return compile_graph

    return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"))


def step(layer, x, gy):
    x = x.detach().clone().requires_grad_()
    y = layer(x)
    y.backward(gy)
    return y.detach(), x.grad, layer.weight.grad, layer.bias.grad


def full_size_outputs(gm, numel: int, names: tuple[str, ...]) -> list[str]:
    """The nodes of ``gm`` among ``names`` whose output has ``numel`` elements."""
    found = []
    for node in gm.graph.nodes:
        value = node.meta.get("val")
        if (node.op == "call_function" and any(n in str(node.target) for n in names)
                and isinstance(value, torch.Tensor) and value.numel() == numel):
            found.append(str(node.target))
    return found


def test_backward_graph_builds_no_full_size_zeros():
    """Old path: the top-k gather's backward scattered k·C numbers into a new full-size zero tensor
    (new_zeros + scatter_add/index_add), one more write and read of x's size."""
    torch._dynamo.reset()
    graphs: dict[str, list] = {}
    layer = N.create("lp_bn(p=inf)", 4)
    x = torch.randn(6, 4, 5, 5, generator=gen(0))
    compiled = torch.compile(layer, fullgraph=True, backend=recording_backend(graphs))
    step(compiled, x, torch.randn(x.shape, generator=gen(1)))
    (backward,) = graphs["backward"]
    assert not full_size_outputs(backward, x.numel(), ("zeros", "full", "scatter", "index_add")), \
        backward.graph
    assert full_size_outputs(backward, x.numel(), ("index_put",)), backward.graph
    torch._dynamo.reset()


@pytest.mark.parametrize("shape", [(6, 4, 5, 5), (40, 3), (8, 3, 7), (2, 3, 4, 5, 3)])
@pytest.mark.parametrize("topk", [10, 3])
def test_compiled_equals_eager_plain_path(shape, topk):
    torch._dynamo.reset()
    eager = N.create(f"lp_bn(p=inf, topk={topk})", shape[1])
    with torch.no_grad():
        eager.weight.uniform_(0.5, 1.5, generator=gen(2))
        eager.bias.uniform_(-1, 1, generator=gen(3))
    traced = copy.deepcopy(eager)
    compiled = torch.compile(traced, fullgraph=True, backend="aot_eager")
    for i in range(2):  # the second step reads the running statistics the first wrote
        x = torch.randn(shape, generator=gen(10 + i)) * 3 + 1
        gy = torch.randn(shape, generator=gen(20 + i))
        eager.zero_grad(), traced.zero_grad()
        with N.plain_autograd():
            want = step(eager, x, gy)
        got = step(compiled, x, gy)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(traced.running_mean, eager.running_mean)
        torch.testing.assert_close(traced.running_var, eager.running_var)
    torch._dynamo.reset()


def test_channels_last_and_no_input_grad_under_compile():
    torch._dynamo.reset()
    eager = N.create("lp_bn(p=inf)", 3)
    traced = copy.deepcopy(eager)
    compiled = torch.compile(traced, fullgraph=True, backend="aot_eager")
    x = torch.randn(4, 3, 6, 6, generator=gen(4)).to(memory_format=torch.channels_last)
    with N.plain_autograd():
        want = eager(x)
    got = compiled(x)  # x does not require grad: γ and β do
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got.square().sum().backward()
    want.square().sum().backward()
    torch.testing.assert_close(traced.weight.grad, eager.weight.grad, rtol=1e-4, atol=1e-5)
    # Σ 2y over 144 values of size ~3 that sum to ~0: an absolute tolerance
    torch.testing.assert_close(traced.bias.grad, eager.bias.grad, rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()


@pytest.mark.parametrize("shape", [(5, 3, 4, 4), (30, 2)])
def test_gradcheck_float64(shape):
    """Finite differences of the function itself (eager; distinct values, so the top-k set is
    stable under the perturbation)."""
    x = torch.randn(shape, generator=gen(5), dtype=torch.float64, requires_grad=True)
    gamma = torch.rand(shape[1], generator=gen(6), dtype=torch.float64).add_(0.5).requires_grad_()
    beta = torch.randn(shape[1], generator=gen(7), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, g, b: LinfNormalize.apply(x, g, b, 1e-5, 3)[0],
                                    (x, gamma, beta))


def test_statistics_match_the_layer_definition():
    """μ_B from row sums is the batch mean; s is C(n)·mean of the k largest |x − μ_B| (a full sort
    as the reference)."""
    x = torch.randn(7, 3, 9, generator=gen(8), dtype=torch.float64) * 2
    _, mean, scale = LinfNormalize.apply(x, torch.ones(3, dtype=torch.float64),
                                         torch.zeros(3, dtype=torch.float64), 1e-5, 4)
    torch.testing.assert_close(mean, x.mean(dim=(0, 2)))
    centred = (x - mean[None, :, None]).abs().transpose(0, 1).reshape(3, -1)
    top = centred.sort(dim=1, descending=True).values[:, :4].mean(dim=1)
    torch.testing.assert_close(scale, N.hoffer_linf_constant(63) * top)


@pytest.mark.parametrize("shape", [(600, 8), (300, 4, 1, 1)])
def test_inductor_puts_the_gradient_on_the_eager_entries(shape):
    """Inductor itself (not aot_eager), two threads, one value per sample and channel, many ties:
    the gradient lands on the top-k entries eager picks. The (N, C) search once saved its sample
    indices as a transposed view; inductor's two-thread backward then put the scale's gradient on
    other entries (3.9 off; right with one thread)."""
    torch._dynamo.reset()
    torch.set_num_threads(2)  # the suite's one thread hid it (the one_thread fixture restores)
    eager = N.create("lp_bn(p=inf)", shape[1])
    compiled = torch.compile(copy.deepcopy(eager), fullgraph=True)
    x = torch.randint(-2, 3, shape, generator=gen(4)).float()
    gy = torch.randn(shape, generator=gen(5))
    want, got = step(eager, x, gy), step(compiled, x, gy)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
