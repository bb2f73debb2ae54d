"""One owner per piece of state.

The run config is one frozen object validated once, when it is built, and ``bnlab train``'s options
are generated from its fields; the trainer's metric window, metric rows, checkpoint state and
progress each live in one object, and the checkpoint helpers are typed by a protocol.
"""

from __future__ import annotations

import dataclasses
import json
import typing

import numpy as np
import pytest
import torch
import typer
from typer.testing import CliRunner

import bnlab.cli.train as train_cli
import bnlab.train.config as config_mod
from bnlab.cli import app
from bnlab.train import TrainConfig, run
from bnlab.train.engine import Trainer
from bnlab.train.record import MetricRows
from bnlab.train.resume import Checkpoints, Resumable, checkpoint_state, restore_state
from bnlab.train.window import MetricWindow

# The options `bnlab train` had before they were generated (the interface users type).
OLD_FLAGS = {
    "--config", "--model", "--norm", "--activation", "--placement", "--model-option", "--data",
    "--data-option", "--data-dir", "--no-verify", "--download", "--epochs", "--steps", "--lr",
    "--lr-scale-invariant", "--momentum", "--weight-decay", "--batch-size", "--optimizer",
    "--schedule", "--seed", "--checkpoint-every", "--eval-every", "--log-every", "--augment",
    "--no-augment", "--device", "--scale-invariant", "--probe", "--probe-every", "--runs-dir",
    "--divergence-factor", "--compile", "--force", "--log-to", "--nproc", "--sync-norms",
    "--no-sync-norms", "--json",
}


# -- the config: frozen, validated once -------------------------------------------------------


def test_config_is_frozen_and_its_containers_read_only():
    cfg = TrainConfig(steps=2, probes=["grad_norm"], model_options={"width": 8})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.model_options["width"] = 16  # type: ignore[index]
    assert cfg.probes == ("grad_norm",) and isinstance(cfg.probes, tuple)
    # the dict form (store, checkpoint, hash) is plain JSON, as before
    assert json.loads(json.dumps(cfg.to_dict()))["model_options"] == {"width": 8}


@pytest.mark.parametrize("values, message", [
    ({"momentum": 1.5}, r"momentum must be in \[0, 1\), got 1.5"),
    ({"optimizer": "adam"}, "unknown optimizer 'adam'; valid optimizers: sgd, psgd"),
    ({"probe_every": 0}, "probe_every must be a positive integer"),
    ({"augment": "yes"}, "augment must be true or false"),
])
def test_a_bad_value_is_refused_when_the_config_is_built(values, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(steps=1, **values)
    good = TrainConfig(steps=1)
    with pytest.raises(ValueError, match=message):  # a changed copy is a new config: checked too
        dataclasses.replace(good, **values)


def test_values_are_normalised_once_and_hash_as_before():
    cfg = TrainConfig.from_dict({"steps": 3, "lr": 1, "batch_size": " Full ", "probes": "grad_norm",
                                 "scale_invariant": "a,b"})
    assert (cfg.lr, cfg.batch_size, cfg.probes, cfg.scale_invariant) == (
        1.0, "full", ("grad_norm",), ("a", "b"))
    assert TrainConfig.coerce(cfg) is cfg  # nothing downstream copies or re-checks it
    # the run id is the hash of the normalised plain values (lists, floats), as before the change
    same = TrainConfig.from_dict({**cfg.to_dict()})
    assert same == cfg and same.run_id() == cfg.run_id()


def test_the_cli_path_validates_the_config_exactly_once(tmp_path, monkeypatch):
    calls = []
    real = config_mod._validate  # TrainConfig.__post_init__'s one validator
    monkeypatch.setattr(config_mod, "_validate", lambda c: (calls.append(1), real(c)))
    result = CliRunner().invoke(app, ["train", "--steps", "2", "--batch-size", "64",
                                      "--runs-dir", str(tmp_path), "--json"], prog_name="bnlab")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["status"] == "finished"
    assert len(calls) == 1  # built once from the flags; launcher, run and prepare take it as is


# -- the CLI is generated from the config ------------------------------------------------------


def test_cli_options_are_the_config_fields_plus_the_run_options():
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(train_cli.TRAIN_OPTIONS) == fields | {"config_file", "force", "log_to", "as_json",
                                                     "doctor"}
    for f in dataclasses.fields(TrainConfig):
        _, option = train_cli.TRAIN_OPTIONS[f.name]
        assert option.help == f.metadata["cli"]["help"]


def test_help_lists_the_same_options_as_before():
    group = typer.Typer()
    group.command("train")(train_cli.train_command)
    group.command("other")(lambda: None)  # two commands: typer keeps "train" a subcommand
    command = typer.main.get_group(group).commands["train"]
    flags = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} - {"--help"}
    assert flags == OLD_FLAGS | {"--compiled-steps", "--doctor"}  # the flags added since
    result = CliRunner().invoke(app, ["train", "--help"], prog_name="bnlab",
                                env={"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"})
    assert result.exit_code == 0 and "Skip checksum verification of data files." in result.output


