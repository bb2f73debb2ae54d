"""The project speaks of itself as it is today: no numbered work period or issue number of bnlab's
own in any tracked file (code, tests, docs, benchmarks, results, CHANGELOG.md) or file name. When
something was measured is a date and a commit; what changed lives in CHANGELOG.md by version.
Other projects' trackers (``pytorch#46516``, ``Lightning#17446``) are references, not history.
"""

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# a work period ("session N", "sessions N–M", "the session-N run", "sessionN_a.json"), an issue
# number ("issue N", "Issues N–M", "(issue #N)") or one folded into a name ("_sN_", "_issueN");
# the examples the tests below use are split into pieces so that this file passes its own scan
HISTORY = re.compile(r"\bsessions?[ _-]?[0-9]+|\bissues?[ _-]?#?[0-9]+|_s[0-9]+[_.]|_issue[0-9]+",
                     re.I)
UPSTREAM = re.compile(r"(pytorch|torch|lightning|numpy|scipy|python|github\.com/[\w.-]+/[\w.-]+)"
                      r"[^\n]{0,24}$", re.I)


def tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [p for p in out.stdout.decode().split("\0") if p]


def history_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of each line that dates itself by a work period or issue number
    (an upstream project's issue, named just before it, is allowed)."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in HISTORY.finditer(line):
            if not UPSTREAM.search(line[:match.start()]):
                found.append((number, line.strip()[:160]))
                break
    return found


def read_text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None  # binary
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_no_tracked_file_is_named_by_a_work_period_or_an_issue():
    named = [p for p in tracked() if HISTORY.search(Path(p).name)]
    assert not named, "rename by what it measures or does:\n" + "\n".join(named)


def test_no_tracked_text_dates_itself_by_a_work_period_or_an_issue():
    hits = []
    for rel in tracked():
        path = REPO / rel
        text = read_text(path) if path.is_file() else None
        hits += [f"{rel}:{n}: {line}" for n, line in history_lines(text or "")]
    assert not hits, f"{len(hits)} lines:\n" + "\n".join(hits)


@pytest.mark.parametrize("line", [
    "Measured in sess" "ion 14 on a quiet machine", "the sess" "ion-4 catalogue run",
    "(iss" "ue 18, item 4)", "Iss" "ues 9–13: layers", "benchmarks/results/norms_s" "17_half.json",
    "train_iss" "ue18.json", "docs/recheck/sess" "ion13_a.json"])
def test_history_is_found(line):
    assert history_lines(line) == [(1, line)]


@pytest.mark.parametrize("line", [
    "fixed upstream (pytorch#46516)", "see Lightning iss" "ue #17446",
    "measured 2026-11-29 at a07692e", "benchmarks/results/norms_small_shapes.json",
    "torch.set_num_threads(1)", "the sessions table"])
def test_upstream_references_and_dates_are_not_history(line):
    assert history_lines(line) == []
