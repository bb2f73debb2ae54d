"""A layer's whole training step as two compiled functions, for small eager CPU tensors.

On a small tensor ((1000, 10), (32, 16, 8, 8)) an eager training step of a BN variant costs what
its dozens of dispatched operations cost in Python and the dispatcher, not arithmetic: several
times torch's BatchNorm, and even the least a hand-written eager ``autograd.Function`` can do stays
above it (``benchmarks/eager_floor.py``, ``benchmarks/results/eager_floor.json``). Only compiled
code gets below that. ``torch.compile`` does not help there either: its guards and wrappers cost
more per call than the step itself.

So, opt-in (:func:`.switches.compiled_steps`, or ``BNLAB_COMPILED_STEPS=1``), a layer's training
step on a small CPU input runs as

* **forward**: one inductor-compiled function of ``(x, parameters, buffers)`` that returns ``y``
  and what the backward needs, and writes the buffer updates in place (running statistics, mbn's
  moving moments, cbn's AMAT, step counters);
* **backward**: one compiled function of (what the forward saved, ∂L/∂y) that returns the input
  and parameter gradients,

called directly from one ``autograd.Function``: no dynamo, no guards. Both come from one joint
graph, traced once per key from the layer's own plain-autograd forward and its ``torch.func.vjp``
(``functional_call``, ``functionalize``, ``make_fx`` on fake tensors, inductor's decompositions),
and split by torch's min-cut partitioner (AOTAutograd's): the variant stays its one
``coefficients`` description, nothing is written per variant. A buffer the backward would read
itself is saved as a copy taken before the in-place update. The key is the layer's class, its
hyper-parameters (its catalogue entry's options: ``eps``, ``momentum``, ρ, τ0, …), the inputs'
shapes and dtypes, and which tensors require grad (none, or grad off: a forward-only function);
layers with equal keys share the compiled functions (a 25-layer network compiles once). Tracing on
fake tensors means no value of a tensor can be baked into the code: a step that reads one in Python
fails to trace and keeps its eager path, with one warning. Whatever a step reads from a buffer
(cbn's η, brn's warm-up step, mbn's λ exponent) is an input; Python numbers it reads are in the
key.

Which steps take it: training mode (batch statistics), float32/float64, contiguous, on the CPU,
below :data:`MAX_NUMEL` elements (above it inductor's one-thread loops lose to torch's kernels
in the fused operators), not synchronized, not under ``torch.compile``, ``torch.func`` transforms, a
``TorchDispatchMode`` or :func:`plain_autograd`, for the classes of :data:`ROUTED_SPECS` exactly
(a user's subclass, or a layer with a method set on it, stays eager; ``si_bn``: the normalization
inside it, with the layer's weight as a second input, so ‖w‖² and its gradient are compiled too).
``noisy_bn`` does not: its noise comes from its own generator, which a compiled function cannot
advance; nor ``bn``, which runs torch's kernel.

The trace normalizes through :mod:`.written_grad` (μ_B detached where its gradient is zero), so the
compiled backward is one reduction pass and one pointwise pass, as the fused path's formula.

Cost: the first call per key compiles (the first in a process also imports inductor, and its
first on a machine builds inductor's C++ prefix); inductor's on-disk cache then serves later
processes (``benchmarks/compile_stall.py`` → ``benchmarks/results/compile_stall.json``). Then the
BN family and ``lp_bn(p=1)`` train at about native BatchNorm's speed on small and mid-size shapes,
where their eager steps are several times slower; ``lp_bn(p=inf)`` stays above it, because its
deterministic top-k's ``topk`` stays an aten kernel (``benchmarks/norms.py --modes
eager,compiled_step`` → ``benchmarks/results/norms_small_shapes.json``; the tables on the
Benchmarks page). Numerics:
inductor's reductions round differently from the eager kernels (float32 agrees to ~1e-6
relative, float64 to ~1e-15), so runs with and without differ in the last bits; the stored
catalogue runs are eager. Not twice differentiable (as the fused operators).
"""

from __future__ import annotations

