"""Benchmark: forward+backward of every layer against torch's native BatchNorm, eager and compiled
(CPU).

    python benchmarks/norms.py [--pairs 15] [--threads 2] [--specs bn,cbn] [--quick] [--out PATH]
    python benchmarks/norms.py --threads 1 --clock cpu --modes eager   # on a loaded machine
    python benchmarks/norms.py --precisions fp32,bf16,fp16 --modes eager  # half inputs too

bnlab and native BN are timed alternately in one process (pairs, median of the per-pair ratios; see
benchmarks/timing.py), float32, training mode, on (128, 64, 32, 32) and on two small shapes where
dispatch dominates, (1000, 10) and (32, 16, 8, 8) (``--shapes``; compiled only on the first).
``--precisions fp16,bf16``: the input in that dtype (as a convolution under autocast hands it on),
the layer and native BN in float32 under autocast, the operation count of that step.
Columns: eager and ``torch.compile`` (inductor), both against *eager* native BN, and the number of
operations one training forward + backward dispatches (:mod:`bnlab.norms.tools.opcount`, views
excluded; "inside": counting the aten ops that bnlab's own operators run, about the kernel launches
on a GPU). ``noisy_bn`` is also compared with native BN plus the same noise in plain PyTorch (its
honest floor). Writes benchmarks/results/norms.json and prints Markdown tables. ``--quick``: tiny
shape, few pairs, dynamo's "eager" backend instead of inductor — seconds, for the test that checks
the script runs.

Goals (``goals``): eager BN family ≤ 1.3× native; every layer compiled ≤ 1.0× native eager;
``noisy_bn``, ``lp_bn``, ``si_bn``, ``wn`` eager ≤ 1.5× (the wrappers against their 1×1 conv +
native BN). ``goals_ops_and_small_shapes``: small shapes ≤ 1.3× native eager, (128, 64, 32, 32)
≤ 1.1×; ``noisy_bn`` ≤ 1.2× native BN + noise; ≤ 16 dispatched operations for the BN family, ≤ 24
for ``lp_bn``, ``noisy_bn``, ``si_bn``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import (AMP_DTYPES, BN_FAMILY, SPECS, Budget, NativeBNPlusNoise, fwd_bwd,
                    layer_table, measure, op_counts, run_header)

from bnlab.norms.engine import compiled_step
from bnlab.norms.engine.route import FUSED_MIN_NUMEL
from bnlab.norms.tools.bench import _layer

FULL_SHAPES, QUICK_SHAPE = [(128, 64, 32, 32), (1000, 10), (32, 16, 8, 8)], (8, 4, 4, 4)
EAGER_1_5 = ["noisy_bn", "lp_bn(p=1)", "lp_bn(p=inf)", "si_bn", "wn"]


def parse_specs(text: str, parser: argparse.ArgumentParser) -> list[str]:
    specs = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in specs if s not in SPECS]
    if unknown or not specs:
        parser.error(f"unknown layer(s) {', '.join(unknown) or '(none given)'}; valid: "
                     f"{', '.join(SPECS)}")
    return specs


def goals(rows: list[dict]) -> dict:
    """Each goal: the ratios it covers and whether every one meets it (False where a row has no
    ratio)."""
    by = {(r["spec"], r["mode"]): r.get("ratio") for r in rows if r["precision"] == "fp32"}

    def check(specs, mode, limit):
        ratios = {s: by.get((s, mode)) for s in specs}
        return {"limit": limit, "ratios": ratios,
                "met": all(v is not None and v <= limit for v in ratios.values())}

    return {"eager_bn_family_le_1.3": check(BN_FAMILY, "eager", 1.3),
            "compiled_every_layer_le_1.0": check(SPECS, "compiled", 1.0),
            "eager_others_le_1.5": check(EAGER_1_5, "eager", 1.5)}


def noise_yardstick(shape, pairs: int, inner: int, clock) -> dict:
    """noisy_bn against native BN + the same noise in plain PyTorch (its honest floor)."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    row = {"spec": "noisy_bn", "precision": "fp32", "mode": "eager", "shape": list(shape),
           "reference": "native_bn+noise eager"}
    row.update(measure(fwd_bwd(_layer("noisy_bn", shape), x),
                       fwd_bwd(NativeBNPlusNoise(shape[1]), x), pairs, inner, lambda: None, clock))
    return row


