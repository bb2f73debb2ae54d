"""The catalogue's docs against the registry: the entry count printed in docs/readme/experiments.md
is the number of registered entries (it said 24 when there were 32)."""

import re
from pathlib import Path

from bnlab.experiments.base import load_catalogue

DOCS = Path(__file__).resolve().parent.parent / "docs" / "readme" / "experiments.md"


def test_docs_entry_count_matches_the_registry():
    counts = [int(n) for n in re.findall(r"# (\d+) entries", DOCS.read_text())]
    assert counts, "docs/readme/experiments.md no longer states the entry count"
    assert counts == [len(load_catalogue())] * len(counts)


def test_every_entry_is_named_in_a_docs_page():
    pages = "".join(p.read_text() for p in DOCS.parent.glob("experiments*.md"))
    missing = [eid for eid in load_catalogue() if f"`{eid}`" not in pages]
    assert not missing, f"entries not named in docs/readme/experiments*.md: {missing}"
