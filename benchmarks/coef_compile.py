"""Benchmark: the fused path with compiled per-channel coefficients against eager ones.

    python benchmarks/coef_compile.py [--specs bn,cbn] [--shapes 1000x10,32x16x8x8] [--pairs 11]

One training forward + backward, float32, 1 thread, timed by this thread's CPU time (the machine
is shared), four arms alternated in one process (pair i runs them forwards when i is even,
backwards when odd; median of the per-pair ratios to native BN): native ``nn.BatchNorm``; the
layer's plain-autograd path; the fused operators with eager coefficients; the fused operators with
compiled coefficients (``BNLAB_COMPILE_COEFFICIENTS=1``, inductor). Also the one-time compile cost
(wall clock, first step) and the operations counted inside bnlab's operators
(``count_ops(..., inside=True)``) on (32, 64, 16, 16).
Writes benchmarks/results/norms_coef_compile.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import provenance

import bnlab.norms.engine.route as norms_route
from bnlab.norms.tools.bench import _layer
from bnlab.norms.tools.opcount import count_ops, training_step

ARMS = {"plain": ("0", 1 << 62), "fused": ("0", 0), "fused+compiled": ("1", 0)}


def arm(spec: str, shape, policy: str, min_numel: int):
    torch.manual_seed(0)
    step = training_step(_layer(spec, shape), shape)

    def run() -> None:
        os.environ["BNLAB_COMPILE_COEFFICIENTS"], norms_route.FUSED_MIN_NUMEL = policy, min_numel
        step()

    start = time.perf_counter()
    run()
    return run, time.perf_counter() - start


def compare(spec: str, shape, pairs: int, inner: int) -> dict:
    arms, first = {"native": arm("native_bn", shape, "0", 0)[0]}, {}
    for name, (policy, min_numel) in ARMS.items():
        arms[name], first[name] = arm(spec, shape, policy, min_numel)
    for fn in arms.values():
        for _ in range(5):
            fn()
    times: dict[str, list[float]] = {k: [] for k in arms}
    for i in range(pairs):
        for name, fn in list(arms.items()) if i % 2 == 0 else list(reversed(arms.items())):
            start = time.thread_time()
            for _ in range(inner):
                fn()
            times[name].append((time.thread_time() - start) / inner * 1e6)
    native = times["native"]
    return {
        "spec": spec,
        "shape": list(shape),
        "us": {k: round(statistics.median(v), 1) for k, v in times.items()},
        "ratio_to_native": {
            k: round(statistics.median(a / b for a, b in zip(v, native)), 2)
            for k, v in times.items()
            if k != "native"
        },
        "first_step_s": {k: round(v, 2) for k, v in first.items()},
    }


def inside_counts(spec: str, shape=(32, 64, 16, 16)) -> dict:
    out = {}
    for policy in "01":
        os.environ["BNLAB_COMPILE_COEFFICIENTS"], norms_route.FUSED_MIN_NUMEL = policy, 0
        torch.manual_seed(0)
        step = training_step(_layer(spec, shape), shape)
        step()
        out["compiled" if policy == "1" else "eager"] = count_ops(step, inside=True).total
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", default="bn,mbn,cbn,brn")
    parser.add_argument("--shapes", default="1000x10,32x16x8x8")
    parser.add_argument("--pairs", type=int, default=11)
    parser.add_argument("--inner", type=int, default=20)
    parser.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "norms_coef_compile.json")
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
    load = [round(x, 2) for x in os.getloadavg()]
    rows, counts = [], {}
    for spec in args.specs.split(","):
        for shape in shapes:  # first: its first compiled step pays the compile (first_step_s)
            rows.append(compare(spec, shape, args.pairs, args.inner))
            print(json.dumps(rows[-1]), flush=True)
        counts[spec] = inside_counts(spec)
    result = {
        **provenance(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "threads": 1,
        "clock": "thread CPU time",
        "pairs": args.pairs,
        "inner": args.inner,
        "load_before": load,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "inside_op_counts_32x64x16x16": counts,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(counts))


if __name__ == "__main__":
    sys.exit(main())
