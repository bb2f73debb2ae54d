"""``bn`` against ``torch.nn.BatchNorm1d/2d/3d`` itself, on torch's own sample inputs.

The samples are torch 2.13's ``module_inputs_torch_nn_BatchNorm{1,2,3}d`` and its error inputs, read
from torch's installed ``torch/testing/_internal/common_modules.py`` with ``ast`` and run with small
stand-ins for ``ModuleInput``/``FunctionInput``: importing that module needs ``expecttest`` (not a
dependency) and costs ~20 s, while its BatchNorm functions only list constructor arguments and input
shapes. Every sample builds torch's module and bnlab's ``bn`` from the same arguments and state and
compares outputs, gradients and buffers with ``torch.testing.assert_close``'s tolerances for the
dtype (float32, float64, float16/bfloat16 input with float32 parameters), in training and eval, on
the plain and the fused path. Then the module protocol: signature, validation, factory kwargs,
resets, the forward rule with/without buffers, zero-size batches for every layer, memory formats,
state_dict versions and ``assign=True``, pickling, the "mixed dtype" rule, and ``convert``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import io
import itertools
import pickle
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

import bnlab.norms as N
import bnlab.norms.engine.route as norms_route
from bnlab.norms.registry import REGISTRY

TORCH_CLASSES = {cls.__name__: cls for cls in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)}
CHANNEL_LAYERS = sorted(name for name, info in REGISTRY.items()
                        if info.kind == "channel" and name != "none")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- torch's sample inputs, read from its source ---------------------------------------------
def _torch_sample_functions() -> dict[str, object]:
    """Exec torch's BatchNorm sample-input functions with stand-ins that record what they build."""
    spec = importlib.util.find_spec("torch.testing._internal.common_modules")
    assert spec is not None and spec.origin, "torch ships torch/testing/_internal/common_modules.py"
    tree = ast.parse(open(spec.origin, encoding="utf-8").read())
    wanted = [node for node in tree.body
              if isinstance(node, ast.FunctionDef) and "BatchNorm" in node.name
              and node.name.startswith(("module_inputs_torch_nn_BatchNorm", "module_error_inputs"))]
    namespace = {
        "partial": lambda f, **kw: (lambda shape: SimpleNamespace(shape=shape)),
        "make_tensor": None, "torch": torch,
        "FunctionInput": lambda *args, **kwargs: SimpleNamespace(args=args, kwargs=kwargs),
        "ModuleInput": lambda constructor_input, forward_input, desc="": SimpleNamespace(
            constructor=constructor_input, forward=forward_input, desc=desc),
        "ErrorModuleInput": lambda module_input, error_on, error_type, error_regex: SimpleNamespace(
            sample=module_input, error_type=error_type, error_regex=error_regex),
        "ModuleErrorEnum": SimpleNamespace(FORWARD_ERROR="forward",
                                           CONSTRUCTION_ERROR="construction"),
    }
    exec(compile(ast.Module(body=wanted, type_ignores=[]), spec.origin, "exec"), namespace)
    return {node.name: namespace[node.name] for node in wanted}


def torch_samples() -> list[tuple[str, str, tuple, dict, tuple]]:
    """(torch class name, description, constructor args, kwargs, input shape) for every sample."""
    functions = _torch_sample_functions()
    samples = []
    for name in TORCH_CLASSES:
        info = SimpleNamespace(module_cls=TORCH_CLASSES[name])
        inputs = functions[f"module_inputs_torch_nn_{name}"]
        for s in inputs(info, "cpu", torch.float32, True, True):
            samples.append((name, s.desc or "default", s.constructor.args, s.constructor.kwargs,
                            s.forward.args[0].shape))
    return samples


def torch_error_samples() -> list[tuple[str, tuple, dict, type, str]]:
    errors = _torch_sample_functions()["module_error_inputs_torch_nn_BatchNorm1d_2d_3d"]
    return [(name, e.sample.constructor.args, e.sample.constructor.kwargs, e.error_type,
             e.error_regex)
            for name, cls in TORCH_CLASSES.items()
            for e in errors(SimpleNamespace(module_cls=cls), "cpu", torch.float32, False, True)]


