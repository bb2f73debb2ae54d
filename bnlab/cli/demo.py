"""`bnlab demo`: the main job on embedded data.

Runs a curated set of smoke-preset catalogue entries covering all five papers (digits, Gaussian
regression, teacher–student and closed forms) and writes the report to ``runs/report/index.html``.
The entries are chosen for cost: the Peng tables' and Santurkar's VGG smoke presets take 5–12
minutes each on their own (``bnlab reproduce ID``). ``--layers`` instead prints the layer timing
table on small shapes.

All entries' runs go to one sweep (:func:`bnlab.experiments.runner.reproduce_many`): as many worker
processes as there are free cores, one torch thread each, a progress bar (or lines) with an ETA;
the numbers do not depend on the worker count.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer

from bnlab.experiments.parallel import free_cores
from bnlab.experiments.runner import reproduce_many
from bnlab.norms.tools.bench import benchmark, format_table
from bnlab.report import write_report
from bnlab.report.headline import answer_lines

DEMO_ENTRIES = [
    "santurkar-fig8",  # 25-layer DLN: standard vs BN (activation drift), 3 seeds
    "luo-fig2",  # generalization error vs α: theory and BN simulation
    "luo-table2",  # fixed points, η_max, η_eff against the ODE and simulation
    "peng-fig2",  # η_k, τ_k distributions (ResNet-20, Eq. 7 block)
    "peng-eq14",  # BN before ReLU as ℓ2 normalization with ρ = √2
    "peng-thm1",  # the convergence bound of SGD and its three effects
    "arora-rates",  # GD/SGD convergence rates for any lr of the scale-invariant weights
    "mbn-batch-size",  # BN vs MBN at small batch, and the data-parallel arms
    "mbn-theorems",  # the batch statistics' noise and MBN's moving statistics
]
# Left out for cost (each alone with `bnlab reproduce ID`): luo-fig4 (10 seeds × 5 arms, ≈4.5 min)
# and arora-d1 (30 runs × 100 epochs, ≈2 min): smoke presets sized to resolve their claims.


def demo(
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="store, checkpoints and report"),
    layers: bool = typer.Option(False, "--layers", help="only print the layer timing table"),
    tiny: bool = typer.Option(False, "--tiny", help="a few steps per run (a wiring check)"),
    workers: int = typer.Option(
        None,
        "--workers",
        min=1,
        help="worker processes (default: the free cores; numbers do not depend on it)",
    ),
) -> None:
    """Run the curated smoke entries of all five papers and write the report."""
    if layers:
        typer.echo(format_table(benchmark([(64, 16, 16, 16), (256, 10)], repeats=5)))
        return
    count = workers or free_cores()
    typer.echo(
        f"demo: {len(DEMO_ENTRIES)} entries, {count} worker process(es) × 1 thread", err=True
    )
    start = time.perf_counter()
    outcomes = list(reproduce_many(
        DEMO_ENTRIES, "smoke", runs_dir=runs_dir, tiny=tiny, progress=True, workers=count
    ))
    report = write_report(runs_dir)
    typer.echo(f"demo: {time.perf_counter() - start:.0f} s wall", err=True)
    typer.echo(f"report: {report}")
    # the answer last, one line per entry; the whole summaries are in the report
    for line in answer_lines([(i, "smoke", outcome) for i, outcome in outcomes], report):
        typer.echo(line)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
