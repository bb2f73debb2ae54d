"""Analysis helpers shared by the catalogue entries (plots and tables from stored runs)."""

from __future__ import annotations

from pathlib import Path

from bnlab.report.plots import panels


def training_curves(ctx, path: Path, *, title: str, metrics=("train_loss", "train_accuracy", "test_accuracy"),
                    logy_loss: bool = False) -> Path:
    """One panel per metric, one curve per run label."""
    specs = []
    for metric in metrics:
        series = {r.label: r.series(metric) for r in ctx.runs}
        series = {k: v for k, v in series.items() if v[0]}
        specs.append({"series": series, "xlabel": "step", "ylabel": metric, "title": metric,
                      "logy": logy_loss and metric.endswith("loss")})
    return panels(path, specs, title=title)


def final_table(ctx, *, paper: dict[str, str] | None = None,
                metrics=("train_loss", "train_accuracy", "test_accuracy")) -> list[dict]:
    rows = []
    for r in ctx.runs:
        row = {"run": r.label, "status": r.status}
        for m in metrics:
            row[m] = r.final(m)
        if paper is not None:
            row["paper"] = paper.get(r.label, "—")
        rows.append(row)
    return rows
