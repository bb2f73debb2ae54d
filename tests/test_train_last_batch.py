"""A final batch of a few samples in every epoch: warned about by the trainer, absent from every
catalogue entry (Peng Table 4's smoke trained on 899 images = 7 × 128 + 3, and that batch of 3
decided cells of its verdict)."""

from __future__ import annotations

import warnings

import pytest

from bnlab.experiments.base import load_catalogue
from bnlab.experiments.rule_stats import DIGITS_CLASS_SIZES, config_test_images
from bnlab.train.prepare import SMALL_LAST_BATCH, prepare

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


def _last_batch(config: dict) -> tuple[int, int] | None:
    """(samples, batch size) of the final batch of an epoch of a digits config, None if whole or
    not a digits/batch config."""
    batch = config.get("batch_size", 128)
    if config.get("data") != "digits" or isinstance(batch, str):
        return None
    n_train = sum(DIGITS_CLASS_SIZES) - config_test_images(config)
    last = n_train % batch
    return (last, batch) if last not in (0, 1) else None  # a last batch of 1 is dropped


def test_no_catalogue_entry_ends_its_epochs_with_a_batch_of_a_few_samples():
    catalogue = load_catalogue()
    small = {}
    for name in catalogue:
        entry = catalogue.entry(name).target
        for preset in ("smoke", "paper"):
            for run in entry.plan(preset).runs:
                last = _last_batch(run.config)
                if last and last[0] < min(SMALL_LAST_BATCH, last[1] // 4):
                    small[(entry.id, preset)] = last
    assert small == {}
