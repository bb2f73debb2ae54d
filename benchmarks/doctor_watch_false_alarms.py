"""How often the watcher's own thresholds warn on healthy training runs (its false-alarm rate).

    nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/doctor_watch_false_alarms.py

Healthy runs: bnlab's ``mlp`` and ``luo_cnn`` (``bnlab.models``, BN) on bnlab's ``digits``
data (8×8 images, 10 classes), batch 64, 300 steps of SGD with momentum 0.9, at learning rates
0.02, 0.1 and 0.3, weight decay 0 and 5e-4, a step schedule dropping the rate 10× at step 200,
seeds 0..``--seeds``-1; watched by :class:`bnlab.doctor.Doctor` at its defaults (every 16 steps),
``report(examine=False)``: the findings of the watched series alone (the checkup's false alarms are
measured by benchmarks/doctor_false_alarms.py). A warning on any of these runs is a false alarm;
the result lists each, with its code and value. Results go to
benchmarks/results/doctor_watch_false_alarms.json (dated, with the commit).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import provenance

from bnlab import data, models
from bnlab.doctor import Doctor

ROOT = Path(__file__).resolve().parent
STEPS, BATCH, DROP = 300, 64, 200


def run(model_name: str, lr: float, weight_decay: float, seed: int) -> dict:
    torch.manual_seed(seed)
    ds = data.load("digits", device="cpu", seed=seed)
    model = models.create(model_name, norm="bn", input_shape=tuple(ds.x_train.shape[1:]),
                          num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=weight_decay)
    doc = Doctor(model, F.cross_entropy, opt)
    g = torch.Generator().manual_seed(seed)
    for step in range(1, STEPS + 1):
        if step == DROP:
            for group in opt.param_groups:
                group["lr"] = lr / 10
        i = torch.randint(0, len(ds.x_train), (BATCH,), generator=g)
        x, y = ds.x_train[i], ds.y_train[i]
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        doc.after_backward((x, y), step)
        opt.step()
        doc.after_step((x, y), step)
    report = doc.report(examine=False)
    return {"model": model_name, "lr": lr, "weight_decay": weight_decay, "seed": seed,
            "warnings": [{"code": f.code, "value": f.value, "threshold": f.threshold,
                          "layers": list(f.layers)} for f in report.warnings]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--models", nargs="+", default=["mlp", "luo_cnn"])
    parser.add_argument("--out", type=Path,
                        default=ROOT / "results" / "doctor_watch_false_alarms.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    runs = []
    for model_name, lr, wd, seed in itertools.product(args.models, (0.02, 0.1, 0.3), (0.0, 5e-4),
                                                      range(args.seeds)):
        runs.append(run(model_name, lr, wd, seed))
        print(model_name, lr, wd, seed, [w["code"] for w in runs[-1]["warnings"]], flush=True)
    alarms = [r for r in runs if r["warnings"]]
    result = {**provenance(), "settings": {"steps": STEPS, "batch": BATCH, "drop_at": DROP,
                                           "seeds": args.seeds, "models": args.models,
                                           "every": 16, "data": "digits"},
              "runs": len(runs), "runs_with_a_warning": len(alarms),
              "false_alarm_rate": len(alarms) / len(runs), "alarms": alarms,
              "elapsed_s": time.perf_counter() - start}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(alarms)} of {len(runs)} healthy runs warned; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
