"""What the doctor costs: the checkup on ResNet-20, the watcher's overhead on a training loop, and
how well a probe's cost is priced before it runs.

    nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/doctor.py
    .venv/bin/python benchmarks/doctor.py --quick   # a small MLP, 2 pairs: a dry run

Settings: ``bnlab.models.create("resnet20")`` (BN) on CIFAR-shaped Gaussian inputs (no download;
timing does not depend on pixel values), cross-entropy on random labels, SGD lr 0.1 momentum 0.9,
CPU, ``torch.set_num_threads(--threads)`` (default 1).

- ``examine``: :func:`bnlab.doctor.examine` with its defaults on batches of 128 (it reads 512
  samples: 4 batches), the wall and CPU time of each of ``--examine-repeats`` calls (goal: under
  60 s).
- ``watcher``: the overhead of :class:`bnlab.doctor.Doctor` on the training loop, measured as
  Cockpit does (Schneider, Dangel & Hennig, "Cockpit: A Practical Debugging Tool for the Training
  of Deep Neural Networks", 2021: the same loop with and without the instrument, alternated in one
  process): two identical model/optimizer pairs, one watched, train ``--segment`` steps each in
  turn, ``--pairs`` times after one untimed warm-up segment each (the watcher's one-time setup
  falls there); overhead = median over pairs of t_watched / t_plain, in wall time and in CPU time
  (``time.process_time``: with one thread, the work done, which other processes on a shared
  machine do not inflate). At ``every`` 1 (every step) and 16 (the default), the sharpness off;
  the sharpness at its priced cadence is added as its CPU seconds per call over its cadence, per
  step (``amortized_sharpness``), and ``total_at_default`` = the default cadence's CPU ratio +
  that share (goal: at most 1.1).
- ``pricing``: a Lab with the ``hessian`` probe (defaults: 20 Lanczos steps, 10 Hutchinson samples)
  on ResNet-20 at batch 16 (the README's setting, 32×32): the estimate the Lab warns with before
  the first call against the call's measured seconds; and ``hvp_passes``: one Hessian-vector
  product in forward+backward passes (what :data:`bnlab.probes.cost.HVP` assumes).

Results go to benchmarks/results/doctor.json (dated, with the commit).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import provenance

from bnlab import models, probes
from bnlab.doctor import Doctor, examine
from bnlab.probes import cost as probe_cost
from bnlab.probes.base import ProbeContext
from bnlab.probes.hessian import hessian_vector_product
from bnlab.probes.state import preserved

ROOT = Path(__file__).resolve().parent


def network(name: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 64, bias=False),
                             nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 10))
    return models.create(name, norm="bn", input_shape=(3, 32, 32), num_classes=10)


def batches(batch: int, count: int, seed: int, side: int = 32) -> list:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 3, side, side, generator=g),
             torch.randint(0, 10, (batch,), generator=g)) for _ in range(count)]


def optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def time_examine(name: str, batch: int, repeats: int, side: int) -> dict:
    model = network(name, 0)
    opt = optimizer(model)
    data = batches(batch, 4, 1, side)
    seconds, cpu, report = [], [], None
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        report = examine(model, F.cross_entropy, data, optimizer=opt)
        seconds.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    assert report is not None
    return {"model": name, "batch": batch, "seconds": seconds, "cpu_seconds": cpu,
            "median_s": statistics.median(seconds), "median_cpu_s": statistics.median(cpu),
            "by_check_s": report.context.get("seconds_by_check"), "findings": report.codes()}


class Segment:
    """One model/optimizer trained ``steps`` steps at a time, watched or not."""

    def __init__(self, name: str, data: list, doctor: dict | None) -> None:
        self.model = network(name, 0)
        self.opt = optimizer(self.model)
        self.data = data
        self.step = 0
        self.doctor = (None if doctor is None else
                       Doctor(self.model, F.cross_entropy, self.opt, **doctor))

    def run(self, steps: int) -> tuple[float, float]:
        """(wall seconds, CPU seconds) of ``steps`` training steps."""
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            self.step += 1
            x, y = self.data[self.step % len(self.data)]
            self.opt.zero_grad(set_to_none=True)
            F.cross_entropy(self.model(x), y).backward()
            if self.doctor is not None:
                self.doctor.after_backward((x, y), self.step)
            self.opt.step()
            if self.doctor is not None:
                self.doctor.after_step((x, y), self.step)
        return time.perf_counter() - start, time.process_time() - start_cpu


def overhead(name: str, batch: int, every: int, segment: int, pairs: int, side: int) -> dict:
    data = batches(batch, 4, 2, side)
    plain = Segment(name, data, None)
    watched = Segment(name, data, {"every": every, "sharpness_every": 0})
    plain.run(segment)  # warm-up: allocator, the watcher's one-time setup
    watched.run(segment)
    ratios, cpu_ratios, plain_s, watched_s, plain_cpu = [], [], [], [], []
    for _ in range(pairs):
        a, a_cpu = plain.run(segment)
        b, b_cpu = watched.run(segment)
        plain_s.append(a / segment)
        plain_cpu.append(a_cpu / segment)
        watched_s.append(b / segment)
        ratios.append(b / a)
        cpu_ratios.append(b_cpu / a_cpu)
    return {"every": every, "segment_steps": segment, "pairs": pairs, "ratios": ratios,
            "median_ratio": statistics.median(ratios), "cpu_ratios": cpu_ratios,
            "median_cpu_ratio": statistics.median(cpu_ratios),
            "plain_step_s": statistics.median(plain_s),
            "plain_step_cpu_s": statistics.median(plain_cpu),
            "watched_step_s": statistics.median(watched_s)}


def sharpness_share(name: str, batch: int, step_seconds: float, side: int) -> dict:
    """The sharpness at its priced cadence: seconds per call / cadence / step seconds."""
    data = batches(batch, 2, 3, side)
    model = network(name, 0)
    opt = optimizer(model)
    doc = Doctor(model, F.cross_entropy, opt, sharpness_every=None)
    x, y = data[0]
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    doc.after_backward((x, y), 1)  # prices the cadence
    cadence = doc.sharpness_every
    start = time.process_time()
    doc.measure_sharpness(cadence, 0.1)  # one call, as the watcher makes it (CPU seconds)
    call = time.process_time() - start
    return {"sharpness_every": cadence, "call_s": call,
            "estimated_call_s": doc.costs["sharpness_cost"]["seconds"],
            "share": call / cadence / step_seconds}


def pricing(name: str, batch: int, side: int) -> dict:
    model = network(name, 0)
    opt = optimizer(model)
    (x, y), = batches(batch, 1, 4, side)
    probe = probes.create("hessian")
    lab = probes.Lab(model, F.cross_entropy, [probe], optimizer=opt)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lab.after_backward((x, y), 1)
    measured = lab.series("probe/hessian/seconds")[0][1]
    pass_s = probe_cost.time_pass(model, F.cross_entropy, (x, y), opt, repeats=3)
    ctx = ProbeContext(model=model, loss_fn=F.cross_entropy, batch=(x, y), step=1, optimizer=opt)
    with preserved(model, opt) as snap:
        ctx.snapshot = snap
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        _, hvp, dim = hessian_vector_product(ctx, names)
        v = torch.randn(dim, generator=torch.Generator().manual_seed(0))
        hvp(v)  # warm
        start = time.perf_counter()
        for _ in range(3):
            hvp(v)
        hvp_s = (time.perf_counter() - start) / 3
    return {"model": name, "batch": batch, "estimated_s": lab.costs[0].seconds,
            "measured_s": measured, "estimate_over_measured": lab.costs[0].seconds / measured,
            "warned": [str(w.message) for w in caught if w.category is probe_cost.ProbeCostWarning],
            "pass_s": pass_s, "hvp_s": hvp_s, "hvp_passes": hvp_s / pass_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small MLP, 2 pairs: a dry run")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--segment", type=int, default=16)
    parser.add_argument("--examine-repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "doctor.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    name, side = ("mlp", 8) if args.quick else ("resnet20", 32)
    pairs, segment = (2, 16) if args.quick else (args.pairs, args.segment)
    start = time.perf_counter()
    result = {**provenance(), "settings": {
        "model": name, "threads": args.threads, "pairs": pairs, "segment_steps": segment,
        "torch": torch.__version__, "quick": args.quick,
        # the machine is shared: the 1-minute load average at the start says how much
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}}
    result["examine"] = time_examine(name, 128, 1 if args.quick else args.examine_repeats, side)
    print("examine", json.dumps(result["examine"]["seconds"]), flush=True)
    result["watcher"] = [overhead(name, 128, every, segment, pairs, side) for every in (1, 16)]
    for row in result["watcher"]:
        print(f"watcher every {row['every']}: {row['median_ratio']:.3f}x", flush=True)
    step_s = result["watcher"][1]["plain_step_cpu_s"]
    result["amortized_sharpness"] = sharpness_share(name, 128, step_s, side)
    result["total_at_default"] = (result["watcher"][1]["median_cpu_ratio"]
                                  + result["amortized_sharpness"]["share"])
    print(f"total at the default cadence: {result['total_at_default']:.3f}x", flush=True)
    result["pricing"] = pricing(name, 16, side)
    print("pricing", {k: v for k, v in result["pricing"].items() if k != "warned"}, flush=True)
    result["elapsed_s"] = time.perf_counter() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
