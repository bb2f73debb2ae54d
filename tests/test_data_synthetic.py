"""bnlab.data: the registry, `load`, digits, Santurkar's Gaussian regression and Luo's
teacher-student."""

import math

import numpy as np
import pytest
import torch

from bnlab import data
from bnlab.data import DataSource


# ----------------------------------------------------------------------------- registry and load


def test_sources_registry_names_the_five_sources():
    assert set(data.SOURCES) == {"cifar10", "cifar100", "digits", "imagefolder",
                                 "gaussian_regression", "teacher_student"}
    assert all(callable(f) for f in data.SOURCES.values())


def test_unknown_source_error_names_every_valid_choice():
    with pytest.raises(ValueError) as info:
        data.load("mnist")
    message = str(info.value)
    assert "mnist" in message
    for name in data.SOURCES:
        assert name in message


def test_unknown_option_error_names_the_valid_options():
    with pytest.raises(ValueError) as info:
        data.load("teacher_student", M=3)
    message = str(info.value)
    assert "M" in message
    for option in ("N", "P", "alpha", "noise_var", "n_test"):
        assert option in message


@pytest.mark.parametrize(
    "name, options, word",
    [
        ("teacher_student", {"N": 0}, "N"),
        ("teacher_student", {"noise_var": -1.0}, "noise_var"),
        ("teacher_student", {"N": 10, "P": 30, "alpha": 2.0}, "disagree"),
        ("gaussian_regression", {"d": "ten"}, "d"),
        ("gaussian_regression", {"dtype": "int8"}, "float32"),
        ("digits", {"standardize": "global"}, "channel"),
        ("digits", {"test_fraction": 1.5}, "test_fraction"),
    ],
)
def test_bad_option_values_raise_value_error_naming_the_option(name, options, word):
    with pytest.raises(ValueError, match=word):
        data.load(name, **options)


def test_names_are_case_and_dash_insensitive_and_string_options_are_parsed():
    a = data.load("Teacher-Student", N="8", P="16", n_test="0")
    assert a.name == "teacher_student" and a.x_train.shape == (16, 8) and a.x_test is None


@pytest.mark.parametrize(
    "name, options, task, input_shape, num_outputs, n_train, n_test",
    [
        ("digits", {}, "classification", (1, 8, 8), 10, 1438, 359),
        ("gaussian_regression", {}, "regression", (10,), 10, 1000, 0),
        ("gaussian_regression", {"d": 4, "n": 30, "n_test": 7}, "regression", (4,), 4, 30, 7),
        ("teacher_student", {"N": 16, "alpha": 0.5, "n_test": 9}, "regression", (16,), 1, 8, 9),
    ],
)
def test_shapes_dtypes_and_fields(name, options, task, input_shape, num_outputs, n_train, n_test):
    ds = data.load(name, **options)
    assert isinstance(ds, DataSource)
    assert ds.task == task and ds.input_shape == input_shape and ds.num_outputs == num_outputs
    assert ds.x_train.shape == (n_train, *input_shape) and ds.x_train.dtype == torch.float32
    if task == "classification":
        assert ds.y_train.shape == (n_train,) and ds.y_train.dtype == torch.int64
        assert int(ds.y_train.min()) >= 0 and int(ds.y_train.max()) < num_outputs
    else:
        assert ds.y_train.shape == (n_train, num_outputs) and ds.y_train.dtype == torch.float32
    if n_test:
        assert ds.x_test.shape == (n_test, *input_shape) and ds.y_test.shape[0] == n_test
    else:
        assert ds.x_test is None and ds.y_test is None
    assert ds.n_train == n_train and ds.n_test == n_test and ds.has_test == bool(n_test)


@pytest.mark.parametrize(
    "name, options", [("digits", {}), ("gaussian_regression", {"n_test": 5}),
                      ("teacher_student", {"N": 32})]
)
def test_fixed_seed_is_deterministic_and_seeds_differ(name, options):
    a = data.load(name, seed=3, **options)
    b = data.load(name, seed=3, **options)
    c = data.load(name, seed=4, **options)
    for field in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert not torch.equal(a.x_train, c.x_train)


def test_float64_option_gives_the_float32_data_before_rounding():
    lo = data.load("teacher_student", N=16, seed=1)
    hi = data.load("teacher_student", N=16, seed=1, dtype="float64")
    assert hi.x_train.dtype == torch.float64 and hi.meta["w_star"].dtype == torch.float64
    assert torch.equal(hi.x_train.float(), lo.x_train)


def test_to_moves_every_tensor_including_meta():
    ds = data.load("gaussian_regression", d=3, n=5).to("meta")
    assert ds.x_train.device.type == "meta" and ds.meta["A"].device.type == "meta"
    assert "n_train=5" in repr(ds)  # and the repr does not dump tensors
    assert "tensor(" not in repr(ds)