import operator
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, cast

import torch
import torch.nn as nn
from torch import Tensor
from torch._guards import TracingContext
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.autograd.graph import increment_version
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .fused import refuse_double_backward
from .switches import fast_paths_allowed, module_group, tracing
from .written_grad import traced_step

# the catalogue entries whose layer classes take the compiled step (bn runs torch's kernel already)
ROUTED_SPECS = ("mean_only_bn", "var_only_bn", "mbn", "cbn", "brn", "lp_bn", "si_bn")
# Python numbers every ChannelNorm step reads, beside its catalogue options
_BASE_ATTRIBUTES = ("num_features", "eps", "momentum", "affine", "track_running_stats", "training")
_DTYPES = (torch.float32, torch.float64)

_LOCK = threading.Lock()
_BUILT: dict[tuple, "CompiledStep | None"] = {}  # key -> compiled step, or None (stays eager)
_WARNED: set[tuple] = set()  # (class, hyper-parameters) told that they reached SHAPES_PER_LAYER
SHAPES_PER_LAYER = 16  # keys (shapes, grad patterns) compiled per class and hyper-parameters
# Inputs below this many elements take the compiled step: below it the compiled step beats the
# fused path on one thread; above it the two are mixed, and at (128, 64, 32, 32) inductor's loops
# lose to torch's kernels. The bound is on the safe side of the crossover (benchmarks/norms.py
# --compiled-step-max-numel → benchmarks/results/norms_crossover*.json, Benchmarks page).
MAX_NUMEL = 1 << 19
CALLS: dict[str, int] = {"forward": 0, "backward": 0}  # compiled calls made (tests, diagnostics)


def _eligible(layer: nn.Module, x: Tensor, extra: tuple, methods: frozenset[str]) -> bool:
    """``extra``: further tensor inputs of the forward (si_bn's layer weight); ``methods``:
    the class's methods, none of which may be replaced on the layer itself."""
    return (layer.training and torch.is_tensor(x) and x.device.type == "cpu"
            and x.dtype in _DTYPES and 0 < x.numel() < MAX_NUMEL and x.dim() >= 2
            and x.shape[1] == layer.num_features and x.is_contiguous()
            and all(torch.is_tensor(t) and t.device.type == "cpu" and t.dtype in _DTYPES
                    and t.is_contiguous() for t in extra)
            and not tracing() and fast_paths_allowed()
            and not torch.jit.is_tracing() and _get_current_dispatch_mode() is None
            and module_group(layer) is None
            and methods.isdisjoint(layer.__dict__))


def route(cls: type[nn.Module], options: Iterable[str]) -> None:
    """Let ``cls``'s training step take the compiled route where :func:`_eligible` (called by the
    catalogue's ``norm`` decorator for :data:`ROUTED_SPECS`); ``options``: its catalogue options,
    the Python numbers its step reads. Instances of ``cls`` exactly: a subclass stays eager."""
    attributes = operator.attrgetter(
        *_BASE_ATTRIBUTES, *(o for o in options if o not in ("bias", "sync", "affine")))
    methods = frozenset(name for name in dir(cls) if callable(getattr(cls, name, None))
                        and not name.startswith("__"))
    ROUTED[cls] = (attributes, methods)


# class -> (the Python numbers its step reads, its methods): filled by route()
ROUTED: dict[type, tuple[Callable[[nn.Module], tuple], frozenset[str]]] = {}


def compiled_call(layer: Any, x: Tensor, args: tuple) -> Tensor | None:
    """The layer's training step through its compiled functions, or None where it does not take
    them (called by :func:`bnlab.norms.engine.route.run` while the compiled steps are on)."""
    routed = ROUTED.get(type(layer))
    if routed is None or not _eligible(layer, x, args, routed[1]):
        return None
    layer.check_input(x)
    inputs = (x, *args)
    params: list[Tensor] = [p for p in layer._parameters.values() if p is not None]
    step = _step_for(layer, inputs, params, routed[0])
    if step is None:
        return None
    return step(inputs, params, [b for b in layer._buffers.values() if b is not None])


