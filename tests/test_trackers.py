"""The TensorBoard and MLflow loggers, read back with the real libraries: every value the run store
holds (scalars and probes, at their steps), the config and the final status."""

from __future__ import annotations

import math

import pytest

from bnlab.store import Store
from bnlab.train import run
from bnlab.train.trackers import MLflowLogger, TensorBoardLogger, mlflow_key, parse_log_to

CONFIG = dict(model="mlp", data="digits", steps=6, lr=0.05, batch_size=256, seed=1, log_every=1,
              model_options={"width": 16}, probes=["grad_stats(every=2)"])


def _stored(runs_dir, run_id) -> dict[str, list[tuple[int, float]]]:
    with Store(runs_dir / "bnlab.db") as store:
        return store.metrics(run_id)


def _same(points_a, points_b) -> bool:
    return len(points_a) == len(points_b) and all(
        sa == sb and (math.isclose(va, vb, rel_tol=1e-6, abs_tol=1e-9)
                      or (math.isnan(va) and math.isnan(vb)))
        for (sa, va), (sb, vb) in zip(points_a, points_b)
    )


def test_tensorboard_logger_mirrors_scalars_probes_config_and_status(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    record = run(dict(CONFIG, runs_dir=str(tmp_path)),
                 callbacks=[TensorBoardLogger(tmp_path / "tb")], progress=False)
    plain = run(dict(CONFIG, runs_dir=str(tmp_path / "plain")), progress=False)
    assert plain.id == record.id  # a logger never changes the run's identity
    acc = EventAccumulator(str(tmp_path / "tb" / record.id),
                           size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    stored = _stored(tmp_path, record.id)
    assert any(name.startswith("probe/grad_stats/") for name in stored)
    assert set(acc.Tags()["scalars"]) == set(stored)
    for name, points in stored.items():
        logged = [(e.step, e.value) for e in acc.Scalars(name)]
        assert _same(logged, points), name
    texts = {tag: acc.Tensors(tag) for tag in acc.Tags()["tensors"]}
    config_text = texts["config/text_summary"][0].tensor_proto.string_val[0].decode()
    assert '"lr": 0.05' in config_text and '"width": 16' in config_text
    assert texts["status/text_summary"][-1].tensor_proto.string_val[0].decode() == "finished"


def test_mlflow_logger_mirrors_metrics_params_and_status_in_a_file_store(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").resolve().as_uri()
    record = run(dict(CONFIG, runs_dir=str(tmp_path)),
                 callbacks=[MLflowLogger(uri)], progress=False)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("bnlab")
    (found,) = client.search_runs([experiment.experiment_id],
                                  f"tags.`bnlab.run_id` = '{record.id}'")
    assert found.info.status == "FINISHED" and found.data.tags["bnlab.status"] == "finished"
    assert found.data.params["lr"] == "0.05" and found.data.params["model_options.width"] == "16"
    assert found.data.params["norm"] == "bn"
    stored = _stored(tmp_path, record.id)
    assert set(found.data.metrics) == {mlflow_key(n) for n in stored}
    for name, points in stored.items():
        history = sorted((m.step, m.value)
                         for m in client.get_metric_history(found.info.run_id, mlflow_key(name)))
        assert _same(history, points), name


def test_log_to_specs_and_missing_packages_are_clear_errors(tmp_path, monkeypatch):
    import builtins

    with pytest.raises(ValueError, match="unknown tracker 'wandb'; valid forms: tensorboard:DIR "
                                         "\\| mlflow:URI"):
        parse_log_to("wandb:project")
    with pytest.raises(ValueError, match="bad tracker 'tensorboard'; expected tensorboard:DIR"):
        parse_log_to("tensorboard")
    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name == "tensorboard" or name.startswith("tensorboard."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    monkeypatch.delitem(__import__("sys").modules, "tensorboard", raising=False)
    with pytest.raises(ValueError, match=r"needs the 'tensorboard' package.*pip install "
                                         r"'bnlab\[track\]'"):
        parse_log_to(f"tensorboard:{tmp_path}")


def test_log_to_flag_of_bnlab_train(tmp_path):
    pytest.importorskip("tensorboard")
    from typer.testing import CliRunner

    from bnlab.cli import app

    result = CliRunner().invoke(
        app, ["train", "--model", "mlp", "--data", "digits", "--steps", "2", "--batch-size", "256",
              "--runs-dir", str(tmp_path), "--log-to", f"tensorboard:{tmp_path / 'tb'}", "--json"])
    assert result.exit_code == 0, result.output
    assert list((tmp_path / "tb").glob("*/events.out.tfevents.*"))
    bad = CliRunner().invoke(
        app, ["train", "--steps", "2", "--runs-dir", str(tmp_path), "--log-to", "neptune:x"])
    assert bad.exit_code == 2 and "unknown tracker 'neptune'" in bad.output


def test_mlflow_run_of_a_failed_then_resumed_bnlab_run_is_one_run(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from bnlab.train.callbacks import Callback

    class FailOnce(Callback):
        fired = False

        def on_train_batch_end(self, loop):
            step = loop.step
            if step == 5 and not FailOnce.fired:
                FailOnce.fired = True
                raise RuntimeError("crash")

    uri = (tmp_path / "mlruns").resolve().as_uri()
    config = dict(CONFIG, probes=[], checkpoint_every=2, runs_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="crash"):
        run(config, callbacks=[MLflowLogger(uri), FailOnce()], progress=False)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("bnlab")
    (failed,) = client.search_runs([experiment.experiment_id])
    assert failed.info.status == "FAILED" and failed.data.tags["bnlab.status"] == "failed"
    record = run(config, callbacks=[MLflowLogger(uri), FailOnce()], progress=False)
    assert record.status == "finished" and record.resumed_from == 4
    (resumed,) = client.search_runs([experiment.experiment_id])  # the same MLflow run, continued
    assert resumed.info.run_id == failed.info.run_id and resumed.info.status == "FINISHED"
    steps = {m.step for m in client.get_metric_history(resumed.info.run_id, "train_loss")}
    assert steps == {s for s, _ in _stored(tmp_path, record.id)["train_loss"]}