# ----------------------------------------------------------------------------- Santurkar's DLN data


def test_gaussian_regression_targets_equal_A_x():
    ds = data.load("gaussian_regression", n_test=50, seed=7)
    A = ds.meta["A"].double()
    assert A.shape == (10, 10)
    for x, y in ((ds.x_train, ds.y_train), (ds.x_test, ds.y_test)):
        expected = x.double() @ A.T
        # y was computed in float64 from the float64 A, A was rounded to float32 afterwards:
        # |error| <= |x| |A| * 2^-24 per term, far below 1e-5 relative to the target scale (~3).
        assert torch.allclose(y.double(), expected, rtol=0, atol=1e-5 * float(expected.abs().max()))
    exact = data.load("gaussian_regression", seed=7, dtype="float64")
    assert torch.equal(exact.y_train, exact.x_train @ exact.meta["A"].T)


def test_gaussian_regression_inputs_and_matrix_are_standard_gaussian():
    ds = data.load("gaussian_regression", d=40, n=4000, seed=0, dtype="float64")
    x, A = ds.x_train, ds.meta["A"]
    cov = x.T @ x / x.shape[0]
    # Each covariance entry has standard error ~ 1/sqrt(4000) = 0.016 (diagonal sqrt(2) times that);
    # 0.1 is > 4.5 standard errors for the largest of the 1600 entries.
    assert torch.allclose(cov, torch.eye(40, dtype=torch.float64), atol=0.1)
    # 1600 i.i.d. N(0,1) entries: mean has s.e. 0.025, variance s.e. 0.035.
    assert abs(float(A.mean())) < 0.12 and abs(float(A.var()) - 1.0) < 0.18


def test_gaussian_regression_test_split_does_not_change_training_data():
    a = data.load("gaussian_regression", n_test=0, seed=2)
    b = data.load("gaussian_regression", n_test=300, seed=2)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.meta["A"], b.meta["A"])


# ----------------------------------------------------------------------------- Luo's
# teacher-student


def test_teacher_norm_and_input_variance_follow_luo():
    N, P = 25, 16000
    ds = data.load("teacher_student", N=N, P=P, n_test=0, seed=0, dtype="float64")
    w, x = ds.meta["w_star"], ds.x_train
    assert w.shape == (N,)
    assert math.isclose(float(w @ w) / N, 1.0, rel_tol=1e-12)  # (1/N) w*ᵀw* = 1 exactly
    # 400k coordinates of variance 1/N: relative s.e. of the variance sqrt(2/400k) = 0.2%.
    assert abs(float(x.var()) * N - 1.0) < 0.02
    assert abs(float(x.mean())) * N**0.5 < 0.01
    # Clean teacher output w*ᵀx ~ N(0, 1): relative s.e. of its variance sqrt(2/16000) = 1.1%.
    assert abs(float((x @ w).var()) - 1.0) < 0.06


@pytest.mark.parametrize("noise_var", [0.25, 1.0, 0.0])
def test_teacher_student_noise_variance_is_recovered(noise_var):
    ds = data.load("teacher_student", N=20, P=20000, n_test=20000, noise_var=noise_var,
                   seed=5, dtype="float64")
    for x, y in ((ds.x_train, ds.y_train), (ds.x_test, ds.y_test)):
        residual = y.squeeze(1) - x @ ds.meta["w_star"]
        if noise_var == 0.0:
            assert float(residual.abs().max()) < 1e-12
        else:
            # s.e. of a sample variance of 20000 Gaussians: sqrt(2/20000) = 1% relative; allow 5%.
            assert abs(float(residual.var()) / noise_var - 1.0) < 0.05
            assert abs(float(residual.mean())) < 5 * (noise_var / 20000) ** 0.5
    assert ds.meta["noise_var"] == noise_var


@pytest.mark.parametrize("alpha", [0.5, 4.0])
def test_teacher_student_alpha_is_recovered_from_the_spectrum(alpha):
    N = 200
    ds = data.load("teacher_student", N=N, alpha=alpha, n_test=0, seed=1, dtype="float64")
    P = ds.x_train.shape[0]
    assert P == round(alpha * N) and ds.meta["alpha"] == P / N and ds.meta["P"] == P
    eig = torch.linalg.eigvalsh(ds.x_train.T @ ds.x_train)  # N x N, rank min(P, N)
    # trace(XᵀX)/N = sum of P*N squares of variance 1/N, divided by N: mean alpha, relative s.e.
    # sqrt(2/(P N)) < 1%.
    assert abs(float(eig.sum()) / N / alpha - 1.0) < 0.03
    # Luo, after Eq. (16): nonzero eigenvalues fill [(sqrt(a)-1)^2, (sqrt(a)+1)^2]
    # (Marchenko-Pastur). Finite-N edges move by O(N^(-2/3)) ~ 3%; compare the support with 15%
    # slack.
    nonzero = eig[-min(P, N):]
    lo, hi = (alpha**0.5 - 1) ** 2, (alpha**0.5 + 1) ** 2
    assert float(nonzero.max()) == pytest.approx(hi, rel=0.15)
    assert float(nonzero.min()) == pytest.approx(lo, rel=0.15, abs=0.02)


