"""Paired timing shared by benchmarks/norms.py (CPU) and benchmarks/gpu.py (CUDA).

A layer and its reference (torch's native BatchNorm, cuDNN on a GPU) are timed alternately in one
process — pair i runs A then B when i is even, B then A when odd — and the reported ratio is the
median of the per-pair ratios, so drifts of the machine (other jobs, clocks, thermals) cancel
instead of landing on whichever ran second. Timing lives here, never in tests: tests only check that
the scripts run and write the right keys (``--quick``).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from contextlib import nullcontext
from typing import Callable

import torch
import torch.nn as nn

from provenance import provenance

from bnlab.norms import NativeBatchNorm, compiled_steps, set_progress
from bnlab.norms.engine import compiled_step
from bnlab.norms.tools.bench import DEFAULT_SPECS, _layer
from bnlab.norms.tools.opcount import count_ops, training_step

SPECS = DEFAULT_SPECS
BN_FAMILY = ["bn", "mean_only_bn", "var_only_bn", "mbn", "cbn", "cbn(decouple=false)", "brn"]
WRAPPERS = ("si_bn", "wn")  # they include their 1×1 conv: compared with that conv + native BN
AMP_DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


class Budget:
    """Wall-clock budget: compiles are skipped (and say so) once the next one would not fit."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.compile_estimate = 0.0  # the slowest compile seen so far

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def allows_compile(self) -> bool:
        return self.left() > 1.5 * self.compile_estimate + 5.0

    def record_compile(self, seconds: float) -> None:
        self.compile_estimate = max(self.compile_estimate, seconds)


def run_header(benchmark: str, clock: str, load_before: float) -> dict:
    """What a CPU benchmark's JSON records about its run: torch, threads, machine, clock ("cpu":
    thread CPU time, else wall time), the 1-minute load average at its start and end, and the date
    and commit (:func:`provenance.provenance`)."""
    return {"benchmark": benchmark, **provenance(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "machine": platform.machine(),
            "clock": "thread CPU time" if clock == "cpu" else "wall time",
            "load_average_1min": {"start": load_before, "end": os.getloadavg()[0],
                                  "cpus": os.cpu_count()}}


def reference_for(spec: str, shape: tuple[int, ...]) -> tuple[nn.Module, str]:
    c = shape[1]
    if spec in WRAPPERS:
        inner = nn.Conv2d(c, c, 1, bias=False) if len(shape) == 4 else nn.Linear(c, c, bias=False)
        return nn.Sequential(inner, NativeBatchNorm(c)), "conv1x1+native_bn" if len(shape) == 4 \
            else "linear+native_bn"
    return NativeBatchNorm(c), "native_bn"


class NativeBNPlusNoise(nn.Module):
    """``noisy_bn``'s honest floor: torch's BatchNorm, then Santurkar Alg. 1's noise
    written in plain PyTorch (the same four draws from a ``torch.Generator``, then ``s·a + m``)."""

    def __init__(self, c: int, n_mu: float = 0.5, n_sigma: float = 1.25, r_mu: float = 0.1,
                 r_sigma: float = 0.1):
        super().__init__()
        self.bn, self.spreads = NativeBatchNorm(c), (n_mu, n_sigma, r_mu, r_sigma)
        self.generator = torch.Generator().manual_seed(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.bn(x)
        n_mu, n_sigma, r_mu, r_sigma = self.spreads
        g, c, shape = self.generator, a.shape[1], (1, -1) + (1,) * (a.dim() - 2)
        mu = torch.empty(c).uniform_(-n_mu, n_mu, generator=g).view(shape)
        sigma = torch.empty(c).uniform_(1.0, n_sigma, generator=g).view(shape)
        m = torch.empty_like(a).uniform_(-r_mu, r_mu, generator=g) + mu
        s = torch.empty_like(a).normal_(0.0, r_sigma, generator=g) + sigma
        return s * a + m


def op_counts(spec: str, shape: tuple[int, ...], device: torch.device | str = "cpu",
              precision: str = "fp32") -> dict:
    """Operations one training forward + backward dispatches (:mod:`bnlab.norms.tools.opcount`,
    views excluded), and "inside": the aten ops that bnlab's own operators run in their kernels
    (about the kernel launches on a GPU), on the path the layer takes for this shape; fp16/bf16: the
    input in that dtype, as autocast hands it on, the layer in float32."""
    torch.manual_seed(0)
    step = training_step(_layer(spec, shape), shape, device=device,
                         dtype=AMP_DTYPES[precision] or torch.float32)
    step()
    return {"ops": count_ops(step).total, "ops_inside": count_ops(step, inside=True).total}


def float64_agreement(spec: str, shape: tuple[int, ...], device: torch.device | str,
                      precision: str) -> dict:
    """Three training steps of ``spec`` on ``device`` (input in ``precision``, as autocast hands
    it on; the layer float32; mbn's λ and cbn's AMAT η > 0, so the buffers they read have moved)
    against the same layer in float64 on the same input values. For the last step's
    output and the input gradient: ``error``, the largest ``|got − truth|`` in units of the input
    dtype's eps times ``max |truth|``; for half inputs also ``rounded_once``, whether every entry is
    within ``½ eps·|truth| + 10⁻³ eps·max |truth|`` (a float32 result rounded to half once, as
    tests/test_norms_half_fused.py asserts on the CPU). The correctness half of a device run: it
    exercises that device's branches of the kernels (addcmul affine passes, its statistics and
    reduction kernels, compiled coefficients on CUDA), which CPU tests reach only by imitation."""
    dtype = AMP_DTYPES[precision] or torch.float32
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=gen) * 3 + 50).to(device, dtype)
    g = torch.randn(shape, generator=gen).to(device, dtype)
    results = []
    for layer_dtype, input_dtype in ((torch.float32, dtype), (torch.float64, torch.float64)):
        torch.manual_seed(0)
        layer = _layer(spec, shape).to(device, layer_dtype).train()
        set_progress(layer, lr=0.05, epoch=2, epochs=4)
        for _ in range(3):
            xi = x.detach().to(input_dtype).clone().requires_grad_()
            y = layer(xi)
            y.backward(g.to(y.dtype))
        results.append((y.detach(), xi.grad, type(y.grad_fn).__name__))
    (y, gx, node), (y_true, gx_true, _) = results
    eps = torch.finfo(dtype).eps
    row: dict = {"spec": spec, "precision": precision, "path": node}
    for name, got, truth in (("y", y, y_true), ("input_grad", gx, gx_true)):
        err, scale = (got.double() - truth).abs(), truth.abs()
        row[name] = {"error": float(err.max() / (eps * scale.max()))}
        if dtype != torch.float32:
            row[name]["rounded_once"] = bool(
                (err <= 0.5 * eps * scale + 1e-3 * eps * scale.max()).all())
    return row