SAMPLES = torch_samples()
DTYPES = {  # input dtype, parameter dtype
    "float32": (torch.float32, torch.float32), "float64": (torch.float64, torch.float64),
    "float16-in-float32": (torch.float16, torch.float32),
    "bfloat16-in-float32": (torch.bfloat16, torch.float32),
}


def test_torch_samples_were_read():
    """22 samples in torch 2.13 (8 + 7 + 7), among them a zero batch and bias=False per class."""
    assert len(SAMPLES) >= 22
    descs = {(cls, desc) for cls, desc, *_ in SAMPLES}
    assert {("BatchNorm1d", "zero_batch"), ("BatchNorm2d", "affine_not_bias"),
            ("BatchNorm3d", "zero_batch")} <= descs


# ---- building the pair ---------------------------------------------------------------------
def set_state(module: nn.Module, seed: int) -> None:
    """Non-trivial γ, β and running statistics (counter 3: momentum=None's 1/t is tested)."""
    g = gen(seed)
    with torch.no_grad():
        c = module.num_features
        if module.weight is not None:
            module.weight.copy_(1 + 0.2 * torch.randn(c, generator=g))
        if module.bias is not None:
            module.bias.copy_(0.2 * torch.randn(c, generator=g))
        if module.running_mean is not None:
            module.running_mean.copy_(0.3 * torch.randn(c, generator=g))
            module.running_var.copy_(0.5 + torch.rand(c, generator=g))
            module.num_batches_tracked.fill_(3)


def pair(cls_name: str, args: tuple, kwargs: dict, param_dtype: torch.dtype, seed: int = 0):
    ref = TORCH_CLASSES[cls_name](*args, **kwargs)
    ours = N.BatchNorm(*args, **kwargs)
    for m in (ref, ours):
        set_state(m, seed)
    return ref.to(param_dtype), ours.to(param_dtype)


def sample_input(shape: tuple, dtype: torch.dtype, seed: int, mean: float = 0.0) -> torch.Tensor:
    """torch's make_tensor range (uniform in [-9, 9]), from a seeded generator."""
    x = torch.rand(shape, generator=gen(seed), dtype=torch.float64) * 18 - 9 + mean
    return x.to(dtype).requires_grad_()


def step(module: nn.Module, x: torch.Tensor, seed: int):
    """One forward and backward with a fixed random output gradient: (y, ∂x, ∂γ, ∂β, buffers)."""
    x = x.detach().clone().requires_grad_()
    y = module(x)
    g = torch.randn(y.shape, generator=gen(seed + 100), dtype=torch.float64).to(y.dtype)
    (y * g).sum().backward()
    grads = [p.grad.clone() if p is not None and p.grad is not None else None
             for p in (module.weight, module.bias)]
    for p in module.parameters():
        p.grad = None
    return y.detach(), x.grad, *grads, {k: v.clone() for k, v in module.named_buffers()}


def assert_same(ours, ref, what: str) -> None:
    if ref is None:
        assert ours is None, what
        return
    torch.testing.assert_close(ours, ref, msg=lambda m: f"{what}: {m}")


@pytest.fixture(params=["plain", "fused"])
def path(request, monkeypatch):
    """Small inputs take the plain autograd path; FUSED_MIN_NUMEL = 0 sends them to the fused."""
    monkeypatch.setattr(norms_route, "FUSED_MIN_NUMEL", 0 if request.param == "fused" else 1 << 62)
    return request.param


