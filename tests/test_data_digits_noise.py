"""digits(noise=σ): fixed Gaussian pixel noise of SD σ on the standardized images (the
Peng-table proxy with headroom), drawn from its own seeded generator."""

import pytest
import torch

from bnlab import data


def test_noise_is_gaussian_of_the_stated_sd_and_leaves_the_split_alone():
    clean = data.load("digits", size=16, seed=3)
    noisy = data.load("digits", size=16, seed=3, noise=1.5)
    assert torch.equal(clean.meta["train_index"], noisy.meta["train_index"])
    assert torch.equal(clean.y_test, noisy.y_test)
    for a, b in ((clean.x_train, noisy.x_train), (clean.x_test, noisy.x_test)):
        diff = (b - a).flatten().double()
        # 1438·256 and 359·256 draws: the SD within 1 %, the mean within 4 SE of 0
        assert diff.std().item() == pytest.approx(1.5, rel=0.01)
        assert abs(diff.mean().item()) < 4 * 1.5 / diff.numel() ** 0.5
    assert noisy.meta["noise"] == 1.5


def test_noise_is_reproducible_per_seed_and_zero_is_clean():
    a = data.load("digits", seed=1, noise=0.5)
    b = data.load("digits", seed=1, noise=0.5)
    c = data.load("digits", seed=2, noise=0.5)
    assert torch.equal(a.x_train, b.x_train)
    assert not torch.equal((a.x_train - data.load("digits", seed=1).x_train)[:5],
                           (c.x_train - data.load("digits", seed=2).x_train)[:5])
    assert torch.equal(data.load("digits", seed=1, noise=0.0).x_train,
                       data.load("digits", seed=1).x_train)


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_bad_noise_names_the_option(bad):
    with pytest.raises(ValueError, match="noise"):
        data.load("digits", noise=bad)
