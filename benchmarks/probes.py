"""Overhead of each probe relative to a training step, and naive vs batched landscape evaluation.

    .venv/bin/python benchmarks/probes.py          # DLN (batch 1000 and 128), vgg_santurkar (128)
    .venv/bin/python benchmarks/probes.py --quick  # fewer repeats, DLN only

Settings: Santurkar's deep linear network (25 layers of width 10, BN after each hidden
layer, Gaussian regression x ~ N(0, I_10), y = A x with Gaussian A, n = 1000) at batch 1000 (full
batch, as in the paper) and 128, and ``vgg_santurkar`` at batch 128 on CIFAR-shaped Gaussian inputs
(no data is downloaded; timing does not depend on the pixel values). CPU,
``torch.set_num_threads(--threads)`` (default 1: the benchmark machine is shared and oversubscribed
threads make timings meaningless).

A "training step" is zero_grad + forward + backward + SGD step (momentum 0.9). Each probe is created
with its defaults and ``every=1``; its cost is the ``probe/<name>/seconds`` it records itself
(snapshot and restore included), median over the timed calls after one untimed warm-up call.
Overhead = probe seconds / step seconds. Results go to benchmarks/results/probes.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import provenance

import bnlab.probes as probes

ROOT = Path(__file__).resolve().parent


def dln_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    try:
        from bnlab import models
        return models.create("dln", norm="bn", input_shape=(10,), num_classes=10)
    except (ImportError, AttributeError):  # pragma: no cover - models not installed
        import bnlab.norms as norms
        layers = []
        for _ in range(24):
            layers += [nn.Linear(10, 10, bias=False), norms.create("bn", 10)]
        return nn.Sequential(*layers, nn.Linear(10, 10, bias=False))


def vgg_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    from bnlab import models
    return models.create("vgg_santurkar", norm="bn", input_shape=(3, 32, 32), num_classes=10)


def dln_data(batch: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(10, 10, generator=g)
    x = torch.randn(1000, 10, generator=g)
    return [(x[i:i + batch], x[i:i + batch] @ a.T) for i in range(0, 1000 - batch + 1, batch)]


def vgg_data(batch: int, seed: int, count: int = 2):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 3, 32, 32, generator=g),
             torch.randint(0, 10, (batch,), generator=g))
            for _ in range(count)]


def time_steps(model, loss_fn, batches, lr, repeats) -> float:
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    times = []
    for i in range(repeats + 1):
        x, y = batches[i % len(batches)]
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
        if i > 0:  # the first step warms up allocator and kernels
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_probe(model, loss_fn, batches, lr, probe, repeats) -> tuple[float, dict]:
    """Median of the probe's own recorded seconds over ``repeats`` calls after one warm-up call."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    lab = probes.Lab(model, loss_fn, [probe], optimizer=opt)
    seconds = []
    last = {}
    for i in range(repeats + 1):
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        metrics = lab.after_backward((x, y), i)
        opt.step()
        metrics.update(lab.after_step((x, y), i))
        if i > 0:
            seconds.append(metrics[f"probe/{probe.name}/seconds"])
        last = metrics
    return statistics.median(seconds), last