# half inputs always take the plain path (the fused one is for float32/float64)
DTYPE_PATHS = [(d, p) for d in DTYPES for p in ("plain", "fused") if p == "plain" or "in" not in d]


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("dtype,path", DTYPE_PATHS, ids=[f"{d}-{p}" for d, p in DTYPE_PATHS])
@pytest.mark.parametrize("sample", SAMPLES, ids=[f"{c}-{d}" for c, d, *_ in SAMPLES])
def test_bn_equals_torch_on_its_samples(sample, dtype, path, training, monkeypatch):
    monkeypatch.setattr(norms_route, "FUSED_MIN_NUMEL", 0 if path == "fused" else 1 << 62)
    cls_name, _, args, kwargs, shape = sample
    x_dtype, param_dtype = DTYPES[dtype]
    ref, ours = pair(cls_name, args, kwargs, param_dtype)
    ref.train(training), ours.train(training)
    for seed in range(2):  # two steps: the running statistics of the first feed the second
        x = sample_input(shape, x_dtype, seed)
        got, want = step(ours, x, seed), step(ref, x, seed)
        names = ("output", "input grad", "weight grad", "bias grad")
        for what, a, b in zip(names, got[:4], want[:4]):
            assert_same(a, b, f"step {seed} {what}")
        assert got[4].keys() == want[4].keys()
        for k in want[4]:
            assert_same(got[4][k], want[4][k], f"step {seed} buffer {k}")
    assert ours.state_dict().keys() == ref.state_dict().keys()


# ---- constructor -------------------------------------------------------------------------
def test_signature_is_torchs():
    ours = inspect.signature(N.BatchNorm).parameters
    ref = inspect.signature(nn.BatchNorm2d).parameters
    assert list(ours)[: len(ref)] == list(ref)
    for name, p in ref.items():
        assert (ours[name].default, ours[name].kind) == (p.default, p.kind), name


@pytest.mark.parametrize("error", torch_error_samples(), ids=[e[0] for e in torch_error_samples()])
def test_torch_error_inputs_raise(error):
    """torch's error samples (eps=-1: ValueError "eps must be positive"); bnlab refuses it at
    construction, torch at forward."""
    cls_name, args, kwargs, error_type, regex = error
    shapes = {"BatchNorm1d": (2, 10), "BatchNorm2d": (2, 10, 5, 5), "BatchNorm3d": (2, 10, 4, 4, 4)}
    shape = shapes[cls_name]
    with pytest.raises(error_type, match=regex):
        TORCH_CLASSES[cls_name](*args, **kwargs)(torch.randn(shape))
    with pytest.raises(error_type, match=regex):
        N.BatchNorm(*args, **kwargs)(torch.randn(shape))


@pytest.mark.parametrize("name", CHANNEL_LAYERS)
@pytest.mark.parametrize("bad", [
    {"eps": 0.0}, {"eps": -1.0}, {"eps": float("nan")}, {"eps": float("inf")}, {"eps": 10**400},
    {"eps": "abc"}, {"momentum": float("nan")}, {"momentum": float("inf")}, {"momentum": 1.5}],
    ids=str)
def test_bad_eps_and_momentum_are_refused_by_every_layer(name, bad):
    with pytest.raises(ValueError, match=f"{next(iter(bad))} must be"):
        N.create(name, 4, **bad)


def test_eps_changed_after_construction_is_checked_at_forward_like_torch():
    for module in (nn.BatchNorm1d(3), N.BatchNorm(3)):
        module.eps = 0.0
        with pytest.raises(ValueError, match="eps must be positive during training"):
            module(torch.randn(4, 3))
        module.eval()
        assert module(torch.randn(4, 3)).shape == (4, 3)  # ε = 0 is allowed at inference (torch)
        module.eps = -1.0
        with pytest.raises(ValueError, match="eps must be non-negative"):
            module(torch.randn(4, 3))