def fwd_bwd(module: nn.Module, x: torch.Tensor, precision: str = "fp32") -> Callable[[], None]:
    """One training-mode forward + backward of ``module`` on ``x`` (under autocast for
    fp16/bf16)."""
    module.train()
    dtype = AMP_DTYPES[precision]
    autocast = (lambda: torch.autocast(x.device.type, dtype=dtype)) if dtype is not None \
        else nullcontext
    grad = {}

    def step() -> None:
        xi = x.detach().requires_grad_()
        with autocast():
            y = module(xi)
        if y.dtype not in grad:
            grad[y.dtype] = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(
                y.device, y.dtype)
        y.backward(grad[y.dtype])

    return step


def paired(a: Callable[[], None], b: Callable[[], None], pairs: int, warmup: int = 2,
           inner: int = 1, sync: Callable[[], None] = lambda: None,
           clock: Callable[[], float] = time.perf_counter) -> dict:
    """Median ms of ``a`` and ``b`` and the median of the per-pair ratios a/b, timed alternately.
    ``clock``: wall time by default; ``time.thread_time`` (one thread) measures this thread's CPU
    time, which other processes on a loaded machine disturb far less."""
    for _ in range(warmup):
        a(), b()
    sync()
    times: dict[Callable, list[float]] = {a: [], b: []}
    for i in range(pairs):
        for f in ((a, b) if i % 2 == 0 else (b, a)):
            start = clock()
            for _ in range(inner):
                f()
            sync()
            times[f].append((clock() - start) / inner)
    ratios = [ta / tb for ta, tb in zip(times[a], times[b])]
    return {"ms": 1e3 * statistics.median(times[a]), "ref_ms": 1e3 * statistics.median(times[b]),
            "ratio": statistics.median(ratios)}


