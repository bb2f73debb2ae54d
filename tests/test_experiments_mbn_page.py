"""docs/readme/small-batches.md is what bnlab/experiments/mbn/page.py renders from the numbers the
page carries (the stored mbn-batch-size run's per-seed accuracies), judged by today's rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from bnlab.experiments.mbn import page
from bnlab.experiments.mbn.arms import ARMS
from bnlab.experiments.mbn.entries import BATCH_SIZES, SEEDS, batch_size_verdict

PAGE = Path(__file__).resolve().parents[1] / "docs" / "readme" / "small-batches.md"


def test_the_page_is_rendered_from_its_numbers():
    text = PAGE.read_text()
    data = page.embedded(text)
    # a hand edit of a number, the table or the verdict (or a change of the rule) shows up here:
    # regenerate with `python -m bnlab.experiments.mbn.page RUNS --commit SHA`
    assert page.render(data) == text


def test_the_numbers_are_a_full_measurement_counted_on_the_test_set():
    data = page.embedded(PAGE.read_text())
    n_test = data["n_test"]
    ends = (min(BATCH_SIZES), max(BATCH_SIZES))
    for arm in ARMS:
        assert sorted(map(int, data["acc"][arm])) == sorted(BATCH_SIZES), arm
        for M, seeds in data["acc"][arm].items():
            many = int(M) in ends and arm != "synced BN"
            assert len(seeds) == (len(SEEDS) if many else 1), (arm, M)
            for value in seeds.values():  # accuracies are counts of test images
                assert value * n_test == pytest.approx(round(value * n_test), abs=1e-6)
    verdict, summary = batch_size_verdict(page._acc(data), tiny=False, n_test=n_test)
    assert f"is **{verdict}**" in PAGE.read_text() and summary in PAGE.read_text()
