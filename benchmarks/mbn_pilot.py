"""The pilot behind ``mbn-batch-size``'s design SDs: MBN, BN and BRN at M = 2 and M = 32 on the
smoke recipe, seeds the entry never judges (10, 11, 12), stored before the judged run.

The entry judges MBN's test-accuracy drop (acc at M = 32 − acc at M = 2) against BN's and BRN's
(bnlab/experiments/mbn/entries.py, DESIGNS). A design SD stated in advance must not come from the
runs it judges, so it comes from here: per comparison, the pooled SD of one seed's drop difference,
``SE_welch · sqrt(n / 2)`` at n seeds per arm. Writes benchmarks/results/mbn_pilot.json (dated,
with the commit). Usage: ``python benchmarks/mbn_pilot.py RUNS_DIR`` (about 3 minutes on one core).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from provenance import provenance

from bnlab import train
from bnlab.experiments.mbn.arms import lr_for
from bnlab.experiments.mbn.entries import _base

SEEDS = (10, 11, 12)  # disjoint from the entry's judged seeds (0, 1, 2)
ARMS = {"BN": "bn", "MBN": "mbn", "BRN": "brn"}
SIZES = (2, 32)
OUT = Path(__file__).resolve().parent / "results" / "mbn_pilot.json"


def accuracy(runs_dir: str, norm: str, m: int, seed: int) -> float:
    config = {**_base("smoke"), "norm": norm, "batch_size": m, "lr": lr_for(m), "seed": seed,
              "runs_dir": runs_dir}
    record = train.run(config)
    return float(record.metrics["test_accuracy"])


def main(runs_dir: str) -> dict:
    acc = {arm: {m: [accuracy(runs_dir, norm, m, s) for s in SEEDS] for m in SIZES}
           for arm, norm in ARMS.items()}
    drops = {arm: [a32 - a2 for a2, a32 in zip(acc[arm][2], acc[arm][32])] for arm in ARMS}
    n = len(SEEDS)
    comparisons = {}
    for other in ("BN", "BRN"):
        se = math.sqrt((statistics.variance(drops["MBN"]) + statistics.variance(drops[other])) / n)
        diff = statistics.mean(drops["MBN"]) - statistics.mean(drops[other])
        comparisons[f"MBN - {other}"] = {"mean_drop_difference": diff, "welch_se": se,
                                         "design_sd": se * math.sqrt(n / 2)}
    result = {**provenance(), "recipe": "mbn-batch-size smoke (mlp depth 3 width 64, digits, "
              "6 epochs, lr 0.1·M/32, momentum 0.9)", "seeds": list(SEEDS),
              "accuracy": {a: {str(m): v for m, v in d.items()} for a, d in acc.items()},
              "drops": drops, "comparisons": comparisons}
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])["comparisons"], indent=1))