@pytest.mark.parametrize("name", CHANNEL_LAYERS)
def test_factory_kwargs_bias_and_resets_for_every_layer(name):
    """device/dtype place every tensor (meta, float64); bias=False keeps γ only; resets restore
    the initial state."""
    layer = N.create(name, 4, device="meta", dtype=torch.float64)
    tensors = list(layer.parameters()) + list(layer.buffers())
    assert tensors and all(t.device.type == "meta" for t in tensors)
    assert all(t.dtype == torch.float64 for t in tensors if t.is_floating_point())
    assert layer.num_batches_tracked.dtype == torch.long
    no_bias = N.create(name, 4, bias=False)
    assert no_bias.bias is None and no_bias.weight is not None
    assert "bias" not in no_bias.state_dict()
    assert "bias=False" in repr(no_bias)
    assert N.create(f"{name}(bias=false)", 4).bias is None  # the spec option too
    fresh = {k: v.clone() for k, v in N.create(name, 4).state_dict().items()}
    layer = N.create(name, 4).train()
    N.set_progress(layer, lr=0.1, epoch=2, epochs=3)
    for seed in range(3):
        layer(torch.randn(8, 4, generator=gen(seed)) * 3 + 1)
    with torch.no_grad():
        layer.weight.mul_(2), layer.bias.add_(1)
    layer.reset_parameters()
    for k, v in layer.state_dict().items():
        torch.testing.assert_close(v, fresh[k], msg=f"{name}: {k} after reset_parameters")


def test_resets_equal_torchs():
    ref, ours = pair("BatchNorm2d", (3,), {}, torch.float32)
    for m in (ref, ours):
        m(torch.randn(4, 3, 2, 2, generator=gen(0)))
        m.reset_running_stats()
    assert_same(ours.state_dict(), ref.state_dict(), "after reset_running_stats")
    for m in (ref, ours):
        m.reset_parameters()
    assert_same(ours.state_dict(), ref.state_dict(), "after reset_parameters")


# ---- the forward rule ----------------------------------------------------------------------
@pytest.mark.parametrize("training,track,buffers,momentum", list(itertools.product(
    [True, False], [True, False], [True, False], [0.1, None])))
def test_forward_rule_in_every_combination(training, track, buffers, momentum):
    """torch: batch statistics in training or without buffers; buffers present with
    track_running_stats=False are used in eval (and left alone in training)."""
    options = {"momentum": momentum, "track_running_stats": buffers}
    ref, ours = pair("BatchNorm2d", (3,), options, torch.float32)
    for m in (ref, ours):
        m.track_running_stats = track
        m.train(training)
    for seed in range(3):
        x = sample_input((4, 3, 2, 2), torch.float32, seed)
        got, want = step(ours, x, seed), step(ref, x, seed)
        for i, what in enumerate(("output", "input grad", "weight grad", "bias grad")):
            assert_same(got[i], want[i], f"{what} at step {seed}")
        assert_same(got[4], want[4], f"buffers at step {seed}")


@pytest.mark.parametrize("name", CHANNEL_LAYERS)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_zero_size_batch_for_every_layer(name, training):
    """torch: an empty output, zero (not None) γ/β gradients, running statistics unchanged."""
    layer = N.create(name, 5).train(training)
    before = {k: v.clone() for k, v in layer.named_buffers()}
    for shape in ((0, 5), (0, 5, 9), (0, 5, 2, 2), (2, 5, 0, 3)):
        x = torch.randn(shape, requires_grad=True)
        y = layer(x)
        assert y.shape == shape and y.dtype == x.dtype
        y.sum().backward()
        assert x.grad is not None and x.grad.shape == shape
        for p in layer.parameters():
            assert p.grad is not None and torch.equal(p.grad, torch.zeros_like(p))
    for k, v in layer.named_buffers():
        if k not in ("num_batches_tracked", "_amat_steps"):
            assert torch.equal(v, before[k]), f"{name}: {k} changed by an empty batch"
    if name == "bn" and training:  # torch counts the empty batch
        ref = nn.BatchNorm2d(5)
        ref(torch.randn(0, 5, 2, 2)), ref(torch.randn(2, 5, 0, 3)), ref(torch.randn(0, 5, 2, 2))
        ref(torch.randn(0, 5, 2, 2))
        assert int(layer.num_batches_tracked) == int(ref.num_batches_tracked) == 4


