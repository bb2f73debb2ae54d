"""Internal covariate shift in the optimization sense (Santurkar et al. 2018, Definition 2.1, Fig.
6)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .base import (
    PROBES, Probe, ProbeContext, cosine, flat, loss_and_grads, select_layers, weight_layers,
)
from .state import simulated_step


def execution_order(ctx: ProbeContext) -> dict[str, int]:
    """Position of each parameter in the forward computation: the call order of the module owning
    it.

    Definition 2.1 updates "the preceding layers" W_1..W_{i−1}; the order is observed with forward
    pre-hooks during one forward pass (so it is right even when modules are registered out of
    order). Parameters whose owner is never called come last, in registration order.
    """
    model = ctx.model
    owners = {}
    for module_name, module in model.named_modules():
        for pname, _ in module.named_parameters(recurse=False):
            owners[f"{module_name}.{pname}" if module_name else pname] = module
    calls: dict[int, int] = {}
    handles = []
    for module in {id(m): m for m in owners.values()}.values():
        def pre(mod, inputs):
            calls.setdefault(id(mod), len(calls))
        handles.append(module.register_forward_pre_hook(pre))
    try:
        if ctx.snapshot is not None:
            ctx.snapshot.reset_forward_state()
        with torch.no_grad():
            ctx.loss()
    finally:
        for h in handles:
            h.remove()
    names = [n for n, _ in model.named_parameters()]
    late = len(calls)
    return {n: calls.get(id(owners[n]), late + i) for i, n in enumerate(names)}


@PROBES.register()
class ICSProbe(Probe):
    """ICS per weight layer i (Santurkar Definition 2.1): the gradient of layer i before and after
    the preceding layers take this step's update, on the same batch.

    G = ∇_{W_i} L(W_1, …, W_k; x, y),  G' = ∇_{W_i} L(W'_1, …, W'_{i−1}, W_i, …, W_k; x, y), with W'
    the parameters after this step's optimizer update (obtained by running the real optimizer step
    inside the snapshot and rewinding it, see :func:`bnlab.probes.state.simulated_step`, so
    momentum, weight decay and Adam are honoured). Records ``l2/<layer>`` = ‖G − G'‖₂ and
    ``cos/<layer>`` = cos(G, G'). Layers are the Linear/Conv modules (their weight and bias form
    W_i); BN's γ, β belong to whichever layer they precede. All passes are in training mode on the
    same batch with the same layer noise and running statistics.

    Cost: 1 simulated optimizer step + (1 + k′) forward/backward passes, k′ = number of layers with
    updated predecessors (all weight layers but the first).
    """

    name = "ics"
    summary = ("gradient change of each layer when the preceding layers take this step's update "
               "(Santurkar Def. 2.1, Fig. 6)")
    cost = ("1 optimizer step (simulated) + 1 + k' forward/backward passes "
            "(k' = weight layers after the first)")

    def __init__(self, every: int = 1, layers: Iterable[str] | None = None) -> None:
        super().__init__(every)
        self.layers = None if layers is None else list(layers)

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        model = ctx.model
        model.train()
        chosen = select_layers(model, self.layers, weight_layers(model), "weight")
        params = dict(model.named_parameters())
        order = execution_order(ctx)
        lr = None if ctx.optimizer is not None else ctx.learning_rate()
        updated_by_id = simulated_step(ctx.require_snapshot(), lr)
        theta = {n: p.detach() for n, p in params.items()}
        updated = {n: updated_by_id[id(p)] for n, p in params.items()}
        layer_params = {}
        for lname, module in chosen:
            names = [f"{lname}.{pn}" if lname else pn for pn, p in module.named_parameters()
                     if p.requires_grad]
            if names:
                layer_params[lname] = names
        wrt = [n for names in layer_params.values() for n in names]
        _, g_all = loss_and_grads(ctx, wrt)
        g_by_name = dict(zip(wrt, g_all))
        out = {}
        for lname, names in layer_params.items():
            first = min(order[n] for n in names)
            mixed = {n: (updated[n] if order[n] < first else theta[n]) for n in params}
            g = flat(g_by_name[n] for n in names)
            preceding = [n for n in params if order[n] < first]
            if all(torch.equal(updated[n], theta[n]) for n in preceding):
                g_new = g  # nothing before this layer moved: G' = G exactly, no pass needed
            else:
                _, g_list = loss_and_grads(ctx, names, mixed)
                g_new = flat(g_list)
            out[f"l2/{lname}"] = float((g - g_new).norm())
            out[f"cos/{lname}"] = cosine(g, g_new)
        return out
