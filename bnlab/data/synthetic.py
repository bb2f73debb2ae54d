"""The two synthetic tasks of the papers and the 8×8 handwritten digits (shipped in bnlab/data).

* ``gaussian_regression`` — Santurkar et al. (2018), appendix A, "25-layer deep linear network on
  synthetic Gaussian data": fit ``A x`` from ``x`` with ``x`` Gaussian and ``A`` (10x10) i.i.d.
  Gaussian, 1000 samples, trained full batch.
* ``teacher_student`` — Luo et al. (2019), section 4: linear teacher ``y = w*ᵀx + ε`` with
  ``x ~ N(0, 1/N)`` per coordinate, ``(1/N) w*ᵀw* = 1`` (section 3.2) and load ``α = P/N``.
* ``digits`` — scikit-learn's copy of the UCI 8x8 handwritten digits, 1797 grey images, shipped
  as ``bnlab/data/digits.npz`` (:mod:`bnlab.data.digits_archive`), equal to ``load_digits()``.

Every random draw comes from one CPU ``torch.Generator`` seeded with ``seed``; samples are drawn in
float64 and cast to ``dtype`` so float32 and float64 data agree to rounding, and the result is the
same whatever ``device`` it is moved to.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from bnlab.spec import Param, check_choice

from .base import DTYPE, DataSource, as_float, as_float_dtype, as_int, count, cpu_generator, source
from .digits_archive import load_digits_arrays


@source("gaussian_regression", {"d": count(10, 1, "input and output dimension"),
                                  "n": count(1000, 1, "training samples"),
                                  "n_test": count(0, 0, "test samples"), "dtype": DTYPE})
def gaussian_regression(
    *,
    device="cpu",
    seed=0,
    data_dir=None,
    verify=True,
    download=False,
    d=10,
    n=1000,
    n_test=0,
    dtype="float32",
) -> DataSource:
    """Santurkar et al. (2018), appendix A: targets ``y = A x``, ``x ~ N(0, I_d)``, ``A_ij ~ N(0,
    1)``.

    The paper trains on ``n = 1000`` samples (the full batch) with ``d = 10`` and reports training
    loss only, so by default there is no test split (``n_test = 0``); ``n_test > 0`` draws a test
    set from the same distribution with the same ``A``. Draw order: ``A``, training inputs, test
    inputs — so ``n_test`` never changes the training data. Targets are exact products (computed
    in float64): ``y_train == x_train @ A.T``. ``meta["A"]`` holds ``A`` (shape ``(d, d)``).
    ``data_dir``, ``verify`` and ``download`` are accepted for a uniform signature and ignored.
    """
    d = as_int("d", d, minimum=1)
    n = as_int("n", n, minimum=1)
    n_test = as_int("n_test", n_test, minimum=0)
    dtype = as_float_dtype(dtype)
    gen = cpu_generator(seed)
    A = torch.randn(d, d, generator=gen, dtype=torch.float64)
    x_train = torch.randn(n, d, generator=gen, dtype=torch.float64)
    x_test = torch.randn(n_test, d, generator=gen, dtype=torch.float64) if n_test else None
    # Cast x first and compute y from the cast x, so the returned pair satisfies y = A x exactly
    # up to one rounding of the product.
    x_train = x_train.to(dtype)
    y_train = (x_train.double() @ A.T).to(dtype)
    if x_test is not None:
        x_test = x_test.to(dtype)
        y_test = (x_test.double() @ A.T).to(dtype)
    else:
        y_test = None
    return DataSource(
        name="gaussian_regression",
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        task="regression",
        input_shape=(d,),
        num_outputs=d,
        meta={"A": A.to(dtype), "d": d, "n": n, "n_test": n_test, "seed": seed},
    ).to(device)


@source("teacher_student", {
    "N": count(512, 1, "input dimension"),
    "P": count(None, 1, "training samples (none: from alpha)"),
    "alpha": Param(None, float, positive=True, nullable=True, help="load P/N (none: 1 unless P)"),
    "noise_var": Param(0.25, float, minimum=0.0, help="label-noise variance (Eq. 14)"),
    "n_test": count(2048, 0, "test samples"), "dtype": DTYPE})
def teacher_student(
    *,
    device="cpu",
    seed=0,
    data_dir=None,
    verify=True,
    download=False,
    N=512,
    P=None,
    alpha=None,
    noise_var=0.25,
    n_test=2048,
    dtype="float32",
) -> DataSource:
    """Luo et al. (2019), section 4: the linear teacher ``y = w*ᵀx + ε``.

    * inputs ``x ∈ R^N`` with i.i.d. coordinates ``N(0, 1/N)`` (section 4, "x is drawn from
      N(0, 1/N)"), so ``E[xxᵀ] = I/N`` and the eigenvalues of ``XᵀX`` (``P`` samples) fill the
      Marchenko–Pastur interval ``[(√α − 1)², (√α + 1)²]`` quoted after Eq. (16);
    * teacher ``w*`` drawn ``N(0, I_N)`` and rescaled so that ``(1/N) w*ᵀw* = 1`` exactly
      (section 3.2: "the norm of the ground-truth vector is (1/N) w*ᵀw* = 1"); hence the clean
      target ``w*ᵀx`` is ``N(0, 1)`` — signal variance 1;
    * label noise ``ε ~ N(0, noise_var)``, independent per sample, on the training *and* the test
      targets (the generalization error is "validation loss − training loss"). ``noise_var`` is
      the variance, the ``ϵ²`` of Eq. (14); the default 0.25 is the paper's "noise variance ... be
      0.25" (section 4.1).

    ``P`` (training samples) or ``alpha = P/N`` choose the load; ``P = round(alpha * N)``; with
    neither, ``alpha = 1`` (the interpolation peak). The paper's numerical study uses ``N = 4096``;
    the default ``N = 512`` keeps runs short. Targets have shape ``(n, 1)`` (``num_outputs = 1``).
    Draw order: ``w*``, training inputs, training noise, test inputs, test noise.

    ``meta``: ``w_star`` (shape ``(N,)``), ``noise_var``, ``alpha`` (= P/N as realized), ``N``,
    ``P``, ``n_test``, ``signal_var`` (= 1).
    """
    N = as_int("N", N, minimum=1)
    P = _training_size(N, P, alpha)
    noise_var = as_float("noise_var", noise_var, minimum=0.0)
    n_test = as_int("n_test", n_test, minimum=0)
    dtype = as_float_dtype(dtype)
    gen = cpu_generator(seed)

    w_star = torch.randn(N, generator=gen, dtype=torch.float64)
    w_star = w_star * (N**0.5 / w_star.norm())
    x_train, y_train = _teacher_samples(P, w_star, noise_var, dtype, gen)
    x_test, y_test = _teacher_samples(n_test, w_star, noise_var, dtype,
                                      gen) if n_test else (None, None)
    meta = {"w_star": w_star.to(dtype), "noise_var": noise_var, "alpha": P / N, "N": N, "P": P,
            "n_test": n_test, "signal_var": 1.0, "seed": seed}
    return DataSource(name="teacher_student", x_train=x_train, y_train=y_train, x_test=x_test,
                      y_test=y_test, task="regression", input_shape=(N,), num_outputs=1,
                      meta=meta).to(device)


def _training_size(N: int, P, alpha) -> int:
    """The teacher-student option ``P``, or ``round(alpha * N)``, or ``N`` (alpha = 1) with
    neither."""
    if P is not None:
        P = as_int("P", P, minimum=1)
    if alpha is None:
        return N if P is None else P
    alpha = as_float("alpha", alpha, strictly_positive=True)
    P_from_alpha = int(round(alpha * N))
    if P_from_alpha < 1:
        raise ValueError(f"option alpha={alpha} with N={N} gives P={P_from_alpha}; P must be >= 1")
    if P is not None and P != P_from_alpha:
        raise ValueError(f"options P={P} and alpha={alpha} disagree: alpha*N = {alpha * N:g}; give "
                         "one of them")
    return P_from_alpha


def _teacher_samples(count: int, w_star: torch.Tensor, noise_var: float, dtype: torch.dtype,
                     gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` inputs ``x ~ N(0, I/N)`` and targets ``w*ᵀx + ε``, ``ε ~ N(0, noise_var)`` (draw
    order: x, ε)."""
    N = w_star.numel()
    x = torch.randn(count, N, generator=gen, dtype=torch.float64) / N**0.5
    eps = torch.randn(count, generator=gen, dtype=torch.float64) * noise_var**0.5
    x = x.to(dtype)
    y = (x.double() @ w_star + eps).to(dtype).unsqueeze(1)
    return x, y


DIGITS_STANDARDIZE = ("channel", "pixel", "none")
DIGITS_SIZES = (8, 16, 32)
# the noise stream's seed differs from the split's, so they are not correlated
NOISE_SEED_OFFSET = 7_919
# declared once: the registry checks it for data.load, digits() itself for direct calls
DIGITS_NOISE = Param(0.0, float, minimum=0.0,
                     help="SD of fixed Gaussian pixel noise (standardized units)")


def resize_images(images: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear resize of ``(n, C, H, W)`` images to ``size × size`` (``align_corners=False``: pixel
    centres map to pixel centres, so a constant image stays constant); ``size == H == W`` returns
    them."""
    if images.shape[-2:] == (size, size):
        return images
    return F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)


@source("digits", {
    "test_fraction": Param(0.2, float, minimum=0.0, help="held-out share, in [0, 1)"),
    "standardize": Param("channel", str, choices=DIGITS_STANDARDIZE, help="per channel or pixel"),
    "size": Param(8, int, choices=DIGITS_SIZES, help="side of the (upsampled) images"),
    "noise": DIGITS_NOISE})
def digits(*, device="cpu", seed=0, data_dir=None, verify=True, download=False,
           test_fraction=0.2, standardize="channel", size=8, noise=0.0) -> DataSource:
    """scikit-learn's bundled handwritten digits (1797 samples, 10 classes) as ``(n, 1, size,
    size)`` images.

    ``size`` (8, 16 or 32): the 8×8 originals bilinearly upsampled (:func:`resize_images`) before
    standardization. Why: a 3×3 zero-padded conv net on 8×8 inputs has 2×2 (all border) or 4×4 maps
    in its deep stages, where the padding pattern — the same for every sample — dominates the norms'
    input variance; 16×16 or 32×32 inputs give those stages interior pixels (see
    ``bnlab.models.padding_share``).

    Split: stratified (:func:`stratified_split`, default 80/20: 1438 train / 359 test);
    ``meta["train_index"]`` and ``meta["test_index"]`` index into ``load_digits()``. Standardization
    (``standardize``: ``"channel"``, ``"pixel"`` or ``"none"``, :func:`standardization`) uses
    training-set statistics only; the constants are in ``meta["mean"]``/``meta["std"]``.

    ``noise`` (σ ≥ 0): Gaussian noise of SD σ added once to every standardized pixel, train and test
    images alike, drawn from its own generator (seeded by ``seed``, so the split does not change
    with σ). Why: a conv net reaches 98 % on the clean digits, a ceiling where effects of a few
    points cannot show; at σ = 1.5 BN-ResNet-20 at width ½ reaches 85–87 % (a pilot), with
    room above and below.
    """
    test_fraction = as_float("test_fraction", test_fraction)
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"option test_fraction must be in [0, 1), got {test_fraction}")
    standardize = check_choice("standardize", standardize, DIGITS_STANDARDIZE, "standardizations")
    size = check_choice("size", as_int("size", size), DIGITS_SIZES)
    noise = DIGITS_NOISE.convert("digits", "noise", noise)
    gen = cpu_generator(seed)

    raw_images, raw_target = load_digits_arrays()  # scikit-learn's load_digits() values and order
    images = torch.from_numpy(np.asarray(raw_images, dtype=np.float64)).unsqueeze(1)  # (1797,1,8,8)
    images = resize_images(images, size)
    labels = torch.from_numpy(np.asarray(raw_target, dtype=np.int64))

    train_index, test_index = stratified_split(labels, test_fraction, gen)
    x_train, y_train = images[train_index], labels[train_index]
    x_test, y_test = images[test_index], labels[test_index]
    mean, std = standardization(x_train, standardize)
    x_train = ((x_train - mean) / std).float()
    x_test = ((x_test - mean) / std).float()
    x_train, x_test = _add_pixel_noise(x_train, x_test, noise, seed)

    device = torch.device(device)
    has_test = test_index.numel() > 0
    meta = {"size": size, "noise": noise,
            "mean": mean.float().to(device), "std": std.float().to(device),
            "standardize": standardize, "test_fraction": test_fraction,
            "train_index": train_index.to(device), "test_index": test_index.to(device),
            "classes": [str(c) for c in range(10)], "seed": seed}
    return DataSource(name="digits", x_train=x_train.to(device), y_train=y_train.to(device),
                      x_test=x_test.to(device) if has_test else None,
                      y_test=y_test.to(device) if has_test else None, task="classification",
                      input_shape=(1, size, size), num_outputs=10, meta=meta)


def _add_pixel_noise(x_train: torch.Tensor, x_test: torch.Tensor, noise: float,
                     seed) -> tuple[torch.Tensor, torch.Tensor]:
    """Add N(0, noise²) once to every pixel of both splits, from a generator of its own."""
    if noise == 0:
        return x_train, x_test
    noise_gen = cpu_generator(NOISE_SEED_OFFSET + int(seed))
    x_train = x_train + noise * torch.randn(x_train.shape, generator=noise_gen)
    x_test = x_test + noise * torch.randn(x_test.shape, generator=noise_gen)
    return x_train, x_test


def stratified_split(labels: torch.Tensor, test_fraction: float,
                     gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(train_index, test_index): within each class (in class order) the samples are permuted by
    ``gen`` and ``round(test_fraction * class_size)`` go to the test set; both splits keep the
    original order."""
    test_parts = []
    for c in range(int(labels.max()) + 1):
        members = torch.nonzero(labels == c).flatten()
        n_test_c = int(round(test_fraction * members.numel()))
        perm = torch.randperm(members.numel(), generator=gen)
        test_parts.append(members[perm[:n_test_c]])
    test_index = torch.sort(torch.cat(test_parts)).values
    is_test = torch.zeros(labels.numel(), dtype=torch.bool)
    is_test[test_index] = True
    return torch.nonzero(~is_test).flatten(), test_index


def standardization(x_train: torch.Tensor, standardize: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) from the training images only (the test set never leaks into them).

    ``"channel"`` (the digits default): the one mean and standard deviation of all training pixels —
    the single-channel analogue of CIFAR's per-channel normalization, so the image stays an image
    for a CNN (shape ``(1, 1, 1)``); ``"pixel"``: each pixel separately (scikit-learn's
    ``StandardScaler``; pixels constant on the training set, such as the always-blank corners, get
    std 1 so they stay 0; shape ``(1, size, size)``); ``"none"``: mean 0 and std 1 (the raw 0–16
    intensities stay).
    """
    if standardize == "channel":
        return x_train.mean().reshape(1, 1, 1), x_train.std().reshape(1, 1, 1)
    if standardize == "pixel":
        std = x_train.std(dim=0)
        return x_train.mean(dim=0), torch.where(std > 0, std, torch.ones_like(std))
    return torch.zeros(1, 1, 1, dtype=torch.float64), torch.ones(1, 1, 1, dtype=torch.float64)