def side_by_side(rows: list[dict]) -> str:
    """The README table: one line per (shape, layer), eager and compiled ratios against eager native
    BN."""
    cells = {(tuple(r["shape"]), r["spec"], r["precision"], r["mode"],
              r["reference"].endswith("noise eager")): r for r in rows}

    def ratio(row):
        return f"{row['ratio']:.2f}" if row and "ratio" in row \
            else (row or {}).get("error", "–")[:40]

    lines = ["| shape | input | layer | reference | eager ms | reference ms | eager × | "
             "compiled × | compiled step × | ops | ops inside |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for shape, spec, precision, mode, noise in dict.fromkeys(k for k in cells
                                                             if k[3] == "eager"):
        eager = cells[(shape, spec, precision, mode, noise)]
        compiled, step = (cells.get((shape, spec, precision, other, noise))
                          for other in ("compiled", "compiled_step"))
        ms = f"{eager['ms']:.3f} | {eager['ref_ms']:.3f}" if "ms" in eager else "– | –"
        lines.append(f"| {'×'.join(map(str, shape))} | {precision} | `{spec}` | "
                     f"{eager['reference']} | {ms} | "
                     f"{ratio(eager)} | {ratio(compiled) if compiled else '–'} | "
                     f"{ratio(step) if step else '–'} | {eager.get('ops', '–')} | "
                     f"{eager.get('ops_inside', '–')} |")
    return "\n".join(lines)


