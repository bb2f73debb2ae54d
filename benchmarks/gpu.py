"""GPU benchmark: every layer against cuDNN BatchNorm (fp32, AMP fp16, AMP bf16) and a ResNet-20
training step on CIFAR-shaped synthetic tensors, eager and ``torch.compile``, for every layer.

    python benchmarks/gpu.py [--budget-s 300] [--out-dir benchmarks/results] [--specs bn,cbn]
    python benchmarks/gpu.py --device cpu --quick  # CPU dry run: tiny shapes, numbers mean nothing

Writes ``<out-dir>/gpu-<device>.json`` (device from ``torch.cuda.get_device_name``), which also
records each layer's dispatched operations (fp32 and half inputs) and its step against a float64
run on the device (``float64_agreement``: the device's own kernel branches, checked in seconds).
Without CUDA it
refuses (exit code 2) unless asked for the CPU dry run. Timing as in benchmarks/timing.py: layer and
reference alternately, median of the per-pair ratios, ``torch.cuda.synchronize`` around each sample
of ``inner`` steps. Sections, cheapest first: (1) layer table eager in fp32/fp16/bf16 on (128, 64,
32, 32); (2) ResNet-20 step (SGD, batch 128, 3×32×32, 10 classes) eager in fp32 and bf16 autocast;
(3) every layer compiled (fp32); (4) the ResNet-20 step compiled (fp32), layer by layer in priority
order — compiled rows against the native layer/model in eager mode — until ``--budget-s`` (whole
run) is spent: what did not fit is listed as skipped (a compiled ResNet-20 costs about a minute of
compilation per layer kind; raise the budget to cover more). AMP fp16 training of the ResNet would
need a GradScaler; the bf16 step does not, so the ResNet uses bf16.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import provenance
from timing import (AMP_DTYPES, SPECS, Budget, compile_and_warm, failure, float64_agreement,
                    format_rows, layer_table, measure, op_counts)

import bnlab.models as M
from bnlab.norms import set_progress

# Priority for the compiled section: native first (the reference), then the BN family, then the
# rest.
PRIORITY = ["native_bn", "bn", "cbn", "mbn", "brn", "mean_only_bn", "var_only_bn",
            "cbn(decouple=false)", "noisy_bn", "lp_bn(p=1)", "lp_bn(p=inf)", "si_bn", "wn"]
FULL = dict(layer_shape=(128, 64, 32, 32), batch=128, image=32, pairs=15, inner=5)
# random draws (noisy_bn) differ between the float32 and float64 runs; the wrappers hold a conv
AGREEMENT_SKIPPED = ("native_bn", "noisy_bn", "si_bn", "wn")
QUICK = dict(layer_shape=(8, 4, 4, 4), batch=4, image=8, pairs=1, inner=1)


def agreement_or_failure(spec: str, shape: tuple[int, ...], device: torch.device,
                         precision: str) -> dict:
    """:func:`timing.float64_agreement`, or the error: a layer whose step fails on this device is
    a result to report (and the timing sections still run)."""
    try:
        return float64_agreement(spec, shape, device, precision)
    except Exception as err:
        return {"spec": spec, "precision": precision, **failure(err)}


def resnet_step(spec: str, device: torch.device, batch: int, image: int, precision: str):
    """(model, make_step): ``make_step(net)`` is one SGD step of ResNet-20 (``net`` = the model or
    its compiled form) with ``spec`` on a fixed synthetic CIFAR-shaped batch."""
    torch.manual_seed(0)
    model = M.create("resnet20", norm=spec, input_shape=(3, image, image),
                     num_classes=10).to(device).train()
    set_progress(model, lr=0.05, epoch=2, epochs=4)  # mbn's λ and cbn's AMAT η > 0, as in training
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, image, image, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dtype = AMP_DTYPES[precision]

    def make_step(net: nn.Module):
        def step() -> None:
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype or torch.float32,
                                enabled=dtype is not None):
                loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
        return step

    return model, make_step


def resnet_rows(specs, device, cfg, precisions, mode, budget, backend, sync,
                progress) -> list[dict]:
    rows = []
    for precision in precisions:
        ref_model, ref_make = resnet_step("native_bn", device, cfg["batch"],
                                          cfg["image"], precision)
        ref_step = ref_make(ref_model)
        for spec in specs:
            row = {"spec": spec, "precision": precision, "mode": mode,
                   "reference": "native_bn resnet20 eager"}
            try:
                model, make = resnet_step(spec, device, cfg["batch"], cfg["image"], precision)
            except Exception as err:  # e.g. a layer the model builder does not take
                step, info = None, failure(err)
            else:
                step, info = ((make(model), {}) if mode == "eager" else
                              compile_and_warm(model, make, budget, backend))
            row.update(info)
            if step is not None:
                row.update(measure(step, ref_step, cfg["pairs"], max(1, cfg["inner"] // 2), sync))
            rows.append(row)
            progress(row)
    return rows


def device_slug(device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda",
                        help="cuda (default) or cpu (only with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes, 1 pair; on a CPU, dynamo 'eager' backend")
    parser.add_argument("--budget-s", type=float, default=300,
                        help="wall-clock budget of the whole run")
    parser.add_argument("--specs", default=",".join(PRIORITY),
                        help="comma-separated subset of: " + ", ".join(SPECS))
    parser.add_argument("--out-dir", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    args.specs = [s.strip() for s in args.specs.split(",") if s.strip()]
    unknown = [s for s in args.specs if s not in SPECS]
    if unknown or not args.specs:
        parser.error(f"unknown layer(s) {', '.join(unknown) or '(none given)'}; valid: "
                     f"{', '.join(SPECS)}")
    return args


def refusal(args) -> str | None:
    if args.device == "cuda" and not torch.cuda.is_available():
        return ("benchmarks/gpu.py needs a CUDA GPU, and torch.cuda.is_available() is False here. "
                "For CPU numbers run benchmarks/norms.py; for a dry run of this script: "
                "--device cpu --quick")
    if args.device == "cpu" and not args.quick:
        return "--device cpu is only a dry run (--quick); CPU timings come from benchmarks/norms.py"
    if args.device not in ("cuda", "cpu"):
        return f"unknown --device {args.device!r}; valid: cuda, cpu"
    return None


def metadata(args, device: torch.device, cfg: dict, backend: str) -> dict:
    return {
        "benchmark": "bnlab layers vs native (cuDNN) BatchNorm and a ResNet-20 SGD step; "
                     "paired, median ratio",
        **provenance(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)",
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
        "quick": args.quick, "compile_backend": backend, "layer_shape": list(cfg["layer_shape"]),
        "resnet20": {"batch": cfg["batch"], "input": [3, cfg["image"], cfg["image"]],
                     "optimizer": "SGD(0.05, m=0.9)"},
        "pairs": cfg["pairs"], "inner": cfg["inner"], "budget_s": args.budget_s, "complete": False,
        "layers": [], "resnet20_step": [], "elapsed_s": 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    message = refusal(args)
    if message:
        print(message, file=sys.stderr)
        return 2
    start = time.monotonic()
    device = torch.device(args.device)
    cfg = QUICK if args.quick else FULL
    backend = "eager" if device.type == "cpu" else "inductor"
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cpu":
        # the dry run only checks the plumbing; one thread is fastest on tiny tensors
        torch.set_num_threads(1)
    budget = Budget(args.budget_s)
    specs = [s for s in PRIORITY if s in args.specs]
    shape = cfg["layer_shape"]

    def progress(row):
        print(f"{row['spec']:<22}{row['precision']:<6}{row['mode']:<10}"
              f"{row.get('ratio', row.get('error') or row.get('skipped'))}",
              file=sys.stderr, flush=True)

    common = dict(pairs=cfg["pairs"], budget=budget, backend=backend, inner=cfg["inner"], sync=sync,
                  progress=progress)
    result = metadata(args, device, cfg, backend)
    out = Path(args.out_dir) / f"gpu-{device_slug(device)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every section, so a run cut short still leaves its results
        result["elapsed_s"] = round(time.monotonic() - start, 1)
        out.write_text(json.dumps(result, indent=2))

    layers, resnet = result["layers"], result["resnet20_step"]
    # dispatched operations per training step on this device (fp32, and half inputs as
    # autocast hands them on), and the aten ops run inside bnlab's operators (about the kernel
    # launches): cheap, so first
    result["op_counts"] = {spec: op_counts(spec, shape, device) for spec in specs}
    result["op_counts_half"] = {precision: {spec: op_counts(spec, shape, device, precision)
                                            for spec in specs} for precision in ("fp16", "bf16")}
    # correctness on this device, in seconds: each layer's step against float64 (≤ 1: rounded once)
    result["float64_agreement"] = [agreement_or_failure(spec, shape, device, precision)
                                   for spec in specs if spec not in AGREEMENT_SKIPPED
                                   for precision in ("fp32", "fp16", "bf16")]
    save()
    layers += layer_table(specs, shape, device, ["fp32", "fp16", "bf16"], ["eager"], **common)
    save()
    resnet += resnet_rows(specs, device, cfg, ["fp32", "bf16"], "eager", budget,
                          backend, sync, progress)
    save()
    # compiled, in priority order, while the budget lasts: small layer graphs first
    for spec in specs:
        layers += layer_table([spec], shape, device, ["fp32"], ["compiled"], **common)
        save()
    for spec in specs:
        resnet += resnet_rows([spec], device, cfg, ["fp32"], "compiled", budget,
                              backend, sync, progress)
        save()
    result["complete"] = True
    save()
    print(format_rows(layers) + "\n\n" + format_rows(resnet))
    print(f"wrote {out} in {result['elapsed_s']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
