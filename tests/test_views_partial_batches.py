"""Probe readings at an epoch's partial last batch are left out of analyses.

A probe measures the training batch. With digits' 1,438 training images in batches of 128, every
twelfth step trains on 30 samples: there, with BN, Santurkar's loss range along the gradient was
30–170× that of the whole batches, and half of those probes (every 30 steps) fell on one.
``partial_batch_steps`` reads the schedule from the run's config; it is checked here against the
batches the trainer really draws.
"""

from __future__ import annotations

import pytest

from bnlab.experiments.views import RunView, partial_batch_steps
from bnlab.train import run
from bnlab.train.callbacks import Callback


def test_the_schedule_of_partial_batches_from_the_config():
    partial = partial_batch_steps({"data": "digits", "batch_size": 128})  # 1,438 = 11 × 128 + 30
    assert [s for s in range(1, 40) if partial(s)] == [12, 24, 36]
    # whole batches, or a size the config alone does not give: every reading kept
    assert partial_batch_steps({"data": "digits", "batch_size": 128,
                                "data_options": {"test_fraction": 0.501}}) is None  # 896 = 7 × 128
    assert partial_batch_steps({"data": "digits", "batch_size": "full"}) is None
    assert partial_batch_steps({"data": "cifar10", "batch_size": 128}) is None
    # 1,438 = 3 × 479 + 1: the batch of 1 is dropped, every batch kept is whole
    assert partial_batch_steps({"data": "digits", "batch_size": 479}) is None


class BatchSizes(Callback):
    def __init__(self):
        self.sizes = {}

    def on_train_batch_end(self, loop):
        self.sizes[loop.step] = int(loop.batch[1].shape[0])


@pytest.mark.parametrize("batch_size, options", [(128, {}), (100, {"test_fraction": 0.3})])
def test_the_schedule_matches_the_batches_the_trainer_draws(tmp_path, batch_size, options):
    sizes = BatchSizes()
    config = {"model": "mlp", "norm": "bn", "data": "digits", "data_options": options,
              "batch_size": batch_size, "steps": 40, "lr": 0.05, "seed": 0,
              "runs_dir": str(tmp_path)}
    record = run(config, callbacks=[sizes], progress=False)
    assert record.status == "finished" and len(sizes.sizes) == 40
    partial = partial_batch_steps(config)
    assert {s for s, n in sizes.sizes.items() if n < batch_size} == \
        {s for s in sizes.sizes if partial(s)} != set()


class _Store:
    def metrics(self, run_id, names=None):
        rows = [(s, float(s)) for s in range(6, 61, 6)]
        return {name: rows for name in names}


def _view(config):
    return RunView("a", {}, "r1", "finished", {"config": config}, _Store())


def test_series_leaves_out_probe_readings_at_partial_batches_only():
    view = _view({"data": "digits", "batch_size": 128})
    assert view.series("probe/landscape/loss_range")[0] == [6, 18, 30, 42, 54]
    assert view.series("probe/landscape/loss_range", partial_batches=True)[0] == \
        list(range(6, 61, 6))
    assert view.series("train_loss")[0] == list(range(6, 61, 6))  # the training's own metrics
    assert _view({"data": "cifar10", "batch_size": 128}).series("probe/x")[0] == \
        list(range(6, 61, 6))
