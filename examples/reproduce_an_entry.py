"""Reproduce a catalogue entry and read its verdict, from Python (the CLI is one line, below).

    bnlab reproduce luo-fig2 --preset smoke --runs-dir runs    # the same from the shell
    python examples/reproduce_an_entry.py [RUNS_DIR]             # the smoke preset (seconds)
    BNLAB_EXAMPLE_QUICK=1 python examples/reproduce_an_entry.py  # --tiny: a wiring check

luo-fig2 is Luo et al., *Towards Understanding Regularization in Batch Normalization* (ICLR 2019,
arXiv:1809.00846), Fig. 2: the generalization error of a teacher-student perceptron trained with BN
against the closed form for weight decay ζ. The entry's runs and computations go to RUNS_DIR's
store; the analysis draws the figure from the store alone, so `bnlab report` can redraw it at any
time. A tiny run is too short to decide the claim: its verdict is "inconclusive" by design.
"""

import os
import sys
import tempfile
from pathlib import Path

from bnlab.experiments import get, reproduce
from bnlab.report import write_report

QUICK = os.environ.get("BNLAB_EXAMPLE_QUICK") == "1"


def main(runs_dir: Path) -> None:
    entry = get("luo-fig2")
    print(f"{entry.id}: {entry.target} — {entry.claim}")
    outcome = reproduce(entry.id, "smoke", runs_dir=runs_dir, tiny=QUICK, report=False,
                        progress=False)
    print(f"verdict: {outcome.verdict} — {outcome.summary}")
    for row in outcome.table:
        print(f"  {row['quantity']}: ours {row['ours']}, paper {row['paper']}")
    print("figures:", ", ".join(str(f) for f in outcome.figures))
    print("report:", write_report(runs_dir))   # the whole store's report, rebuilt without training


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