def _step_for(layer: nn.Module, inputs: tuple[Tensor, ...], params: list[Tensor],
              attributes: Callable[[nn.Module], tuple]) -> "CompiledStep | None":
    """The compiled step for this layer and these inputs, built on the first call with its key."""
    grad = torch.is_grad_enabled()
    needs = tuple(t.requires_grad for t in (*inputs, *params)) if grad else ()
    needs = needs if any(needs) else ()  # () : forward only
    key = (type(layer), attributes(layer),
           tuple((t.shape, t.dtype, t.is_contiguous()) for t in inputs),
           tuple(n for n, b in layer._buffers.items() if b is not None),
           tuple(n for n, p in layer._parameters.items() if p is not None), needs)
    step = _BUILT.get(key, _MISSING)
    if step is _MISSING:
        with _LOCK:  # one build per key, also when two threads meet it at once
            step = _BUILT.get(key, _MISSING)
            if step is _MISSING:
                step = _BUILT[key] = _build(layer, inputs, needs) if _may_build(key) else None
    return step


def _may_build(key: tuple) -> bool:
    """At most :data:`SHAPES_PER_LAYER` input shapes per (class, hyper-parameters): a model fed
    ever new shapes (variable lengths) would otherwise compile for seconds at every one. Beyond
    it the step stays eager, with one warning (dynamo's recompile limit, for the same reason)."""
    family = key[:2]
    built = sum(1 for other in _BUILT if other[:2] == family)
    if built < SHAPES_PER_LAYER:
        return True
    if family not in _WARNED:
        _WARNED.add(family)
        warnings.warn(f"bnlab: {key[0].__name__}'s training step was compiled for "
                      f"{SHAPES_PER_LAYER} input shapes already; new shapes run eagerly "
                      "(bnlab.norms.engine.compiled_step.SHAPES_PER_LAYER)", RuntimeWarning,
                      stacklevel=5)
    return False


_MISSING: Any = object()


@dataclass
class CompiledStep:
    """The two compiled functions of one key; ``needs``: which of (*inputs, *params) get a
    gradient (empty: forward only)."""

    forward: Callable[[list[Tensor]], list[Tensor]]
    backward: Callable[[list[Tensor]], list[Tensor]] | None
    needs: tuple[bool, ...]
    written: tuple[int, ...]  # the buffers (indices) the forward writes in place
    graphs: tuple[torch.fx.GraphModule, ...] = ()  # what was compiled (forward, backward)

    def wrote(self, buffers: list[Tensor]) -> None:
        """Bump the version counters of the buffers written, as an eager in-place update does
        (inductor's code writes through pointers): a graph that saved one still fails at backward
        instead of reading the new value."""
        if self.written:
            increment_version([buffers[i] for i in self.written])

    def __call__(self, inputs: tuple[Tensor, ...], params: list[Tensor],
                 buffers: list[Tensor]) -> Tensor:
        """One step on a layer's present (not None) parameters and buffers, in their order."""
        if self.backward is None:
            CALLS["forward"] += 1
            with torch.no_grad():
                y = self.forward([*(t.detach() for t in (*inputs, *params)), *buffers])[0]
            self.wrote(buffers)
            return y
        return _CompiledStepFunction.apply(self, buffers, *inputs, *params)


class _CompiledStepFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, step: CompiledStep, buffers: list[Tensor],
                *tensors: Tensor) -> Tensor:
        CALLS["forward"] += 1
        y, *saved = step.forward([*tensors, *buffers])
        step.wrote(buffers)
        ctx.step = step
        ctx.save_for_backward(*saved)
        return y

    @staticmethod
    def backward(ctx, grad_y: Tensor):
        refuse_double_backward("compiled training step")
        CALLS["backward"] += 1
        step = ctx.step
        saved = ctx.saved_tensors
        grads = iter(step.backward([*saved, grad_y.contiguous()]))
        return (None, None, *(next(grads) if need else None for need in step.needs))


