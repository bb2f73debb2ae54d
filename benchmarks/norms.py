"""Benchmark: forward+backward time of every layer vs torch's native BatchNorm (CPU, float32).

    python benchmarks/norms.py [--repeats 20] [--threads N]

Writes benchmarks/results/norms.json and prints the Markdown table used in the README.
Goal (issue 2): bn, mean_only_bn, var_only_bn, mbn, cbn, brn within 1.5× of native on (128, 64, 32, 32).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

from bnlab.norms.bench import benchmark, format_table

GOAL_SPECS = ["bn", "mean_only_bn", "var_only_bn", "mbn", "cbn", "brn"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "norms.json"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = benchmark([(128, 64, 32, 32), (1000, 10)], repeats=args.repeats,
                     progress=lambda r: print(f"{r['spec']:<22}{r['shape']}  {r['ratio_to_native']:.2f}x", file=sys.stderr))
    conv = {r["spec"]: r["ratio_to_native"] for r in rows if r["shape"] == [128, 64, 32, 32]}
    goal = {s: {"ratio": conv[s], "within_1.5x": conv[s] <= 1.5} for s in GOAL_SPECS}
    result = {
        "benchmark": "norms forward+backward, training mode, float32, CPU",
        "torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
        "processor": platform.processor(), "repeats": args.repeats, "rows": rows, "goal_conv_shape": goal,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(format_table(rows))


if __name__ == "__main__":
    main()
