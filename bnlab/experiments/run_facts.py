"""What the verdict rule (:mod:`bnlab.experiments.verdicts`) reads from an entry's runs, the measure
step before it judges: an arm's per-seed values with divergence as failure (item 4,
:func:`arm_values`), where training's final learning-rate phase is read a second time (item 6,
:func:`settle_fraction`) and how many images an accuracy is counted on (item 3's binomial floor,
:func:`n_test_images`)."""

from __future__ import annotations

from bnlab.train.schedules import parse_schedule

from .significance import finite_values

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


def arm_values(runs, read, failure_value: float) -> tuple[list[float], list[str]]:
    """Item 4 of the rule: per-seed values of one arm, ``read(run)`` for finished runs,
    ``failure_value`` for a diverged run or a finished one whose value is non-finite. Runs that
    crashed or were interrupted are left out and their labels returned, so the summary can name
    them."""
    values, missing = [], []
    for r in runs:
        if r.status == "diverged":
            values.append(failure_value)
        elif r.status == "finished":
            value = finite_values([read(r)])
            values.append(value[0] if value else failure_value)
        else:
            missing.append(r.label)
    return values, missing


def settle_fraction(config: dict) -> float:
    """Item 6 of the rule: where (fraction of training) the verdict is read a second time, halfway
    through the final learning-rate phase. For ``step:E1,...,Ek`` over E epochs that is (Ek + (E −
    Ek)/2)/E — after the last drop, so the two readings compare like with like; otherwise 2/3."""
    schedule = parse_schedule(str(config.get("schedule") or "constant"))  # the one parser
    epochs = config.get("epochs")
    if schedule.kind == "step" and epochs:
        last = max(schedule.milestones)
        if last < epochs:
            return (last + (epochs - last) / 2) / epochs
    return 2 / 3
