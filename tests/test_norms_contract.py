"""The contract a variant is written against, stated in code: the flags a layer may set are
declared (with a default and a docstring) on ``ChannelNorm`` and read as attributes, the ``forward``
a reader sees in the source is the one that runs, and the switches live in one module."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import torch

import bnlab
import bnlab.norms as N
from bnlab.norms.engine import route, switches
from bnlab.norms.registry import REGISTRY

FLAGS = ("reads_own_updates", "signed_buffers", "counts_empty_batches", "nonfinite_batches")
PACKAGE = Path(bnlab.__file__).resolve().parent


def _documented_class_attributes(cls: type) -> dict[str, str]:
    """{name: docstring} of the class attributes followed by a string literal in cls's source."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    found = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            found[node.target.id] = after.value.value
    return found


def test_every_flag_is_declared_on_the_base_with_a_default_and_a_docstring():
    documented = _documented_class_attributes(N.ChannelNorm)
    for flag in FLAGS:
        assert flag in vars(N.ChannelNorm), f"{flag} has no default on ChannelNorm"
        assert len(documented.get(flag, "")) > 40, f"{flag} has no docstring on ChannelNorm"
    cbn = N.create("cbn", 3)
    assert cbn.reads_own_updates and cbn.signed_buffers == ("running_var",)
    assert not cbn.counts_empty_batches and N.create("bn", 3).counts_empty_batches


def test_no_flag_is_looked_up_with_getattr():
    pattern = re.compile(r"getattr\([^()]*,\s*[\"'](%s)[\"']" % "|".join(FLAGS))
    found = [f"{path.relative_to(PACKAGE.parent)}: {m.group(0)}"
             for path in PACKAGE.rglob("*.py") for m in pattern.finditer(path.read_text())]
    assert not found, found


def _catalogue_layers():
    for name, entry in sorted(REGISTRY.items()):
        if entry.kind == "channel" and name not in ("none", "gn"):
            yield name, N.create(name, 4)


@pytest.mark.parametrize("name, layer", list(_catalogue_layers()))
def test_the_forward_in_the_source_is_the_one_that_runs(name, layer):
    """No decorator or class hook replaces a layer's forward: the function that runs is the one
    written in a class of the layer's MRO (functools.wraps would leave ``__wrapped__``)."""
    forward = type(layer).forward
    assert not hasattr(forward, "__wrapped__"), f"{name}: forward is wrapped"
    owners = [cls for cls in type(layer).__mro__ if vars(cls).get("forward") is forward]
    assert owners and forward.__qualname__ == f"{owners[0].__qualname__}.forward", name


def test_the_switches_are_defined_in_one_module():
    for switch in (N.plain_autograd, N.compiled_steps, N.set_compiled_steps,
                   N.set_nonfinite_guard, N.nonfinite_guard_enabled):
        assert switch.__module__ == switches.__name__, switch
    with N.compiled_steps():
        assert switches.compiled_steps_enabled()
    assert not switches.compiled_steps_enabled()


def test_the_route_decides_fused_or_plain_in_one_place(monkeypatch):
    """A layer's step takes the fused operators exactly where route.takes_fused says so."""
    layer, x = N.create("mbn", 4), torch.randn(8, 4, 3, 3)
    monkeypatch.setattr(route, "FUSED_MIN_NUMEL", 0)
    assert route.takes_fused(layer, x)
    with N.plain_autograd():
        assert not route.takes_fused(layer, x)
    monkeypatch.setattr(route, "FUSED_MIN_NUMEL", 1 << 62)
    assert not route.takes_fused(layer, x)
