"""Small matplotlib helpers the catalogue entries draw with (Agg backend; PNG files).

Each PNG carries, in a text chunk, a key of what drew it: the function, its arguments (every data
value) and this module's code and matplotlib's version. A figure whose file already holds the key
it would be drawn with is not drawn again: a report re-written over an unchanged store draws
nothing (drawing and laying out was ≈ 43 of a 36-entry report's 63 s). Arguments that cannot be
written out exactly (anything but numbers, strings, None, sequences, mappings and arrays/tensors)
give no key, and the figure is always drawn: a cache that can miss, never one that can be stale.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

Series = tuple[Sequence[float], Sequence[float]]

# Axis names for the metrics the engine records (entries often pass a metric's name as the label).
READABLE = {
    "epoch_train_loss": "training loss (epoch mean)",
    "epoch_train_accuracy": "training accuracy (epoch mean)",
    "train_loss": "training loss",
    "train_accuracy": "training accuracy",
    "test_loss": "test loss",
    "test_accuracy": "test accuracy",
    "lr": "learning rate",
    "step": "step",
    "epoch": "epoch",
}


def readable(label: str) -> str:
    """An axis name for people: a recorded metric's name spelled out (``epoch_train_loss`` →
    ``training loss (epoch mean)``), any other snake_case identifier with spaces; text is kept."""
    if label in READABLE:
        return READABLE[label]
    if label and " " not in label and "_" in label and label.replace("_", "").isalnum():
        return label.replace("_", " ")
    return label


def _legend(ax, entries: int) -> None:
    """The legend beside the axes (never over a curve); in columns when it is long."""
    ax.legend(
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
        frameon=False,
        ncol=1 if entries <= 12 else 2,
    )


FIGURE_KEY = "bnlab-figure-key"  # the PNG text chunk holding what drew the figure
_CODE = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16] + "/" + matplotlib.__version__


def _plain(obj: Any) -> Any:
    """JSON for what ``json`` does not write itself: arrays and tensors (``tolist``), mappings,
    paths; anything else is refused (no key: the figure is drawn)."""
    if callable(getattr(obj, "tolist", None)):
        return obj.tolist()
    if isinstance(obj, Mapping):
        return dict(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"no exact text for {type(obj).__name__}")


def figure_key(kind: str, *args: Any) -> str | None:
    """The key of a figure drawn by ``kind`` from ``args`` (None: some argument has no exact
    text)."""
    try:
        # insertion order kept: the order of series sets their colours and legend
        text = json.dumps([kind, _CODE, args], default=_plain, allow_nan=True)
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def is_current(path: Path, key: str | None) -> bool:
    """Whether ``path`` is a PNG this module wrote with ``key`` (then it is not drawn again)."""
    if key is None or not Path(path).is_file():
        return False
    from PIL import Image

    try:
        with Image.open(path) as image:
            return getattr(image, "text", {}).get(FIGURE_KEY) == key
    except (OSError, ValueError, SyntaxError):  # unreadable, truncated or not a PNG: redraw
        return False


def _save(fig, path: Path, title: str | None = None, key: str | None = None) -> Path:
    """Title, lay out (constrained: legends outside the axes keep their room), write the PNG
    (creating its folder; written beside and renamed, so a killed process never leaves a file
    that holds its key but not its image), record ``key`` in it and free the figure."""
    if title:
        fig.suptitle(title, fontsize=11)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    kind = path.suffix.lstrip(".").lower() or "png"  # the name's format (svg, pdf: no key kept)
    try:
        fig.savefig(partial, dpi=110, format=kind,
                    metadata={FIGURE_KEY: key} if key is not None and kind == "png" else None)
        os.replace(partial, path)
    finally:
        plt.close(fig)
        partial.unlink(missing_ok=True)
    return path


def _finite(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    pairs = [(x, y) for x, y in zip(xs, ys) if y is not None and math.isfinite(y)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def panels(
    path: Path, panels: Sequence[Mapping], *, title: str | None = None, ncols: int | None = None
) -> Path:
    """Draw several line panels side by side.

    Each panel: ``{"series": {label: (x, y)}, "xlabel", "ylabel", "title", "logy": bool, "logx":
    bool, "band": {label: (x, lo, hi)}, "hline": value, "ylim": (lo, hi)}`` (``ylim`` clips the
    y-axis: say so in the title). Axis names go through :func:`readable`; each legend sits beside
    its panel. Not drawn again if ``path`` holds this very figure (:func:`is_current`).
    """
    key = figure_key("panels", panels, title, ncols)
    if is_current(path, key):
        return Path(path)
    return _save(panel_figure(panels, ncols=ncols), path, title, key)


def panel_figure(panels: Sequence[Mapping], *, ncols: int | None = None):
    """The figure :func:`panels` writes (for tests and notebooks); the caller closes it."""
    n = len(panels)
    ncols = ncols or min(n, 3)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(5.6 * ncols, 3.3 * nrows), squeeze=False, layout="constrained"
    )
    for ax, spec in zip(axes.flat, panels):
        for label, (xs, ys) in spec.get("series", {}).items():
            xs, ys = _finite(xs, ys)
            style = spec.get("style", {}).get(label, {})
            if len(xs) == 1 or spec.get("markers"):
                ax.plot(xs, ys, marker="o", ms=3, label=label, **style)
            else:
                ax.plot(xs, ys, label=label, **style)
        for label, (xs, lo, hi) in spec.get("band", {}).items():
            ax.fill_between(xs, lo, hi, alpha=0.25, label=label)
        if spec.get("hline") is not None:
            ax.axhline(spec["hline"], color="k", lw=0.8, ls="--")
        if spec.get("logy"):
            ax.set_yscale("log")
        if spec.get("logx"):
            ax.set_xscale("log")
        if spec.get("ylim") is not None:
            ax.set_ylim(*spec["ylim"])
        ax.set_xlabel(readable(spec.get("xlabel", "")))
        ax.set_ylabel(readable(spec.get("ylabel", "")))
        ax.set_title(spec.get("title", ""), fontsize=10)
        if spec.get("series") or spec.get("band"):
            _legend(ax, len(spec.get("series", {})) + len(spec.get("band", {})))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    return fig


def histograms(
    path: Path,
    groups: Mapping[str, Mapping[str, Sequence[float]]],
    *,
    title: str | None = None,
    bins: int = 40,
    xlabel: str = "activation",
) -> Path:
    """One panel per group, overlaid histograms of its samples (e.g. one per training step)."""
    key = figure_key("histograms", groups, title, bins, xlabel)
    if is_current(path, key):
        return Path(path)
    n = len(groups)
    fig, axes = plt.subplots(1, n, figsize=(5.6 * n, 3.3), squeeze=False, layout="constrained")
    for ax, (name, hists) in zip(axes.flat, groups.items()):
        for label, values in hists.items():
            vals = [v for v in values if v is not None and math.isfinite(v)]
            if vals:
                ax.hist(vals, bins=bins, histtype="step", density=True, label=label)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(readable(xlabel))
        _legend(ax, len(hists))
    return _save(fig, path, title, key)


def bars(
    path: Path,
    groups: Mapping[str, Mapping[str, float]],
    *,
    ylabel: str,
    title: str | None = None,
    errors: Mapping[str, Mapping[str, float]] | None = None,
) -> Path:
    """Grouped bar chart: groups on the x axis (e.g. activations), one bar per series (e.g.
    method)."""
    key = figure_key("bars", groups, ylabel, title, errors)
    if is_current(path, key):
        return Path(path)
    names = list(groups)
    series = list(dict.fromkeys(s for g in groups.values() for s in g))  # first-seen order
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(
        figsize=(max(5, 1.3 * len(names) * max(1, len(series) / 3)) + 1.5, 3.5),
        layout="constrained",
    )
    for i, s in enumerate(series):
        xs = [j + i * width for j in range(len(names))]
        ys = [groups[g].get(s, float("nan")) for g in names]
        err = [errors[g].get(s, 0.0) for g in names] if errors else None
        ax.bar(xs, ys, width, label=s, yerr=err)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names)
    ax.set_ylabel(readable(ylabel))
    if title:
        ax.set_title(title, fontsize=10)
    _legend(ax, len(series))
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path, key=key)
