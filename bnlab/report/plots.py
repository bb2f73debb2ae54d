"""Kept for old imports: the figure helpers live in :mod:`bnlab.plots` (below the catalogue, which
draws with them; the report sits above the catalogue and only re-exports them here)."""

from bnlab.plots import bars, histograms, panels

__all__ = ["bars", "histograms", "panels"]
