"""Benchmark: how long the first training step of a layer stalls under compiled steps (CPU).

    python benchmarks/compile_stall.py [--specs "cbn;mbn;lp_bn(p=inf);brn"] [--repeats 2]
                                       [--out benchmarks/results/compile_stall.json]

``bnlab.norms.compiled_steps()`` compiles each layer's step on its first call with a new key
(bnlab/norms/engine/compiled_step.py). This times that first call, one forward + backward on (1000,
10), for each spec in turn in a **fresh process** (imports counted apart), once with an empty
inductor cache directory (``cold``: a first run on a machine) and once more with the directory that
run filled (``warm``: every later run), ``--repeats`` times each. It records inductor's FX graph
cache counters (hit, miss or bypass) so a reader sees which route each process took, and a digest of
what each step computed (output, gradients, buffers), equal in both states where the cached code
is the compiled code. Wall clock, one thread. Writes JSON: per repeat and per state, the seconds
of the import and of each spec's first call.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import provenance

CHILD = r"""
import hashlib, json, sys, time, warnings
t0 = time.perf_counter()
import torch
import bnlab.norms as N
from bnlab.norms.engine import compiled_step as cs
from torch._dynamo.utils import counters
warnings.simplefilter("ignore")
torch.set_num_threads(1)
out = {"import_s": time.perf_counter() - t0, "first_call_s": {}, "digest": {}}
for spec in sys.argv[1].split(";"):
    gen = torch.Generator().manual_seed(0)
    layer = N.create(spec, 10)
    x = torch.randn(1000, 10, generator=gen, requires_grad=True)
    with N.compiled_steps():
        t = time.perf_counter()
        y = layer(x)
        y.backward(torch.randn(1000, 10, generator=gen))
        out["first_call_s"][spec] = time.perf_counter() - t
    # what the step computed, bit for bit: output, gradients, buffers
    tensors = [y, x.grad, *(p.grad for p in layer.parameters()), *layer.buffers()]
    out["digest"][spec] = hashlib.sha256(b"".join(
        t.detach().contiguous().numpy().tobytes() for t in tensors)).hexdigest()
out["compiled_calls"] = dict(cs.CALLS)
out["fx_graph_cache"] = {k: v for k, v in counters["inductor"].items() if "fxgraph" in k}
print(json.dumps(out))
"""


def first_calls(specs: str, cache_dir: str) -> dict:
    """One fresh process timing each spec's first compiled step, with inductor's cache at
    ``cache_dir``."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD, specs], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", default="cbn;mbn;lp_bn(p=inf);brn")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "compile_stall.json")
    args = parser.parse_args(argv)
    import torch
    runs = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as cache_dir:
            cold = first_calls(args.specs, cache_dir)
            warm = first_calls(args.specs, cache_dir)
        runs.append({"repeat": repeat, "cold": cold, "warm": warm})
        for state, run in (("cold", cold), ("warm", warm)):
            calls = ", ".join(f"{s} {t:.2f} s" for s, t in run["first_call_s"].items())
            print(f"repeat {repeat} {state}: import {run['import_s']:.2f} s; first calls: {calls}; "
                  f"cache {run['fx_graph_cache']}", flush=True)
    result = {**provenance(), "torch": torch.__version__, "shape": [1000, 10], "threads": 1,
              "clock": "wall",
              "specs": args.specs.split(";"), "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
