"""The benchmarks page's tables are what the stored results render (benchmarks/tables.py), every
stored result is dated, and none is superseded by a later run of the same measurement."""

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"


def load_tables():
    spec = importlib.util.spec_from_file_location("bench_tables", REPO / "benchmarks" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


T = load_tables()


def test_the_page_tables_equal_what_the_results_render():
    text = T.PAGE.read_text()
    assert T.rewrite(text, T.render_all()) == text, "run: python benchmarks/tables.py"


def test_no_stored_layer_result_is_superseded():
    assert T.superseded() == []


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")) +
                         sorted((REPO / "docs" / "recheck").glob("*.json")), ids=lambda p: p.name)
def test_every_stored_result_says_when_and_at_which_commit(path):
    run = json.loads(path.read_text())
    assert len(run["date"]) == 10 and run["date"][4] == "-", run["date"]
    assert run["commit"] and run["commit"] != "unknown"


def _run(path: Path, date: str, ratio: float, spec: str = "bn", pairs: int = 9) -> None:
    row = {"spec": spec, "precision": "fp32", "mode": "eager", "reference": "native_bn eager",
           "shape": [128, 64, 32, 32], "ratio": ratio, "ops": 4}
    path.write_text(json.dumps({"date": date, "time_utc": "10:00", "commit": "abc1234",
                                "threads": 2, "clock": "wall time", "pairs": pairs,
                                "rows": [row]}))


def test_the_newest_run_of_a_setting_gives_the_cell_and_the_older_file_is_superseded(tmp_path):
    _run(tmp_path / "norms_old.json", "2026-01-01", 1.50)
    _run(tmp_path / "norms_new.json", "2026-02-01", 1.10)
    _run(tmp_path / "norms_other.json", "2025-12-01", 0.90, spec="mbn")
    rendered = T.render_layers(T.merged_cells(tmp_path))
    assert "| `bn` | 1.10 |" in rendered and "1.50" not in rendered
    assert "| `mbn` | 0.90 |" in rendered  # an older run still owns the cells nobody re-measured
    assert T.superseded(tmp_path) == ["norms_old.json"]
    assert "`norms_new.json` (2026-02-01, abc1234, 9 pairs)" in rendered


def test_a_quick_dry_run_gives_no_cell(tmp_path):
    _run(tmp_path / "norms_a.json", "2026-01-01", 1.20)
    _run(tmp_path / "norms.json", "2026-02-01", 9.99)
    quick = tmp_path / "norms.json"
    quick.write_text(quick.read_text().replace('"pairs"', '"quick": true, "pairs"'))
    assert "| `bn` | 1.20 |" in T.render_layers(T.merged_cells(tmp_path))
    assert T.superseded(tmp_path) == []


def test_more_pairs_win_a_tie_of_date_and_time(tmp_path):
    _run(tmp_path / "norms_a.json", "2026-01-01", 1.20, pairs=21)
    _run(tmp_path / "norms_b.json", "2026-01-01", 1.30, pairs=11)
    assert "| `bn` | 1.20 |" in T.render_layers(T.merged_cells(tmp_path))


def test_a_region_without_a_table_is_an_error_naming_it():
    text = "<!-- bench:nope:start -->\nold\n<!-- bench:nope:end -->\n"
    with pytest.raises(ValueError, match="nope"):
        T.rewrite(text, {"layers": "x"})
    assert T.rewrite("a <!-- bench:layers:start -->old<!-- bench:layers:end --> b",
                     {"layers": "new"}) == \
        "a <!-- bench:layers:start -->\nnew\n<!-- bench:layers:end --> b"
