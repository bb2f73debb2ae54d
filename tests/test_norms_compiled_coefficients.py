"""The fused operators' per-channel math traced once per variant and compiled.

:mod:`bnlab.norms.engine.coef_compile` replaces the eager coefficient graph inside
``bnlab::stats_affine`` by one compiled function (coefficients + per-channel partials) and the
backward's per-channel algebra by another. Checked here against the eager per-channel path in
float64 for every BN-family variant (values, input and parameter gradients, buffers after three
steps, so an in-place buffer update between forward and backward would show), against
``torch.nn.BatchNorm2d``, and for the fallbacks. Compile time: dynamo's ``aot_eager`` backend
(traces, generates no code: ~1 s a variant) for the variants; inductor (C++ code generation, 5–25
s) for ``bn`` only.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import bnlab.norms.engine.route as norms_route
from bnlab.norms.engine import coef_compile, switches
from bnlab.norms.tools.bench import _layer as _bench_layer
from bnlab.norms.engine.fused import fused_normalize
from bnlab.norms.tools.opcount import count_ops, training_step
from bnlab.norms.variants.batchnorm import BatchNorm


class SharedPathBatchNorm(BatchNorm):
    """BN's coefficients on the shared path (``bn`` itself trains through torch's kernel)."""

    def coefficients(self, mean, var, gamma, beta):  # overridden: the shared path
        return super().coefficients(mean, var, gamma, beta)


def _layer(spec: str, shape):
    layer = _bench_layer(spec, shape)
    if spec != "bn":
        return layer
    shared = SharedPathBatchNorm(shape[1])
    shared.load_state_dict(layer.state_dict())
    return shared

SHAPE = (6, 5, 3, 2)
VARIANTS = [
    "bn",
    "mean_only_bn",
    "var_only_bn",
    "mbn",
    "cbn",
    "cbn(decouple=false)",
    "cbn(center=false)",
    "cbn(amat=false)",
    "brn",
    "brn(relax_from=2, r_max_at=5, d_max_at=5)",
    "lp_bn",
    "si_bn",
]


@pytest.fixture(scope="module", autouse=True)
def clean_cache():
    coef_compile.reset()
    yield
    coef_compile.reset()


@pytest.fixture
def policy(monkeypatch):
    """Small inputs on the fused path, the aot_eager backend; returns a setter of the policy."""
    monkeypatch.setattr(norms_route, "FUSED_MIN_NUMEL", 0)
    monkeypatch.setenv("BNLAB_COEF_BACKEND", "aot_eager")
    return lambda value: monkeypatch.setenv("BNLAB_COMPILE_COEFFICIENTS", value)


@pytest.fixture
def fresh(policy):
    """As ``policy``, with no compiled function cached (for the tests of building and failing)."""
    coef_compile.reset()
    return policy


def three_steps(spec: str, shape=SHAPE) -> list[torch.Tensor]:
    """Outputs, input and parameter gradients of three float64 training steps, then the buffers."""
    torch.manual_seed(0)
    layer = _layer(spec, shape).double().train()
    gen, out = torch.Generator().manual_seed(1), []
    for _ in range(3):
        x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 3 + 2).requires_grad_()
        y = layer(x)
        y.backward(torch.randn(shape, generator=gen, dtype=torch.float64))
        assert type(y.grad_fn).__name__.startswith("_StatsAffine")  # the fused path ran
        out += [y.detach(), x.grad] + [p.grad.clone() for p in layer.parameters()]
    return out + [b.clone() for b in layer.buffers()]


def built() -> list[str]:
    return [key[0] for key, fn in coef_compile._BUILT.items() if fn is not None]


def assert_close_all(got, want, rtol=1e-13):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=rtol, atol=rtol * float(w.abs().max()) + 1e-300)


@pytest.mark.parametrize("spec", VARIANTS)
def test_compiled_equals_eager_per_channel_path(spec, policy):
    policy("0")
    before = dict(coef_compile.CALLS)
    eager = three_steps(spec)
    assert dict(coef_compile.CALLS) == before
    policy("1")
    compiled = three_steps(spec)
    calls = {k: v - before.get(k, 0) for k, v in coef_compile.CALLS.items()}
    assert calls == {"forward": 3, "backward": 3}, "the compiled functions did not run"
    assert_close_all(compiled, eager)


def test_inductor_bn_matches_torch_batchnorm(fresh):
    """The generated C++ (inductor) against torch's own BatchNorm2d, float64, two steps."""
    fresh("1")
    monkey = pytest.MonkeyPatch()
    monkey.setenv("BNLAB_COEF_BACKEND", "inductor")
    try:
        ours, ref = _layer("bn", SHAPE).double(), torch.nn.BatchNorm2d(SHAPE[1]).double()
        with torch.no_grad():
            ref.weight.uniform_(0.5, 2.0)
            ours.weight.copy_(ref.weight)
        gen = torch.Generator().manual_seed(3)
        for _ in range(2):
            x = torch.randn(SHAPE, generator=gen, dtype=torch.float64) * 2 + 5
            g = torch.randn(SHAPE, generator=gen, dtype=torch.float64)
            xs = [x.clone().requires_grad_() for _ in range(2)]
            ours(xs[0]).backward(g)
            ref(xs[1]).backward(g)
            torch.testing.assert_close(xs[0].grad, xs[1].grad, rtol=1e-12, atol=1e-12)
        for a, b in [
            (ours.weight.grad, ref.weight.grad),
            (ours.bias.grad, ref.bias.grad),
            (ours.running_mean, ref.running_mean),
            (ours.running_var, ref.running_var),
        ]:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        assert built() == ["forward", "backward"]
    finally:
        monkey.undo()


