"""The README a newcomer scans in five minutes: at most 180 lines and 20 KB, no table cell over 300
characters, and one verdict row per stored entry, each with our number beside the paper's
(``headline``, read from the summary) and a link to an anchor on the entry's page, where its full
summary is (``build_readme.page_table``)."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def _cells(text: str) -> list[str]:
    """Every cell of every Markdown table row in ``text`` (escaped pipes stay inside a cell)."""
    cells = []
    for line in text.splitlines():
        if line.startswith("|") and not set(line) <= set("|-: "):
            cells += [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
    return cells


def _slug(heading: str) -> str:
    """Python-Markdown's toc slug (MkDocs) and GitHub's, alike for plain headings."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"[\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    text = page.read_text()
    ids = set(re.findall(r'<a id="([^"]+)"></a>', text))
    return ids | {_slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_readme_is_at_most_180_lines_and_20_kb():
    text = README.read_text()
    assert len(text.splitlines()) <= 180
    assert len(text.encode()) <= 20 * 1024


def test_no_readme_table_cell_is_over_300_characters():
    cells = _cells(README.read_text())
    assert cells, "the README has tables"
    widest = max(cells, key=len)
    assert len(widest) <= 300, widest[:200]


def test_every_readme_link_with_an_anchor_lands_on_it():
    text = README.read_text()
    links = re.findall(r"\]\(([^)#\s]+)#([^)\s]+)\)", text)
    assert links
    missing = [f"{page}#{anchor}" for page, anchor in links
               if not (REPO / page).is_file() or anchor not in anchors(REPO / page)]
    assert not missing, missing


def test_one_row_per_stored_entry_linking_to_its_full_evidence(br):
    rows, _ = br.load_snapshot(br.SNAPSHOT)
    region = br.region(README.read_text())
    lines = [line for line in region.splitlines() if line.startswith("| [`")]
    assert [re.match(r"\| \[`([^`]+)`\]", line).group(1) for line in lines] == \
        [r["id"] for r in rows]
    for row, line in zip(rows, lines):
        page = br.page_of(row)
        assert f"]({page}#{row['id']})" in line
        assert f"**{row['verdict']}**" in line
        # the anchor is on the page, followed by the entry's whole summary
        text = (REPO / page).read_text()
        at = text.index(f'<a id="{row["id"]}"></a>')
        assert " ".join(row["summary"].split()) in text[at:].split("\n\n")[0]
    assert region.count("*The rule:") == 1  # stated once, under the table
    assert region.rstrip().splitlines()[-1].startswith("*The rule:")


# Real summaries (docs/verdicts.json, stored 2026-11-28/29), cut after the part headline reads.
PENG_TABLE1 = ("CBN − BN test accuracy, mean over Sigmoid/Tanh/SELU -23.5 pt ± 1.4 (SE, floored; "
               "95 % CI [-26.8, -20.2], p=8.8e-07, n=5/5) vs the paper's +6.08 pt; resolvable ≥ "
               "4.5 pt (design SD 1.7, 3 points per activation, assumed before the runs)")
PENG_FIG4 = ("CBN − BN mean training loss over the run, mean over the panels of the table's "
             "primary activations (ResNet-20: Sigmoid/Tanh/SELU; VGG-16 in smoke: Tanh/SELU) "
             "+0.285 ± 0.017 (SE; 95 % CI [+0.241, +0.33], p=2.7e-05, n=5/5) vs the paper's "
             "negative (direction only); resolvable ≥ 0.2 (design SD 0.1)")
MBN_BATCH = ("test accuracy M = 32 → M = 2, mean over seeds: BN 0.981 → 0.617 (drop 0.365, n=3), "
             "MBN 0.981 → 0.933 (drop 0.048, n=3); MBN's − BN's test-accuracy drop from M = 32 to "
             "M = 2 -0.317 ± 0.024 (SE; 95 % CI [-0.413, -0.22], p=0.0042, n=3/3) vs the paper's "
             "negative (direction only); resolvable ≥ 0.13")
LUO_FIG2 = ("150 epochs, 5 seeds: BN points (population statistics) fitted best by ζ_BN = 0.0202 "
            "(paper: 0.014; per seed 0.0204 ± 0.0021 (n=5)); the no-batch-noise control")
PENG_TABLE5 = ("top-1 gain of CBN over BN, points: ResNet-18/Sigmoid +12.4 ± 16 (SE; Welch "
               "p=0.52, n=3/3, resolvable ≥ 79 at the design SD) [paper +18.12]; ResNet-18/Tanh "
               "-17.4 ± 28 (SE; Welch p=0.58, n=3/3) [paper +5.67]")
PENG_THM1 = ("primary: max over 30 runs of mean‖∇F‖² / (T₁+T₂+T₃) = 0.247 (≤ 1 required); effects "
             "(difference, lower arm − higher arm; negative = as claimed): larger lr → smaller T₁")
ARORA_D3 = ("average test accuracy of the last epochs, SGD/PSGD — unified: lr 0.01 0.986/0.985, lr "
            "0.1 0.991/0.989, lr 1 0.983/0.967, lr 10 0.969/0.397, lr 100 0.952/0.100; separate: "
            "lr 0.01 0.984/0.984; SGD stays above 75 % at every lr while PSGD falls")


@pytest.mark.parametrize("summary, ours, paper, clause", [
    (PENG_TABLE1, "-23.5 pt ± 1.4", "+6.08 pt",
     "CBN − BN test accuracy, mean over Sigmoid/Tanh/SELU (p=8.8e-07, n=5/5)"),
    # "; " inside the brackets does not end the clause; the aside is dropped to fit
    (PENG_FIG4, "+0.285 ± 0.017", "negative (direction only)",
     "CBN − BN mean training loss over the run, mean over the panels of the table's primary "
     "activations (p=2.7e-05, n=5/5)"),
    # the primary after a first clause of reported numbers
    (MBN_BATCH, "-0.317 ± 0.024", "negative (direction only)",
     "MBN's − BN's test-accuracy drop from M = 32 to M = 2 (p=0.0042, n=3/3)"),
    (LUO_FIG2, "0.0202", "0.014",
     "150 epochs, 5 seeds: BN points (population statistics) fitted best by ζ_BN"),
    (PENG_TABLE5, "+12.4 ± 16", "+18.12",
     "top-1 gain of CBN over BN, points: ResNet-18/Sigmoid (p=0.52, n=3/3)"),
    (PENG_THM1, "0.247", "≤ 1", "primary: max over 30 runs of mean‖∇F‖² / (T₁+T₂+T₃)"),
])
def test_headline_reads_ours_and_the_papers_number(br, summary, ours, paper, clause):
    assert br.headline(summary) == {"ours": ours, "paper": paper, "clause": clause}


def test_headline_falls_back_to_the_shortened_first_clause(br):
    got = br.headline(ARORA_D3)
    assert got["ours"] == got["paper"] == "—"
    assert len(got["clause"]) <= br.CLAUSE_CHARS and got["clause"].endswith(" …")
    assert ARORA_D3.startswith(got["clause"][:-2])
    assert br.headline("") == {"ours": "—", "paper": "—", "clause": ""}


def test_shorten_drops_asides_first_and_never_cuts_inside_brackets(br):
    text = "alpha beta (gamma delta epsilon) zeta (eta theta) iota kappa lambda"
    assert br.shorten(text, 100) == text
    # the last aside goes first, then the one before it
    assert br.shorten(text, 60) == "alpha beta (gamma delta epsilon) zeta iota kappa lambda"
    assert br.shorten(text, 45) == "alpha beta zeta iota kappa lambda"
    assert br.shorten("a (b c d e f g h) " * 3 + "x" * 30, 12).endswith("…")
    out = br.shorten("one [two three four five six] seven", 20)
    assert out.count("[") == out.count("]") and len(out) <= 20


def test_every_stored_rows_readme_cells_fit(br):
    rows, runs_dir = br.load_snapshot(br.SNAPSHOT)
    table = br.verdict_table(rows, runs_dir)
    assert max(len(c) for c in _cells(table)) <= 300
    numbered = [r["id"] for r in rows if br.headline(r["summary"])["ours"] != "—"]
    # the primary comparisons that state the paper's number give it beside ours
    assert {"peng-table1", "peng-table2", "peng-table3", "peng-table4", "luo-fig4",
            "mbn-batch-size", "santurkar-fig8"} <= set(numbered)


def test_the_stored_rows_carry_no_work_period_or_issue_number(br):
    rows, _ = br.load_snapshot(br.SNAPSHOT)
    dated = re.compile(r"\b(?:session|issue)[- ]\d+", flags=re.I)
    assert not [r["id"] for r in rows if dated.search(r["summary"])]
