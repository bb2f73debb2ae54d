"""The docs: the MkDocs site builds with --strict, the README stays short and its links resolve, its
verdict table is generated from a store, and papers are cited by title, never by a local path."""

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
BUILD_README = REPO / "docs" / "build_readme.py"


def _build_readme_module():
    spec = importlib.util.spec_from_file_location("build_readme", BUILD_README)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages(nav) -> list[str]:
    pages = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_site_builds_strict(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(module.split(".")[0]) is None:
            pytest.skip(f"{module} is not installed: pip install -e '.[docs]' (make "
                        "docs installs it)")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    site = tmp_path / "site"
    # the API reference was rendered from the docstrings, the figures and the changelog were
    # included
    assert 'id="bnlab.norms.create"' in (site / "api" / "norms" / "index.html").read_text()
    assert 'id="bnlab.probes.Lab"' in (site / "api" / "probes" / "index.html").read_text()
    assert 'id="bnlab.train.run"' in (site / "api" / "train" / "index.html").read_text()
    assert (site / "figures" / "santurkar-fig8-activations.png").is_file()
    assert "Unreleased" in (site / "changelog" / "index.html").read_text()
    # the scripts, included
    assert "BNLAB_EXAMPLE_QUICK" in (site / "examples" / "index.html").read_text()
    assert not list(site.rglob("*.py")), "scripts in docs/ must not be published"


def test_every_docs_page_is_in_the_nav():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    pages = set(_nav_pages(config["nav"]))
    on_disk = {str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md")}
    assert on_disk == pages, \
        f"not in nav: {sorted(on_disk - pages)}; missing files: {sorted(pages - on_disk)}"


def test_no_local_paper_paths():
    files = [REPO / "README.md", REPO / "CHANGELOG.md", *(REPO / "bnlab").rglob("*.py"),
             *(REPO / "docs").rglob("*.md"), *(REPO / "examples").rglob("*.py")]
    offenders = [f"{p.relative_to(REPO)}:{i}" for p in files
                 for i, line in enumerate(p.read_text().splitlines(), 1) if "shared/papers" in line]
    assert not offenders, \
        "cite papers by title, authors and arXiv id, not by a local path: " + ", ".join(offenders)


def test_readme_is_short_and_its_links_resolve():
    text = (REPO / "README.md").read_text()
    assert text.count("<!-- verdicts:start -->") == 1 and text.count("<!-- verdicts:end -->") == 1
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert local, "the README links to the docs pages"
    missing = [t for t in local if not (REPO / t).exists()]
    assert not missing, missing


def test_replace_region_keeps_the_rest():
    br = _build_readme_module()
    text = f"# top\n{br.START}\nold table\n{br.END}\nbottom\n"
    out = br.replace_region(text, "| new |")
    assert out == f"# top\n{br.START}\n| new |\n{br.END}\nbottom\n"
    assert br.replace_region(out, "| new |") == out  # idempotent
    for broken in ("no markers", f"{br.END}\n{br.START}", f"{br.START}{br.END}{br.START}{br.END}"):
        with pytest.raises(ValueError, match="verdicts:start"):
            br.replace_region(broken, "x")


def test_verdict_table_cells_stay_one_line():
    br = _build_readme_module()
    rows = [{"id": "e", "paper": "luo", "authors": "Luo et al. 2019", "target": "Fig. 2",
             "preset": "smoke", "tiny": False, "verdict": "held", "summary": "a | b\nc",
             "date": "2026-11-26"}]
    table = br.verdict_table(rows, "runs")
    row = [line for line in table.splitlines() if line.startswith("| [`e`]")]
    assert row == ["| [`e`](docs/readme/experiments-luo-mbn.md#e) | Luo et al. 2019, Fig. 2 | "
                   "**held** | — | — | a \\| b c |"]
    assert "No catalogue entry" in br.verdict_table([], "runs")


def test_verdicts_come_from_the_store(tmp_path):
    from bnlab.experiments import reproduce

    outcome = reproduce("luo-fig2", "smoke", runs_dir=tmp_path / "runs", tiny=True,
                        report=False, progress=False)
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- verdicts:start -->\n<!-- verdicts:end -->\nrest\n")
    page = tmp_path / "docs" / "readme" / "experiments-luo-mbn.md"  # found beside the README
    page.parent.mkdir(parents=True)
    page.write_text("# luo\n> banner\n\n<!-- verdicts:start -->\n<!-- verdicts:end -->\nrest\n")
    build = [sys.executable, str(BUILD_README), "--runs-dir", str(tmp_path / "runs"), "--readme",
             str(readme), "--snapshot", str(tmp_path / "verdicts.json")]
    proc = subprocess.run(build, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in readme.read_text().splitlines() if line.startswith("| [`")]
    link = "[`luo-fig2`](docs/readme/experiments-luo-mbn.md#luo-fig2)"
    assert len(rows) == 1 and rows[0].startswith(f"| {link} |")
    assert f"**{outcome.verdict}**" in rows[0] and "tiny" in rows[0]
    assert readme.read_text().endswith("<!-- verdicts:end -->\nrest\n")
    page_rows = [line for line in page.read_text().splitlines() if line.startswith("| `")]
    assert len(page_rows) == 1 and page_rows[0].startswith("| `luo-fig2` | Fig. 2 | smoke (tiny")
    assert page.read_text().endswith("<!-- verdicts:end -->\nrest\n")
    # --check: the README agrees with this store; once the store holds another entry, it does not
    assert subprocess.run(build + ["--check"], capture_output=True, text=True,
                          timeout=300).returncode == 0
    reproduce("luo-table2", "smoke", runs_dir=tmp_path / "runs", tiny=True,
              report=False, progress=False)
    proc = subprocess.run(build + ["--check"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "+ | [`luo-table2`]" in proc.stderr, proc.stderr[-2000:]
    assert f"{page}: the verdict table disagrees" in proc.stderr  # each file is reported
    assert "luo-table2" not in readme.read_text() + page.read_text()  # --check writes nothing


def test_readme_table_is_what_the_stored_verdicts_render():
    """README's table against docs/verdicts.json (the rows of the store it was generated from,
    written by the same command): a hand edit of the table, or a row whose entry no longer exists,
    fails."""
    from bnlab.experiments.base import load_catalogue

    br = _build_readme_module()
    rows, runs_dir = br.load_snapshot(br.SNAPSHOT)
    assert rows, "docs/verdicts.json holds no rows: run make demo, then python docs/build_readme.py"
    assert br.region((REPO / "README.md").read_text()) == br.verdict_table(rows, runs_dir).strip()
    catalogue = load_catalogue()
    for row in rows:
        assert row["id"] in catalogue and catalogue[row["id"]].paper == row["paper"], row["id"]


def test_missing_runs_dir_is_a_clear_error(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- verdicts:start -->\n<!-- verdicts:end -->\n")
    proc = subprocess.run([sys.executable, str(BUILD_README), "--runs-dir", str(tmp_path / "nope"),
                           "--readme", str(readme)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "no run store" in proc.stderr
    assert readme.read_text() == "<!-- verdicts:start -->\n<!-- verdicts:end -->\n"


def test_py_typed_is_shipped():
    assert (REPO / "bnlab" / "py.typed").is_file()
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["bnlab"]


def test_verdict_table_names_the_cpu_and_threads_the_runs_recorded():
    """float32 results move between CPU models and SIMD levels (measured: a store trained
    on an AVX512 EPYC against one trained on another CPU): the note under the table says where
    the runs ran."""
    br = _build_readme_module()
    row = {"id": "e", "paper": "luo", "authors": "Luo et al. 2019", "target": "Fig. 2",
           "preset": "smoke", "tiny": False, "verdict": "held", "summary": "s",
           "date": "2026-11-27", "threads": [1], "cpus": ["AMD EPYC (AVX512)"]}
    note = br.verdict_table([row], "runs").splitlines()[0]
    assert "1 torch thread(s)" in note and "AMD EPYC (AVX512)" in note
    assert "AMD EPYC" not in br.verdict_table([{**row, "cpus": []}], "runs")
