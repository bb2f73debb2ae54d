"""Benchmark: forward+backward of every layer against torch's native BatchNorm, eager and compiled (CPU).

    python benchmarks/norms.py [--pairs 15] [--threads 2] [--specs bn,cbn] [--quick] [--out PATH]

bnlab and native BN are timed alternately in one process (pairs, median of the per-pair ratios; see
benchmarks/timing.py) on (128, 64, 32, 32), float32, training mode. Columns: eager and
``torch.compile`` (inductor), both against *eager* native BN. Writes benchmarks/results/norms.json
and prints a Markdown table. ``--quick``: tiny shape, few pairs, dynamo's "eager" backend instead of
inductor — seconds, for the test that checks the script runs (its numbers mean nothing).

Goals (issue 9): eager BN family ≤ 1.3× native; every layer compiled ≤ 1.0× native eager;
``noisy_bn``, ``lp_bn``, ``si_bn``, ``wn`` eager ≤ 1.5× (the wrappers against their 1×1 conv + native BN).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import BN_FAMILY, SPECS, Budget, layer_table  # noqa: E402

FULL_SHAPE, QUICK_SHAPE = (128, 64, 32, 32), (8, 4, 4, 4)
EAGER_1_5 = ["noisy_bn", "lp_bn(p=1)", "lp_bn(p=inf)", "si_bn", "wn"]


def parse_specs(text: str, parser: argparse.ArgumentParser) -> list[str]:
    specs = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in specs if s not in SPECS]
    if unknown or not specs:
        parser.error(f"unknown layer(s) {', '.join(unknown) or '(none given)'}; valid: {', '.join(SPECS)}")
    return specs


def goals(rows: list[dict]) -> dict:
    """Each goal: the ratios it covers and whether every one meets it (False where a row has no ratio)."""
    by = {(r["spec"], r["mode"]): r.get("ratio") for r in rows}

    def check(specs, mode, limit):
        ratios = {s: by.get((s, mode)) for s in specs}
        return {"limit": limit, "ratios": ratios, "met": all(v is not None and v <= limit for v in ratios.values())}

    return {"eager_bn_family_le_1.3": check(BN_FAMILY, "eager", 1.3),
            "compiled_every_layer_le_1.0": check(SPECS, "compiled", 1.0),
            "eager_others_le_1.5": check(EAGER_1_5, "eager", 1.5)}


def side_by_side(rows: list[dict]) -> str:
    """The README table: one line per layer, eager and compiled ratios against eager native BN."""
    cells = {(r["spec"], r["mode"]): r for r in rows}

    def ratio(row):
        return f"{row['ratio']:.2f}" if row and "ratio" in row else (row or {}).get("error", "–")[:40]

    lines = ["| layer | reference | eager ms | reference ms | eager × | compiled × |", "|---|---|---:|---:|---:|---:|"]
    for spec in dict.fromkeys(r["spec"] for r in rows):
        eager, compiled = cells.get((spec, "eager")), cells.get((spec, "compiled"))
        ms = f"{eager['ms']:.1f} | {eager['ref_ms']:.1f}" if eager and "ms" in eager else "– | –"
        lines.append(f"| `{spec}` | {(eager or compiled)['reference']} | {ms} | {ratio(eager)} | {ratio(compiled)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (the goals: 2)")
    parser.add_argument("--quick", action="store_true", help="tiny shape, 2 pairs, dynamo 'eager' backend")
    parser.add_argument("--specs", default=",".join(SPECS), help="comma-separated subset of: " + ", ".join(SPECS))
    parser.add_argument("--budget-s", type=float, default=1800, help="compiles stop when this is spent")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "norms.json"))
    args = parser.parse_args(argv)
    specs = parse_specs(args.specs, parser)
    torch.set_num_threads(args.threads)
    shape, pairs = (QUICK_SHAPE, 2) if args.quick else (FULL_SHAPE, args.pairs)
    backend = "eager" if args.quick else "inductor"
    load_before = os.getloadavg()[0]  # other processes on the machine distort 2-thread timings: recorded
    rows = layer_table(specs, shape, torch.device("cpu"), ["fp32"], ["eager", "compiled"], pairs,
                       Budget(args.budget_s), backend=backend,
                       progress=lambda r: print(f"{r['spec']:<22}{r['mode']:<10}"
                                                f"{r.get('ratio', r.get('error') or r.get('skipped'))}",
                                                file=sys.stderr))
    result = {
        "benchmark": "norms forward+backward, training mode, float32, CPU; paired with native BN, median ratio",
        "torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
        "shape": list(shape), "pairs": pairs, "compile_backend": backend, "quick": args.quick,
        "load_average_1min": {"start": load_before, "end": os.getloadavg()[0], "cpus": os.cpu_count()},
        "rows": rows, "goals": goals(rows),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(side_by_side(rows))
    return result


if __name__ == "__main__":
    main()