def failure(err: Exception) -> dict:
    """A row's record of an exception: a layer that fails is a result to report, not a crash."""
    return {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}


def measure(step: Callable[[], None], ref_step: Callable[[], None], pairs: int, inner: int,
            sync: Callable[[], None], clock: Callable[[], float] = time.perf_counter) -> dict:
    """:func:`paired`, or the error: one layer that fails (e.g. under autocast) must not end the
    run."""
    try:
        return paired(step, ref_step, pairs, inner=inner, sync=sync, clock=clock)
    except Exception as err:
        return failure(err)


def compile_and_warm(module: nn.Module,
                     make_step: Callable[[nn.Module], Callable[[], None]], budget: Budget,
                     backend: str = "inductor") -> tuple[Callable[[], None] | None, dict]:
    """``make_step(torch.compile(module))`` after its first calls (the compile), or None and why
    not."""
    if not budget.allows_compile():
        return None, {"skipped": f"time budget ({budget.left():.0f} s left, a compile took up to "
                                 f"{budget.compile_estimate:.0f} s)"}
    start = time.perf_counter()
    try:
        step = make_step(torch.compile(module, backend=backend))
        # the first call compiles forward and backward; the second catches recompiles
        step(), step()
    except Exception as err:  # a layer that does not compile is a result to report, not a crash
        return None, failure(err)
    seconds = time.perf_counter() - start
    budget.record_compile(seconds)
    return step, {"compile_s": round(seconds, 1)}


def compiled_step_and_warm(module: nn.Module, make_step: Callable[[nn.Module], Callable[[], None]]
                           ) -> tuple[Callable[[], None] | None, dict]:
    """``make_step(module)`` run inside ``bnlab.norms.compiled_steps()`` after its first call (the
    compile of the layer's step: bnlab.norms.engine.compiled_step), or None and why not."""
    inner = make_step(module)

    def step() -> None:
        with compiled_steps():
            inner()
    start, before = time.perf_counter(), compiled_step.CALLS["forward"]
    try:
        step(), step()
    except Exception as err:
        return None, failure(err)
    if compiled_step.CALLS["forward"] == before:
        return None, {"skipped": "the layer does not take the compiled step"}
    return step, {"compile_s": round(time.perf_counter() - start, 1)}


def layer_table(specs: list[str], shape: tuple[int, ...], device: torch.device,
                precisions: list[str], modes: list[str], pairs: int, budget: Budget,
                backend: str = "inductor", inner: int = 1, sync: Callable[[], None] = lambda: None,
                progress: Callable[[dict], None] | None = None,
                clock: Callable[[], float] = time.perf_counter) -> list[dict]:
    """One row per (spec, precision, mode): the layer's fwd+bwd against its native reference in
    eager mode."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(device)
    rows = []
    for precision in precisions:
        # AMP activations arrive in half
        xp = x if precision == "fp32" else x.to(AMP_DTYPES[precision])
        for spec in specs:
            torch.manual_seed(0)
            reference, ref_name = reference_for(spec, shape)
            ref_step = fwd_bwd(reference.to(device), xp, precision)
            layer = _layer(spec, shape).to(device)
            for mode in modes:
                row = {"spec": spec, "precision": precision, "mode": mode,
                       "reference": f"{ref_name} eager"}
                make = lambda m: fwd_bwd(m, xp, precision)  # noqa: E731
                step, info = ((make(layer), {}) if mode == "eager" else
                              compiled_step_and_warm(layer, make) if mode == "compiled_step" else
                              compile_and_warm(layer, make, budget, backend))
                row.update(info)
                if step is not None:
                    row.update(measure(step, ref_step, pairs, inner, sync, clock))
                rows.append(row)
                if progress is not None:
                    progress(row)
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = ["| layer | precision | mode | ms | reference ms | × reference |",
             "|---|---|---|---:|---:|---:|"]
    for r in rows:
        if "ratio" in r:
            lines.append(f"| `{r['spec']}` | {r['precision']} | {r['mode']} | {r['ms']:.3f} | "
                         f"{r['ref_ms']:.3f} | "
                         f"{r['ratio']:.2f} |")
        else:
            lines.append(f"| `{r['spec']}` | {r['precision']} | {r['mode']} | – | – | "
                         f"{r.get('error') or r.get('skipped')} |")
    return "\n".join(lines)
