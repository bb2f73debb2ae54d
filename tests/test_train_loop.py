"""The training loop end to end: accuracy on digits, the DLN, divergence, resume after SIGKILL,
callbacks, the run store and the `bnlab train` / `bnlab runs` commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from bnlab.callbacks import Callback
from bnlab.cli import app
from bnlab.store import Store
from bnlab.train import load_model, run
from bnlab.store.run_files import checkpoint_path

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _models_available() -> bool:
    from bnlab import models

    return hasattr(models, "MODELS") and {"mlp", "dln"} <= set(models.MODELS)


needs_models = pytest.mark.skipif(not _models_available(), reason="bnlab.models not available yet")



# -- a small local model with every kind of state a checkpoint must carry -------------------------


def noisy_model(shape, classes):
    """Conv + noisy BN (layer generator) + dropout (global RNG) + BN running stats."""
    from bnlab import norms

    return nn.Sequential(
        nn.Conv2d(shape[0], 8, 3, padding=1, bias=False),
        norms.create("noisy_bn", 8),
        nn.ReLU(),
        nn.Flatten(),
        nn.Dropout(0.1),
        nn.Linear(8 * shape[1] * shape[2], 16, bias=False),
        nn.BatchNorm1d(16),
        nn.ReLU(),
        nn.Linear(16, classes),
    )


RESUME_CONFIG = dict(
    model="test_noisy_cnn", data="digits", steps=30, lr=0.05, momentum=0.9, weight_decay=5e-4,
    batch_size=100, schedule="step:1", augment=True, seed=7, checkpoint_every=8, log_every=1,
)


class KillAt(Callback):
    """Test-only: SIGKILL this very process after a given step (a crash, not an exception)."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, loop):
        if loop.step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def test_resume_after_sigkill_equals_uninterrupted_bitwise(tmp_path):
    killed_dir, clean_dir = tmp_path / "killed", tmp_path / "clean"
    script = textwrap.dedent(
        f"""
        import torch
        torch.set_num_threads(1)
        from bnlab.train import run
        from tests.test_train_loop import KillAt, noisy_model, RESUME_CONFIG
        run(dict(RESUME_CONFIG, runs_dir={str(killed_dir)!r}), model_factory=noisy_model,
            callbacks=[KillAt(21)], progress=False)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    with Store(killed_dir / "bnlab.db") as store:
        (row,) = store.list_runs()
        assert row["status"] == "running"  # nobody got to mark it: it was killed

    # 30 steps of 100 on 1438 samples: step 21 is mid-epoch 2; the last checkpoint was step 16
    resumed = run(dict(RESUME_CONFIG, runs_dir=str(killed_dir)),
                  model_factory=noisy_model, progress=False)
    assert resumed.resumed_from == 16 and resumed.status == "finished" and resumed.steps == 30
    clean = run(dict(RESUME_CONFIG, runs_dir=str(clean_dir)),
                model_factory=noisy_model, progress=False)
    assert clean.id == resumed.id and clean.resumed_from is None

    a = torch.load(checkpoint_path(killed_dir, resumed.id), weights_only=True)
    b = torch.load(checkpoint_path(clean_dir, clean.id), weights_only=True)
    for key in b["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for key in ("torch_rng", "data_generator"):
        assert torch.equal(a[key], b[key]), key
    assert all(torch.equal(a["noise_generators"][k], b["noise_generators"][k])
               for k in b["noise_generators"])
    assert resumed.metrics == clean.metrics
    with Store(killed_dir / "bnlab.db") as s1, Store(clean_dir / "bnlab.db") as s2:
        m1, m2 = s1.metrics(resumed.id), s2.metrics(clean.id)
    assert m1 == m2  # the replayed steps were logged once, identically
    assert [s for s, _ in m1["train_loss"]] == list(range(1, 31))


def test_finished_run_is_returned_without_retraining_and_failed_run_resumes(tmp_path):
    calls = []

    class Boom(Callback):
        def on_train_batch_end(self, loop):
            calls.append(loop.step)
            if loop.step == 5 and len(calls) == 5:
                raise RuntimeError("boom")

    cfg = dict(RESUME_CONFIG, steps=8, checkpoint_every=4, runs_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="boom"):
        run(cfg, model_factory=noisy_model, callbacks=[Boom()], progress=False)
    with Store(tmp_path / "bnlab.db") as store:
        (row,) = store.list_runs()
        assert row["status"] == "failed" and "boom" in row["error"] and row["steps"] == 5
    record = run(cfg, model_factory=noisy_model, callbacks=[Boom()], progress=False)
    assert record.status == "finished" and record.resumed_from == 4
    assert calls == [1, 2, 3, 4, 5, 5, 6, 7, 8]
    again = run(cfg, model_factory=noisy_model, callbacks=[Boom()], progress=False)
    assert again.status == "finished" and again.metrics == record.metrics
    assert calls[-1] == 8 and len(calls) == 9  # not retrained


def test_callbacks_see_gradients_and_log_into_the_store(tmp_path):
    class Probe(Callback):
        def __init__(self):
            self.hooks = []

        def on_train_start(self, loop):
            self.hooks.append(("start", loop.step))

        def on_before_optimizer_step(self, loop):
            grads = [p.grad for p in loop.model.parameters()]
            assert all(g is not None for g in grads)
            loop.log("grad_norm", torch.sqrt(sum((g**2).sum() for g in grads)))
            loop.log("batch_loss_again", loop.loss_fn(loop.model(loop.batch[0]), loop.batch[1]))

        def on_train_end(self, loop, status):
            self.hooks.append(("end", loop.step))

    probe = Probe()
    record = run(dict(RESUME_CONFIG, steps=3, runs_dir=str(tmp_path)), model_factory=noisy_model,
                 callbacks=[probe], progress=False)
    assert probe.hooks == [("start", 0), ("end", 3)]
    with Store(tmp_path / "bnlab.db") as store:
        m = store.metrics(record.id)
    assert [s for s, _ in m["grad_norm"]] == [1, 2, 3] and all(v > 0 for _, v in m["grad_norm"])
    assert {"train_loss", "train_accuracy", "test_loss", "test_accuracy",
            "epoch_train_loss"} <= set(m)


def test_checkpoint_is_weights_only_and_load_model_restores_weights(tmp_path):
    record = run(dict(RESUME_CONFIG, steps=2, runs_dir=str(tmp_path)),
                 model_factory=noisy_model, progress=False)
    state = torch.load(record.checkpoint, weights_only=True)
    assert state["step"] == 2 and state["run_id"] == record.id
    model = load_model(record.id, tmp_path, model_factory=noisy_model)
    assert all(torch.equal(v, state["model"][k]) for k, v in model.state_dict().items())


# -- the papers' settings with the real models -----------------------------------------------------


@needs_models
def test_mlp_bn_on_digits_reaches_90_percent(tmp_path):
    record = run(dict(model="mlp", norm="bn", data="digits", epochs=3, lr=0.1, batch_size=64,
                      runs_dir=str(tmp_path)), progress=False)
    assert record.status == "finished"
    # 359 test images: 90% leaves ~7 standard errors of margin below the ~97% this reaches
    assert record.metrics["test_accuracy"] >= 0.90
    # the weights feeding BN, and (ReLU) the first BN's (γ, β) as one vector; not the last BN's
    assert set(record.scale_invariant) == {"layers.0.0.weight", "layers.1.0.weight",
                                           "layers.0.1.weight", "layers.0.1.bias"}


@needs_models
@pytest.mark.parametrize("norm, lr", [("bn", 0.05), ("none", 5e-3)])
def test_dln_full_batch_gd_decreases_loss(tmp_path, norm, lr):
    """Santurkar App. A: 25-layer DLN, full-batch GD on y = Ax (here 60 steps, d=10, n=1000)."""
    record = run(dict(model="dln", norm=norm, data="gaussian_regression", steps=60, lr=lr,
                      batch_size="full", runs_dir=str(tmp_path)), progress=False)
    assert record.status == "finished"
    with Store(tmp_path / "bnlab.db") as store:
        losses = [v for _, v in store.metrics(record.id, "train_loss")["train_loss"]]
    assert len(losses) == 60
    assert losses[-1] < 0.9 * losses[0], (losses[0], losses[-1])


@needs_models
def test_large_lr_without_normalization_diverges_cleanly_via_cli(tmp_path):
    result = runner.invoke(
        app, ["train", "--model", "mlp", "--norm", "none", "--data", "digits", "--steps", "50",
              "--lr", "1e3", "--batch-size", "64", "--runs-dir", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["status"] == "diverged"
    # found at the next check (every 50 steps by default: no host sync per step), stopped there
    assert 1 <= record["metrics"]["diverged_step"] <= record["steps"] <= 50
    assert {"train_loss", "test_loss", "test_accuracy"} <= set(record["metrics"])


@needs_models
def test_lr_sweep_completes_and_reports_divergence(tmp_path):
    statuses = {}
    for lr in (1e-2, 1e-1, 1.0, 1e1, 1e2):
        r = run(dict(model="mlp", norm="none", data="digits", steps=20, lr=lr, batch_size=128,
                     runs_dir=str(tmp_path)), progress=False)
        statuses[lr] = r.status
        assert (r.status == "diverged") == ("diverged_step" in r.metrics)
    # (lr 10 sends the loss to ~1e21 and back: above divergence_factor x the first loss, diverged)
    assert statuses[1e-2] == "finished" and statuses[1e1] == "diverged" \
        and statuses[1e2] == "diverged", statuses
    with Store(tmp_path / "bnlab.db") as store:
        assert sorted(r["status"] for r in store.list_runs()) == sorted(statuses.values())


@needs_models
def test_runs_list_show_export(tmp_path):
    record = run(dict(model="mlp", data="digits", steps=3, runs_dir=str(tmp_path)), progress=False)
    result = runner.invoke(app, ["runs", "list", "--runs-dir", str(tmp_path), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)[0]["id"] == record.id
    result = runner.invoke(
        app, ["runs", "show", record.id[:6], "--runs-dir", str(tmp_path), "--json"])
    shown = json.loads(result.stdout)
    assert shown["status"] == "finished" and shown["env"]["torch"] == torch.__version__
    # what moves float32 results between machines is recorded with every run
    assert shown["env"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert shown["env"]["cpu_model"]
    assert shown["series"]["train_loss"]["points"] == 3
    result = runner.invoke(
        app, ["runs", "export", record.id, "--format", "csv", "--runs-dir", str(tmp_path)])
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "run_id,step,name,value" \
        and any(",3,test_accuracy," in line for line in lines)
    result = runner.invoke(app, ["runs", "show", "zzzz", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2 and "no run 'zzzz'" in result.output


@needs_models
def test_probe_flag(tmp_path):
    probes = pytest.importorskip("bnlab.probes")
    if not hasattr(probes, "create"):
        pytest.skip("bnlab.probes.create not available yet")
    names = sorted(getattr(probes, "PROBES", {}) or [])
    if not names:
        pytest.skip("bnlab.probes lists no probes")
    name = "grad_stats" if "grad_stats" in names else names[0]
    result = runner.invoke(
        app, ["train", "--model", "mlp", "--data", "digits", "--steps", "4", "--probe", name,
              "--probe-every", "2", "--runs-dir", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout.strip().splitlines()[-1])
    with Store(tmp_path / "bnlab.db") as store:
        names_logged = set(store.metrics(record["id"]))
    probe_rows = names_logged - {"train_loss", "train_accuracy", "test_loss", "test_accuracy",
                                 "epoch_train_loss", "epoch_train_accuracy", "lr"}
    assert probe_rows, "the probe logged nothing"
    with Store(tmp_path / "bnlab.db") as store:
        steps = {s for rows in store.metrics(record["id"], sorted(probe_rows)).values()
                 for s, _ in rows}
    assert steps == {2, 4}  # --probe-every 2 over 4 steps


@needs_models
def test_cli_failed_run_prints_stored_record_and_exits_1(tmp_path, monkeypatch):
    from bnlab.train import loop

    def broken_evaluate(self):
        raise RuntimeError("evaluation exploded")

    monkeypatch.setattr(loop._Trainer, "evaluate", broken_evaluate)
    result = runner.invoke(app, ["train", "--model", "mlp", "--data", "digits", "--steps", "2",
                                 "--runs-dir", str(tmp_path), "--json"])
    assert result.exit_code == 1
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["status"] == "failed" and "evaluation exploded" in record["error"] \
        and record["steps"] == 2


# -- clean edges -----------------------------------------------------------------------------------


@needs_models
def test_ctrl_c_stores_interrupted_and_says_how_to_resume(tmp_path):
    """A real SIGINT to a `bnlab train` process once its first checkpoint exists."""
    import time

    args = [sys.executable, "-m", "bnlab.cli", "train", "--model", "mlp", "--data",
            "digits", "--steps", "20000", "--batch-size", "64", "--checkpoint-every", "5",
            "--runs-dir", str(tmp_path)]
    def deliverable_sigint():  # a mask or SIG_IGN left by another test in this worker is inherited
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            preexec_fn=deliverable_sigint)
    deadline = time.monotonic() + 300  # generous: CI shares 2 cores between pytest workers
    while not list((tmp_path / "checkpoints").glob("*.pt")) and time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    assert list((tmp_path / "checkpoints").glob("*.pt")), proc.communicate(timeout=60)[1][-2000:]
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(
            f"no exit 240 s after SIGINT: {proc.communicate()[1][-2000:]}") from None
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    with Store(tmp_path / "bnlab.db") as store:
        (row,) = store.list_runs()
    assert row["status"] == "interrupted" and 5 <= row["steps"] < 20000
    assert f"interrupted at step {row['steps']} — re-run the same command to resume" in err


def test_invalid_scale_invariant_override_leaves_no_record(tmp_path):
    with pytest.raises(ValueError, match="nomatch"):
        run(dict(RESUME_CONFIG, steps=2, scale_invariant=["nomatch"], runs_dir=str(tmp_path)),
            model_factory=noisy_model, progress=False)
    assert not (tmp_path / "bnlab.db").exists()
    result = runner.invoke(app, ["train", "--model", "mlp", "--data", "digits", "--steps", "2",
                                 "--scale-invariant", "nomatch", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2 and "nomatch" in result.output
    assert not (tmp_path / "bnlab.db").exists()


def test_load_model_of_a_model_factory_run_says_how(tmp_path):
    record = run(dict(RESUME_CONFIG, steps=2, runs_dir=str(tmp_path)),
                 model_factory=noisy_model, progress=False)
    with pytest.raises(ValueError, match="model_factory=your_factory"):
        load_model(record.id, tmp_path)


def test_report_on_a_missing_runs_dir_fails_clearly(tmp_path):
    missing = tmp_path / "nothing"
    result = runner.invoke(app, ["report", "--runs-dir", str(missing)])
    assert result.exit_code == 2 and "no run store" in result.output
    assert not missing.exists()


def test_compile_trains_like_eager(tmp_path, monkeypatch):
    # aot_eager traces forward and backward as inductor does, without its C++ build (suite time)
    compiled_modules = []
    original = torch.compile

    def compile_aot_eager(module, **kwargs):
        compiled_modules.append(module)
        return original(module, backend="aot_eager")

    monkeypatch.setattr(torch, "compile", compile_aot_eager)
    def small(shape, classes):  # plain layers: dynamo traces them in a second
        return nn.Sequential(nn.Flatten(), nn.Linear(shape[0] * shape[1] * shape[2], 16), nn.ReLU(),
                             nn.Linear(16, classes))

    base = dict(model="small", data="digits", steps=3, lr=0.05, batch_size=64,
                runs_dir=str(tmp_path))
    eager = run(base, model_factory=small, progress=False)
    assert compiled_modules == []
    compiled = run(dict(base, compile=True), model_factory=small, progress=False)
    assert len(compiled_modules) == 1 and compiled.id != eager.id and compiled.status == "finished"
    assert compiled.metrics["train_loss"] == pytest.approx(eager.metrics["train_loss"], rel=1e-4)


def test_progress_lines_show_the_last_steps_loss_not_nan(tmp_path, capsys):
    """The engine reads losses only at checks; a progress line must not show a never-read loss."""
    record = run(dict(model="mlp", norm="bn", data="digits", steps=7, lr=0.1, batch_size=64,
                      runs_dir=str(tmp_path)), progress="lines")
    assert record.status == "finished"
    err = capsys.readouterr().err
    line = [ln for ln in err.splitlines() if " step 7/7 " in ln]
    assert line, err
    assert "loss nan" not in line[-1]
    shown = float(line[-1].split(" loss ")[1].split()[0])
    with Store(tmp_path / "bnlab.db") as store:
        last = store.metrics(record.id, "train_loss")["train_loss"][-1]
    assert last[0] == 7 and abs(shown - last[1]) <= 1e-3 * abs(last[1])


@pytest.mark.parametrize("norm", ["mbn", "cbn(rho=2, amat=true)"])
def test_engine_never_triggers_the_missing_progress_warning(tmp_path, norm):
    """bnlab.train tells the layers lr and epoch itself, also before the scale-invariance
    detection's training-mode forward passes: a user must not see the 'training without
    set_progress' warning."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        record = run(dict(model="mlp", norm=norm, data="digits", steps=3, lr=0.1, batch_size=64,
                          runs_dir=str(tmp_path)), progress=False)
    assert record.status == "finished"