def bench_model(label, make_model, loss_fn, batches, lr, repeats, probe_repeats, skip=()):
    print(f"[{label}] timing training steps ...", flush=True)
    model = make_model()
    step = time_steps(model, loss_fn, batches, lr, repeats)
    print(f"[{label}] step {step * 1e3:.1f} ms", flush=True)
    rows = {}
    for name in probes.available():
        if name in skip:
            continue
        probe = probes.create(name, every=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            seconds, metrics = time_probe(make_model(), loss_fn, batches, lr, probe,
                                          probe_repeats.get(name, repeats))
        rows[name] = {"seconds": seconds, "overhead": seconds / step, "cost": probe.cost,
                      "metrics_per_call": sum(1 for k in metrics if not k.endswith("/seconds"))}
        print(f"[{label}] {name:18s} {seconds * 1e3:10.1f} ms  = {seconds / step:7.2f} steps",
              flush=True)
    # naive vs batched landscape, same model state, same grid; batched result checked against naive
    # once
    model = make_model()
    x, y = batches[0]
    model.train()
    loss_fn(model(x), y).backward()  # as in a training step: the direction is the step's .grad
    ctx = probes.ProbeContext(model=model, loss_fn=loss_fn, batch=(x, y), step=0, lr=lr)
    steps = probes.step_sizes(lr, probes.default_range(model), 8)
    landscape = {"num": 8, "multipliers": list(probes.default_range(model))}
    results = {"naive": [], "batched": []}
    for method in results:  # untimed warm-up of each path
        probes.evaluate_landscape(ctx, steps, method)
    for _ in range(max(1, probe_repeats.get("landscape_compare", 2))):
        for method in results:  # interleaved, so drifting machine load hits both alike
            start = time.perf_counter()
            res = probes.evaluate_landscape(ctx, steps, method)
            results[method].append((time.perf_counter() - start, res))
    naive_s = statistics.median(t for t, _ in results["naive"])
    batched_s = statistics.median(t for t, _ in results["batched"])
    naive_min = min(t for t, _ in results["naive"])
    batched_min = min(t for t, _ in results["batched"])
    ref, bat = results["naive"][-1][1], results["batched"][-1][1]
    from bnlab.probes.landscape import _mismatch
    landscape.update({
        "naive_seconds": naive_s, "batched_seconds": batched_s, "speedup": naive_s / batched_s,
        "naive_seconds_min": naive_min, "batched_seconds_min": batched_min,
        "speedup_of_minima": naive_min / batched_min,
        "batched_method_used": bat.method, "fallback_reason": bat.fallback_reason,
        "agree_within_1e-3": _mismatch(bat, ref) is None, "beta_naive": ref.beta_smoothness,
        "beta_batched": bat.beta_smoothness, "calls_each": len(results["naive"]),
    })
    print(f"[{label}] landscape naive {naive_s * 1e3:.1f} ms, batched {batched_s * 1e3:.1f} ms, "
          f"speedup {naive_s / batched_s:.2f}x (of minima {naive_min / batched_min:.2f}x, "
          f"{bat.method})", flush=True)
    return {"step_seconds": step, "batch": int(x.shape[0]), "lr": lr, "probes": rows,
            "landscape": landscape}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, DLN only")
    parser.add_argument("--skip-vgg", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "probes.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    mse, ce = nn.MSELoss(), nn.CrossEntropyLoss()
    dln_repeats = 3 if args.quick else 10
    report = {
        **provenance(),
        "settings": {
            "device": "cpu", "threads": args.threads, "torch": torch.__version__,
            "python": platform.python_version(), "machine": platform.machine(), "quick": args.quick,
            "timing": "median; step = zero_grad+forward+backward+SGD(momentum 0.9) step; "
                      "probe = its own recorded probe/<name>/seconds (snapshot/restore "
                      "included), one warm-up call excluded",
            "dln": "bnlab.models dln, depth 25, width 10, norm bn; x ~ N(0, I_10), y = A x, "
                   "n = 1000, lr 1e-3",
            "vgg": "bnlab.models vgg_santurkar, norm bn, CIFAR-shaped N(0,1) inputs, "
                   "10 classes, lr 0.1",
            "landscape_compare": "evaluate_landscape on one batch, 8 step sizes over the "
                                 "default range x lr; naive = one forward/backward per step "
                                 "size, batched = torch.func.vmap",
        },
        "models": {},
    }
    report["models"]["dln_batch1000"] = bench_model(
        "dln b=1000", lambda: dln_model(0), mse, dln_data(1000, 0), 1e-3, dln_repeats,
        {"landscape_compare": 2 if args.quick else 6})
    report["models"]["dln_batch128"] = bench_model(
        "dln b=128", lambda: dln_model(0), mse, dln_data(128, 0), 1e-3, dln_repeats,
        {"landscape_compare": 2 if args.quick else 6})
    if not (args.quick or args.skip_vgg):
        vgg_repeats = 3
        report["settings"]["vgg_repeats"] = ("3 training steps; 2 timed calls per probe "
                                             "(1 for ics and landscape); landscape comparison "
                                             "2 calls each")
        report["models"]["vgg_santurkar_batch128"] = bench_model(
            "vgg b=128", lambda: vgg_model(0), ce, vgg_data(128, 0), 0.1, vgg_repeats,
            {name: 2 for name in probes.available()}
            | {"ics": 1, "landscape": 1, "landscape_compare": 2})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