def test_a_failing_compile_warns_once_and_stays_eager(fresh, monkeypatch):
    fresh("0")
    eager = three_steps("bn")
    fresh("1")
    monkeypatch.setenv("BNLAB_COEF_BACKEND", "no_such_backend_for_the_test")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = three_steps("bn")
        three_steps("bn")
    failures = [w for w in caught if "stays eager" in str(w.message)]
    assert len(failures) == 1, [str(w.message) for w in caught]
    assert (
        built() == [] and None in coef_compile._BUILT.values()
    )  # remembered: not retried each step
    assert_close_all(got, eager, rtol=0)


def test_cross_channel_coefficients_stay_eager(fresh):
    """A coefficient map that mixes channels has no per-channel partials: detected, kept eager."""
    fresh("1")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4, dtype=torch.float64, generator=gen)
    gamma = torch.rand(4, dtype=torch.float64, generator=gen).requires_grad_()

    def coefficients(mean, var, gamma):  # one variance shared by all channels
        scale = gamma * torch.rsqrt(var.mean() + 1e-5)
        return scale, -mean * scale

    def moments(t):
        return *torch.batch_norm_update_stats(t, None, None, 0.0), t.shape[0]

    grads = []
    for value in ("1", "0"):
        fresh(value)
        xr = x.clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            y = fused_normalize(xr, moments, coefficients, gamma)[0]
        grads.append(torch.autograd.grad(y, (xr, gamma), torch.cos(y.detach())))
    assert built() == [] and None in coef_compile._BUILT.values()  # checked once, kept eager
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-14)
    mean, var = (
        x.mean(0),
        x.var(0, unbiased=False),
    )  # outside reference: plain autograd on the formula
    xr = x.clone().requires_grad_()
    y = (xr - xr.mean(0)) * gamma * torch.rsqrt(xr.var(0, unbiased=False).mean() + 1e-5)
    torch.testing.assert_close(grads[0][0], torch.autograd.grad(y, xr, torch.cos(y.detach()))[0])
    assert mean.shape == var.shape == (4,)


def test_inside_op_count_drops_where_compiled(policy):
    shape = (8, 16, 4, 4)
    counts = {}
    for value in ("0", "1"):
        policy(value)
        torch.manual_seed(0)
        step = training_step(_layer("cbn", shape), shape)
        step()
        counts[value] = count_ops(step, inside=True)
    assert counts["1"].by_name()["compiled::coefficients"] == 2
    assert counts["0"].total >= 100 and counts["1"].total <= counts["0"].total // 2, (
        counts["0"].total,
        counts["1"].total,
    )


def test_policy_default_is_cuda_only_and_bad_values_are_named(policy, monkeypatch):
    monkeypatch.delenv("BNLAB_COMPILE_COEFFICIENTS", raising=False)
    assert not switches.coefficients_compiled(torch.device("cpu"))
    assert switches.coefficients_compiled(torch.device("cuda"))
    policy("sometimes")
    with pytest.raises(ValueError, match="auto, 1 and 0"):
        switches.coefficients_compiled(torch.device("cpu"))


def test_a_foreign_dispatch_mode_gets_the_eager_path(fresh):
    """Dynamo refuses user dispatch modes: under one the eager path runs, and nothing is remembered
    as failed (the next step outside the mode compiles)."""

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    fresh("1")
    layer, x = _layer("bn", SHAPE), torch.randn(SHAPE).requires_grad_()
    with Seen():
        layer(x).sum().backward()
    assert coef_compile._BUILT == {}
    layer(x).sum().backward()
    assert built() == ["forward", "backward"]


def test_threads_share_one_compile_and_leave_dynamo_config_as_found(policy):
    """Two threads stepping compiled layers at once: the results of serial steps, one compiled
    function, and dynamo's static-shape flags restored afterwards (a count, not saved values)."""
    import threading

    policy("1")
    serial = [three_steps("bn") for _ in range(2)]
    results, errors = [None, None], []
    barrier = threading.Barrier(2)

    def work(i):
        try:
            barrier.wait(10)
            results[i] = three_steps("bn")
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for got, want in zip(results, serial):
        assert_close_all(got, want, rtol=0)
    config = torch._dynamo.config
    assert config.force_parameter_static_shapes and config.force_nn_module_property_static_shapes
