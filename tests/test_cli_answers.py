"""Output that leads with the answer: ``bnlab reproduce`` and ``bnlab demo`` end with one line per
entry (verdict, our number against the paper's, the report section with the evidence), and
``bnlab experiments list`` is a compact table by default, with ``--long`` (the full text) and
``--json`` (every field)."""

import json
import re

import pytest
from typer.testing import CliRunner

from bnlab.cli import app
from bnlab.experiments.base import Outcome, load_catalogue
from bnlab.report.headline import answer_lines

# Real summaries (docs/verdicts.json, stored 2026-11-29), cut after the part headline reads.
PENG_TABLE2 = ("CBN − BN test accuracy, mean over Tanh/SELU +3.69 pt ± 1.4 (SE; 95 % CI [+0.445, "
               "+6.93], p=0.031, n=5/5) vs the paper's +4.18 pt; resolvable ≥ 4.3 pt")
ARORA_D3 = ("average test accuracy of the last epochs, SGD/PSGD — unified: lr 0.01 0.986/0.985, lr "
            "0.1 0.991/0.989, lr 1 0.983/0.967, lr 10 0.969/0.397, lr 100 0.952/0.100; SGD stays "
            "above 75 % at every lr while PSGD falls")


def _outcome(verdict: str, summary: str) -> Outcome:
    return Outcome(figures=[], table=[], verdict=verdict, summary=summary)


def test_answer_lines_give_verdict_numbers_and_where_the_evidence_is():
    lines = answer_lines([("peng-table2", "smoke", _outcome("held", PENG_TABLE2)),
                          ("arora-d3", "smoke", _outcome("held", ARORA_D3)),
                          ("luo-fig2", "paper", ValueError("no stored results"))],
                         "runs/report/index.html")
    assert lines[0] == ("peng-table2  held          ours +3.69 pt ± 1.4 vs the paper's +4.18 pt  "
                        "→ runs/report/index.html#peng-table2-smoke")
    # several numbers decide it: the short clause instead, never the whole summary
    assert lines[1].startswith("arora-d3     held          average test accuracy of the last")
    assert lines[1].endswith("→ runs/report/index.html#arora-d3-smoke") and len(lines[1]) < 150
    assert lines[2].startswith("luo-fig2     error         ValueError: no stored results")
    assert lines[2].endswith("#luo-fig2-paper")


def test_answer_lines_fall_back_to_the_outcomes_table():
    table = [{"quantity": "gd · η_w=0.01: log-log slope", "ours": "-0.47",
              "paper": "−0.5 (Thm 3.1)"},
             {"quantity": "gd · η_w=0.1: log-log slope", "ours": "-0.48", "paper": "−0.5"}]
    outcome = Outcome([], table, "held", "primary: steepest-worst log-log slopes; tolerance +0.1")
    line = answer_lines([("arora-rates", "smoke", outcome)], "r.html")[0]
    assert line == ("arora-rates  held          gd · η_w=0.01: log-log slope: ours -0.47 vs the "
                    "paper's −0.5 (Thm 3.1) (row 1 of 2)  → r.html#arora-rates-smoke")


def _tail_answers(output: str, ids: list[str]) -> list[str]:
    lines = output.strip().splitlines()
    assert len(lines) > len(ids), output
    return lines[-len(ids):]


def _check_answers(answers: list[str], ids: list[str], report) -> None:
    html = report.read_text()
    for experiment_id, line in zip(ids, answers):
        verdict = r"(held|not held|inconclusive)"
        assert re.match(rf"{re.escape(experiment_id)} +{verdict} ", line), line
        anchor = f"{experiment_id}-smoke"
        assert line.endswith(f"→ {report}#{anchor}")
        assert f'id="{anchor}"' in html  # the link lands on the entry's section


