"""The bnlab files a reader opens to follow one training forward + backward of a layer.

    python benchmarks/norms_reading.py [--spec cbn] [--shape 32x16x16x16]

Counted by running it: ``sys.settrace`` records every function of ``bnlab`` that executes during
one training forward and ``backward()`` (after one warm-up step, so one-time imports and lazy
set-up are not counted), in the default configuration (no compiled steps, guard off). A file counts
when one of its functions runs; its lines are the file's whole length (what a reader opens), and
the lines of the functions that ran are given beside. The catalogue machinery that built the layer
(spec parsing) is not counted: it does not run in the step.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections import defaultdict
from pathlib import Path

import torch

import bnlab
import bnlab.norms as N

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import provenance

PACKAGE = Path(bnlab.__file__).resolve().parent


def trace_step(spec: str, shape: tuple[int, ...]) -> dict[str, set]:
    """{file relative to the repository: {(first line, last line) of each function that ran}}."""
    torch.manual_seed(0)
    layer = N.create(spec, shape[1])
    N.set_progress(layer, lr=0.01, epoch=1, epochs=2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g)
    layer.train()
    layer(x.requires_grad_(True)).sum().backward()  # warm-up
    ran: dict[str, set] = defaultdict(set)

    def tracer(frame, event, arg):
        if event == "call":
            path = Path(frame.f_code.co_filename).resolve()
            if PACKAGE in path.parents:
                code = frame.f_code
                last = max((line for _, _, line in code.co_lines() if line), default=0)
                ran[str(path.relative_to(PACKAGE.parent))].add((code.co_firstlineno, last))
        return None

    sys.settrace(tracer)
    threading.settrace(tracer)
    try:
        y = layer(x)
        y.sum().backward()
    finally:
        sys.settrace(None)
        threading.settrace(lambda *a: None)
    return ran


STEPS = (("cbn", (32, 16, 16, 16), "fused"), ("cbn", (8, 16, 4, 4), "plain"),
         ("mbn", (32, 16, 16, 16), "fused"))
RESULT = Path(__file__).resolve().parent / "results" / "norms_reading.json"


def step_name(spec: str, shape: tuple[int, ...], route: str) -> str:
    """A step's key in :data:`RESULT`, e.g. ``"cbn fused 32x16x16x16"``."""
    return f"{spec} {route} {'x'.join(map(str, shape))}"


def measure(spec: str, shape: tuple[int, ...]) -> dict:
    """{"files": [...], "lines": total} of one training step (:func:`trace_step`)."""
    ran = trace_step(spec, shape)
    lines = {name: len((PACKAGE.parent / name).read_text().splitlines()) for name in ran}
    return {"files": sorted(ran), "lines": sum(lines.values())}


def record() -> dict:
    """The :data:`STEPS` measured now, written into :data:`RESULT` beside its earlier records."""
    old = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    now = {step_name(spec, shape, route): measure(spec, shape) for spec, shape, route in STEPS}
    out = {"what": old.get("what", "bnlab files and lines that run in one training forward + "
                           "backward of a layer (benchmarks/norms_reading.py)"),
           **provenance(),
           "machine": "2-core CPU, OMP_NUM_THREADS=1",
           "earlier": old.get("earlier", []), "now": now}
    RESULT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="cbn")
    parser.add_argument("--shape", default="32x16x16x16")
    parser.add_argument("--record", action="store_true",
                        help=f"measure the standard steps and write {RESULT.name}")
    args = parser.parse_args()
    if args.record:
        print(json.dumps(record()["now"], indent=1))
        return
    shape = tuple(int(s) for s in args.shape.split("x"))
    ran = trace_step(args.spec, shape)
    total = 0
    for name in sorted(ran):
        lines = len((PACKAGE.parent / name).read_text().splitlines())
        body = sum(last - first + 1 for first, last in ran[name])
        total += lines
        print(f"{lines:5d}  {name}  ({len(ran[name])} functions ran, {body} of their lines)")
    print(f"{total:5d}  lines in {len(ran)} files: {args.spec} training forward + backward "
          f"on {args.shape}")


if __name__ == "__main__":
    main()
