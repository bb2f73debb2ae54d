"""The answer first: an outcome's verdict, our number beside the paper's and one short clause, read
from its summary (``headline``), for the README's verdict table (``docs/build_readme.py``) and the
last lines of ``bnlab demo`` and ``bnlab reproduce`` (``answer_lines``), each pointing to where the
full evidence is."""

from __future__ import annotations

import re
from pathlib import Path

# A summary this short is its own primary comparison (``first_clause``).
SHORT_SUMMARY = 200


def first_clause(summary: str) -> str:
    """The primary comparison of an outcome's summary: the summary up to its first ``"; "`` outside
    brackets. A clause without a digit only names what is measured ("median drift …, per seed"),
    so it runs on to the next clause; a summary of at most ``SHORT_SUMMARY`` characters is whole."""
    if len(summary) <= SHORT_SUMMARY:
        return summary
    depth, start = 0, 0
    for i, char in enumerate(summary):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(depth - 1, 0)
        elif depth == 0 and summary.startswith("; ", i):
            if any(c.isdigit() for c in summary[start:i]):
                return summary[:i]
            start = i + 2
    return summary


# ``headline``'s patterns, tried in order on the summary (numbers as the analyses print them).
_NUM = r"[+\-−]?\d[\d.]*(?:e[+\-]?\d+)?"
_PARENS = r"\((?:[^()]|\([^()]*\))*\)"  # one bracketed group, one level of nesting inside
_HEADLINES = (
    # a Design's primary: "<quantity> -23.5 pt ± 1.4 (SE; …, p=…, n=5/5) vs the paper's +6.08 pt"
    re.compile(rf"(?P<ours>{_NUM}(?: \w+)? ± {_NUM}(?: (?:pt|dex|points))?) (?P<stats>{_PARENS}) "
               r"vs the paper's (?P<paper>[^;]+)"),
    # a per-panel comparison with the paper's number in brackets: "+12.4 ± 16 (SE; …) [paper +18]"
    re.compile(rf"(?P<ours>{_NUM} ± {_NUM}) (?P<stats>{_PARENS}) \[paper (?P<paper>{_NUM})\]"),
    # a fitted number beside the paper's: "ζ_BN = 0.0202 (paper: 0.014; …"
    re.compile(rf"= (?P<ours>{_NUM}) \(paper: (?P<paper>{_NUM})"),
    # a number against a stated value: "= 1.422 (10–90 %: …) vs √2 = 1.414, …"
    re.compile(rf"= (?P<ours>{_NUM})(?: {_PARENS})? vs (?P<paper>[^,;]+)"),
    # a bound: "= 0.247 (≤ 1 required)"
    re.compile(rf"= (?P<ours>{_NUM}) \((?P<paper>[≤≥<>] ?{_NUM}) required\)"),
)
# The README's clause: at most this many characters (bracketed asides dropped first).
CLAUSE_CHARS = 130


def headline(summary: str) -> dict[str, str]:
    """Our number, the paper's and one short clause for the README's row, read from an outcome's
    summary: the first of ``_HEADLINES`` found (the primary's "vs the paper's" anywhere in the
    summary, the others in ``first_clause(summary)``) gives ``ours`` and ``paper``, and the clause
    is what the summary measures there (the clause before our number, with the test's p and n
    when it states them). A summary that matches none (several numbers, none of them the paper's)
    falls back to ``"—"`` for both and its first clause, shortened (``shorten``)."""
    clause = first_clause(summary)
    for i, pattern in enumerate(_HEADLINES):
        text = summary if i == 0 else clause
        match = pattern.search(text)
        if match is None:
            continue
        what = _last_clause(text[:match.start()]).strip(" :=;,")
        stats = re.findall(r"\b([pn]=[^,;)]+)", match.groupdict().get("stats") or "")
        what = shorten(what or clause, CLAUSE_CHARS - 20)
        return {"ours": match["ours"], "paper": match["paper"].strip(),
                "clause": what + (f" ({', '.join(stats)})" if stats else "")}
    return {"ours": "—", "paper": "—", "clause": shorten(clause, CLAUSE_CHARS)}


def _last_clause(text: str) -> str:
    """What follows the last ``"; "`` outside brackets in ``text`` (all of it when none)."""
    depth, start = 0, 0
    for i, char in enumerate(text):
        depth += char in "([{"
        depth -= char in ")]}" and depth > 0
        if depth == 0 and text.startswith("; ", i):
            start = i + 2
    return text[start:]


def shorten(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters: bracketed asides dropped from the last one back,
    then cut at a word boundary (never inside brackets) with "…"."""
    text = " ".join(text.split())
    while len(text) > limit:
        groups = list(re.finditer(rf" ?{_PARENS}", text))
        if not groups:
            break
        text = text[:groups[-1].start()] + text[groups[-1].end():]
    if len(text) <= limit:
        return text
    cut, depth = 0, 0
    for i, char in enumerate(text[:limit]):
        depth += char in "([{"
        depth -= char in ")]}" and depth > 0
        if char == " " and depth == 0:
            cut = i
    return text[:cut or limit - 1].rstrip(" ,;:") + " …"


def _numbers(outcome) -> str:
    """Ours against the paper's: the summary's primary (``headline``), else the first row of the
    outcome's table that has both (named as one of its rows), else the summary's short clause."""
    head = headline(outcome.summary)
    if head["ours"] != "—":
        return f"ours {head['ours']} vs the paper's {head['paper']}"
    rows = [r for r in outcome.table or [] if r.get("ours") not in (None, "", "—")
            and r.get("paper") not in (None, "", "—", "-")]
    if not rows:
        return shorten(head["clause"], 70)
    row = rows[0]
    of = f" (row 1 of {len(outcome.table)})" if len(outcome.table) > 1 else ""
    return shorten(f"{row.get('quantity', '')}: ours {row['ours']} vs the paper's "
                   f"{row['paper']}", 90) + of


def answer_lines(results: list[tuple[str, str, object]], report: Path | str) -> list[str]:
    """One line per ``(id, preset, outcome)``: the verdict, our number against the paper's
    (``_numbers``) and the report section with the full evidence (``report`` + ``#id-preset``,
    the report's anchors). An outcome that is an exception is an ``error`` line naming it."""
    width = max((len(i) for i, _, _ in results), default=0)
    lines = []
    for experiment_id, preset, outcome in results:
        where = f"{report}#{experiment_id}-{preset}"
        if isinstance(outcome, BaseException):
            verdict, said = "error", shorten(f"{type(outcome).__name__}: {outcome}", 70)
        else:
            verdict, said = outcome.verdict, _numbers(outcome)
        lines.append(f"{experiment_id:<{width}}  {verdict:<12}  {said}  → {where}")
    return lines
