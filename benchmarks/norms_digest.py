"""Digest of every normalization layer's numbers: outputs, gradients and buffers, hashed.

    python benchmarks/norms_digest.py [--out benchmarks/results/norms_digest.json]

For every catalogue layer (``bnlab.norms.registry.REGISTRY``), the specs whose options pick another
computation (cbn's ``decouple``/``center``/``eta``/``order``/``amat``, lp_bn's ``p``, brn's
relaxation schedule, ``momentum=None``, ``affine``/``bias``/``track_running_stats`` off), and every
route a float32 training step can take on the CPU — the plain autograd ops (small input), the fused
operators (from ``FUSED_MIN_NUMEL`` elements), the plain ops forced by ``plain_autograd()`` on the
large input, a 2-d ``(N, C)`` input, the non-finite guard and ``accumulate`` around the step — this
runs 3 training steps on fixed seeded inputs (an SGD update of γ, β after each, so β-dependent
statistics move), then one eval forward + backward, and hashes (SHA-256 of the raw bytes) every
output, the input/γ/β gradients and every buffer. Two trees that agree here compute the same bits.

A code change that only moves code must leave every hash as it was: ``tests/test_norms_digest.py``
compares a fresh digest against ``benchmarks/results/norms_digest.json`` when the same torch version
runs (another torch may round differently). The JSON records the date and commit it was made at.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
import warnings
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn as nn

import bnlab.norms as N

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import provenance

RESULT = Path(__file__).resolve().parent / "results" / "norms_digest.json"

SPECS = [
    "bn", "bn(affine=false)", "bn(bias=false)", "bn(track_running_stats=false)",
    "mean_only_bn", "var_only_bn", "native_bn", "noisy_bn",
    "lp_bn", "lp_bn(p=1)", "lp_bn(p=inf)",
    "mbn", "mbn(ideal_batch=4)",
    "cbn", "cbn(amat=false)", "cbn(decouple=false)", "cbn(center=false)", "cbn(eta=0.9)",
    "cbn(order=literal)", "cbn(rho=2, track_running_stats=false)",
    "brn", "brn(relax_from=1, r_max_at=3, d_max_at=3)", "brn(r_max=1.05, d_max=0.01)",
    "gn(num_groups=2)", "none",
]
WRAPPERS = ["si_bn", "wn", "wn+mean_only_bn", "si_bn+bn"]
MOMENTUM_NONE = ["bn", "mbn", "cbn(amat=false)", "brn"]

SMALL = (8, 4, 3, 3)  # below FUSED_MIN_NUMEL: the plain autograd ops
LARGE = (32, 16, 16, 16)  # 131072 elements: the fused operators
FLAT = (64, 4)


def _seeded(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * 2.0 + 0.5


def _hash(t: torch.Tensor | None) -> str:
    if t is None:
        return "none"
    t = t.detach().contiguous().cpu()
    return hashlib.sha256(t.numpy().tobytes() + str((t.dtype, tuple(t.shape))).encode()
                          ).hexdigest()[:16]


def _prepare(model: nn.Module, seed: int) -> nn.Module:
    """Seeded γ, β (and wrapped layer weights), seeded noise, a learning rate for AMAT."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.copy_(p + 0.3 * torch.randn(p.shape, generator=g))
    N.seed_layers(model, seed)
    N.set_progress(model, lr=0.01, epoch=2, epochs=3)
    return model


def _build(spec: str, channels: int, momentum_none: bool) -> nn.Module:
    torch.manual_seed(0)  # noisy_bn's default seed, wrapped layers' init
    if spec.split("(")[0].split("+")[0] in ("si_bn", "wn"):
        return N.normalized(nn.Linear(6, channels), spec)
    options = {"momentum": None} if momentum_none else {}
    return N.create(spec, channels, **options)


