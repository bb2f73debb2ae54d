"""The catalogue machinery: sweeps that survive divergence, the report from the store, Ray
sweeps."""

from __future__ import annotations

import importlib.util
import json
import signal

import pytest
from typer.testing import CliRunner

import bnlab.experiments as E
from bnlab.experiments import runner
from bnlab.experiments.base import CATALOGUE, Experiment, Outcome, Plan, RunSpec, register

BASE = dict(model="mlp", model_options={"depth": 2, "width": 16}, data="digits", steps=12,
            batch_size=64, seed=0)
# a linear net without normalization at lr=1e3 overflows within a dozen steps
WILD = {**BASE, "norm": "none", "lr": 1e3, "activation": "identity"}


def _analyze(ctx) -> Outcome:
    statuses = {r.label: r.status for r in ctx.runs}
    losses = {r.label: r.series("train_loss")[1] for r in ctx.runs}
    from bnlab.plots import panels

    fig = panels(ctx.figure_path("loss"),
                 [{"series": {k: (list(range(len(v))), v) for k, v in losses.items()}}])
    held = statuses.get("calm") == "finished"
    return Outcome([fig], [{"quantity": k, "ours": v, "paper": "-"} for k, v in statuses.items()],
                   "held" if held else "not held",
                   f"statuses {statuses}; computed {ctx.data.get('square')}")


@pytest.fixture
def toy_entry():
    exp = Experiment(
        id="test-toy", paper="santurkar", target="Fig. 0", title="toy", claim="calm runs finish",
        smoke_changes="tiny", cost={"smoke": "seconds"},
        plan=lambda preset: Plan(
            runs=[RunSpec("calm", {**BASE, "norm": "bn", "lr": 0.1}),
                  RunSpec("wild", WILD),
                  RunSpec("broken", {**BASE, "norm": "bn", "lr": 0.1, "model": "mlp",
                                     "model_options": {"depth": 2, "width": 16,
                                                       "no_such_option": 1}})],
            compute={"square": lambda: {"x": [1, 2, 3], "y": [1, 4, 9]}}),
        analyze=_analyze)
    register(exp)
    yield exp
    CATALOGUE.remove(exp.id)


def test_sweep_with_diverging_and_failing_runs_records_all(toy_entry, tmp_path):
    from bnlab.report import write_report

    outcome = runner.reproduce("test-toy", "smoke", runs_dir=tmp_path, progress=False)
    write_report(tmp_path)
    statuses = {row["quantity"]: row["ours"] for row in outcome.table}
    assert statuses == {"calm": "finished", "wild": "diverged", "broken": "failed"}
    assert outcome.verdict == "held"
    assert outcome.figures[0].stat().st_size > 1000
    html = (tmp_path / "report" / "index.html").read_text()
    assert "test-toy" in html and "Verdict: held" in html
    md = (tmp_path / "report" / "index.md").read_text()
    assert "figures/test-toy/smoke/loss.png" in md
    # re-running skips the finished runs: no run is trained again
    calls = []
    import bnlab.train

    original = bnlab.train.run
    try:
        bnlab.train.run = lambda config, **kw: calls.append(config) or original(config, **kw)
        runner.reproduce("test-toy", "smoke", runs_dir=tmp_path, progress=False)
    finally:
        bnlab.train.run = original
    from bnlab.store import Store

    with Store(tmp_path / "bnlab.db") as store:
        ids = [r["id"] for r in store.list_runs()]
    assert len(ids) == len(set(ids))


def test_report_renders_from_store_without_training(toy_entry, tmp_path, monkeypatch):
    runner.reproduce("test-toy", "smoke", runs_dir=tmp_path, progress=False, report=False)
    import bnlab.train

    def no_training(*args, **kwargs):
        raise AssertionError("the report must not train")

    monkeypatch.setattr(bnlab.train, "run", no_training)
    (tmp_path / "report").exists() and __import__("shutil").rmtree(tmp_path / "report")
    result = CliRunner().invoke(__import__("bnlab.cli", fromlist=["app"]).app,
                                ["report", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    html = (tmp_path / "report" / "index.html").read_text()
    assert "computed {&#x27;x&#x27;: [1, 2, 3]" in html or "computed {'x': [1, 2, 3]" in html
    assert (tmp_path / "report" / "figures" / "test-toy" / "smoke" / "loss.png").exists()


def test_unknown_ids_and_presets_are_clear_errors():
    with pytest.raises(ValueError, match="valid ids"):
        E.get("santurkar-fig999")
    with pytest.raises(ValueError, match="valid presets: smoke, paper"):
        E.check_preset("huge")
    from bnlab.cli import app

    result = CliRunner().invoke(app, ["reproduce", "nope-fig1"])
    assert result.exit_code == 2 and "valid ids" in result.output


def test_catalogue_lists_every_paper_with_claims():
    result = CliRunner().invoke(__import__("bnlab.cli", fromlist=["app"]).app,
                                ["experiments", "list", "--json"])
    assert result.exit_code == 0
    entries = json.loads(result.output)
    assert {"santurkar-fig2"} <= {e["id"] for e in entries}
    for e in entries:
        assert e["claim"] and e["smoke_changes"] and "smoke" in e["cost"]
        assert e["id"].startswith(e["paper"])


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray not installed")
def test_ray_sweep_on_a_local_instance(tmp_path):
    import ray

    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:  # a sandbox without shared memory or sockets cannot host Ray at all: that is not our bug
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        ray.shutdown()
    except Exception as err:
        pytest.skip(f"a local Ray instance could not start here: {err}")
    finally:  # Ray leaves its SIGTERM handler (sys.exit) behind: later tests would inherit it
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    configs = [{**BASE, "norm": "bn", "lr": 0.1, "runs_dir": str(tmp_path)},
               {**WILD, "runs_dir": str(tmp_path)}]
    records = runner.run_sweep(configs, ray_address="local", progress=False)
    assert [r["status"] for r in records] == ["finished", "diverged"]
    # the sweep started Ray and gave back the signal handlers it found (a run trained in this
    # process afterwards defers SIGTERM again)
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    from bnlab.store import Store

    with Store(tmp_path / "bnlab.db") as store:  # both Ray tasks wrote into the same store
        assert {r["status"] for r in store.list_runs()} == {"finished", "diverged"}


def test_demo_covers_all_five_papers_with_catalogue_entries():
    from bnlab.cli.demo import DEMO_ENTRIES
    from bnlab.experiments.base import PAPERS

    catalogue = E.load_catalogue()
    assert set(DEMO_ENTRIES) <= set(catalogue)
    assert {catalogue[i].paper for i in DEMO_ENTRIES} == set(PAPERS)
