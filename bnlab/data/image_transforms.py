"""The standard ImageNet transforms as torch operations on uint8 image tensors.

These follow the PyTorch ImageNet example that Peng et al. name for their ILSVRC2012 runs
(``RandomResizedCrop(224)`` + ``RandomHorizontalFlip()`` for training; ``Resize(256)`` +
``CenterCrop(224)`` for evaluation; then ``Normalize`` with the ImageNet mean and standard
deviation), written with torch ops so that every random draw comes from a caller's
``torch.Generator`` and the number of draws per batch is fixed (a batch of ``n`` images always takes
the same draws, whatever the crops come out as).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# torchvision's ImageNet statistics (the PyTorch ImageNet example's Normalize).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CROP_SCALE = (0.08, 1.0)     # RandomResizedCrop's defaults: share of the area ...
CROP_RATIO = (3 / 4, 4 / 3)  # ... and aspect ratio of the crop
ATTEMPTS = 10                # RandomResizedCrop tries 10 boxes before its centre-crop fallback


def resize_shorter(image: torch.Tensor, size: int) -> torch.Tensor:
    """``Resize(size)`` on one ``(C, H, W)`` image: the shorter side becomes ``size``, aspect kept.

    Bilinear with antialiasing (torchvision's default for tensors); the longer side is
    ``int(size * long / short)`` as in torchvision. Returns float32 in the input's value range.
    """
    _, h, w = image.shape
    if h <= w:
        new_h, new_w = size, int(size * w / h)
    else:
        new_h, new_w = int(size * h / w), size
    x = image.unsqueeze(0).float()
    if (new_h, new_w) == (h, w):
        return x[0]
    return F.interpolate(x, size=(new_h, new_w), mode="bilinear", align_corners=False,
                         antialias=True)[0]


def center_crop(image: torch.Tensor, size: int) -> torch.Tensor:
    """``CenterCrop(size)`` of a ``(C, H, W)`` image at least ``size`` on each side (torchvision's
    rounding)."""
    _, h, w = image.shape
    if h < size or w < size:
        raise ValueError(f"center_crop: image {h}x{w} is smaller than the crop {size}")
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return image[:, top:top + size, left:left + size]


def to_uint8(image: torch.Tensor) -> torch.Tensor:
    return image.round().clamp_(0, 255).to(torch.uint8)


def crop_boxes(n: int, height: int, width: int, generator: torch.Generator, *, scale=CROP_SCALE,
               ratio=CROP_RATIO) -> tuple[torch.Tensor, torch.Tensor]:
    """``RandomResizedCrop``'s boxes for ``n`` images of ``height x width`` and a flip coin per
    image: ``(boxes, flip)``, ``boxes`` an ``(n, 4)`` int64 tensor of ``(top, left, h, w)``,
    ``flip`` bool ``(n,)``.

    Per image: up to 10 tries of an area ``U(scale) * H * W`` and an aspect ratio ``exp(U(log
    ratio))``; the first box that fits is taken at a uniformly drawn position; if none fits, the
    largest centred box whose aspect ratio lies in ``ratio``. Draws (always the same count for ``n``
    images): areas ``(n, 10)``, log ratios ``(n, 10)``, positions ``(n, 2)``, flips ``(n,)``.
    """
    area = height * width
    shares = torch.empty(n, ATTEMPTS, dtype=torch.float64).uniform_(scale[0], scale[1],
                                                                    generator=generator)
    logs = torch.empty(n, ATTEMPTS, dtype=torch.float64).uniform_(
        math.log(ratio[0]), math.log(ratio[1]), generator=generator)
    position = torch.rand(n, 2, dtype=torch.float64, generator=generator)
    flip = torch.randint(0, 2, (n,), generator=generator).bool()
    aspect = logs.exp()
    w = (shares * area * aspect).sqrt().round().long()
    h = (shares * area / aspect).sqrt().round().long()
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = fits.long().argmax(dim=1, keepdim=True)  # the first fitting attempt (0 when none fits)
    w, h = w.gather(1, first)[:, 0], h.gather(1, first)[:, 0]
    fallback_h, fallback_w = _fallback_box(height, width, ratio)
    found = fits.any(dim=1)
    h = torch.where(found, h, torch.full_like(h, fallback_h))
    w = torch.where(found, w, torch.full_like(w, fallback_w))
    top = torch.where(found, (position[:, 0] * (height - h + 1)).floor().long(), (height - h) // 2)
    left = torch.where(found, (position[:, 1] * (width - w + 1)).floor().long(), (width - w) // 2)
    return torch.stack([top, left, h, w], dim=1), flip


def _fallback_box(height: int, width: int, ratio) -> tuple[int, int]:
    in_ratio = width / height
    if in_ratio < min(ratio):
        return int(round(width / min(ratio))), width
    if in_ratio > max(ratio):
        return height, int(round(height * max(ratio)))
    return height, width


def random_resized_crop_flip(images: torch.Tensor, size: int, generator: torch.Generator, *,
                             scale=CROP_SCALE, ratio=CROP_RATIO) -> torch.Tensor:
    """``RandomResizedCrop(size)`` + ``RandomHorizontalFlip()`` on a batch ``(N, C, H, W)`` (any
    dtype).

    Each image gets its own box (`crop_boxes`) resized to ``size x size`` (bilinear, antialiased)
    and a fair coin for the flip. Returns float32 in the input's value range, on the input's device.
    """
    if images.ndim != 4:
        raise ValueError("random_resized_crop_flip expects (N, C, H, W), got shape "
                         f"{tuple(images.shape)}")
    n, c, height, width = images.shape
    boxes, flip = crop_boxes(n, height, width, generator, scale=scale, ratio=ratio)
    out = torch.empty(n, c, size, size, dtype=torch.float32, device=images.device)
    for i, (top, left, h, w) in enumerate(boxes.tolist()):
        crop = images[i:i + 1, :, top:top + h, left:left + w].float()
        out[i] = F.interpolate(crop, size=(size, size), mode="bilinear", align_corners=False,
                               antialias=True)[0]
    flip = flip.to(images.device)
    out[flip] = out[flip].flip(-1)
    return out


def normalize(images: torch.Tensor, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> torch.Tensor:
    """``ToTensor`` + ``Normalize``: pixel values 0–255 to ``(x / 255 − mean) / std`` per channel,
    float32."""
    mean_t = torch.tensor(mean, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
    return (images.float() / 255.0 - mean_t) / std_t
