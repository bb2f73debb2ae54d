"""`bnlab demo`: the main job on embedded data.

Until the experiment catalogue lands, the demo exercises every layer end to end: it builds each one
from its spec, runs forward+backward against torch's native BatchNorm on small shapes and prints the
timing table.
"""

from __future__ import annotations

import typer


def demo(repeats: int = typer.Option(5, help="timed repetitions per layer")) -> None:
    """Run the main demo on embedded data (CPU, a few minutes at most)."""
    from bnlab.norms.bench import benchmark, format_table

    rows = benchmark([(64, 16, 16, 16), (256, 10)], repeats=repeats)
    typer.echo(format_table(rows))


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
