"""Benchmark: how close to native BatchNorm can ANY eager Python layer come on small tensors (CPU)?

    python benchmarks/eager_floor.py [--pairs 21] [--threads 1] [--clock cpu] [--quick] [--out PATH]

The small-shape goal is ≤ 1.3× native eager BatchNorm on (1000, 10) and (32, 16, 8, 8), where
the time is dispatch and Python, not arithmetic. This script measures the floor of the eager route,
each row timed alternately with ``nn.BatchNorm`` in one process (benchmarks/timing.py: median of
the per-pair ratios), one training forward + backward:

* ``empty_function``: an ``autograd.Function`` whose forward clones x and whose backward returns g
  (the cost of being one Python autograd node, with no normalization at all);
* ``lean_mean_only``: mean-only BN (Luo et al. 2019, §5: ``y = γ(x − μ_B) + β``) as ONE
  hand-written ``autograd.Function`` on torch's own kernels — statistics, affine pass, the two
  reductions of BatchNorm's backward kernel and a two-op input gradient, no per-channel graph, no
  buffer update. Nothing written generically (a variant as a ``coefficients`` function) can do less
  per call, so its ratio bounds what the eager route can reach for every variant but ``bn``;
* ``compiled_mean_only``: the same function as two inductor-compiled graphs called directly;
* ``aot_function mean_only_bn``: bnlab's layer itself, traced generically and compiled by
  AOTAutograd + inductor without dynamo;
* bnlab's ``bn`` (torch's kernel) and ``mean_only_bn`` as they run by default.

``--quick`` also checks that ``lean_mean_only`` computes what ``mean_only_bn`` does (output and
gradients), so the floor is of the same computation. Writes benchmarks/results/eager_floor.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import fwd_bwd, measure, run_header

import bnlab.norms as norms

SHAPES = [(1000, 10), (32, 16, 8, 8)]


class _Clone(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g


class EmptyFunction(nn.Module):
    """One Python autograd node that does no normalization."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Clone.apply(x)


