"""Shuffling, batching and the standard CIFAR augmentation, all on tensors on the data's device.

No ``DataLoader``: the whole dataset already lives on the training device, so an epoch is a
permutation and a sequence of ``index_select`` calls, and augmentation is one batched gather.
Random draws come from the ``torch.Generator`` the caller passes; they are made on the
generator's device and moved to the data's device, so a CPU generator gives the same epochs and
the same augmentations whether the data is on the CPU or a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F


def resolve_batch_size(batch_size, n: int) -> int:
    """An integer batch size for ``n`` samples: ``None`` or ``"full"`` mean ``n`` (full batch).

    Raises ``ValueError`` (naming the valid choices) for non-positive sizes, sizes larger than the
    data, and anything that is neither an integer nor ``"full"``.
    """
    if batch_size is None or (isinstance(batch_size, str) and batch_size.strip().lower() == "full"):
        return n
    if isinstance(batch_size, bool):
        raise ValueError(f"batch_size must be a positive integer or 'full', got {batch_size!r}")
    try:
        value = int(batch_size)
        if isinstance(batch_size, float) and not batch_size.is_integer():
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(
            f"batch_size must be a positive integer or 'full', got {batch_size!r}"
        ) from None
    if value < 1:
        raise ValueError(f"batch_size must be a positive integer or 'full', got {batch_size!r}")
    if value > n:
        raise ValueError(
            f"batch_size {value} is larger than the {n} samples; use at most {n}, or 'full' for "
            "full batch"
        )
    return value


def num_batches(n: int, batch_size, drop_last: bool = False) -> int:
    """How many batches `batches` yields per epoch for ``n`` samples."""
    size = resolve_batch_size(batch_size, n)
    return n // size if drop_last else -(-n // size)


def batches(
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size,
    *,
    generator: torch.Generator | None,
    shuffle: bool = True,
    drop_last: bool = False,
    augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of ``(xb, yb)`` minibatches; every sample appears exactly once (or, with
    ``drop_last``, at most once, the incomplete last batch dropped).

    * ``batch_size``: a positive integer, or ``None``/``"full"`` for one batch of all samples
      (full-batch gradient descent). A full batch is yielded unpermuted even with
      ``shuffle=True`` — the order inside a single batch does not change a mean loss or batch
      statistics — which saves a copy of the data and consumes no random numbers.
    * ``shuffle``: a fresh permutation of the samples from ``generator`` each call (each epoch);
      ``shuffle=False`` yields contiguous slices (views, no copies) in order.
    * ``augment``: ``augment(xb, generator) -> xb`` applied to each batch (e.g. `cifar_augment`).
    * ``generator`` is required when shuffling or augmenting; it may live on any device.

    Everything stays on ``x``'s device; the yielded ``yb`` is on ``y``'s device.
    """
    n = x.shape[0]
    if y.shape[0] != n:
        raise ValueError(f"x has {n} samples but y has {y.shape[0]}")
    if n == 0:
        raise ValueError("cannot batch an empty dataset")
    size = resolve_batch_size(batch_size, n)
    if (shuffle and size < n) or augment is not None:
        if not isinstance(generator, torch.Generator):
            raise ValueError(
                "batches needs a torch.Generator (generator=...) to shuffle or augment"
            )

    def finish(xb, yb):
        if augment is not None:
            xb = augment(xb, generator)
        return xb, yb

    return _iterate(x, y, n, size, shuffle, drop_last, generator, finish)


def _iterate(x, y, n, size, shuffle, drop_last, generator, finish):
    # A separate generator function so argument errors in `batches` raise at call time, not at
    # the first next().
    if size == n:
        yield finish(x, y)
        return
    stop = n - n % size if drop_last else n
    if not shuffle:
        for start in range(0, stop, size):
            yield finish(x[start : start + size], y[start : start + size])
        return
    order = torch.randperm(n, generator=generator, device=generator.device)
    order_x = order.to(x.device)
    order_y = order_x if y.device == x.device else order.to(y.device)
    for start in range(0, stop, size):
        yield finish(x.index_select(0, order_x[start : start + size]),
                     y.index_select(0, order_y[start : start + size]))


def crop_flip_draws(
    n: int, generator: torch.Generator, padding: int = 4
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The random numbers of `cifar_augment` for ``n`` images, in the order it draws them.

    Returns ``(top, left, flip)`` on the generator's device: crop offsets into the zero-padded
    image, uniform on ``{0, ..., 2*padding}`` like torchvision's ``RandomCrop(padding=...)``, and a
    fair coin per image for the horizontal flip.
    """
    device = generator.device
    top = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=device)
    left = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=device)
    flip = torch.randint(0, 2, (n,), generator=generator, device=device).bool()
    return top, left, flip


def cifar_augment(x: torch.Tensor, generator: torch.Generator, *, padding: int = 4) -> torch.Tensor:
    """The standard CIFAR augmentation on a batch ``(N, C, H, W)``: pad every side with ``padding``
    zeros, crop back to ``H x W`` at a random offset, and flip horizontally with probability 1/2 —
    each image with its own draws (`crop_flip_draws`), all images in one batched gather.

    This is the augmentation of He et al. (2016) used for the CIFAR ResNets; Santurkar et al.
    (2018) train *without* augmentation, so `batches` applies none unless asked. The padding is
    the value 0 of the tensor given: on normalized CIFAR that is the training mean colour, whereas
    torchvision's usual pipeline (crop the raw image, then normalize) pads with black.
    """
    if x.ndim != 4:
        raise ValueError(f"cifar_augment expects images (N, C, H, W), got shape {tuple(x.shape)}")
    if not isinstance(padding, int) or isinstance(padding, bool) or padding < 0:
        raise ValueError(f"padding must be a non-negative integer, got {padding!r}")
    n, c, h, w = x.shape
    top, left, flip = (t.to(x.device) for t in crop_flip_draws(n, generator, padding))
    padded = F.pad(x, (padding, padding, padding, padding))
    rows = top[:, None] + torch.arange(h, device=x.device)  # (N, H): source row of each output row
    cols = left[:, None] + torch.arange(w, device=x.device)  # (N, W)
    cols = torch.where(flip[:, None], cols.flip(1), cols)  # flipping the crop reverses its columns
    batch_index = torch.arange(n, device=x.device)[:, None, None, None]
    channel_index = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[batch_index, channel_index, rows[:, None, :, None], cols[:, None, None, :]]
