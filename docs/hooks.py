"""MkDocs hook: Sphinx cross-reference roles in docstrings (``:func:`x```) rendered as plain code.

The API pages come from the docstrings (mkdocstrings, sphinx style), which name functions with
Sphinx roles; the Markdown renderer keeps the role's text, so pages showed ``:func:`` before a name.
"""

from __future__ import annotations

import re

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):(?=<code>)")
ROLE_TEXT = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):`~?([^`]+)`")


def on_page_markdown(markdown: str, **kwargs) -> str:
    return ROLE_TEXT.sub(r"`\1`", markdown)


def on_page_content(html: str, **kwargs) -> str:
    return ROLE.sub("", html)
