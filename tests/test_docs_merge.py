"""Rows from several stores in one snapshot (docs/build_readme.py ``--merge``): the merged store's
entries replace their rows and name their store, every other row is kept, and the README's note, the
pages' notes and each entry's evidence say which store a row comes from."""

import json

import pytest


def _row(entry: str, verdict: str, summary: str = "s", paper: str = "luo") -> dict:
    return {"id": entry, "paper": paper, "authors": "Luo et al. 2019", "target": "Fig. 2",
            "preset": "smoke", "tiny": False, "verdict": verdict, "summary": summary,
            "date": "2026-12-06", "threads": [1], "cpus": []}


def test_merge_replaces_the_stores_entries_and_keeps_the_rest(br):
    rows = [_row("luo-fig2", "held"), _row("luo-fig3", "held"),
            _row("arora-d1", "held", paper="arora")]
    new = [_row("luo-fig3", "not held", "new"), _row("luo-fig4", "inconclusive")]
    merged = br.merge_rows(rows, new, "other", "runs")
    assert [(r["id"], r["verdict"], r.get("store")) for r in merged] == [
        ("luo-fig2", "held", None), ("luo-fig3", "not held", "other"),
        ("luo-fig4", "inconclusive", "other"), ("arora-d1", "held", None)]  # PAPERS' order
    # merged from the snapshot's own store again: the row names no other store
    assert "store" not in br.merge_rows(merged, [_row("luo-fig3", "held")], "runs", "runs")[1]


def test_notes_and_evidence_name_the_stores(br):
    rows = br.merge_rows([_row("luo-fig2", "held")], [_row("luo-fig3", "held")], "/x/runs_b",
                         "runs")
    note = br.verdict_table(rows, "runs").splitlines()[0]
    assert "Rows by store: 1 from `runs`, 1 from `/x/runs_b`" in note
    page = br.page_table(rows, "runs", br.page_of(rows[0]))
    assert "Rows by store: 1 from `runs`, 1 from `/x/runs_b`" in page.splitlines()[0]
    evidence = [line for line in page.splitlines() if line.startswith('<a id="')]
    assert evidence[0].startswith('<a id="luo-fig2"></a>**`luo-fig2`** (Fig. 2, smoke, stored '
                                  "2026-12-06): ")
    assert evidence[1].startswith('<a id="luo-fig3"></a>**`luo-fig3`** (Fig. 2, smoke, stored '
                                  "2026-12-06 in `/x/runs_b`): ")
    # one store: no per-store sentence
    assert "Rows by store" not in br.verdict_table([_row("luo-fig2", "held")], "runs")
    # the snapshot's own store first, then the others by name
    rows = br.merge_rows(rows, [_row("luo-fig4", "held")], "/a/runs_a", "runs")
    assert "Rows by store: 1 from `runs`, 1 from `/a/runs_a`, 1 from `/x/runs_b`" in \
        br.verdict_table(rows[::-1], "runs")


def test_merge_on_the_command_line(br, tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- verdicts:start -->\n<!-- verdicts:end -->\n")
    snapshot = tmp_path / "verdicts.json"
    snapshot.write_text(json.dumps({"runs_dir": "runs", "rows": [_row("luo-fig2", "held"),
                                                                  _row("luo-fig3", "held")]}))
    (tmp_path / "other").mkdir()
    seen = []

    def collect(runs_dir, only=None):
        seen.append((str(runs_dir), only))
        return [_row("luo-fig3", "not held")]

    monkeypatch.setattr(br, "collect_rows", collect)
    args = ["--readme", str(readme), "--snapshot", str(snapshot), "--runs-dir",
            str(tmp_path / "other"), "--merge", "--only", "luo-fig3"]
    assert br.main(args) == 0
    assert seen == [(str(tmp_path / "other"), {"luo-fig3"})]
    data = json.loads(snapshot.read_text())
    assert data["runs_dir"] == "runs"
    assert [(r["id"], r["verdict"], r.get("store")) for r in data["rows"]] == [
        ("luo-fig2", "held", None), ("luo-fig3", "not held", str(tmp_path / "other"))]
    assert "**not held**" in readme.read_text()
    # an entry --only names that the store does not hold is an error, and nothing is written
    before = snapshot.read_text()
    assert br.main(args[:-1] + ["luo-fig9"]) == 2 and snapshot.read_text() == before


@pytest.mark.parametrize("args", [["--only", "luo-fig2"], ["--from-snapshot", "--merge"]])
def test_merge_options_that_do_not_go_together(br, tmp_path, args, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- verdicts:start -->\n<!-- verdicts:end -->\n")
    assert br.main(["--readme", str(readme), "--snapshot", str(tmp_path / "v.json"), *args]) == 2
    assert "--merge" in capsys.readouterr().err
