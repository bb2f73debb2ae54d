"""A bnlab layer in your own model: convert, train with `track`, autocast, torch.compile, fold.

    python examples/layer_in_your_model.py            # a few hundred steps on synthetic data
    BNLAB_EXAMPLE_QUICK=1 python examples/layer_in_your_model.py   # seconds (what the tests run)

Complete BN (Peng et al., *Re-Thinking the Effectiveness of Batch Normalization and Beyond*) with
AMAT needs the learning rate at every step; `bnlab.norms.track` hooks the optimizer so nothing has
to be passed by hand. Quick mode compiles with the `aot_eager` backend (traces forward and backward
through dynamo and AOTAutograd without building C++ kernels); the full run uses inductor.
"""

import os

import torch
from torch import nn

import bnlab.norms as N

QUICK = os.environ.get("BNLAB_EXAMPLE_QUICK") == "1"
EPOCHS, STEPS_PER_EPOCH = (2, 3) if QUICK else (5, 40)


def your_model() -> nn.Module:
    """Any model with torch BatchNorm layers: yours, torchvision's or timm's."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )


def main() -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 3, 16, 16, generator=gen)
    # a learnable toy task
    y = (x.mean(dim=(1, 2, 3)) > 0).long() + 2 * (x[:, 0].mean(dim=(1, 2)) > 0).long()

    # every BatchNorm -> Complete BN, γ/β/stats kept
    model = N.convert(your_model(), "cbn(rho=2, amat=true)")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # lr and epoch, automatically
    tracker = N.track(model, opt, epochs=EPOCHS, steps_per_epoch=STEPS_PER_EPOCH)
    step_fn = torch.compile(model, backend="aot_eager" if QUICK else "inductor")
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(EPOCHS):
        for step in range(STEPS_PER_EPOCH):
            idx = torch.randint(0, len(x), (64,), generator=gen)
            opt.zero_grad()
            # mixed precision: statistics stay float32
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_fn(step_fn(x[idx]), y[idx])
            loss.backward()
            opt.step()
        print(f"epoch {epoch + 1}/{EPOCHS}: loss {loss.item():.3f}")
    tracker.remove()

    model.eval()
    # inference: every CBN folded into the conv before it
    folded, report = N.fold(model, report=True)
    with torch.no_grad():
        gap = (folded(x) - model(x)).abs().max().item()
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    print(f"folded {len(report.folded)} norms, left {len(report.unfolded)}; max |folded - eval| = "
          f"{gap:.2e}")
    print(f"train accuracy (eval mode): {accuracy:.3f}")
    assert not report.unfolded and gap < 1e-4, (report, gap)


if __name__ == "__main__":
    main()