class _LeanMeanOnly(torch.autograd.Function):
    """y = γ(x − μ_B) + β with the gradient written out: ∂L/∂x = γ(g − Σg/n), ∂L/∂γ = Σg(x − μ_B),
    ∂L/∂β = Σg."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        mean, _ = torch.batch_norm_update_stats(x, None, None, 0.0)
        zero, one = torch.zeros_like(weight), torch.ones_like(weight)
        y = torch.batch_norm(x, weight, bias - mean * weight, zero, one, False, 0.0, 0.0, False)
        ctx.save_for_backward(x, mean, weight)
        return y

    @staticmethod
    def backward(ctx, g):
        x, mean, weight = ctx.saved_tensors
        one = torch.ones_like(mean)
        _, g_weight, g_bias = torch.ops.aten.native_batch_norm_backward(
            g, x, one, None, None, mean, one, True, 0.0, [False, True, True])
        n = x.numel() // x.shape[1]
        shape = (1, -1) + (1,) * (x.dim() - 2)
        g_x = (g - (g_bias / n).view(shape)) * weight.view(shape)
        return g_x, g_weight, g_bias


class LeanMeanOnly(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(c)), nn.Parameter(torch.zeros(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _LeanMeanOnly.apply(x, self.weight, self.bias)


def _mean_only_forward(x, weight, bias):
    mean = x.mean(0) if x.dim() == 2 else x.mean((0, *range(2, x.dim())))
    shape = (1, -1) + (1,) * (x.dim() - 2)
    return (x - mean.view(shape)) * weight.view(shape) + bias.view(shape), mean


def _mean_only_backward(g, x, mean, weight):
    dims = (0,) if x.dim() == 2 else (0, *range(2, x.dim()))
    shape = (1, -1) + (1,) * (x.dim() - 2)
    g_bias = g.sum(dims)
    g_weight = (g * (x - mean.view(shape))).sum(dims)
    n = x.numel() // x.shape[1]
    return (g - (g_bias / n).view(shape)) * weight.view(shape), g_weight, g_bias


class CompiledMeanOnly(nn.Module):
    """Mean-only BN with its whole forward and its whole backward each ONE inductor-compiled
    function (``make_fx`` + ``compile_fx_inner``, static shapes), called directly: no dynamo guards,
    no AOTAutograd wrappers, one ``autograd.Function``. Not a bnlab layer: the measurement of the
    route that could reach the issue's small-shape goal (a variant's closure state — buffers, λ, η
    — would have to become explicit inputs, which the direct call needs)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        from torch._inductor.compile_fx import compile_fx_inner
        from torch.fx.experimental.proxy_tensor import make_fx

        c = shape[1]
        self.weight, self.bias = nn.Parameter(torch.ones(c)), nn.Parameter(torch.zeros(c))
        gen = torch.Generator().manual_seed(0)
        x, g = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
        m, w, b = (torch.randn(c, generator=gen) for _ in range(3))  # distinct: no aliasing
        forward = make_fx(_mean_only_forward)(x, w, b)
        backward = make_fx(_mean_only_backward)(g, x, m, w)
        self.kernels = (compile_fx_inner(forward, [x, w, b]),
                        compile_fx_inner(backward, [g, x, m, w]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _CompiledMeanOnly.apply(x, self.weight, self.bias, self.kernels)


class _CompiledMeanOnly(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, kernels):
        y, mean = kernels[0]([x, weight, bias])
        ctx.save_for_backward(x, mean, weight)
        ctx.backward_kernel = kernels[1]
        return y

    @staticmethod
    def backward(ctx, g):
        x, mean, weight = ctx.saved_tensors
        g_x, g_weight, g_bias = ctx.backward_kernel([g.contiguous(), x, mean, weight])
        return g_x, g_weight, g_bias, None


class AotStep(nn.Module):
    """bnlab's own ``mean_only_bn``, its plain training step traced generically (``functional_call``
    over its parameters and buffers) and compiled by AOTAutograd with inductor, without dynamo: a
    generic compiled route that exists today. Its runtime wrappers (the buffer update is an input
    mutation) run in Python on every call."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        from functorch.compile import aot_function
        from torch._inductor.compile_fx import compile_fx_inner
        from torch._inductor.decomposition import select_decomp_table
        from torch.func import functional_call

        self.layer = norms.create("mean_only_bn", shape[1])
        params = [n for n, _ in self.layer.named_parameters()]
        buffers = [n for n, _ in self.layer.named_buffers()]

        def step(x, ps, bs):
            with norms.plain_autograd():
                return functional_call(self.layer, (dict(zip(params, ps)), dict(zip(buffers, bs))),
                                       (x,))

        self.step = aot_function(step, fw_compiler=compile_fx_inner, bw_compiler=compile_fx_inner,
                                 decompositions=select_decomp_table())
        self.tensors = (list(self.layer.parameters()), list(self.layer.buffers()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.step(x, *self.tensors)


def aot_step_agrees_with_bnlab(shape: tuple[int, ...]) -> bool:
    """The AOT-compiled step and the eager layer it traces: output, input gradient, buffers."""
    aot = AotStep(shape)
    eager = copy.deepcopy(aot.layer)
    gen = torch.Generator().manual_seed(0)
    x, g = torch.randn(shape, generator=gen) * 3 + 2, torch.randn(shape, generator=gen)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = aot(xa), eager(xb)
    ya.backward(g)
    yb.backward(g)
    pairs = [(ya, yb), (xa.grad, xb.grad), *zip(aot.layer.buffers(), eager.buffers())]
    return all(torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-4) for a, b in pairs)


def candidates(shape: tuple[int, ...]) -> dict[str, nn.Module]:
    c = shape[1]
    return {"empty_function": EmptyFunction(), "lean_mean_only": LeanMeanOnly(c),
            "compiled_mean_only": CompiledMeanOnly(shape),
            "aot_function mean_only_bn": AotStep(shape),
            "bnlab bn": norms.create("bn", c),
            "bnlab mean_only_bn": norms.create("mean_only_bn", c)}


def agrees_with_bnlab(shape: tuple[int, ...], candidate: str = "lean_mean_only") -> bool:
    """A mean-only candidate and bnlab's mean_only_bn: same output and gradients (float64 for the
    lean function; the compiled one is float32, to float32 rounding)."""
    gen = torch.Generator().manual_seed(0)
    compiled = candidate == "compiled_mean_only"
    dtype = torch.float32 if compiled else torch.float64
    x = torch.randn(shape, generator=gen, dtype=dtype) * 3 + 2
    g = torch.randn(shape, generator=gen, dtype=dtype)
    mine = CompiledMeanOnly(shape) if compiled else LeanMeanOnly(shape[1]).double()
    ours = norms.create("mean_only_bn", shape[1]).to(dtype)
    with torch.no_grad():
        for m in (mine, ours):
            m.weight.copy_(torch.linspace(0.5, 2.0, shape[1]))
            m.bias.copy_(torch.linspace(-1.0, 1.0, shape[1]))
    outs = []
    for m in (mine, ours):
        xi = x.clone().requires_grad_()
        y = m(xi)
        y.backward(g)
        outs.append([y, xi.grad, m.weight.grad, m.bias.grad])
    tol = 1e-4 if compiled else 1e-10
    return all(torch.allclose(a, b, rtol=tol, atol=tol * float(b.abs().max()))
               for a, b in zip(*outs))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="cpu",
                        help="cpu: this thread's CPU time (steadier on a shared machine)")
    parser.add_argument("--quick", action="store_true", help="2 pairs, 1 call each: seconds")
    parser.add_argument("--out",
                        default=str(Path(__file__).parent / "results" / "eager_floor.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    pairs, inner = (2, 1) if args.quick else (args.pairs, 200)
    load_before, rows = os.getloadavg()[0], []
    for shape in SHAPES:
        x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        torch_bn = nn.BatchNorm1d if len(shape) == 2 else nn.BatchNorm2d
        native = fwd_bwd(torch_bn(shape[1]), x)
        for name, module in candidates(shape).items():
            row = {"shape": list(shape), "layer": name, "reference": "nn.BatchNorm eager",
                   **measure(fwd_bwd(module, x), native, pairs, inner, lambda: None, clock)}
            rows.append(row)
            print(f"{str(shape):<16}{name:<22}{row.get('ratio', row.get('error'))}",
                  file=sys.stderr)
    result = {
        **run_header("the eager floor on small shapes: training forward+backward, float32, CPU; "
                     "paired with nn.BatchNorm, median ratio", args.clock, load_before),
        "pairs": pairs, "calls_per_timing": inner, "quick": args.quick,
        "lean_mean_only_agrees_with_bnlab": all(agrees_with_bnlab(s) for s in SHAPES),
        "compiled_mean_only_agrees_with_bnlab": all(agrees_with_bnlab(s, "compiled_mean_only")
                                                    for s in SHAPES),
        "aot_step_agrees_with_bnlab": all(aot_step_agrees_with_bnlab(s) for s in SHAPES),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print("| shape | layer | ms | nn.BatchNorm ms | × |\n|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {tuple(r['shape'])} | {r['layer']} | {r.get('ms', float('nan')):.4f} | "
              f"{r.get('ref_ms', float('nan')):.4f} | {r.get('ratio', float('nan')):.2f} |")
    return result


if __name__ == "__main__":
    main()