def _run(model: nn.Module, shape: tuple[int, ...], around: Callable[[nn.Module], contextlib.
                                                                      AbstractContextManager]
         ) -> dict[str, str]:
    out: dict[str, str] = {}
    for step in range(3):
        x = _seeded(shape, 100 + step).requires_grad_(True)
        w = _seeded(shape[:1] + (model_out(model, shape),) + shape[2:], 200 + step)
        model.train()
        with around(model):
            y = model(x)
            (y * w).sum().backward()
        out[f"train{step}.y"] = _hash(y)
        out[f"train{step}.dx"] = _hash(x.grad)
        with torch.no_grad():
            for name, p in sorted(model.named_parameters()):
                out[f"train{step}.d{name}"] = _hash(p.grad)
                if p.grad is not None:
                    p.sub_(0.1 * p.grad)
                p.grad = None
    for name, b in sorted(model.named_buffers()):
        out[f"buffer.{name}"] = _hash(b)
    model.eval()
    x = _seeded(shape, 300).requires_grad_(True)
    y = model(x)
    y.sum().backward()
    out["eval.y"], out["eval.dx"] = _hash(y), _hash(x.grad)
    for name, p in sorted(model.named_parameters()):
        out[f"eval.d{name}"] = _hash(p.grad)
    return out


def model_out(model: nn.Module, shape: tuple[int, ...]) -> int:
    linear = next((m for m in model.modules() if isinstance(m, nn.Linear)), None)
    return linear.out_features if linear is not None else shape[1]


@contextlib.contextmanager
def _nothing(model: nn.Module) -> Iterator[None]:
    yield


@contextlib.contextmanager
def _plain(model: nn.Module) -> Iterator[None]:
    with N.plain_autograd():
        yield


@contextlib.contextmanager
def _guard(model: nn.Module) -> Iterator[None]:
    previous = N.set_nonfinite_guard(True)
    try:
        yield
    finally:
        N.set_nonfinite_guard(previous)


@contextlib.contextmanager
def _accumulate(model: nn.Module) -> Iterator[None]:
    with N.accumulate(model, steps=1):
        yield


def cases() -> Iterator[tuple[str, str, tuple[int, ...], bool, Callable]]:
    """(case name, spec, input shape, momentum=None, context around each training step)."""
    for spec in SPECS:
        yield f"{spec} small", spec, SMALL, False, _nothing
        yield f"{spec} large", spec, LARGE, False, _nothing
        yield f"{spec} large plain", spec, LARGE, False, _plain
        yield f"{spec} flat", spec, FLAT, False, _nothing
        if spec in ("bn", "mbn", "cbn", "brn", "noisy_bn", "native_bn"):
            yield f"{spec} small guard", spec, SMALL, False, _guard
            yield f"{spec} large guard", spec, LARGE, False, _guard
    for spec in MOMENTUM_NONE:
        yield f"{spec} momentum=None small", spec, SMALL, True, _nothing
        yield f"{spec} momentum=None large", spec, LARGE, True, _nothing
    for spec in ("bn", "mbn", "cbn", "brn", "native_bn"):
        yield f"{spec} accumulate small", spec, SMALL, False, _accumulate
    for spec in WRAPPERS:
        yield f"{spec} flat", spec, (16, 6), False, _nothing
        yield f"{spec} large", spec, (16384, 6), False, _nothing


def digest() -> dict[str, dict[str, str]]:
    torch.set_num_threads(1)  # reductions split the same way on every machine
    result = {}
    with warnings.catch_warnings():  # noisy_bn's eval warning, cbn's without-progress one
        warnings.simplefilter("ignore")
        for name, spec, shape, momentum_none, around in cases():
            channels = 4 if shape[1] == 6 else shape[1]
            model = _prepare(_build(spec, channels, momentum_none), seed=7)
            result[name] = _run(model, shape, around)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args()
    layers = digest()
    record = {**provenance(), "torch": torch.__version__, "threads": 1, "layers": layers}
    args.out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"{len(layers)} cases -> {args.out}")


if __name__ == "__main__":
    main()
