"""`bnlab demo`: the main job on embedded data.

Runs a curated set of smoke-preset catalogue entries covering all five papers (digits, Gaussian
regression, teacher–student and closed forms) and writes the report to ``runs/report/index.html``.
The entries are chosen for cost: the Peng tables' and Santurkar's VGG smoke presets take 5–12
minutes each on their own (``bnlab reproduce ID``). ``--layers`` instead prints the layer timing
table on small shapes.
"""

from __future__ import annotations

from pathlib import Path

import typer

from bnlab.experiments.runner import reproduce
from bnlab.norms.bench import benchmark, format_table
from bnlab.report import write_report

DEMO_ENTRIES = [
    "santurkar-fig8",   # 25-layer DLN: standard vs BN (activation drift), 3 seeds
    "luo-fig2",         # generalization error vs α: theory and BN simulation
    "luo-table2",       # fixed points, η_max, η_eff against the ODE and simulation
    "luo-fig4",         # SGD, BN, WN, WN + mean-only / variance-only BN
    "peng-fig2",        # η_k, τ_k distributions (ResNet-20, Eq. 7 block)
    "arora-d1",         # SGD vs projected SGD over learning rates (BN on the logits), 3 seeds
    "mbn-batch-size",   # BN vs MBN at small batch, and the data-parallel arms
]


def demo(
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="store, checkpoints and report"),
    layers: bool = typer.Option(False, "--layers", help="only print the layer timing table"),
    tiny: bool = typer.Option(False, "--tiny", help="a few steps per run (a wiring check)"),
) -> None:
    """Run the curated smoke entries of all five papers and write the report."""
    if layers:
        typer.echo(format_table(benchmark([(64, 16, 16, 16), (256, 10)], repeats=5)))
        return
    for i, experiment_id in enumerate(DEMO_ENTRIES, 1):
        typer.echo(f"[{i}/{len(DEMO_ENTRIES)}] {experiment_id} ...", err=True)
        outcome = reproduce(experiment_id, "smoke", runs_dir=runs_dir, tiny=tiny, report=False)
        typer.echo(f"{experiment_id}: {outcome.verdict} — {outcome.summary}")
    typer.echo(f"report: {write_report(runs_dir)}")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