def test_flags_override_the_yaml_file_key_by_key(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(train_cli, "train", lambda config, **kw: seen.append(config))
    path = tmp_path / "run.yaml"
    path.write_text("epochs: 3\nlr: 0.5\nmodel_options: {width: 8}\nprobes: [grad_norm]\n")
    result = CliRunner().invoke(app, [
        "train", "--config", str(path), "--steps", "4", "--model-option", "depth=3", "--no-verify",
        "--compile", "--probe", "grad_stats", "--probe-every", "2", "--batch-size", "full"],
        prog_name="bnlab")
    assert result.exit_code == 0, result.output
    expected = TrainConfig.from_dict({
        "steps": 4, "lr": 0.5, "model_options": {"width": 8, "depth": 3}, "verify": False,
        "compile": True, "probes": ["grad_stats"], "probe_every": 2, "batch_size": "full"})
    assert seen == [expected]


def test_a_bad_flag_is_one_line_naming_the_valid_choices(tmp_path):
    result = CliRunner().invoke(app, ["train", "--steps", "1", "--optimizer", "adam"],
                                prog_name="bnlab")
    assert result.exit_code == 2
    assert "error: unknown optimizer 'adam'; valid optimizers: sgd, psgd" in result.output


# -- the trainer's state owners ----------------------------------------------------------------


def test_metric_window_matches_a_float64_truth_read_at_any_cadence():
    gen = torch.Generator().manual_seed(0)
    losses = torch.rand(23, generator=gen, dtype=torch.float32) * 3
    correct = torch.randint(0, 9, (23,), generator=gen)
    spe, total = 7, 23
    window = MetricWindow(steps_per_epoch=spe, log_every=5, total_steps=total, classification=True)
    rows = []
    for step in range(1, total + 1):
        window.push(losses[step - 1], 8, correct[step - 1])
        if step in (1, 4, 9, 14, 20, 23):  # reads at irregular checks
            rows += window.read(step)
    assert len(window) == 0 and window.start_loss == float(losses[0])
    assert window.last_loss == float(losses[-1])
    truth = losses.double().numpy()
    epoch_rows = {s: v for s, n, v in rows if n == "epoch_train_loss"}
    for end in (7, 14, 21, 23):
        start = (end - 1) // spe * spe
        assert epoch_rows[end] == pytest.approx(np.mean(truth[start:end]), rel=1e-12)
    assert [s for s, n, _ in rows if n == "train_loss"] == [1, 5, 10, 15, 20]
    assert sum(len(seen) for _, seen in window.take_unscanned()) == total
    assert window.take_unscanned() == []


def test_metric_window_state_round_trips():
    window = MetricWindow(steps_per_epoch=10, log_every=1, total_steps=20, classification=False)
    for step in range(1, 5):
        window.push(torch.tensor(float(step)), 4)
    window.read(4)
    other = MetricWindow(steps_per_epoch=10, log_every=1, total_steps=20, classification=False)
    other.load_state_dict(window.state_dict())
    assert other.state_dict() == window.state_dict() and other.epoch_means() == {"train_loss": 2.5}


def test_trainer_state_lives_in_its_owners(tmp_path, monkeypatch):
    seen = {}

    class Grab(Trainer):
        def train(self):
            seen["trainer"] = self
            return super().train()

    monkeypatch.setattr("bnlab.train.loop.Trainer", Grab)
    run({"steps": 3, "batch_size": 64, "runs_dir": str(tmp_path)}, progress=False)
    trainer = seen["trainer"]
    assert isinstance(trainer.window, MetricWindow) and isinstance(trainer.rows, MetricRows)
    assert isinstance(trainer.checkpoints, Checkpoints)
    # no copy of a window, accumulator, row buffer or checkpoint field is left on the trainer
    stray = [k for k in vars(trainer) if k.startswith(("acc_", "window_", "rows_", "last_loss",
                                                       "start_loss", "buffer", "pending",
                                                       "ckpt", "last_checkpoint"))]
    assert stray == []
    # the checkpoint helpers are typed by the protocol, and the trainer has every field it names
    for helper in (checkpoint_state, restore_state):
        assert typing.get_type_hints(helper)["trainer"] is Resumable
    missing = [name for name in Resumable.__annotations__ if not hasattr(trainer, name)]
    assert missing == []