def test_ctrl_c_inside_a_store_write_loses_no_rows(tmp_path, monkeypatch):
    """SIGINT while the engine writes rows to the store: the write completes, the run stops at the
    step boundary as ``interrupted`` with every row up to it stored, and a re-run resumes."""
    from bnlab.train import RunInterrupted

    original = Store.log_rows
    fired = []

    def log_rows_hit_by_ctrl_c(self, run_id, rows):
        rows = list(rows)
        if not fired and any(step >= 4 for step, _, _ in rows):
            fired.append(True)
            signal.raise_signal(signal.SIGINT)  # lands inside the write
        return original(self, run_id, rows)

    monkeypatch.setattr(Store, "log_rows", log_rows_hit_by_ctrl_c)
    # Python's, as in a fresh process
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    cfg = dict(model="mlp", norm="bn", data="digits", steps=40, lr=0.1, batch_size=64, log_every=2,
               checkpoint_every=2, runs_dir=str(tmp_path))
    with pytest.raises(RunInterrupted) as caught:
        run(cfg, progress=False)
    stopped = caught.value.step
    signal.signal(signal.SIGINT, previous)
    monkeypatch.setattr(Store, "log_rows", original)
    with Store(tmp_path / "bnlab.db") as store:
        (row,) = store.list_runs()
        steps = [s for s, _ in store.metrics(row["id"], "train_loss")["train_loss"]]
    assert fired and row["status"] == "interrupted" and row["steps"] == stopped < 40
    assert steps == [1] + list(range(2, stopped + 1, 2)), steps  # nothing lost, nothing twice
    record = run(cfg, progress=False)
    assert record.status == "finished" and record.metrics["test_accuracy"] > 0.5


def test_compiled_steps_key_runs_the_layers_compiled_steps(tmp_path):
    """``compiled_steps: true`` (``bnlab train --compiled-steps``) runs the norm layers' training
    steps as compiled functions for the run, and only for it; the run is the eager one up to
    float32 rounding, under the same id (a process setting's key, as the thread count)."""
    from bnlab.norms.engine import compiled_step, switches

    base = dict(model="mlp", norm="mean_only_bn", data="digits", steps=3, lr=0.05, batch_size=64,
                runs_dir=str(tmp_path / "eager"))
    before = compiled_step.CALLS["forward"]
    eager = run(base, progress=False)
    assert compiled_step.CALLS["forward"] == before
    compiled = run(dict(base, compiled_steps=True, runs_dir=str(tmp_path / "steps")),
                   progress=False)
    assert compiled_step.CALLS["forward"] > before
    assert not switches.compiled_steps_enabled()
    assert compiled.id == eager.id and compiled.status == "finished"
    assert compiled.metrics["train_loss"] == pytest.approx(eager.metrics["train_loss"], rel=1e-4)
    with pytest.raises(ValueError, match="compiled_steps must be true or false"):
        run(dict(base, compiled_steps="yes"), progress=False)
