"""Verdicts as data: :class:`Verdict` against scipy's Welch interval, the store's outcome column
(schema 2, migrated from a version-1 store), and an entry's outcome analysed once — stored by
``reproduce``, then read by the report and ``bnlab experiments show --json`` without analysing the
entry again, and analysed again once its stored results change."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
from pathlib import Path

import pytest
import torch
from scipy import stats
from typer.testing import CliRunner

from bnlab.cli import app
from bnlab.experiments import base, runner
from bnlab.experiments.verdicts import compare_arms
from bnlab.experiments.verdict_data import VERDICT_SCHEMA, Verdict
from bnlab.experiments.verdicts import Design, judge
from bnlab.report import write_report
from bnlab.store import SCHEMA_VERSION, Store

ENTRY = "arora-rates"  # computations only: seconds at the tiny preset


def _arms(seed: int):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(5, generator=g, dtype=torch.float64)).tolist()
    b = (torch.randn(6, generator=g, dtype=torch.float64) + 1.5).tolist()
    return a, b


def _build_readme():
    path = Path(__file__).resolve().parents[1] / "docs" / "build_readme.py"
    spec = importlib.util.spec_from_file_location("build_readme", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_comparisons_interval_is_welchs():
    a, b = _arms(0)
    record = Verdict.from_comparison("held", "b − a", compare_arms(a, b), paper=1.0)
    ref = stats.ttest_ind(b, a, equal_var=False)
    lo, hi = ref.confidence_interval(0.95)
    assert record.interval == pytest.approx((lo, hi), rel=1e-10)
    assert record.p == pytest.approx(ref.pvalue, rel=1e-10) and record.seeds == (5, 6)
    assert Verdict.from_dict(json.loads(json.dumps(record.to_dict()))) == record


def test_a_judgement_record_holds_the_primary_and_refuses_another_schema():
    a, b = _arms(1)
    design = Design("b − a", paper_effect=1.0, design_sd=1.0, n_seeds=5, source="test")
    judged = judge(a, b, design)
    record = Verdict.from_judgement(judged.verdict, judged, design, rule="r", scale=100,
                                    unit=" pt")
    assert record.effect == pytest.approx(100 * (sum(b) / 6 - sum(a) / 5))
    assert record.interval == pytest.approx(tuple(100 * x for x in judged.ci))
    assert record.resolvable == pytest.approx(100 * judged.mde) and record.paper == 100
    with pytest.raises(ValueError, match="schema"):
        Verdict.from_dict({**record.to_dict(), "schema": VERDICT_SCHEMA + 1})


def test_a_version_1_store_gains_the_outcome_column(tmp_path):
    path = tmp_path / "bnlab.db"
    with Store(path) as store:
        store.save_entry("e", "smoke", [], {"x": 1}, tiny=True, seconds=0.0)
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE experiments DROP COLUMN outcome")
    conn.execute("PRAGMA user_version=1")
    conn.commit()
    conn.close()
    with Store(path, readonly=True) as store:  # read as it is
        assert store.load_entry("e", "smoke")["outcome"] is None
    with Store(path) as store:  # migrated on a writable open
        assert store.save_outcome("e", "smoke", {"verdict": "v"})
        assert store.load_entry("e", "smoke")["outcome"] == {"verdict": "v"}
        store.save_entry("e", "smoke", [], {"x": 2}, tiny=True, seconds=0.0)
        assert store.load_entry("e", "smoke")["outcome"] is None  # a new save clears it
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_an_entry_is_analysed_once_and_read_back(tmp_path, monkeypatch):
    exp = base.get(ENTRY)
    outcome = runner.reproduce(ENTRY, runs_dir=tmp_path, tiny=True, workers=1)
    with runner.analysis_context(ENTRY, "smoke", runs_dir=tmp_path) as ctx:
        fresh = exp.outcome(ctx)  # the entry analysed directly: what the stored one must say
    assert (outcome.summary, outcome.verdict) == (fresh.summary, fresh.verdict)
    assert outcome.record == fresh.record and outcome.record.verdict == outcome.verdict

    def boom(ctx):
        raise AssertionError("analysed again")

    monkeypatch.setattr(exp, "analyze", boom)
    page = (tmp_path / "report" / "index.md")
    write_report(tmp_path)
    assert f"**Verdict: {outcome.verdict}.** {outcome.summary}" in page.read_text()
    result = CliRunner().invoke(app, ["experiments", "show", ENTRY, "--runs-dir", str(tmp_path),
                                      "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["verdict"] == json.loads(json.dumps(outcome.record.to_dict()))
    assert shown["summary"] == outcome.summary and shown["stored"] is True
    rows = _build_readme().collect_rows(tmp_path)  # the README's rows, from the stored outcome
    assert [(r["id"], r["verdict"], r["summary"]) for r in rows] == \
        [(ENTRY, outcome.verdict, outcome.summary)]
    # new results for the entry: its stored outcome is no longer theirs
    with Store(tmp_path / "bnlab.db") as store:
        saved = store.load_entry(ENTRY, "smoke")
        store.save_entry(ENTRY, "smoke", saved["runs"], saved["data"], tiny=True, seconds=0.0)
    write_report(tmp_path)
    assert "analysis failed: AssertionError: analysed again" in page.read_text()
