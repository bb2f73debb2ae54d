"""Every count the docs state about the code equals what the code reports today: catalogue entries
(``bnlab.experiments``), papers, the demo's entries (``bnlab.cli.demo``), layers in the norms
registry, probes (``bnlab.probes.available()``), models and data sources. Counts of tests, which
the docs cannot keep true, must not appear. Generated regions (``<!-- ...:start -->`` …
``<!-- ...:end -->``) are checked by their own generators' tests and skipped here."""

import importlib.util
import re
from pathlib import Path

import pytest

import bnlab.data as data
import bnlab.models as models
import bnlab.norms as norms
import bnlab.probes as probes
from bnlab.cli.demo import DEMO_ENTRIES
from bnlab.experiments import CATALOGUE, PAPERS, load_catalogue

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted((REPO / "docs" / "readme").glob("*.md")) + [
    REPO / "docs" / "index.md", REPO / "docs" / "examples.md", REPO / "README.md"]
WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven "
                                    "twelve thirteen fourteen fifteen sixteen seventeen eighteen "
                                    "nineteen twenty".split())}
NUMBER = r"(\d[\d,]*|" + "|".join(WORDS) + r")"
GENERATED = re.compile(r"<!-- ([\w-]+:)?(\w[\w-]*):start -->.*?<!-- \1?\2:end -->", re.S)


def value(text: str) -> int:
    return WORDS[text.lower()] if text.lower() in WORDS else int(text.replace(",", ""))


def prose(path: Path) -> str:
    return GENERATED.sub("", path.read_text(encoding="utf-8"))


def counts(pattern: str) -> list[tuple[str, int, str]]:
    """``(page, count, matched text)`` for each match of ``NUMBER + pattern`` in the docs' prose."""
    rx = re.compile(rf"\b{NUMBER} {pattern}", re.I)
    return [(p.name, value(m.group(1)), m.group(0)) for p in PAGES for m in rx.finditer(prose(p))]


def code_counts() -> dict[str, int]:
    load_catalogue()
    return {"entries": len(CATALOGUE), "papers": len(PAPERS), "demo": len(DEMO_ENTRIES),
            "layers": len(norms.registry.REGISTRY), "probes": len(probes.available()),
            "models": len(models.MODELS), "sources": len(data.SOURCES)}


CHECKS = {  # what a phrase counts -> the pattern after the number (digits only for entries:
    # the paper pages' worded counts are per page, checked below)
    "entries": r"(?:catalogue |stored )?entries\b(?! of this page)",
    "papers": r"(?:batch-normalization )?papers\b",
    "demo": r"smoke entries\b",
    "layers": r"(?:normali[sz]ation|norm) layers\b",
    "probes": r"(?:built-in probes|probes in the registry)\b",
    "models": r"(?:models|architectures) in the registry\b",
    "sources": r"data sources\b",
}


@pytest.mark.parametrize("kind", sorted(CHECKS))
def test_each_count_in_the_docs_equals_what_the_code_reports(kind):
    want = code_counts()[kind]
    found = counts(CHECKS[kind])
    if kind == "entries":  # worded counts of entries are a page's own (below)
        found = [f for f in found if f[2][0].isdigit()]
    wrong = [f"{page}: {text!r} (the code: {want})" for page, n, text in found if n != want]
    assert not wrong, "\n".join(wrong)


def entries_by_page() -> dict[str, list]:
    """Catalogue entries per paper page, as docs/build_readme.py places their rows."""
    spec = importlib.util.spec_from_file_location("build_readme", REPO / "docs" / "build_readme.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    load_catalogue()
    pages: dict[str, list] = {}
    for name in CATALOGUE:
        entry = CATALOGUE[name]
        page = build.ENTRY_PAGES.get(name, build.PAPER_PAGES[entry.paper])
        pages.setdefault(Path(page).name, []).append(entry)
    return pages


# (page, the sentence stating a count, what it counts among that page's entries)
PAGE_COUNTS = [
    ("experiments-santurkar.md", rf"\b{NUMBER} entries reproduce the figures", None),
    ("experiments-luo-mbn.md", rf"\b{NUMBER} entries of the experiment catalogue", None),
    ("experiments-peng-imagenet.md", rf"\b{NUMBER} entries in `bnlab/experiments/peng/", None),
    ("experiments-peng-arora.md", rf"\b{NUMBER} entries \(", None),
    ("experiments-peng-arora.md", r"entries \((\d+) Peng", "peng"),
    ("experiments-peng-arora.md", r"entries \(\d+ Peng, (\d+) Arora", "arora"),
]


@pytest.mark.parametrize("page, pattern, paper", PAGE_COUNTS)
def test_each_paper_page_counts_its_own_entries(page, pattern, paper):
    entries = entries_by_page()[page]
    want = len([e for e in entries if paper is None or e.paper == paper])
    match = re.search(pattern, prose(REPO / "docs" / "readme" / page), re.I)
    assert match, f"{page}: no sentence matching {pattern!r} (update PAGE_COUNTS with the page)"
    assert value(match.group(1)) == want, f"{page}: {match.group(0)!r}, the catalogue: {want}"


def test_the_theorem_entries_are_counted_right():
    load_catalogue()
    theorems = [n for n in CATALOGUE if CATALOGUE[n].analyze.__module__.endswith(
        ("theorems", "arora.rates"))]
    text = prose(REPO / "docs" / "readme" / "experiments.md")
    match = re.search(rf"\b{NUMBER} entries check the papers' central theoretical claims", text,
                      re.I)
    assert match and value(match.group(1)) == len(theorems), (match and match.group(0), theorems)


def test_the_catalogue_page_states_the_catalogue_size():
    load_catalogue()
    assert f"{len(CATALOGUE)} entries" in prose(REPO / "docs" / "readme" / "experiments.md")


def test_the_demo_entries_named_in_the_docs_are_the_demos():
    text = prose(REPO / "docs" / "readme" / "experiments.md")
    sentence = text[text.index("`make demo` (= `bnlab demo`) runs"):].split("(the list is")[0]
    assert re.findall(r"`([a-z0-9-]+)`", sentence.split("—", 1)[1]) == list(DEMO_ENTRIES)


def test_no_count_of_tests_in_the_docs():
    """A test count goes stale with the next test; the suite's own output is where it lives."""
    found = counts(r"(?:tests\b|passed\b)")
    stale = [f"{page}: {text!r}" for page, n, text in found if n > 5]
    assert not stale, "\n".join(stale)


def test_the_count_checker_sees_a_wrong_count(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("The catalogue has 7 entries and 9 built-in probes. "
                    "<!-- verdicts:start -->99 entries<!-- verdicts:end -->\n")
    monkeypatch.setitem(globals(), "PAGES", [page])
    assert [n for _, n, _ in counts(CHECKS["entries"])] == [7]
    assert [n for _, n, _ in counts(CHECKS["probes"])] == [9]
