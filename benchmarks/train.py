"""The engine's overhead: per-step time of ``bnlab.train.run`` against a plain PyTorch loop.

    .venv/bin/python benchmarks/train.py             # both settings, 7 alternating pairs each
    .venv/bin/python benchmarks/train.py --quick     # 3 pairs, fewer steps
    .venv/bin/python benchmarks/train.py --quick --norm mbn --compiled-steps --output PATH
    python3 benchmarks/train.py --device cuda        # on a GPU (results/train_cuda.json)

Settings: Santurkar's deep linear network (``dln``: 25 layers of width 10, BN after each
hidden layer, Gaussian regression, n = 1000) with full-batch gradient descent, and the digits MLP
(``mlp`` + BN, batch 128). Probes off, one thread (``--threads``), evaluation only at the end.

The plain loop does the same work on the same model: it takes the model, data, loss and batches
that :func:`bnlab.train.prepare` built (so the layers are identical, bnlab's ``bn`` included), and
runs ``batches(...)`` -> forward -> loss -> ``zero_grad`` -> backward -> ``SGD.step`` with nothing
else. Measuring both on one model isolates the engine's overhead (scheduling, accumulators, logging,
checks, the store) from the cost of the layers. For information the plain loop also runs the same
network with torch's fused BatchNorm (norm ``native_bn``).

Per-step time excludes setup: a callback (or the plain loop itself) reads the clock after step
``WARMUP`` and after the last step; per-step = difference / (steps - WARMUP). The clock is the
thread's CPU time on the CPU (one thread does all the work; on a shared, oversubscribed machine wall
time mostly measures waiting for a core), and wall time after ``torch.cuda.synchronize()`` on a GPU.
bnlab and the plain loop alternate, each pair gives a ratio, and the result is the median of the
ratios. Results go to benchmarks/results/train.json (train_cuda.json on a GPU).

``--norm SPEC`` trains bnlab's side (engine and plain loop) with another layer; ``--compiled-steps``
runs its layers' training steps as compiled functions (``bnlab.norms.set_compiled_steps``: both
bnlab sides, not the native-BN loop; the first steps, which compile, are before the clock starts).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

from provenance import provenance  # noqa: E402

from bnlab.data import batches  # noqa: E402
from bnlab.norms import set_compiled_steps  # noqa: E402
from bnlab.train import Callback, prepare, run  # noqa: E402

WARMUP = 10
_clock = time.thread_time  # set to time.perf_counter for a GPU in main()
SETTINGS = {
    "dln_full_batch": dict(model="dln", norm="bn", data="gaussian_regression",
                           batch_size="full", lr=0.05),
    "digits_mlp": dict(model="mlp", norm="bn", data="digits", batch_size=128, lr=0.1),
}


class _Clock(Callback):
    def __init__(self, last: int):
        self.last, self.times = last, {}

    def on_train_batch_end(self, loop):
        step = loop.step
        if step in (WARMUP, self.last):
            if next(loop.model.parameters()).device.type == "cuda":
                torch.cuda.synchronize()
            self.times[step] = _clock()


def bnlab_step(config: dict, steps: int, compile_step: bool = False) -> float:
    clock = _Clock(steps)
    with tempfile.TemporaryDirectory() as runs_dir:
        cfg = dict(config, steps=steps, eval_every=steps, runs_dir=runs_dir, compile=compile_step)
        record = run(cfg, callbacks=[clock], progress=False)
    assert record.status == "finished", record
    return (clock.times[steps] - clock.times[WARMUP]) / (steps - WARMUP)


def plain_step(config: dict, steps: int) -> float:
    """A plain loop over the model and data ``prepare`` builds for ``config``."""
    prep = prepare(dict(config, steps=steps, runs_dir=tempfile.gettempdir()))
    model, data, loss_fn = copy.deepcopy(prep.model).train(), prep.data, prep.loss_fn
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    generator = torch.Generator().manual_seed(0)
    cuda = prep.device.type == "cuda"
    step, times = 0, {}
    while step < steps:
        for xb, yb in batches(data.x_train, data.y_train, prep.batch_size, generator=generator,
                              shuffle=True, drop_last=prep.drop_last):
            loss = loss_fn(model(xb), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step in (WARMUP, steps):
                if cuda:
                    torch.cuda.synchronize()
                times[step] = _clock()
            if step == steps:
                break
    if not torch.isfinite(loss):
        raise RuntimeError("the plain loop diverged; the comparison would be meaningless")
    return (times[steps] - times[WARMUP]) / (steps - WARMUP)


def measure(name: str, config: dict, steps: int, pairs: int, compile_step: bool) -> dict:
    rows = []
    native = dict(config, norm="native_bn")
    for _ in range(pairs):
        b = bnlab_step(config, steps)
        p = plain_step(config, steps)
        n = plain_step(native, steps)
        rows.append((b, p, n))
        print(f"{name}: bnlab {b * 1e3:.3f} ms  plain {p * 1e3:.3f} ms  plain+native_bn "
              f"{n * 1e3:.3f} ms",
              file=sys.stderr)
    out = {
        "config": config,
        "steps": steps,
        "pairs": pairs,
        "bnlab_ms": statistics.median(r[0] for r in rows) * 1e3,
        "plain_ms": statistics.median(r[1] for r in rows) * 1e3,
        "plain_native_bn_ms": statistics.median(r[2] for r in rows) * 1e3,
        "ratio_vs_plain_same_model": statistics.median(r[0] / r[1] for r in rows),
        "ratio_vs_plain_native_bn": statistics.median(r[0] / r[2] for r in rows),
    }
    if compile_step:
        compiled = [bnlab_step(config, steps, compile_step=True) for _ in range(max(1, pairs // 2))]
        out["bnlab_compile_ms"] = statistics.median(compiled) * 1e3
    return out


def summary_rows(results: dict, norm: str = "bn", compiled_steps: bool = False) -> list[dict]:
    """The table's rows: the engine's overhead alone, and the "bnlab `bn` in the engine vs
    native BN in a plain loop" (layers and engine together, against what a PyTorch user would
    write)."""
    rows, how = [], " (compiled steps)" if compiled_steps else ""
    for name, r in results.items():
        rows.append({"setting": name,
                     "row": f"bnlab engine vs plain loop, same model (bnlab `{norm}`{how})",
                     "ratio": r["ratio_vs_plain_same_model"]})
        rows.append({"setting": name,
                     "row": f"bnlab `{norm}`{how} in the engine vs native BN in a plain loop",
                     "ratio": r["ratio_vs_plain_native_bn"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 pairs, fewer steps")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", action="store_true", help="also time bnlab with --compile")
    parser.add_argument("--norm", default="bn", help="bnlab's layer (default bn)")
    parser.add_argument("--compiled-steps", action="store_true",
                        help="bnlab.norms.set_compiled_steps(True) for bnlab's layers")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    set_compiled_steps(args.compiled_steps)
    global _clock
    if args.device != "cpu":
        _clock = time.perf_counter
    pairs = 3 if args.quick else 7
    steps = {"dln_full_batch": 150 if args.quick else 400, "digits_mlp": 200 if args.quick else 600}
    results = {
        name: measure(name, dict(config, device=args.device, norm=args.norm), steps[name], pairs,
                      args.compile)
        for name, config in SETTINGS.items()
    }
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") \
        else platform.processor() or platform.machine()
    clock = "thread CPU time" if args.device == "cpu" else "wall time after cuda.synchronize"
    payload = {**provenance(), "device": device, "threads": args.threads,
               "torch": torch.__version__,
               "clock": clock, "compiled_steps": args.compiled_steps, "results": results,
               "rows": summary_rows(results, args.norm, args.compiled_steps)}
    default = ROOT / "results" / ("train.json" if args.device == "cpu"
                                  else f"train_{args.device.split(':')[0]}.json")
    path = args.output or default
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
