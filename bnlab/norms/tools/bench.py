"""Forward+backward timing of every layer against torch's native BatchNorm (used by the benchmark
and the demo; timing lives here, never in tests)."""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn as nn

from ..ops import create
from .progress import set_progress
from ..variants.wrappers import ScaleInvariantBN, WeightNorm

DEFAULT_SPECS = ["native_bn", "bn", "mean_only_bn", "var_only_bn", "mbn", "cbn",
                 "cbn(decouple=false)", "brn", "noisy_bn", "lp_bn(p=1)", "lp_bn(p=inf)", "si_bn",
                 "wn"]


def _layer(spec: str, shape: tuple[int, ...]) -> nn.Module:
    c = shape[1]
    # wrappers include their layer; time them against conv/linear + native BN
    if spec in ("si_bn", "wn"):
        inner = nn.Conv2d(c, c, 1, bias=False) if len(shape) == 4 else nn.Linear(c, c, bias=False)
        return ScaleInvariantBN(inner) if spec == "si_bn" else WeightNorm(inner)
    layer = create(spec, c)
    if spec.startswith(("mbn", "cbn")):
        # mbn: λ > 0 (moving statistics exercised); cbn: AMAT on
        set_progress(layer, epoch=2, epochs=4, lr=0.05)
    return layer


def time_layer(layer: nn.Module, x: torch.Tensor, repeats: int, warmup: int = 2) -> float:
    """Median seconds of one forward+backward (training mode) over ``repeats`` runs."""
    layer.train()
    grad = torch.randn_like(x)
    times = []
    for i in range(warmup + repeats):
        xi = x.detach().requires_grad_()
        start = time.perf_counter()
        layer(xi).backward(grad)
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append(elapsed)
    return statistics.median(times)


def benchmark(shapes: list[tuple[int, ...]], specs: list[str] | None = None, repeats: int = 10,
              seed: int = 0, progress=None) -> list[dict]:
    """One row per (shape, spec): median time and ratio to native BN on the same shape."""
    specs = specs or DEFAULT_SPECS
    g = torch.Generator().manual_seed(seed)
    rows = []
    for shape in shapes:
        x = torch.randn(*shape, generator=g)
        torch.manual_seed(seed)
        native = time_layer(_layer("native_bn", shape), x, repeats)
        for spec in specs:
            torch.manual_seed(seed)
            t = native if spec == "native_bn" else time_layer(_layer(spec, shape), x, repeats)
            rows.append({"shape": list(shape), "spec": spec, "median_ms": 1e3 * t,
                         "ratio_to_native": t / native})
            if progress is not None:
                progress(rows[-1])
    return rows


def format_table(rows: list[dict]) -> str:
    lines = ["| shape | layer | fwd+bwd median (ms) | × native BN |", "|---|---|---:|---:|"]
    for r in rows:
        shape = "×".join(map(str, r["shape"]))
        lines.append(f"| {shape} | `{r['spec']}` | {r['median_ms']:.3f} | "
                     f"{r['ratio_to_native']:.2f} |")
    return "\n".join(lines)
