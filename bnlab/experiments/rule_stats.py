"""The statistics of the verdict rule (:mod:`bnlab.experiments.verdicts`), apart from the ladder
that turns them into a verdict: an arm's per-seed values with divergence as failure (item 4 of
:data:`~bnlab.experiments.verdicts.RULE`), the binomial floor on the standard error (item 3), Holm's
step-down for a family of comparisons (item 1) and where the settling rule reads a verdict a second
time (item 6)."""

from __future__ import annotations

import math

from bnlab.formatting import finite_or_none
from bnlab.train.schedules import parse_schedule


# scikit-learn's digits: 1,797 images, per class (0–9); the stratified split rounds each class's
# share on its own
DIGITS_CLASS_SIZES = (178, 182, 177, 183, 181, 182, 181, 179, 174, 180)
CIFAR_TEST_IMAGES = 10_000  # CIFAR-10's and CIFAR-100's test sets


def n_test_images(data: str, test_fraction: float = 0.2) -> int:
    """The number of test images an entry's accuracies are counted on (the ``n_test`` of the
    binomial floor): digits' stratified split holds round(``test_fraction``·size) of each class
    (359 at the default 0.2, 898 at 0.5, 901 at 0.501; checked against the split by a test),
    CIFAR's test sets 10,000."""
    if data == "digits":
        return sum(round(test_fraction * size) for size in DIGITS_CLASS_SIZES)
    if data in ("cifar10", "cifar100"):
        return CIFAR_TEST_IMAGES
    raise ValueError(f"no test-set size for data {data!r}; known: digits, cifar10, cifar100")


def digits_train_images(test_fraction: float = 0.2) -> int:
    """The training images of digits' stratified split: the 1,797 less :func:`n_test_images`."""
    return sum(DIGITS_CLASS_SIZES) - n_test_images("digits", test_fraction)


def config_test_images(config: dict) -> int:
    """:func:`n_test_images` of a run config (its ``data`` and ``data_options.test_fraction``)."""
    options = config.get("data_options") or {}
    return n_test_images(config["data"], options.get("test_fraction", 0.2))


def binomial_floor(p_a: float, p_b: float, n_test: int | None, n_a: int, n_b: int) -> float:
    """Binomial SE of the difference of two arm-mean accuracies on ``n_test`` test images (0 without
    n_test)."""
    if not n_test:
        return 0.0
    p_a, p_b = (min(max(p, 0.0), 1.0) for p in (p_a, p_b))
    return math.sqrt(p_a * (1 - p_a) / (n_test * n_a) + p_b * (1 - p_b) / (n_test * n_b))


def holm(pvalues: dict) -> dict:
    """Holm's step-down adjusted p-values (Holm 1979, "A simple sequentially rejective multiple test
    procedure"): the k-th smallest of m gets max over j ≤ k of min(1, (m − j + 1)·p_(j)). None stays
    None."""
    known = sorted(((p, key) for key, p in pvalues.items() if p is not None), key=lambda t: t[0])
    m, running, out = len(known), 0.0, {key: None for key in pvalues}
    for rank, (p, key) in enumerate(known):
        running = max(running, min(1.0, (m - rank) * p))
        out[key] = running
    return out


def arm_values(runs, read, failure_value: float) -> tuple[list[float], list[str]]:
    """Per-seed values of one arm: ``read(run)`` for finished runs, ``failure_value`` for a diverged
    run or a finished one whose value is non-finite (a failure of the arm, not missing data). Runs
    that crashed or were interrupted are left out and their labels returned, so the summary can name
    them."""
    values, missing = [], []
    for r in runs:
        if r.status == "diverged":
            values.append(failure_value)
        elif r.status == "finished":
            value = finite_or_none(read(r))
            values.append(failure_value if value is None else value)
        else:
            missing.append(r.label)
    return values, missing


def settle_fraction(config: dict) -> float:
    """Where (fraction of training) the settling rule reads the verdict a second time: halfway
    through the final learning-rate phase. For ``step:E1,...,Ek`` over E epochs that is (Ek + (E −
    Ek)/2)/E — after the last drop, so the two readings compare like with like; otherwise (constant,
    exponential) 2/3."""
    schedule = parse_schedule(str(config.get("schedule") or "constant"))  # the one parser
    epochs = config.get("epochs")
    if schedule.kind == "step" and epochs:
        last = max(schedule.milestones)
        if last < epochs:
            return (last + (epochs - last) / 2) / epochs
    return 2 / 3