@pytest.mark.parametrize("spec", ["si_bn", "wn", "wn+mean_only_bn"])
def test_zero_size_batch_through_the_wrappers(spec):
    """si_bn and wn (the layers that wrap a linear layer) pass an empty batch as torch's layers
    do."""
    block = N.normalized(nn.Linear(3, 5, bias=False), spec).train()
    before = {k: v.clone() for k, v in block.named_buffers()}
    x = torch.randn(0, 3, requires_grad=True)
    y = block(x)
    assert y.shape == (0, 5)
    y.sum().backward()
    assert x.grad.shape == (0, 3)
    for name, p in block.named_parameters():
        assert p.grad is not None and not p.grad.any(), name
    for k, v in block.named_buffers():
        if not k.endswith("num_batches_tracked"):
            assert torch.equal(v, before[k]), k


def test_one_value_per_channel_still_raises_like_torch():
    for module in (nn.BatchNorm1d(3), N.BatchNorm(3)):
        with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
            module(torch.randn(1, 3))


# ---- memory formats ------------------------------------------------------------------------
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("layout", ["channels_last", "channels_last_3d", "transposed", "strided"])
def test_memory_format_and_non_contiguous_inputs(layout, training, path):
    """Values equal torch's; the output keeps the input's memory format where torch's does."""
    five = layout == "channels_last_3d"
    shape = (4, 3, 5, 6, 2) if five else (4, 3, 5, 6)
    base = sample_input(shape, torch.float32, 0).detach()
    if layout.startswith("channels_last"):
        fmt = torch.channels_last_3d if five else torch.channels_last
        x = base.contiguous(memory_format=fmt)
    else:
        x = base.transpose(2, 3) if layout == "transposed" else base[:, :, ::2]
    ref, ours = pair("BatchNorm3d" if five else "BatchNorm2d", (3,), {}, torch.float32)
    ref.train(training), ours.train(training)
    got, want = step(ours, x, 0), step(ref, x, 0)
    for i, what in enumerate(("output", "input grad", "weight grad", "bias grad")):
        assert_same(got[i], want[i], what)
    if layout.startswith("channels_last"):
        for t_got, t_want in ((got[0], want[0]), (got[1], want[1])):
            assert t_got.is_contiguous(memory_format=fmt) == t_want.is_contiguous(memory_format=fmt)


@pytest.mark.parametrize("name", CHANNEL_LAYERS)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_every_layer_keeps_channels_last(name, training, path):
    """torch's BatchNorm returns channels_last output (and input gradient) for channels_last
    input."""
    layer = N.create(name, 8).train(training)
    x = torch.randn(4, 8, 5, 6, generator=gen(0)).contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    y = layer(x)
    y.backward(torch.ones_like(y))
    for t in (y, x.grad):
        assert t.is_contiguous(memory_format=torch.channels_last), name


# ---- numerics beyond the samples -----------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("mean", [0.0, 5.0])
def test_reduced_precision_input_gradient_is_correctly_rounded(dtype, mean):
    """AMP (half input, float32 γ, β): the input gradient rounds once from float32, as torch's
    does: ≥ 99.9 % of elements equal the float64 gradient rounded to the dtype (torch: 99.98–100 %;
    three gradient paths each rounded to half and summed in half gave 60–67 %)."""
    x = (torch.randn(32, 8, 6, 6, generator=gen(1), dtype=torch.float64) * 2 + mean).to(dtype)
    g = torch.randn(32, 8, 6, 6, generator=gen(2), dtype=torch.float64).to(dtype)
    for module in pair("BatchNorm2d", (8,), {}, torch.float32):
        exact = type(module)(8).double()
        exact.load_state_dict(module.state_dict())
        x64 = x.double().requires_grad_()
        exact(x64).backward(g.double())
        xr = x.clone().requires_grad_()
        module(xr).backward(g)
        assert xr.grad.dtype == dtype
        share = (xr.grad == x64.grad.to(dtype)).double().mean().item()
        assert share >= 0.999, f"{type(module).__name__}: {share:.4%} correctly rounded"


