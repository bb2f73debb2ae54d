"""Draw docs/figures/architecture.png: bnlab's packages in their import layers.

    python docs/architecture_figure.py

The layers are the ones ``tests/test_layering.py`` enforces (a test holds the two lists equal): a
module imports from its own layer or a lower one, never a higher one, and within a layer without
cycles.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

OUT = Path(__file__).resolve().parent / "figures" / "architecture.png"

# Bottom to top: (layer, [(package, what it holds)]).
LAYERS: list[tuple[str, list[tuple[str, str]]]] = [
    ("foundation", [("bnlab.spec", "specs, registries, params"),
                    ("bnlab.callbacks", "the one callback protocol"),
                    ("bnlab.plots", "figure helpers"), ("bnlab.jsonsafe", "JSON of numbers"),
                    ("bnlab.formatting", "numbers as text")]),
    ("norms", [("bnlab.norms",
                "the layers: one coefficients function each, fused ops, convert / fold")]),
    ("models", [("bnlab.models",
                 "ResNet-20, VGGs, MLP, DLN; torchvision / timm with bnlab layers")]),
    ("data", [("bnlab.data", "digits, CIFAR, image folders, synthetic tasks; batching")]),
    ("train/probes/theory/store", [("bnlab.train", "engine: config, loop"),
                                   ("bnlab.probes", "a quantity per callback"),
                                   ("bnlab.theory", "the papers' formulas"),
                                   ("bnlab.store", "run store (SQLite)"),
                                   ("bnlab.integrations", "Lightning, timm adapters"),
                                   ("bnlab.plugins", "register your own")]),
    ("doctor", [("bnlab.doctor", "a BN network's checkup and watcher: seven findings")]),
    ("experiments", [
        ("bnlab.experiments", "catalogue: one package per paper, verdicts.py decides")]),
    ("report", [("bnlab.report", "HTML report and figures from the store")]),
    ("cli", [("bnlab.cli", "every command (bnlab train, reproduce, demo, runs, ...)")]),
]

COLOURS = ["#e8eef7", "#dcebdc", "#f6eadb", "#f3e0e6", "#e6e1f3", "#f7e3d3", "#fbf5d6", "#e0f0f0",
           "#eeeeee"]


def draw(path: Path = OUT) -> Path:
    fig, ax = plt.subplots(figsize=(12.5, 7.2))
    ax.set_xlim(0, 12.5)
    ax.set_ylim(0, len(LAYERS) + 0.4)
    ax.axis("off")
    for row, ((layer, packages), colour) in enumerate(zip(LAYERS, COLOURS)):
        y = row + 0.2
        ax.text(0.1, y + 0.4, layer.replace("/", " / ").replace("theory / ", "theory /\n"),
                fontsize=9, va="center", ha="left", style="italic", color="#444444")
        width = 9.9 / len(packages)
        for i, (package, text) in enumerate(packages):
            x = 2.5 + i * width
            ax.add_patch(FancyBboxPatch((x + 0.05, y + 0.08), width - 0.1, 0.66,
                                        boxstyle="round,pad=0.02", facecolor=colour,
                                        edgecolor="#555555", linewidth=0.8))
            ax.text(x + width / 2, y + 0.55, package, fontsize=9, ha="center",
                    va="center", weight="bold")
            ax.text(x + width / 2, y + 0.28, text, fontsize=7 if len(packages) > 2 else 8,
                    ha="center", va="center", wrap=True)
    ax.add_patch(FancyArrowPatch((2.3, len(LAYERS) - 0.1), (2.3, 0.4), arrowstyle="-|>",
                                 mutation_scale=14, color="#333333"))
    ax.text(2.15, len(LAYERS) / 2, "imports go down only", rotation=90, fontsize=8,
            ha="center", va="center")
    ax.set_title("bnlab's packages by layer (enforced by tests/test_layering.py)", fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


if __name__ == "__main__":
    print(draw())
