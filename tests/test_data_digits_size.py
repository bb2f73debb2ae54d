"""digits(size=16|32): bilinear upsampling of the 8×8 digits (proxy inputs whose deep conv stages
are not all border)."""

import numpy as np
import pytest
import torch

from bnlab import data
from bnlab.data.synthetic import resize_images


@pytest.mark.parametrize("size", [16, 32])
def test_digits_size_gives_upsampled_standardized_images(size):
    small = data.load("digits", seed=0, standardize="none")
    big = data.load("digits", seed=0, standardize="none", size=size)
    assert big.input_shape == (1, size, size) and big.meta["size"] == size
    assert big.x_train.shape == (small.x_train.shape[0], 1, size, size)
    assert torch.equal(big.meta["train_index"], small.meta["train_index"])  # same split
    # bilinear, align_corners=False: averaging each (size/8)×(size/8) block gives back the original
    # up to the blur of the interpolation; the block means correlate almost perfectly with the 8×8
    # image
    k = size // 8
    pooled = torch.nn.functional.avg_pool2d(big.x_train, k)
    corr = np.corrcoef(pooled.flatten().numpy(), small.x_train.flatten().numpy())[0, 1]
    assert corr > 0.97
    std = data.load("digits", seed=0, size=size)
    assert abs(float(std.x_train.mean())) < 1e-4 and abs(float(std.x_train.std()) - 1) < 1e-3


def test_resize_images_keeps_constants_and_interpolates_linearly():
    const = torch.full((2, 1, 8, 8), 3.0, dtype=torch.float64)
    assert torch.allclose(resize_images(const, 16), const.new_full((2, 1, 16, 16), 3.0))
    # a horizontal ramp x_j = j stays a ramp in the interior: output pixel centre u maps to (u +
    # 0.5)/2 − 0.5
    ramp = torch.arange(8, dtype=torch.float64).expand(1, 1, 8, 8).clone()
    out = resize_images(ramp, 16)[0, 0, 0]
    u = torch.arange(1, 15, dtype=torch.float64)
    assert torch.allclose(out[1:15], (u + 0.5) / 2 - 0.5)
    assert resize_images(ramp, 8) is ramp


def test_digits_size_rejects_other_sizes():
    with pytest.raises(ValueError, match="8, 16, 32"):
        data.load("digits", size=12)
    with pytest.raises(ValueError, match="size"):
        data.load("digits", size="big")