def ops_and_small_shape_goals(rows: list[dict], shapes: list[tuple[int, ...]]) -> dict:
    """The ratio and operation-count goals where dispatch matters, each with the values it covers
    and whether all meet it. Small shapes: below ``FUSED_MIN_NUMEL`` elements (where dispatch
    dominates); the large goal and the operation counts read the largest shape run. The ratio goals
    read float32 inputs; the operation counts every precision run (half ones named
    ``spec@bf16``)."""
    largest = max(shapes, key=lambda s: torch.Size(s).numel())

    def name(r: dict) -> str:
        return f"{r['spec']}@{'x'.join(map(str, r['shape']))}"

    def small(r: dict) -> bool:
        return torch.Size(r["shape"]).numel() < FUSED_MIN_NUMEL

    def counted(r: dict) -> str:
        return r["spec"] if r["precision"] == "fp32" else f"{r['spec']}@{r['precision']}"

    every = [r for r in rows if r["mode"] == "eager" and not r["reference"].endswith("noise eager")]
    eager = [r for r in every if r["precision"] == "fp32"]
    at_largest = [r for r in eager if tuple(r["shape"]) == largest and not small(r)]
    counts_at_largest = [r for r in every if tuple(r["shape"]) == largest and not small(r)]
    # noisy_bn's small-shape yardstick is native BN + the same noise (the noise goal below)
    small_eager = {name(r): r.get("ratio") for r in eager if small(r) and r["spec"] != "noisy_bn"}
    # opt-in bnlab.norms.compiled_steps(); bn, noisy_bn, si_bn, wn do not take it (their eager
    # ratio stands)
    stepped = {name(r): r["ratio"] for r in rows if r["mode"] == "compiled_step" and small(r)
               and "ratio" in r and r["precision"] == "fp32"}
    large = {r["spec"]: r.get("ratio") for r in at_largest if r["spec"] in BN_FAMILY}
    noise = {"x".join(map(str, r["shape"])): r.get("ratio") for r in rows
             if r["reference"].endswith("noise eager")}
    ops16 = {counted(r): r.get("ops") for r in counts_at_largest if r["spec"] in BN_FAMILY}
    ops24 = {counted(r): r.get("ops") for r in counts_at_largest
             if r["spec"].startswith(("lp_bn", "noisy_bn", "si_bn"))}

    def check(values, limit):  # met: None where this run measured none of the values
        return {"limit": limit, "values": values, "met": None if not values else all(
            v is not None and v <= limit for v in values.values())}

    return {"small_shapes_eager_le_1.3": check(small_eager, 1.3),
            "small_shapes_with_compiled_steps_le_1.3": check({**small_eager, **stepped}, 1.3),
            "large_bn_family_eager_le_1.1": check(large, 1.1),
            "noisy_vs_native_plus_noise_le_1.2": check(noise, 1.2),
            "ops_bn_family_le_16": check(ops16, 16), "ops_lp_noisy_si_le_24": check(ops24, 24)}


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    return [tuple(int(d) for d in part.split("x")) for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2,
                        help="torch intra-op threads (the goals: 2)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny shape, 2 pairs, dynamo 'eager' backend")
    parser.add_argument("--specs", default=",".join(SPECS),
                        help="comma-separated subset of: " + ", ".join(SPECS))
    parser.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in FULL_SHAPES),
                        help="NxC[xHxW],...; compiled mode runs on the first only")
    parser.add_argument("--modes", default="eager,compiled,compiled_step",
                        help="a subset of eager,compiled,compiled_step (compiled: first shape "
                             "only)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: this thread's CPU time (use with --threads 1 on a loaded "
                             "machine)")
    parser.add_argument("--budget-s", type=float, default=1800,
                        help="compiles stop when this is spent")
    parser.add_argument("--compiled-step-max-numel", type=int, default=None,
                        help="override bnlab.norms.engine.compiled_step.MAX_NUMEL (to measure the "
                             "crossover with the fused path)")
    parser.add_argument("--precisions", default="fp32",
                        help="a subset of fp32,fp16,bf16 (half: the input in that dtype, under "
                             "autocast)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "norms.json"))
    args = parser.parse_args(argv)
    specs = parse_specs(args.specs, parser)
    precisions = [p for p in args.precisions.split(",") if p]
    if not precisions or any(p not in AMP_DTYPES for p in precisions):
        parser.error(f"--precisions {args.precisions!r}: valid values are {', '.join(AMP_DTYPES)}")
    if args.compiled_step_max_numel is not None:
        compiled_step.MAX_NUMEL = args.compiled_step_max_numel
    torch.set_num_threads(args.threads)
    shapes, pairs = ([QUICK_SHAPE], 2) if args.quick else (parse_shapes(args.shapes), args.pairs)
    backend = "eager" if args.quick else "inductor"
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    modes = [m for m in args.modes.split(",") if m]
    # other processes on the machine distort 2-thread timings: recorded
    load_before = os.getloadavg()[0]
    budget, rows = Budget(args.budget_s), []
    for i, shape in enumerate(shapes):
        # small shapes: several calls per timing
        inner = max(1, 2_000_000 // (4 * torch.Size(shape).numel()))
        table = layer_table(
            specs, shape, torch.device("cpu"), precisions,
            modes if i == 0 else [m for m in modes if m != "compiled"], pairs,
            budget, backend=backend, inner=inner, clock=clock,
            progress=lambda r: print(f"{r['spec']:<22}{r['mode']:<10}"
                                     f"{r.get('ratio', r.get('error') or r.get('skipped'))}",
                                     file=sys.stderr))
        counts = {(spec, p): op_counts(spec, shape, precision=p) for spec in specs
                  for p in precisions}
        for row in table:
            row.update(shape=list(shape), **(counts[row["spec"], row["precision"]]
                                             if row["mode"] == "eager" else {}))
        rows += table
        if "noisy_bn" in specs and "eager" in modes and "fp32" in precisions:
            rows.append(dict(noise_yardstick(shape, pairs, inner, clock),
                             **counts["noisy_bn", "fp32"]))
    result = {
        **run_header(f"norms forward+backward, training mode, {'/'.join(precisions)} inputs, "
                     "CPU; paired with native BN, median ratio", args.clock, load_before),
        "shapes": [list(s) for s in shapes], "pairs": pairs, "compile_backend": backend,
        "compiled_step_max_numel": compiled_step.MAX_NUMEL,
        "quick": args.quick,
        "precisions": precisions,
        "rows": rows, "goals": goals([r for r in rows if tuple(r["shape"]) == shapes[0]
                                      and not r["reference"].endswith("noise eager")]),
        "goals_ops_and_small_shapes": ops_and_small_shape_goals(rows, shapes),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(side_by_side(rows))
    return result


if __name__ == "__main__":
    main()
