"""The papers' measurements on a plain PyTorch loop: `bnlab.probes.Lab`.

    python examples/probes_on_your_loop.py
    BNLAB_EXAMPLE_QUICK=1 python examples/probes_on_your_loop.py   # seconds (what the tests run)

Three probes on a small BN MLP: internal covariate shift (Santurkar et al., *How Does Batch
Normalization Help Optimization?*, arXiv:1805.11604, Def. 2.1), the loss landscape's β-smoothness
along the gradient (same paper, §3.2) and the top Hessian eigenvalue against gradient descent's 2/lr
threshold. Probes restore parameters, gradients, buffers, optimizer and RNG state after every call,
so the run is bitwise the run you would have had without them.
"""

import os

import torch
from torch import nn

import bnlab.probes as P

QUICK = os.environ.get("BNLAB_EXAMPLE_QUICK") == "1"
STEPS, EVERY = (6, 3) if QUICK else (200, 25)


def main() -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(512, 20, generator=gen)
    y = (x[:, :5].sum(1) > 0).long()
    model = nn.Sequential(nn.Linear(20, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    lab = P.Lab(model, loss_fn, optimizer=opt, probes=[
        P.create("ics", every=EVERY),
        P.create("landscape", every=EVERY, num=4),
        P.create("hessian", every=EVERY, iters=8, samples=2),
    ])
    for step in range(STEPS):
        idx = torch.randint(0, len(x), (64,), generator=gen)
        batch = (x[idx], y[idx])
        opt.zero_grad()
        loss_fn(model(batch[0]), batch[1]).backward()
        lab.after_backward(batch, step)   # gradients present, before the update
        opt.step()
        lab.after_step(batch, step)

    for name in ("probe/landscape/beta_smoothness", "probe/hessian/top_eigenvalue",
                 "probe/hessian/threshold"):
        series = lab.series(name)
        print(f"{name}: " + ", ".join(f"step {s}: {v:.3g}" for s, v in series))
        assert series, name
    ics = sorted({n for _, n, _ in lab.records if n.startswith("probe/ics/l2/")})
    print("ICS measured at layers:", ", ".join(n.rsplit("/", 1)[1] for n in ics))


if __name__ == "__main__":
    main()