def _pure_step(layer: nn.Module, n_inputs: int, n_params: int) -> Callable:
    """``(*inputs, *params, *buffers) -> y`` through the layer's own forward, the buffers written
    in place."""
    pnames = [n for n, p in layer._parameters.items() if p is not None]
    bnames = [n for n, b in layer._buffers.items() if b is not None]

    def step(*tensors: Tensor) -> Tensor:
        inputs, params = tensors[:n_inputs], tensors[n_inputs:n_inputs + n_params]
        buffers = tensors[n_inputs + n_params:]
        state = {**dict(zip(pnames, params)), **dict(zip(bnames, buffers))}
        return torch.func.functional_call(layer, state, inputs, tie_weights=False)
    return step


def _graph(fn: Callable, inputs: list[Tensor]) -> torch.fx.GraphModule:
    """``fn`` traced on fake tensors (no data baked in) with inductor's decompositions and
    functionalized: buffer writes become copies into the inputs at the end."""
    from torch._inductor.decomposition import select_decomp_table

    def flat(*args: Tensor) -> list[Tensor]:
        return list(fn(*args))
    with torch.autocast("cpu", enabled=False), traced_step():
        graph = make_fx(torch.func.functionalize(flat, remove="mutations_and_views"),
                        decomposition_table=select_decomp_table(), tracing_mode="fake")(*inputs)
    _drop_detaches(graph)
    return graph


def _compile(graph: torch.fx.GraphModule) -> Callable[[list[Tensor]], list[Tensor]]:
    """Inductor's code for ``graph``, called as ``compiled(list_of_tensors)``. In a tracing
    context with a shape environment and fake inputs, else inductor bypasses its on-disk FX graph
    cache ("No shape env") or keys it on real inputs' values: so a later process loads a step
    compiled before (``benchmarks/compile_stall.py``)."""
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx_inner
    from torch.fx.experimental.symbolic_shapes import ShapeEnv  # imports sympy: only here
    fake = FakeTensorMode(shape_env=ShapeEnv())
    inputs = [fake.from_tensor(_example(n.meta["val"]), static_shapes=True)
              for n in graph.graph.find_nodes(op="placeholder")]
    # per-channel values computed once into a (C,) buffer rather than inlined into every
    # full-size loop (inductor's default recomputes up to 30 ops per element, which slows cbn,
    # mbn and brn, whose coefficient chains are long; benchmarks/norms.py --modes compiled_step)
    with torch._guards.tracing(TracingContext(fake)), config.patch(realize_opcount_threshold=4):
        return compile_fx_inner(graph, inputs)


def _example(val: Tensor) -> Tensor:
    return torch.empty_strided(val.shape, val.stride(), dtype=val.dtype)


def _drop_detaches(graph: torch.fx.GraphModule) -> None:
    """Functionalization turns the layer's ``.detach()`` calls into copies that inductor runs as
    separate aten calls (cbn: 10 of them, longer than the rest of the step). In a traced graph a
    detach has done its work (it shaped the traced gradient), and after functionalization nothing
    writes to its result, so each is its input."""
    detach = (torch.ops.aten.detach_copy.default, torch.ops.aten.detach.default)
    for node in list(graph.graph.nodes):
        if node.op == "call_function" and node.target in detach:
            node.replace_all_uses_with(node.args[0])
            graph.graph.erase_node(node)
    graph.recompile()


def _write_back(forward: torch.fx.GraphModule, n_inputs: int, n_buffers: int) -> tuple[int, ...]:
    """Outputs 1 … n_buffers of the partitioned forward graph are the buffers' new values: copy
    each that changed into its input (the last ``n_buffers`` of ``n_inputs``) inside the graph, so
    inductor writes it in place, and drop them from the outputs; return which were written. A
    buffer that the backward reads itself is saved as a copy taken before the write (else the
    backward would read the new value)."""
    graph = forward.graph
    buffers = list(graph.find_nodes(op="placeholder"))[n_inputs - n_buffers:n_inputs]
    output = next(iter(graph.find_nodes(op="output")))
    values = list(output.args[0])
    new, saved = values[1:1 + n_buffers], values[1 + n_buffers:]
    written = tuple(i for i, (buffer, value) in enumerate(zip(buffers, new))
                    if value is not buffer and not _is_copy_of(value, buffer))
    with graph.inserting_before(output):
        saved = [graph.call_function(torch.ops.aten.clone.default, (node,)) if node in buffers
                 else node for node in saved]
        for i in written:
            graph.call_function(torch.ops.aten.copy_.default, (buffers[i], new[i]))
    output.args = ((values[0], *saved),)
    graph.eliminate_dead_code()
    forward.recompile()
    return written


