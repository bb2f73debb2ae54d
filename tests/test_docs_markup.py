"""The docs pages show no Markdown debris: a ``\\|`` inside a code span of a table cell is printed
as typed by the docs site (Python-Markdown keeps code spans verbatim), and a bare ``|`` there splits
the cell on GitHub, so table cells keep pipes out of their code spans; the rendered pages hold no
literal ``\\|``."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted([*(REPO / "docs").rglob("*.md"), REPO / "README.md"])
# the site's Markdown extensions that change how tables and code render (mkdocs.yml)
EXTENSIONS = ["tables", "attr_list", "md_in_html", "admonition", "pymdownx.superfences",
              "pymdownx.details"]


def _table_code_spans(text: str):
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        if not fenced and line.startswith("|"):
            for span in re.findall(r"`([^`]+)`", line):
                yield number, span


def test_no_pipe_inside_a_code_span_of_a_table_cell():
    found = [f"{page.relative_to(REPO)}:{number}: `{span}`" for page in PAGES
             for number, span in _table_code_spans(page.read_text()) if "|" in span]
    assert not found, found


def test_the_rule_catches_the_layers_page_as_it_was():
    old = "| `lp_bn(p=1\\|2\\|inf, topk)` | centre |"
    found = [span for _, span in _table_code_spans(old) if "|" in span]
    assert found == ["lp_bn(p=1\\|2\\|inf, topk)"]


def test_rendered_pages_show_no_escaped_pipe():
    markdown = pytest.importorskip("markdown")
    pytest.importorskip("pymdownx")
    for page in PAGES:
        html = markdown.markdown(page.read_text(), extensions=EXTENSIONS)
        assert "\\|" not in html, (page, html[max(html.index("\\|") - 80, 0):][:160])
    # the check sees what the site shows: the old Layers row rendered its backslashes
    old = "| spec | what |\n|---|---|\n| `lp_bn(p=1\\|2\\|inf, topk)` | centre |\n"
    assert "\\|" in markdown.markdown(old, extensions=EXTENSIONS)
