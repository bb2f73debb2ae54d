"""A final batch of a few samples in every epoch: warned about by the trainer, absent from every
catalogue entry (Peng Table 4's smoke trained on 899 images = 7 × 128 + 3, and that batch of 3
decided cells of its verdict)."""

from __future__ import annotations

import warnings

import pytest

from bnlab.experiments.base import load_catalogue
from bnlab.experiments.run_facts import digits_train_images
from bnlab.train.prepare import prepare, small_last_batch

BASE = dict(model="mlp", model_options={"depth": 2, "width": 16}, data="digits", steps=2,
            batch_size=128, runs_dir="unused")


def _warnings(**config) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prepare({**BASE, **config})
    return [str(w.message) for w in caught if "every epoch ends with a batch" in str(w.message)]


def test_a_batch_of_three_with_batch_norm_is_warned_about():
    message, = _warnings(norm="bn", data_options={"test_fraction": 0.5})
    assert "batch of 3 samples (899 training samples = 7 × 128 + 3)" in message
    assert "whole batches" in message


@pytest.mark.parametrize("config", [
    {"norm": "bn", "data_options": {"test_fraction": 0.501}},  # 896 = 7 × 128
    {"norm": "bn"},  # 1,438 = 11 × 128 + 30: at least SMALL_LAST_BATCH
    {"norm": "none", "data_options": {"test_fraction": 0.5}},  # nothing normalizes over the batch
    {"norm": "bn", "data_options": {"test_fraction": 0.5}, "batch_size": 8},  # 899 = 112 × 8 + 3
])
def test_whole_or_large_last_batches_and_models_without_batch_statistics_are_not(config):
    assert _warnings(**config) == []


def test_the_rule_by_numbers():
    """Below min(16, batch/4) samples and kept: 899 = 7 × 128 + 3 is small; 30 of 128, 3 of 8 (at
    least a quarter of the batch) and a whole epoch are not; a final batch of 1 is dropped, so it
    is not small either."""
    assert small_last_batch(899, 128) == 3
    assert small_last_batch(15 + 256, 256) == 15
    assert small_last_batch(16 + 256, 256) == 0
    assert [small_last_batch(n, b) for n, b in ((1438, 128), (899, 8), (896, 128), (129, 128))] \
        == [0, 0, 0, 0]


def _small_last_batch(config: dict) -> int:
    """The trainer's small final batch (:func:`small_last_batch`) of a digits config, 0 for none
    or for another data source or full-batch training."""
    batch = config.get("batch_size", 128)
    if config.get("data") != "digits" or isinstance(batch, str):
        return 0
    test_fraction = (config.get("data_options") or {}).get("test_fraction", 0.2)
    return small_last_batch(digits_train_images(test_fraction), batch)


def test_no_catalogue_entry_ends_its_epochs_with_a_batch_of_a_few_samples():
    catalogue = load_catalogue()
    small = {}
    for name in catalogue:
        entry = catalogue.entry(name).target
        for preset in ("smoke", "paper"):
            for run in entry.plan(preset).runs:
                last = _small_last_batch(run.config)
                if last:
                    small[(entry.id, preset)] = (last, run.config.get("batch_size", 128))
    assert small == {}