def test_reproduce_ends_with_one_answer_per_entry_and_list_marks_it_stored(tmp_path):
    ids = ["peng-eq14", "luo-table2"]  # computations only: seconds with --tiny
    runs = tmp_path / "runs"
    result = CliRunner().invoke(app, ["reproduce", *ids, "--tiny", "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    report = runs / "report" / "index.html"
    answers = _tail_answers(result.stdout, ids)
    _check_answers(answers, ids, report)
    assert result.stdout.strip().splitlines()[-len(ids) - 1] == f"report: {report}"
    # the eq. 14 summary states its number against √2: both are on the line
    assert re.search(r"ours 1\.4\d+ vs the paper's √2 = 1\.414", answers[0]), answers[0]

    listed = CliRunner().invoke(app, ["experiments", "list", "--runs-dir", str(runs)])
    assert listed.exit_code == 0, listed.output
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:-1]}
    assert "smoke (tiny) 20" in rows["peng-eq14"] and "smoke (tiny) 20" in rows["luo-table2"]
    assert " — " in rows["santurkar-fig2"]
    data = json.loads(CliRunner().invoke(app, ["experiments", "list", "--json", "--runs-dir",
                                               str(runs)]).stdout)
    stored = {e["id"]: e["stored"] for e in data}
    assert stored["peng-eq14"][0]["preset"] == "smoke" and stored["peng-eq14"][0]["tiny"]
    assert stored["santurkar-fig2"] == []


def test_demo_ends_with_one_answer_per_entry(tmp_path, monkeypatch):
    import bnlab.cli.demo as demo

    ids = ["peng-eq14", "mbn-theorems"]
    monkeypatch.setattr(demo, "DEMO_ENTRIES", ids)
    runs = tmp_path / "runs"
    result = CliRunner().invoke(app, ["demo", "--tiny", "--workers", "1", "--runs-dir",
                                      str(runs)])
    assert result.exit_code == 0, result.output
    _check_answers(_tail_answers(result.stdout, ids), ids, runs / "report" / "index.html")
    # no paragraph-long summary anywhere on stdout
    report = str(runs / "report" / "index.html")
    assert max(len(line.replace(report, "")) for line in result.stdout.splitlines()) < 150


def test_experiments_list_is_a_compact_table_by_default(tmp_path):
    catalogue = load_catalogue()
    result = CliRunner().invoke(app, ["experiments", "list", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0].split() == ["id", "paper", "target", "stored", "title"]
    assert [line.split()[0] for line in lines[1:-1]] == list(catalogue)
    assert lines[-1].startswith(f"{len(catalogue)} entries")
    assert max(map(len, lines)) <= 140
    for experiment_id, exp in catalogue.items():
        row = next(line for line in lines if line.split()[0] == experiment_id)
        assert f"  {exp.paper}  " in row and f"  {exp.target}  " in row
        assert exp.title.startswith(row.split("  —  ")[-1].strip().removesuffix(" …"))
    assert "claim:" not in result.stdout  # that is --long's


def test_experiments_list_long_and_json_keep_every_field(tmp_path):
    catalogue = load_catalogue()
    runner = CliRunner()
    long = runner.invoke(app, ["experiments", "list", "--long", "--runs-dir", str(tmp_path)])
    assert long.exit_code == 0, long.output
    for exp in catalogue.values():
        assert f"claim: {exp.claim}" in long.stdout
        for preset, cost in exp.cost.items():
            assert f"{preset}: {cost}" in long.stdout
        if exp.resolution is not None:
            assert f"resolves: {exp.resolution.resolvable}" in long.stdout
    data = json.loads(runner.invoke(app, ["experiments", "list", "--json", "--runs-dir",
                                          str(tmp_path)]).stdout)
    assert [e["id"] for e in data] == list(catalogue)
    for entry in data:
        assert {**catalogue[entry["id"]].describe(), "stored": []} == entry


@pytest.mark.parametrize("flag", ["--long", "--json"])
def test_experiments_list_help_names_the_other_forms(flag):
    result = CliRunner().invoke(app, ["experiments", "list", "--help"])
    assert flag in result.stdout