def _is_copy_of(node: torch.fx.Node, buffer: torch.fx.Node) -> bool:
    return (node.op == "call_function" and node.target == torch.ops.aten.clone.default
            and node.args[0] is buffer)


def _written_inputs(graph: torch.fx.GraphModule, first: int) -> tuple[int, ...]:
    """Which placeholders from position ``first`` on the functionalized graph copies into (its
    buffer writes), as indices counted from ``first``."""
    placeholders = list(graph.graph.find_nodes(op="placeholder"))
    targets = {node.args[0] for node in graph.graph.find_nodes(
        op="call_function", target=torch.ops.aten.copy_.default)}
    return tuple(i - first for i, node in enumerate(placeholders) if i >= first
                 and node in targets)


def _build(layer: nn.Module, inputs: tuple[Tensor, ...],
           needs: tuple[bool, ...]) -> CompiledStep | None:
    """Trace and compile ``layer``'s step for tensors like ``inputs``; None (and one warning) if
    the step cannot be traced or compiled: it then stays eager."""
    params = [p.detach().clone() for p in layer._parameters.values() if p is not None]
    buffers = [b.detach().clone() for b in layer._buffers.values() if b is not None]
    step = _pure_step(layer, len(inputs), len(params))
    examples = [*(t.detach().clone() for t in inputs), *params]  # what may be differentiated
    n_diff = len(examples)

    def forward(*tensors: Tensor) -> tuple[Tensor]:
        return (step(*tensors),)

    def joint(*tensors: Tensor) -> tuple[Tensor, ...]:
        """(y, the buffers' new values, the gradients): forward and backward in one graph."""
        diff, bs, grad_y = tensors[:n_diff], tensors[n_diff:-1], tensors[-1]

        def of(*wrt: Tensor) -> tuple[Tensor, list[Tensor]]:
            it = iter(wrt)
            new = [b.clone() for b in bs]
            return step(*(next(it) if need else t for t, need in zip(diff, needs)), *new), new
        # (output, pull-back, aux): torch.func.vjp's annotation omits the aux
        y, pull, new = cast(Any, torch.func.vjp)(of, *(t for t, need in zip(diff, needs) if need),
                                                 has_aux=True)
        return (y, *new, *pull(grad_y))

    try:
        if not needs:
            graph = _graph(forward, [*examples, *buffers])
            return CompiledStep(_compile(graph), None, needs, _written_inputs(graph, n_diff),
                                (graph,))
        from torch._functorch.partitioners import min_cut_rematerialization_partition
        # every layer's output has its first input's shape
        graph = _graph(joint, [*examples, *buffers, torch.empty_like(examples[0])])
        tangent = list(graph.graph.find_nodes(op="placeholder"))[-1]
        tangent.target = tangent.name = "tangents_1"  # the partitioner's naming (AOTAutograd's)
        graph.recompile()
        fw, bw = min_cut_rematerialization_partition(
            graph, None, num_fwd_outputs=1 + len(buffers))
        written = _write_back(fw, n_diff + len(buffers), len(buffers))
        return CompiledStep(_compile(fw), _compile(bw), needs, written, (fw, bw))
    except Exception as error:  # any failure keeps the eager step
        warnings.warn(f"bnlab: {type(layer).__name__}'s training step could not be compiled for "
                      f"input {tuple(inputs[0].shape)} ({type(error).__name__}: {error}); it "
                      "runs eagerly", RuntimeWarning, stacklevel=4)
        return None
