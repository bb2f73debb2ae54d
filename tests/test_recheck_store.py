"""scripts/recheck_store.py: retrain a store's entries into a scratch store and compare bit for bit.

One tiny main store (santurkar-fig8's six deep-linear runs, 6 steps each) is built once for the
module and rechecked once; the other cases reuse that scratch store (``--resume``: nothing is
retrained) against altered copies of the main store.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import sqlite3
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "recheck_store.py"
ENTRY = "santurkar-fig8"  # six runs of a deep linear network: the cheapest entry with runs


def _load_script():
    spec = importlib.util.spec_from_file_location("recheck_store", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


recheck = _load_script()


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """``(main runs dir, scratch runs dir, exit status, results)`` of one recheck of a tiny
    store."""
    from bnlab.experiments import reproduce

    root = tmp_path_factory.mktemp("recheck")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BNLAB_WORKERS", "1")
        reproduce(ENTRY, "smoke", runs_dir=root / "main", tiny=True, progress=False, workers=1)
        out = root / "results.json"
        status = recheck.main(["--runs-dir", str(root / "main"), "--scratch",
                               str(root / "scratch"), "--out", str(out)])
    return root / "main", root / "scratch", status, json.loads(out.read_text())


def _altered_copy(main: Path, tmp_path: Path, sql: str) -> Path:
    copy = tmp_path / "main"
    shutil.copytree(main, copy)
    with sqlite3.connect(copy / "bnlab.db") as conn:
        conn.execute(sql)
    conn.close()
    return copy


def _resume(main: Path, scratch: Path, tmp_path: Path, monkeypatch) -> tuple[int, dict]:
    monkeypatch.setenv("BNLAB_WORKERS", "1")
    out = tmp_path / "results.json"
    status = recheck.main(["--runs-dir", str(main), "--scratch", str(scratch), "--resume",
                           "--entries", ENTRY, "--out", str(out)])
    return status, json.loads(out.read_text())


def test_an_unchanged_store_rechecks_identical(stores):
    _, _, status, results = stores
    assert status == 0 and results["identical"] is True
    (entry,) = results["entries"]
    assert entry["entry"] == ENTRY and entry["runs"] == entry["compared"] == entry["identical"] == 6
    assert entry["values"] == entry["values_identical"] > 0
    assert entry["new"] == entry["missing"] == entry["damaged"] == entry["differing_runs"] == []
    assert entry["data_diff"] is None and entry["first_diff"] is None
    env = results["environment"]
    assert env["torch"] and env["cpu_model"] and "git" in env
    assert sum(results["stored_run_env"]["git"].values()) == 6


def test_a_changed_stored_value_is_found_and_its_run_reported_damaged(stores, tmp_path,
                                                                      monkeypatch):
    main, scratch, _, _ = stores
    pick = "(SELECT min(rowid) FROM metrics WHERE name NOT LIKE '%seconds')"
    with sqlite3.connect(main / "bnlab.db") as conn:
        run_id, step, name = conn.execute(
            f"SELECT run_id, step, name FROM metrics WHERE rowid = {pick}").fetchone()
    conn.close()
    altered = _altered_copy(main, tmp_path, f"UPDATE metrics SET value = value + 1e-6 "
                                            f"WHERE rowid = {pick}")
    status, results = _resume(altered, scratch, tmp_path, monkeypatch)
    assert status == 1 and results["identical"] is False
    (entry,) = results["entries"]
    assert entry["compared"] == 6 and entry["identical"] == 5
    assert entry["damaged"] == [run_id]  # the seal no longer matches: named, not a crash
    assert entry["values_identical"] == entry["values"] - 1
    assert entry["first_diff"] == [run_id, name, step]
    assert 0 < entry["max_abs"] < 1e-5
    (run,) = entry["differing_runs"]
    assert run["id"] == run_id and "damaged" in run["damaged"]


def test_a_run_the_store_lacks_is_new(stores, tmp_path, monkeypatch):
    main, scratch, _, _ = stores
    with sqlite3.connect(main / "bnlab.db") as conn:
        run_id = conn.execute("SELECT min(id) FROM runs").fetchone()[0]
    conn.close()
    altered = _altered_copy(main, tmp_path, f"DELETE FROM runs WHERE id = '{run_id}'")
    status, results = _resume(altered, scratch, tmp_path, monkeypatch)
    (entry,) = results["entries"]
    assert status == 1 and [r["id"] for r in entry["new"]] == [run_id]
    assert entry["compared"] == entry["identical"] == 5


def test_scratch_that_is_the_store_or_holds_runs_is_refused(stores, capsys):
    main, scratch, _, _ = stores
    for folder in (main, main / ".." / main.name, main / "sub"):
        assert recheck.main(["--runs-dir", str(main), "--scratch", str(folder)]) == 2
        assert "--scratch" in capsys.readouterr().err
    assert not (main / "sub").exists()
    assert recheck.main(["--runs-dir", str(main), "--scratch", str(scratch)]) == 2
    assert "--resume" in capsys.readouterr().err


def test_an_unknown_entry_names_the_stored_ones(stores, tmp_path, capsys):
    main, _, _, _ = stores
    argv = ["--runs-dir", str(main), "--scratch", str(tmp_path / "s"), "--entries", "nope"]
    assert recheck.main(argv) == 2
    err = capsys.readouterr().err
    assert "nope" in err and f"stored entries: {ENTRY}" in err
    assert recheck.main(argv[:4] + ["--preset", "big"]) == 2  # argparse lists the presets
    assert "smoke" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()  # nothing trained


def test_rows_compare_exactly_and_skip_timing():
    nan = math.nan
    old = {"loss": [(1, 0.5), (2, nan)], "probe/ics/seconds": [(1, 0.1)], "acc": [(1, 1.0)]}
    same = {"loss": [(1, 0.5), (2, nan)], "probe/ics/seconds": [(1, 9.9)], "acc": [(1, 1.0)]}
    out = recheck.compare_rows(old, same)
    assert out["values"] == out["values_identical"] == 3 and out["first_diff"] is None
    moved = {"loss": [(1, 0.5), (2, 0.25)], "acc": [(1, 1.0), (3, 0.0)]}
    out = recheck.compare_rows(old, moved)
    assert (out["values"], out["values_identical"]) == (4, 2)
    assert out["first_diff"] == ["loss", 2] and out["max_abs"] == math.inf
    assert recheck.first_difference({"a": [1.0, nan]}, {"a": [1.0, nan]}) is None
    assert recheck.first_difference({"a": [1.0, 2.0]}, {"a": [1.0, 2.5]}) == "data.a[1]"


class _NoRuns:
    def get_run(self, run_id, verify=True):
        return None


def test_a_run_stored_nowhere_matches_the_same_recorded_failure():
    fresh = {"label": "a", "id": "0123456789ab", "status": "failed", "error": "E: pickling"}
    pair = recheck.pair_run(fresh["id"], fresh, dict(fresh), _NoRuns(), _NoRuns())
    assert pair["kind"] == "unstored" and pair["identical"] is True
    other = recheck.pair_run(fresh["id"], fresh, {**fresh, "error": "E: other"}, _NoRuns(),
                             _NoRuns())
    assert other["identical"] is False


def test_cost_counts_runs_the_entry_saved_as_already_done():
    entry = {"seconds": 2.0, "runs": [{"id": "a"}, {"id": "a"}, {"id": None}]}
    assert recheck.cost(entry, {"a": 100.0}) == 100.0  # one run listed twice counts once
    assert recheck.cost({**entry, "seconds": 300.0}, {"a": 100.0}) == 300.0
