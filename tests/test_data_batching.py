"""bnlab.data.batches / cifar_augment: epochs on tensors and the crop+flip augmentation."""

import pytest
import torch
import torch.nn.functional as F

from bnlab import data


def indexed(n, features=3):
    """x whose row i is filled with i, y = i: a batch reveals exactly which samples it holds."""
    y = torch.arange(n)
    x = y.float()[:, None].repeat(1, features)
    return x, y


@pytest.mark.parametrize("n, batch_size", [(103, 10), (64, 16), (5, 1), (7, 7)])
def test_every_sample_appears_exactly_once_per_epoch(n, batch_size):
    x, y = indexed(n)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):  # several epochs from the same generator
        seen = []
        for xb, yb in data.batches(x, y, batch_size, generator=gen):
            assert xb.shape[0] == yb.shape[0] <= batch_size
            assert torch.equal(xb[:, 0].long(), yb)  # x and y rows stay paired
            seen.append(yb)
        assert torch.equal(torch.sort(torch.cat(seen)).values, torch.arange(n))
        assert len(seen) == data.num_batches(n, batch_size)


def test_drop_last_yields_only_full_batches_without_repeats():
    x, y = indexed(103)
    gen = torch.Generator().manual_seed(1)
    got = [yb for _, yb in data.batches(x, y, 10, generator=gen, drop_last=True)]
    assert len(got) == 10 == data.num_batches(103, 10, drop_last=True)
    assert all(b.numel() == 10 for b in got)
    assert torch.cat(got).unique().numel() == 100


def test_shuffle_is_seeded_and_changes_between_epochs():
    x, y = indexed(50)

    def epoch_orders(seed, epochs=2):
        gen = torch.Generator().manual_seed(seed)
        return [torch.cat([yb for _, yb in data.batches(x, y, 8, generator=gen)])
                for _ in range(epochs)]

    a, b, c = epoch_orders(3), epoch_orders(3), epoch_orders(4)
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert not torch.equal(a[0], a[1])  # a new permutation each epoch
    assert not torch.equal(a[0], c[0])
    assert not torch.equal(a[0], torch.arange(50))


def test_no_shuffle_keeps_order_and_yields_views():
    x, y = indexed(10)
    got = list(data.batches(x, y, 4, generator=None, shuffle=False))
    assert [b.tolist() for _, b in got] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert got[0][0].data_ptr() == x.data_ptr()  # a slice, not a copy


@pytest.mark.parametrize("full", ["full", None, "FULL", 12])
def test_full_batch_is_the_whole_dataset(full):
    x, y = indexed(12)
    got = list(data.batches(x, y, full, generator=None))
    assert len(got) == 1 and torch.equal(got[0][0], x) and torch.equal(got[0][1], y)
    assert data.num_batches(12, full) == 1


@pytest.mark.parametrize("bad", [0, -3, 2.5, "big", True, 13])
def test_bad_batch_sizes_name_the_valid_choices(bad):
    x, y = indexed(12)
    with pytest.raises(ValueError, match="full"):
        data.batches(x, y, bad, generator=torch.Generator())


def test_shuffling_without_a_generator_is_refused_at_call_time():
    x, y = indexed(12)
    with pytest.raises(ValueError, match="Generator"):
        data.batches(x, y, 4, generator=None)
    with pytest.raises(ValueError, match="samples"):
        data.batches(x, y[:5], 4, generator=torch.Generator())


def test_augment_is_applied_to_each_batch_with_the_generator():
    x, y = indexed(9)
    gen = torch.Generator().manual_seed(0)
    calls = []

    def mark(xb, g):
        calls.append(g)
        return -xb

    out = list(data.batches(x, y, 4, generator=gen, augment=mark))
    assert len(calls) == 3 and all(g is gen for g in calls)
    assert all(torch.equal(xb[:, 0], -yb.float()) for xb, yb in out)


# ----------------------------------------------------------------------------- cifar_augment


def brute_force_crop_flip(x, top, left, flip, padding):
    """Per-sample reference: zero-pad, slice the crop, flip the columns."""
    out = []
    h, w = x.shape[-2:]
    for i in range(x.shape[0]):
        padded = F.pad(x[i], (padding,) * 4)
        crop = padded[:, int(top[i]) : int(top[i]) + h, int(left[i]) : int(left[i]) + w]
        out.append(crop.flip(-1) if bool(flip[i]) else crop)
    return torch.stack(out)


@pytest.mark.parametrize("shape, padding",
                         [((32, 3, 32, 32), 4), ((6, 1, 8, 8), 1), ((5, 2, 5, 7), 3)])
def test_cifar_augment_equals_per_sample_crop_and_flip(shape, padding):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    out = data.cifar_augment(x, torch.Generator().manual_seed(11), padding=padding)
    top, left, flip = data.crop_flip_draws(shape[0], torch.Generator().manual_seed(11), padding)
    assert torch.equal(out, brute_force_crop_flip(x, top, left, flip, padding))
    assert out.shape == x.shape and out.dtype == x.dtype


def test_each_augmented_image_is_some_crop_and_flip_of_its_source():
    # Independent of crop_flip_draws: search all (2p+1)^2 * 2 candidates for every image.
    x = torch.randn(12, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    out = data.cifar_augment(x, torch.Generator().manual_seed(3))
    flipped_any = shifted_any = False
    for i in range(x.shape[0]):
        padded = F.pad(x[i], (4,) * 4)
        matches = [
            (t, left, f)
            for t in range(9)
            for left in range(9)
            for f in (False, True)
            if torch.equal(out[i], (padded[:, t : t + 32, left : left + 32].flip(-1) if f
                                    else padded[:, t : t + 32, left : left + 32]))
        ]
        assert len(matches) == 1
        t, left, f = matches[0]
        flipped_any |= f
        shifted_any |= (t, left) != (4, 4)
    assert flipped_any and shifted_any


def test_crop_offsets_are_uniform_and_flips_fair():
    n = 40000
    top, left, flip = data.crop_flip_draws(n, torch.Generator().manual_seed(0), 4)
    for offsets in (top, left):
        counts = torch.bincount(offsets, minlength=9).double()
        assert counts.numel() == 9  # offsets 0..8 only
        # Each count ~ Binomial(n, 1/9): s.e. ~ 63 around 4444; allow 5 s.e.
        assert torch.all((counts - n / 9).abs() < 320)
    # Fraction flipped: s.e. 0.0025; allow 4 s.e.
    assert abs(flip.double().mean().item() - 0.5) < 0.01


def test_augmentation_is_per_sample_and_reproducible():
    x = torch.randn(64, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    a = data.cifar_augment(x, torch.Generator().manual_seed(5))
    b = data.cifar_augment(x, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    top, left, flip = data.crop_flip_draws(64, torch.Generator().manual_seed(5))
    assert len(set(zip(top.tolist(), left.tolist(), flip.tolist()))) > 20  # not one draw for all


def test_cifar_augment_rejects_non_images():
    with pytest.raises(ValueError, match="N, C, H, W"):
        data.cifar_augment(torch.zeros(4, 10), torch.Generator())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cpu_generator_gives_the_same_epoch_and_augmentation_on_gpu():
    x = torch.randn(40, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    y = torch.arange(40)

    def run(device):
        gen = torch.Generator().manual_seed(9)
        return [
            (xb.cpu(), yb.cpu())
            for xb, yb in data.batches(x.to(device), y.to(device), 16, generator=gen,
                                       augment=data.cifar_augment)
        ]

    for (xa, ya), (xb, yb) in zip(run("cpu"), run("cuda")):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)
