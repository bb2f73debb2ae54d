"""Recollect a trained model's running statistics: population statistics for inference.

Ioffe & Szegedy 2015 ("Batch Normalization: Accelerating Deep Network Training by Reducing
Internal Covariate Shift"), Algorithm 2 (steps 8-10): the inference network normalizes with
``E[x] = E_B[μ_B]`` and ``Var[x] = m/(m−1)·E_B[σ²_B]``, averages over training mini-batches of the
FINAL network, which is what ``momentum=None`` (torch's cumulative moving average) collects. The
EMA kept during training mixes earlier networks and still holds a trace of its start values; this
replaces it. Every layer's buffers are recomputed, mbn's and cbn's moving statistics included
(:mod:`.population` says what each becomes). Why it exists: after stochastic weight averaging
(torch's ``swa_utils.update_bn`` finds BatchNorm layers by ``isinstance(m, _BatchNorm)`` and skips
bnlab's), and for noisy_bn (Santurkar et al. 2018, "How Does Batch Normalization Help
Optimization?", App. A.2.1, Alg. 1), which adds its noise after the normalization, so every later
layer's running statistics are collected from noisy inputs that eval never sees (luo_cnn, ReLU,
digits: eval 0.897 against 0.986 with batch statistics; recollected with the noise off 0.978).

The batches are whatever a loader yields, as ``update_bn`` takes them and more: a tensor, a tuple
or list whose first element is the input (``(x, y)``), a dict whose ``"input"`` entry is the input
(:data:`INPUT_KEY`), or anything from which ``input=`` picks the input (a dict key, a position, or a
function of the batch).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
import torch.nn as nn

from .population import StatisticsPass

INPUT_KEY = "input"  # the entry of a dict batch that holds the model's input, unless input= says

InputPicker = Callable[[Any], Any] | str | int | None


def pick_input(batch: Any, input: InputPicker = None) -> Any:
    """The model's input in one loader batch (see the module docstring); clear errors otherwise."""
    if callable(input):
        return input(batch)
    if isinstance(input, str):
        if not isinstance(batch, dict) or input not in batch:
            keys = list(batch) if isinstance(batch, dict) else type(batch).__name__
            raise ValueError(f"input={input!r} names a dict entry, but the batch has {keys}")
        return batch[input]
    if isinstance(input, int) and not isinstance(input, bool):
        if not isinstance(batch, (tuple, list)):
            raise ValueError(f"input={input} picks a position in a tuple/list batch, but the batch "
                             f"is a {type(batch).__name__}")
        return batch[input]
    if input is not None:
        raise TypeError(f"input must be None, a dict key (str), a position (int) or a function of "
                        f"the batch, got {type(input).__name__}")
    if isinstance(batch, (tuple, list)):
        if not batch:
            raise ValueError("a loader batch is an empty tuple/list: no input in it")
        return batch[0]
    if isinstance(batch, dict):
        if INPUT_KEY not in batch:
            raise ValueError(f"a dict batch needs an {INPUT_KEY!r} entry (it has {list(batch)}); "
                             "or pass input='<key>' or input=lambda batch: ...")
        return batch[INPUT_KEY]
    return batch


def _to(x: Any, device) -> Any:
    if device is None:
        return x
    if torch.is_tensor(x):
        return x.to(device)
    raise TypeError(f"device={device!r} moves a tensor input; the picked input is a "
                    f"{type(x).__name__} (move it in input=lambda batch: ...)")


@torch.no_grad()
def recollect_running_stats(model: nn.Module, batches: Iterable[Any], *, noise: bool = False,
                            input: InputPicker = None, device=None) -> nn.Module:
    """Reset and recollect every layer's statistics from ``batches``, in place; returns ``model``.

    Every layer with running statistics (torch's BatchNorm and bnlab's) and mbn's/cbn's moving
    statistics are reset and recomputed from one pass in train mode, as the batch averages of
    :mod:`bnlab.norms.tools.population` (for torch's BN and ``bn``: what ``swa_utils.update_bn``
    gives); momentum and each module's train/eval mode are restored afterwards, parameters do not
    change, layers frozen with :func:`bnlab.norms.freeze` keep theirs. ``batches``: tensors, ``(x,
    y)`` tuples or lists, dicts with an ``"input"`` entry; ``input=`` picks another entry (key),
    position (int) or computes the input from the batch (function). ``device``: each input is moved
    there. ``noise=False`` switches noisy_bn's noise off for the pass (no random draws: its
    generator state is kept), so later layers see the activations eval will give them. Call it after
    training (or weight averaging), before evaluating. Raises ``ValueError`` for a model without
    such layers or an empty ``batches``.
    """
    if not StatisticsPass(model).layers:
        raise ValueError("recollect_running_stats: the model has no layer with running statistics "
                         "(or all of them are frozen)")
    modes = {m: m.training for m in model.modules()}
    statistics = StatisticsPass(model, noise=noise).start()
    count = 0
    try:
        model.train()
        for batch in batches:
            model(_to(pick_input(batch, input), device))
            count += 1
    finally:
        statistics.finish()
        for m, training in modes.items():
            m.training = training
    if count == 0:
        raise ValueError("recollect_running_stats: batches is empty (the statistics were reset)")
    return model


def update_bn(loader: Iterable[Any], model: nn.Module, device=None, *,
              input: InputPicker = None) -> None:
    """``torch.optim.swa_utils.update_bn`` for every normalization layer: same signature and loader
    batches (and dicts, ``input=`` as :func:`recollect_running_stats`), bnlab's layers included.

    On torch's BatchNorm the result equals torch's (tests/test_ecosystem_swa.py); a model without
    any normalization layer is left alone, as torch's is.
    """
    if not StatisticsPass(model).layers:
        return
    recollect_running_stats(model, loader, input=input, device=device)
