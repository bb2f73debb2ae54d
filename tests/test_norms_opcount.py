"""Few dispatched operations per training step, pinned so the count cannot creep back.

Counted with :func:`bnlab.norms.tools.opcount.count_ops` (a ``TorchDispatchMode``, views excluded)
on the CPU, one forward + backward on (32, 64, 16, 16) as in the issue. Before the fused operators:
native BatchNorm 6, ``bn`` 55, ``mbn`` 77, ``brn`` 80, ``cbn`` 113, ``lp_bn(p=inf)`` 83,
``noisy_bn`` 71.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
import torch

import bnlab.norms as N
import bnlab.norms.engine.route as norms_route
from bnlab.norms.tools.bench import _layer
from bnlab.norms.tools.opcount import count_ops, count_training_step, training_step

SHAPE = (32, 64, 16, 16)
BN_FAMILY = ["bn", "mean_only_bn", "var_only_bn", "mbn", "cbn", "cbn(decouple=false)",
             "cbn(center=false)", "cbn(amat=false)", "cbn(eta=0.9)", "brn",
             "brn(relax_from=2, r_max_at=5, d_max_at=5)"]
OTHERS = ["lp_bn", "lp_bn(p=1)", "lp_bn(p=inf)", "noisy_bn", "si_bn"]


def counted(spec: str, shape=SHAPE):
    torch.manual_seed(0)
    return count_training_step(_layer(spec, shape), shape)


def test_counter_sees_torch_batchnorm_and_skips_views():
    """The counter against torch's own ops: native BN is its two kernels plus the counter's add_ of
    num_batches_tracked and two gradient accumulations; a chain of views counts nothing."""
    native = counted("native_bn")
    assert native.by_name()["native_batch_norm"] == 1 \
        and native.by_name()["native_batch_norm_backward"] == 1
    assert native.total <= 8, native.names
    x = torch.randn(4, 6)
    assert count_ops(lambda: x.view(2, 12).t()[3:].unsqueeze(0).expand(5, -1, -1)).total == 0
    # a reshape that must copy does count
    assert count_ops(lambda: x.t().reshape(24)).names == ["clone"]
    assert count_ops(lambda: (x * 2).sum()).names == ["mul", "sum"]


@pytest.mark.parametrize("spec", BN_FAMILY)
def test_bn_family_dispatches_at_most_16_ops(spec):
    ops = counted(spec)
    assert ops.total <= 16, ops.by_name()


@pytest.mark.parametrize("spec", OTHERS)
def test_lp_noisy_and_si_bn_dispatch_at_most_24_ops(spec):
    ops = counted(spec)
    assert ops.total <= 24, ops.by_name()


# on small eager CPU inputs, where the fused operators do not run: torch's kernel each way, the rest
# small ops (before, the shared path's plain ops: 80 for noisy_bn, 104 for brn; brn's r, d and
# running update as plain ops around torch's kernel: 52, now one bnlab::renorm_corrections)
TORCH_KERNEL_SMALL = {"noisy_bn": 20, "brn": 12}


@pytest.mark.parametrize("shape", [(1000, 10), (32, 16, 8, 8)])
@pytest.mark.parametrize("spec", list(TORCH_KERNEL_SMALL))
def test_small_inputs_of_noisy_bn_and_brn_run_torch_kernel(spec, shape):
    ops = counted(spec, shape)
    names = ops.by_name()
    assert names["native_batch_norm"] == 1 and names["native_batch_norm_backward"] == 1, names
    assert ops.total <= TORCH_KERNEL_SMALL[spec], names


@pytest.mark.parametrize("spec", ["mean_only_bn", "cbn", "lp_bn(p=1)"])
def test_small_inputs_on_the_fused_path_dispatch_as_few(spec, monkeypatch):
    """The count does not depend on the size: a (1000, 10) batch on the fused path counts the
    same."""
    monkeypatch.setattr(norms_route, "FUSED_MIN_NUMEL", 0)
    assert counted(spec, (1000, 10)).total == counted(spec).total


def test_fused_operators_are_what_the_dispatcher_sees():
    names = counted("cbn").names
    assert names.count("bnlab::stats_affine") == 1 \
        and names.count("bnlab::stats_affine_backward") == 1
    lp = counted("lp_bn(p=inf)").names
    assert lp.count("bnlab::lp_normalize") == 1 and lp.count("bnlab::lp_normalize_backward") == 1


def test_inside_counts_what_the_operators_run():
    """``inside=True`` replaces each bnlab operator by the aten ops of its kernel (about the kernel
    launches on a GPU): the statistics, affine and reduction kernels appear, no bnlab:: name
    remains."""
    torch.manual_seed(0)
    step = training_step(_layer("mean_only_bn", SHAPE), SHAPE)
    step()
    inside = count_ops(step, inside=True).by_name()
    assert not any(name.startswith("bnlab::") for name in inside)
    assert inside["batch_norm_update_stats"] == 1 and inside["native_batch_norm_backward"] == 1
    assert sum(inside.values()) > count_ops(step).total


def test_plain_autograd_is_thread_local():
    """One thread's plain_autograd() leaves another thread's layers on the fused path."""
    layer, x = N.create("mbn", 64), torch.randn(SHAPE).requires_grad_()
    entered, release, seen = threading.Event(), threading.Event(), {}

    def other():
        with N.plain_autograd():
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    entered.wait(10)
    seen["main"] = type(layer(x).grad_fn).__name__
    release.set()
    thread.join()
    with N.plain_autograd():
        seen["inside"] = type(layer(x).grad_fn).__name__
    assert seen["main"].startswith("_StatsAffine") \
        and not seen["inside"].startswith("_StatsAffine"), seen


def test_importing_the_layers_does_not_import_dynamo():
    """``torch.compiler.disable`` is applied lazily (it imports torch._dynamo, 1.2 s)."""
    code = "import sys, bnlab.norms; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_small_inputs_take_the_fused_path_off_the_cpu_only():
    """Off the CPU every plain op is a kernel launch (43–125 per step at small sizes), so the fused
    operators run at every size there; on the CPU small inputs keep the plain path, measured 0–20 %
    faster (docs: benchmarks)."""
    small = (1000, 10)

    def on(device: str, dtype=torch.float32):  # what fused_enabled reads of a (1000, 10) input
        return SimpleNamespace(numel=lambda: 10_000, device=torch.device(device), dtype=dtype)

    assert not norms_route.fused_enabled(torch.empty(small))
    assert norms_route.fused_enabled(on("cuda"))
    assert norms_route.fused_enabled(on("cuda", torch.float64))
    # half inputs, as a convolution under autocast hands them on (tests/test_norms_half_fused.py)
    assert norms_route.fused_enabled(on("cuda", torch.bfloat16))
    assert norms_route.fused_enabled(on("cuda", torch.float16))
    assert norms_route.fused_enabled(torch.empty(64, 32, 8, 8))
    # meta tensors (shape inference) take the plain ops, which have meta kernels
    assert not norms_route.fused_enabled(torch.empty(64, 32, 8, 8, device="meta"))


@pytest.mark.parametrize("spec", ["mean_only_bn", "var_only_bn", "mbn", "brn", "lp_bn(p=1)"])
def test_the_fused_kernels_constant_arguments_launch_nothing(spec):
    """The unit means, variances and weights that the fused path hands torch's BatchNorm kernels are
    cached (:func:`bnlab.norms.engine.kernels.filled`), and so is the zero gradient of a statistic a
    variant ignores: on a GPU each fresh ones/zeros was a launch, five or six a step. A counted step
    (after a first one) of a variant whose own coefficients build no constant (``cbn``'s do) has
    none."""
    torch.manual_seed(0)
    layer = _layer(spec, SHAPE)
    step = training_step(layer, SHAPE)
    step()
    inside = count_ops(step, inside=True).by_name()
    assert not {"ones_like", "zeros_like", "full", "fill_"} & set(inside), inside


def test_cached_constants_stay_constant_and_survive_inference_mode():
    """The cached (C,) constants are never written by the kernels that read them, and one made
    first under ``torch.inference_mode`` is an ordinary tensor that later training steps can use."""
    from bnlab.norms.engine import kernels

    kernels._FILLED.clear()
    layer = N.create("mean_only_bn", SHAPE[1])
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        layer(x)  # the first fused call, which fills the cache
    assert kernels._FILLED and not any(t.is_inference() for t in kernels._FILLED.values())
    for _ in range(2):
        layer(x.clone().requires_grad_()).square().sum().backward()
    for (value, c, dtype, _), t in kernels._FILLED.items():
        assert torch.equal(t, torch.full((c,), value, dtype=dtype))