HALF_SPECS = [n for n in CHANNEL_LAYERS if n != "noisy_bn"] + ["lp_bn(p=1)", "lp_bn(p=inf)"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("spec", HALF_SPECS)
def test_every_layer_rounds_its_reduced_precision_input_gradient_once(spec, dtype):
    """The same for every layer, against its own float64 copy (noisy_bn: its noise is drawn in the
    statistics' dtype, so a float64 copy draws other noise)."""
    x = (torch.randn(32, 8, 6, 6, generator=gen(1), dtype=torch.float64) * 2 + 5).to(dtype)
    g = torch.randn(32, 8, 6, 6, generator=gen(2), dtype=torch.float64).to(dtype)
    layer = N.create(spec, 8)
    exact = N.create(spec, 8).double()
    exact.load_state_dict(layer.state_dict())
    x64 = x.double().requires_grad_()
    exact(x64).backward(g.double())
    xr = x.clone().requires_grad_()
    layer(xr).backward(g)
    share = (xr.grad == x64.grad.to(dtype)).double().mean().item()
    assert share >= 0.999, f"{spec}: {share:.4%} correctly rounded"


EVAL_CENTRED = ["bn", "mean_only_bn", "mbn", "brn", "lp_bn", "noisy_bn", "native_bn"]


@pytest.mark.parametrize("name", EVAL_CENTRED)
@pytest.mark.parametrize("mean", [100.0, 1000.0])
def test_eval_gamma_gradient_at_a_large_activation_mean(name, mean):
    """Eval mode, activations with a large mean: ∂γ = Σ g·(x − μ)/σ, computed centred. Normalized
    error against the layer in float64 ≤ 2e-6 (torch's BatchNorm: 1e-7–2e-6; the uncentred
    Σ g·x − μ Σ g in float32: 1e-5 at mean 100, 1.5e-4 at mean 1000)."""
    layer = N.create(name, 6)
    with torch.no_grad():
        layer.running_mean.fill_(mean).add_(torch.randn(6, generator=gen(3)))
        layer.running_var.uniform_(0.5, 2.0, generator=gen(4))
    layer.eval()
    exact = N.create(name, 6).double().eval()
    exact.load_state_dict(layer.state_dict())
    # float32 values, so the truth differs only by what the layer computes
    x = (torch.randn(64, 6, 4, 4, generator=gen(5), dtype=torch.float64) + mean).float().double()
    g = torch.randn(64, 6, 4, 4, generator=gen(6), dtype=torch.float64).float().double()
    layer(x.float()).backward(g.float())
    exact(x).backward(g)
    truth = exact.weight.grad
    error = (layer.weight.grad.double() - truth).norm() / truth.norm()
    assert error <= 2e-6, f"{name}: normalized γ-gradient error {error:.2e}"


# ---- state_dict, meta device, pickling -----------------------------------------------------
def version_one(state: dict) -> dict:
    """A version-1 checkpoint: no num_batches_tracked, metadata version 1 (torch before 0.4.1)."""
    old = type(state)((k, v) for k, v in state.items() if not k.endswith("num_batches_tracked"))
    old._metadata = {"": {"version": 1}}
    return old


@pytest.mark.parametrize("name", CHANNEL_LAYERS)
def test_version_one_checkpoints_load_strictly_into_every_layer(name):
    layer = N.create(name, 4)
    state = version_one(layer.state_dict())
    with torch.no_grad():
        layer.num_batches_tracked.fill_(5)  # torch keeps the module's counter when it is missing
    layer.load_state_dict(state)
    assert int(layer.num_batches_tracked) == 5
    assert N.create(name, 4).state_dict()._metadata[""]["version"] == 2


def test_state_dicts_interchange_with_torch_including_bias_false_and_version_one():
    for kwargs in ({}, {"bias": False}, {"affine": False}, {"track_running_stats": False}):
        ref, ours = pair("BatchNorm2d", (3,), kwargs, torch.float32, seed=1)
        fresh_ref, fresh_ours = nn.BatchNorm2d(3, **kwargs), N.BatchNorm(3, **kwargs)
        fresh_ours.load_state_dict(ref.state_dict())  # strict, both ways
        fresh_ref.load_state_dict(ours.state_dict())
        assert_same(fresh_ours.state_dict(), ref.state_dict(), f"{kwargs} torch → bnlab")
        assert_same(fresh_ref.state_dict(), ours.state_dict(), f"{kwargs} bnlab → torch")
        if kwargs.get("track_running_stats", True):
            for m in (fresh_ref, fresh_ours):
                m.load_state_dict(version_one(ref.state_dict()))
            assert_same(fresh_ours.state_dict(), fresh_ref.state_dict(), f"{kwargs} version 1")


def test_meta_device_module_loads_with_assign_like_torch():
    trained, _ = pair("BatchNorm2d", (3,), {}, torch.float32, seed=2)
    for make in (nn.BatchNorm2d, N.BatchNorm):
        module = make(3, device="meta")
        module.load_state_dict(trained.state_dict(), assign=True)
        assert all(t.device.type == "cpu" for t in module.state_dict().values())
        assert_same(module.state_dict(), trained.state_dict(), f"{make.__name__} assign")
    results = []
    for make in (nn.BatchNorm2d, N.BatchNorm):
        module = make(3, device="meta")
        module.load_state_dict({}, strict=False, assign=True)  # torch: the counter is tensor(0)
        results.append({k: v.device.type for k, v in module.state_dict().items()})
        assert torch.equal(module.num_batches_tracked, torch.tensor(0))
    assert results[0] == results[1]


@pytest.mark.parametrize("name", CHANNEL_LAYERS)
def test_meta_device_layer_loads_with_assign_and_runs(name):
    """Every layer built on ``meta`` takes a state_dict with ``assign=True`` and then computes as
    the layer it came from (non-persistent buffers, e.g. cbn's η, are rebuilt on the loaded
    device)."""
    source = N.create(name, 4)
    N.set_progress(source, lr=0.1, epoch=1, epochs=3)
    source(torch.randn(8, 4, 3, generator=gen(1)) + 2)
    layer = N.create(name, 4, device="meta")
    layer.load_state_dict(source.state_dict(), assign=True)
    N.set_progress(layer, lr=0.1, epoch=1, epochs=3)
    assert all(t.device.type == "cpu" for t in (*layer.parameters(), *layer.buffers()))
    x = torch.randn(8, 4, 3, generator=gen(2))
    assert_same(layer.eval()(x), source.eval()(x), f"{name} eval output")
    if name != "noisy_bn":  # its own noise generator is not state
        assert_same(layer.train()(x), source.train()(x), f"{name} training output")


@pytest.mark.parametrize("name", CHANNEL_LAYERS)
def test_pickling_round_trip_for_every_layer(name):
    layer = N.create(name, 4)
    N.set_progress(layer, lr=0.1, epoch=2, epochs=3)
    for seed in range(2):
        layer(torch.randn(8, 4, 3, generator=gen(seed)) + 2)
    copy = pickle.loads(pickle.dumps(layer))
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    x = torch.randn(8, 4, 3, generator=gen(9))
    for other in (copy, loaded):
        assert repr(other) == repr(layer)
        assert_same(other.state_dict(), layer.state_dict(), name)
        assert_same(other.eval()(x), layer.eval()(x), f"{name} eval output")


# ---- dtypes: torch's "mixed dtype" rule ----------------------------------------------------
@pytest.mark.parametrize("name", CHANNEL_LAYERS)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_mixed_dtype_raises_like_torch(name, training):
    """torch.nn.BatchNorm with float32 parameters refuses float64 input (and float64 parameters
    refuse float32 input); float16/bfloat16 input with float32 parameters is AMP and runs."""
    for module in (nn.BatchNorm1d(4), N.create(name, 4)):
        module.train(training)
        with pytest.raises(RuntimeError, match="mixed dtype"):
            module(torch.randn(8, 4, dtype=torch.float64))
        for half in (torch.float16, torch.bfloat16):
            assert module(torch.randn(8, 4).to(half)).dtype == half
        module.double()
        with pytest.raises(RuntimeError, match="mixed dtype"):
            module(torch.randn(8, 4))
        assert module(torch.randn(8, 4, dtype=torch.float64)).dtype == torch.float64


# ---- convert carries every option and buffer -------------------------------------------------
def tiny_net(**bn_options) -> nn.Sequential:
    torch.manual_seed(0)  # the conv's init (torch's own initializers draw from the global RNG)
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(3, **bn_options), nn.ReLU(),
                         nn.Flatten(), nn.Linear(48, 2))