@pytest.mark.parametrize("alpha", [0.5, 2.0])
def test_least_squares_generalization_matches_luo_eq14_with_its_sign_corrected(alpha):
    """Luo Eq. (14) prints eps²/(1-alpha) for alpha > 1, which is negative; the least-squares
    excess error is eps²/(alpha-1) (Wishart: E tr (XᵀX)^-1 = N²/(P-N-1) with x ~ N(0, I/N)).
    For alpha < 1 the minimum-norm solution gives 1 - alpha + alpha eps²/(1-alpha) as printed.
    Checks that noise_var is the eps² of Eq. (14) and the data scaling is the paper's."""
    N, noise_var, seeds = 100, 0.25, 24
    errors = []
    for seed in range(seeds):
        ds = data.load("teacher_student", N=N, alpha=alpha, noise_var=noise_var, n_test=0,
                       seed=seed, dtype="float64")
        w = torch.linalg.pinv(ds.x_train) @ ds.y_train.squeeze(1)  # min-norm least squares
        # E_x (w-w*)ᵀx)² with Cov x = I/N
        errors.append(float(((w - ds.meta["w_star"]) ** 2).sum()) / N)
    P = round(alpha * N)
    if alpha > 1:
        expected = noise_var * N / (P - N - 1)  # finite-size exact; -> noise_var/(alpha-1)
        assert expected == pytest.approx(noise_var / (alpha - 1), rel=0.02)
    else:
        expected = (1 - alpha) + noise_var * P / (N - P - 1)  # -> 1 - a + a eps²/(1-a)
        assert expected == pytest.approx(1 - alpha + alpha * noise_var / (1 - alpha), rel=0.02)
    # Per-seed relative spread is ~0.2-0.3, so the mean of 24 has s.e. ~6%; allow 20%.
    assert np.mean(errors) == pytest.approx(expected, rel=0.2)


def test_teacher_student_default_alpha_is_one():
    ds = data.load("teacher_student", N=32, n_test=0)
    assert ds.x_train.shape == (32, 32) and ds.meta["alpha"] == 1.0


# ----------------------------------------------------------------------------- digits


def test_digits_split_is_a_stratified_partition_depending_only_on_seed():
    from sklearn.datasets import load_digits

    labels = torch.from_numpy(load_digits().target.astype(np.int64))
    a = data.load("digits", seed=0)
    train, test = a.meta["train_index"], a.meta["test_index"]
    joined = torch.sort(torch.cat([train, test])).values
    assert torch.equal(joined, torch.arange(labels.numel()))  # disjoint and complete
    assert torch.equal(a.y_train, labels[train]) and torch.equal(a.y_test, labels[test])
    for c in range(10):
        size = int((labels == c).sum())
        assert int((a.y_test == c).sum()) == round(0.2 * size)
    b = data.load("digits", seed=1)
    assert not torch.equal(b.meta["test_index"], test)
    assert torch.equal(data.load("digits", seed=0).meta["test_index"], test)


def test_digits_are_standardized_with_training_statistics_only():
    from sklearn.datasets import load_digits

    raw = torch.from_numpy(load_digits().images.astype(np.float64)).unsqueeze(1)
    ds = data.load("digits", seed=0)
    train_raw = raw[ds.meta["train_index"]]
    mean, std = train_raw.mean(), train_raw.std()
    assert float(ds.meta["mean"]) == pytest.approx(float(mean), rel=1e-6)
    assert torch.allclose(ds.x_train.double(), (train_raw - mean) / std, atol=1e-5)
    assert torch.allclose(ds.x_test.double(), (raw[ds.meta["test_index"]] - mean) / std, atol=1e-5)
    assert abs(float(ds.x_train.mean())) < 1e-5 and abs(float(ds.x_train.double().std()) - 1) < 1e-5
    assert abs(float(ds.x_test.mean())) > 1e-4  # the test set was not used for the statistics

    pixel = data.load("digits", seed=0, standardize="pixel")
    per_pixel_std = pixel.x_train.double().std(dim=0)
    varying = train_raw.std(dim=0) > 0
    assert torch.allclose(per_pixel_std[varying],
                          torch.ones_like(per_pixel_std[varying]), atol=1e-5)
    assert torch.all(pixel.x_train.double().mean(dim=0).abs() < 1e-5)

    none = data.load("digits", seed=0, standardize="none")
    assert torch.equal(none.x_train.double(), train_raw)
