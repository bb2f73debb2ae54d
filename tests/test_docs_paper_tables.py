"""The paper pages' generated verdict tables (docs/build_readme.py): each page in ``PAGES`` holds
one region between the verdict markers, rendered from the same rows as the README's table
(docs/verdicts.json) with each summary cut to its first clause, and a hand edit there is caught."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def snapshot(br):
    rows, runs_dir = br.load_snapshot(br.SNAPSHOT)
    assert rows, "docs/verdicts.json holds no rows: run python docs/build_readme.py --runs-dir runs"
    return rows, runs_dir


def _entry_rows(region: str) -> list[str]:
    return [line for line in region.splitlines() if line.startswith("| `")]


def test_each_page_region_is_what_the_stored_rows_render(br, snapshot):
    rows, runs_dir = snapshot
    for page in br.PAGES:
        have = br.region((REPO / page).read_text())
        assert have == br.page_table(rows, runs_dir, page).strip(), \
            f"{page}: regenerate with python docs/build_readme.py --runs-dir {runs_dir}"


def test_every_stored_row_is_on_exactly_one_page(br, snapshot):
    rows, _ = snapshot
    ids = [re.match(r"\| `([^`]+)`", line).group(1) for page in br.PAGES
           for line in _entry_rows(br.region((REPO / page).read_text()))]
    assert sorted(ids) == sorted(r["id"] for r in rows)
    assert all(br.page_of(r) in br.PAGES for r in rows)
    # the imagenet page discusses peng-table5 and peng-fig6; the README links them there too
    imagenet = br.region((REPO / "docs/readme/experiments-peng-imagenet.md").read_text())
    stored = {r["id"] for r in rows}
    assert {i for i in ("peng-table5", "peng-fig6") if i in stored} == \
        {line.split("`")[1] for line in _entry_rows(imagenet)}


def test_page_row_has_target_verdict_first_clause_and_date(br, snapshot):
    rows, runs_dir = snapshot
    row = rows[0]
    table = br.page_table(rows, runs_dir, br.page_of(row))
    note, header = table.splitlines()[0], table.splitlines()[2]
    assert f"--runs-dir {runs_dir}" in note and f"({len(rows)} in all)" in note
    assert all(f"{t} torch thread(s)" in note for t in row.get("threads", []))
    assert all(cpu in note for cpu in row.get("cpus", []))
    assert header == "| entry | target | preset | verdict | primary comparison | stored |"
    line = next(x for x in _entry_rows(table) if x.startswith(f"| `{row['id']}` |"))
    assert line == (f"| `{row['id']}` | {br._cell(row['target'])} | {row['preset']} | "
                    f"**{row['verdict']}** | {br._cell(br.first_clause(row['summary']))} | "
                    f"{row['date']} |")
    assert "No entry of this page" in br.page_table([], runs_dir, br.PAGES[0])


def _copy_docs(br, rows, runs_dir, root: Path) -> dict[Path, str]:
    """README and the pages, as generated from the snapshot, under ``root``."""
    readme = root / "README.md"
    readme.write_text(f"# x\n{br.START}\n{br.END}\n")
    for page in br.PAGES:
        (root / page).parent.mkdir(parents=True, exist_ok=True)
        (root / page).write_text((REPO / page).read_text())
    targets = br.tables(rows, runs_dir, readme)
    for path, text in br.rewrite(targets).items():
        path.write_text(text)
    return targets


def test_a_hand_edit_inside_a_page_region_is_caught(br, snapshot, tmp_path, capsys):
    rows, runs_dir = snapshot
    targets = _copy_docs(br, rows, runs_dir, tmp_path)
    assert len(targets) == 1 + len(br.PAGES)
    assert [br.check(p, t, "the snapshot") for p, t in targets.items()] == [0] * len(targets)
    page = tmp_path / br.PAGES[0]
    text = page.read_text()
    first = _entry_rows(br.region(text))[0]
    verdict = re.search(r"\*\*([^*]+)\*\*", first).group(0)
    edited = first.replace(verdict, "**held (by hand)**")
    page.write_text(text.replace(first, edited))
    capsys.readouterr()
    assert br.check(page, targets[page], "the snapshot") == 1
    err = capsys.readouterr().err
    assert f"{page}: the verdict table disagrees" in err
    assert f"  - {edited[:150]}" in err and f"  + {first[:150]}" in err
    assert br.check(tmp_path / "README.md", targets[tmp_path / "README.md"], "the snapshot") == 0
    # a page that lost its markers disagrees too (and the rewrite refuses to touch any file)
    page.write_text(text.replace(br.START, ""))
    assert br.check(page, targets[page], "the snapshot") == 1
    with pytest.raises(ValueError, match=re.escape(str(page))):
        br.rewrite(targets)


# Real summaries (docs/verdicts.json, 2026-11-27), cut after the part first_clause reads.
PENG_TABLE1 = ("CBN − BN test accuracy, mean over Sigmoid/Tanh/SELU -23.5 pt ± 1.4 (SE, floored; "
               "95 % CI [-26.8, -20.2], p=8.8e-07, n=5/5) vs the paper's +6.08 pt; resolvable ≥ "
               "4.5 pt (design SD 1.7, 3 points per activation, assumed before the runs (binomial "
               "floor at 85 %: 1.9 on 359 test images)); per activation (reported, Holm-adjusted "
               "p): Sigmoid -72.5 (p_Holm=9.8e-07); Tanh +0.8 (p_Holm=0.66)")
SANTURKAR_FIG8 = ("median drift of a sampled unit's distribution from the first to the last "
                  "measurement, per seed; BN − standard median drift of a unit's distribution "
                  "-0.894 ± 0.15 (SE; 95 % CI [-1.56, -0.232], p=0.028, n=3/3) vs the paper's "
                  "negative (direction only); resolvable ≥ 0.55 (design SD 0.18, smoke pilot "
                  "2026-11-26). Rule: one pre-declared primary comparison per entry")
PENG_TABLE5 = ("top-1 gain of CBN over BN, points: ResNet-18/Sigmoid +12.4 ± 16 (SE; Welch "
               "p=0.52, n=3/3, resolvable ≥ 79 at the design SD) [paper +18.12]; ResNet-18/Tanh "
               "-17.4 ± 28 (SE; Welch p=0.58, n=3/3, resolvable ≥ 79 at the design SD) [paper "
               "+5.67]; ResNet-18/ReLU +11.8 ± 13 (SE; Welch p=0.46, n=3/3)")


def test_first_clause_on_real_summaries(br):
    # "; " inside parentheses and brackets does not end the clause
    assert br.first_clause(PENG_TABLE1) == PENG_TABLE1[:PENG_TABLE1.index(" pt; ") + 3]
    assert br.first_clause(PENG_TABLE1).endswith("vs the paper's +6.08 pt")
    assert br.first_clause(PENG_TABLE5).endswith("at the design SD) [paper +18.12]")
    # a first clause without a number only names the measurement: it runs on to the next
    assert br.first_clause(SANTURKAR_FIG8) == SANTURKAR_FIG8[:SANTURKAR_FIG8.index(
        "only); ") + 5]
    assert br.first_clause(SANTURKAR_FIG8).startswith("median drift of a sampled unit's")


def test_first_clause_keeps_short_or_undivided_summaries_whole(br):
    assert br.first_clause("held: 3/3 seeds; p=0.01") == "held: 3/3 seeds; p=0.01"
    undivided = "x (a; b) " * 40
    assert len(undivided) > br.SHORT_SUMMARY and br.first_clause(undivided) == undivided
    assert br.first_clause("") == ""


def test_first_clause_of_every_stored_row_is_a_balanced_prefix(br, snapshot):
    rows, _ = snapshot
    for row in rows:
        summary, clause = row["summary"], br.first_clause(row["summary"])
        assert clause and summary.startswith(clause), row["id"]
        assert clause == summary or summary[len(clause):].startswith("; "), row["id"]
        assert clause.count("(") == clause.count(")"), row["id"]
        assert any(c.isdigit() for c in clause), row["id"]