def sgd_steps(model: nn.Module, steps: int = 3) -> torch.Tensor:
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for seed in range(steps):
        x = torch.randn(8, 2, 4, 4, generator=gen(seed)) * 3 + 1
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()(torch.randn(8, 2, 4, 4, generator=gen(99)) * 3 + 1)


@pytest.mark.parametrize("options", [{"bias": False}, {"momentum": None}, {"affine": False},
                                     {"track_running_stats": False}], ids=str)
def test_convert_keeps_torchs_behaviour_through_training(options):
    """A converted model trains and evaluates as the torch model does (bias=False stays weight-only:
    a silently added trainable bias made outputs differ by 162 after 3 SGD steps)."""
    ref = tiny_net(**options)
    ours = N.convert(tiny_net(**options), "bn")
    assert isinstance(ours[1], N.BatchNorm)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    ours.load_state_dict(ref.state_dict())  # strict, both ways
    ref.load_state_dict(ours.state_dict())
    torch.testing.assert_close(sgd_steps(ours), sgd_steps(ref))
    assert_same(ours.state_dict(), ref.state_dict(), "after training")


def test_convert_carries_buffers_kept_with_track_running_stats_false():
    """torch's eval normalizes with buffers that exist even when track_running_stats=False."""
    ref = tiny_net()
    sgd_steps(ref.train())
    ref[1].track_running_stats = False
    for spec in ("bn", "mbn", "brn", "native_bn"):
        ours = N.convert(__import__("copy").deepcopy(ref), spec)
        assert ours[1].track_running_stats is False and ours[1].running_mean is not None
        x = torch.randn(8, 2, 4, 4, generator=gen(7)) + 1
        torch.testing.assert_close(ours.eval()(x), ref.eval()(x), msg=spec)


