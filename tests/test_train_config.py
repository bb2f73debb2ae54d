"""Config validation (before any training), schedules, run identity, and the CLI's error
handling."""

from __future__ import annotations

import math

import pytest
import yaml
from typer.testing import CliRunner

from bnlab.cli import app
from bnlab.train import TrainConfig, parse_schedule, run, validate_static
from bnlab.train.config import COSMETIC_KEYS

runner = CliRunner()


def _models_available() -> bool:
    from bnlab import models

    return hasattr(models, "MODELS") and "mlp" in models.MODELS


needs_models = pytest.mark.skipif(not _models_available(), reason="bnlab.models not available yet")


def _cfg(**kw):
    base = dict(model="mlp", data="digits", epochs=1)
    base.update(kw)
    return TrainConfig.from_dict(base)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(model="resnet99"), "unknown model 'resnet99'; valid models: .*mlp"),
        (dict(norm="bogus_norm"), "bad norm spec 'bogus_norm'.*valid names: .*bn"),
        (dict(data="mnist"), "unknown data source 'mnist'; valid choices: .*digits"),
        (dict(schedule="cosine"), "unknown schedule 'cosine'; valid forms: constant"),
        (dict(schedule="step:100,60"), "increasing positive epochs"),
        (dict(schedule="exp:1.5"), r"exp gamma must be in \(0, 1\]"),
        (dict(optimizer="adam"), "unknown optimizer 'adam'; valid optimizers: sgd, psgd"),
        (dict(steps=10), "exactly one of epochs or steps"),
        (dict(epochs=0), "epochs must be a positive integer"),
        (dict(lr=-1.0), "lr must be positive"),
        (dict(lr=math.nan), "lr must be finite"),
        (dict(momentum=1.0), r"momentum must be in \[0, 1\)"),
        (dict(batch_size="half"), "batch_size must be a positive integer or 'full'"),
        (dict(placement="after"), "unknown placement 'after'; valid placements: pre_activation"),
    ],
)
def test_static_validation_names_the_problem(changes, message):
    if "model" in changes:
        if not _models_available():
            pytest.skip("bnlab.models not available yet")
    with pytest.raises(ValueError, match=message):
        validate_static(_cfg(**changes))


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ValueError, match="unknown config key.*lrr.*valid keys: model, norm"):
        TrainConfig.from_dict({"lrr": 0.1})


def test_batch_size_larger_than_data_fails_before_training(tmp_path):
    with pytest.raises(ValueError, match="batch_size 5000 is larger than the training "
                                         "set of 'digits'"):
        run(dict(model="mlp", data="digits", epochs=1, batch_size=5000, runs_dir=str(tmp_path)))
    # validation happens before the store is even created
    assert not (tmp_path / "bnlab.db").exists()


def test_schedules():
    step = parse_schedule("step:60,100")
    assert [step(0, e) for e in (0, 59, 60, 99, 100, 119)] == pytest.approx(
        [1, 1, 0.1, 0.1, 0.01, 0.01])
    assert parse_schedule("step:2:0.5")(0, 3) == 0.5
    exp = parse_schedule("exp:0.9999")
    assert exp(0, 0) == 1.0 and exp(10_000, 7) == pytest.approx(0.9999**10_000)
    assert parse_schedule("constant")(123, 45) == 1.0


def test_run_identity_ignores_only_cosmetic_keys():
    a = _cfg(runs_dir="a", checkpoint_every=5, data_dir="/x")
    b = _cfg(runs_dir="b", checkpoint_every=7)
    assert a.run_id() == b.run_id()
    assert _cfg(lr=0.2).run_id() != _cfg(lr=0.1).run_id()
    assert _cfg(seed=1).run_id() != _cfg(seed=0).run_id()
    assert COSMETIC_KEYS <= set(TrainConfig(steps=1).to_dict())


@needs_models
def test_cli_config_errors_are_clean(tmp_path):
    result = runner.invoke(app, ["train", "--model", "nope", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "unknown model 'nope'" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["train", "--norm", "cbn(rho=", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2 and "bad norm spec" in result.output
    result = runner.invoke(app, ["train", "--batch-size", "99999", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2 and "larger than the training set" in result.output


@needs_models
def test_cli_flags_override_config_file(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(dict(model="mlp", data="digits", epochs=3, lr=0.5, batch_size=256, seed=3,
                            model_options={"width": 16, "depth": 2}))
    )
    result = runner.invoke(
        app,
        ["train", "--config", str(config), "--lr", "0.05", "--steps", "2", "--runs-dir",
         str(tmp_path), "--json"],
    )
    assert result.exit_code == 0, result.output
    import json

    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["config"]["lr"] == 0.05  # flag beats file
    # file beats default
    assert record["config"]["seed"] == 3 and record["config"]["batch_size"] == 256
    assert record["config"]["steps"] == 2 and record["config"]["epochs"] is None
    assert record["steps"] == 2 and record["status"] == "finished"