@pytest.mark.parametrize("name", CHANNEL_LAYERS)
def test_convert_carries_bias_false_device_and_dtype_to_every_layer(name):
    old = nn.BatchNorm2d(3, bias=False, momentum=None, eps=1e-3, device="meta", dtype=torch.float64)
    new = N.convert(old, name)
    assert new.bias is None and new.weight is not None
    assert (new.eps, new.momentum) == (1e-3, None)
    tensors = list(new.parameters()) + list(new.buffers())
    assert all(t.device.type == "meta" for t in tensors)
    assert all(t.dtype == torch.float64 for t in tensors if t.is_floating_point())


def test_convert_refuses_an_option_the_new_layer_cannot_take(monkeypatch):
    """A layer without a ``bias`` option must not silently gain a bias: refused, naming it."""
    # the module, not N.convert (the function)
    convert_module = importlib.import_module("bnlab.norms.tools.convert")

    def no_bias_layer(num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        return N.BatchNorm(num_features, eps, momentum, affine, track_running_stats)

    info = N.NormInfo("no_bias_layer", no_bias_layer, "", "", "")
    monkeypatch.setattr(convert_module, "lookup", lambda spec: (info, {}))
    monkeypatch.setattr(convert_module, "create", lambda spec, c, **kw: no_bias_layer(c, **kw))
    with pytest.raises(ValueError, match="no_bias_layer does not take the option.*bias=False"):
        convert_module.create_like(nn.BatchNorm2d(3, bias=False), "no_bias_layer")
    assert convert_module.create_like(nn.BatchNorm2d(3), "no_bias_layer").bias is not None
