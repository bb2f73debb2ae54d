"""The docs page "Small batches: what to use", rendered from a stored ``mbn-batch-size`` result.

``python -m bnlab.experiments.mbn.page RUNS_DIR --commit SHA > docs/readme/small-batches.md``
reads the entry's runs from the store (:func:`.entries.measure`), judges them
(:func:`.entries.batch_size_verdict`) and writes the page with the per-seed accuracies embedded
at its end. ``tests/test_experiments_mbn_page.py`` re-renders the page from those embedded numbers
with the current code, so the page's tables, verdict and advice cannot drift from the
measurement or from the verdict rule.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

from bnlab.experiments.common import recipe_config
from bnlab.experiments.run_facts import config_test_images
from bnlab.experiments.runner import analysis_context
from bnlab.formatting import fmt, mean_std

from .arms import ARM_TEXT, ARMS, GN_SPEC, RECOLLECTED, SYNC_PROCESSES, SYNCED
from .entries import BATCH_SIZES, batch_size_verdict, measure

KEEPS = 0.05  # an arm "keeps" its accuracy when it loses less than this from M = 32 to M = 2
DATA_MARK = "<!-- small-batches data: "


def page_data(runs_dir: str | Path, commit: str, preset: str = "smoke") -> dict:
    """The numbers the page shows: per arm, batch size and seed, the final test accuracy."""
    with analysis_context("mbn-batch-size", preset, runs_dir=runs_dir) as ctx:
        acc, _ = measure(ctx)
        n_test = config_test_images(recipe_config(ctx))
        stored = ctx.store.load_entry("mbn-batch-size", preset) or {}
    created = stored.get("created")
    date = (datetime.datetime.fromtimestamp(created, datetime.timezone.utc).strftime("%Y-%m-%d")
            if created else "—")
    return {"preset": preset, "date": date, "commit": commit, "n_test": n_test,
            "acc": {arm: {str(M): {str(s): v for s, v in seeds.items()}
                          for M, seeds in by_m.items()} for arm, by_m in acc.items()}}


def _acc(data: dict) -> dict[str, dict[int, dict[int, float | None]]]:
    return {arm: {int(M): {int(s): v for s, v in seeds.items()} for M, seeds in by_m.items()}
            for arm, by_m in data["acc"].items()}


def _label(arm: str) -> str:
    return ARM_TEXT.get(arm, arm)


def _table(acc: dict, mean: dict) -> tuple[list[str], dict[str, float]]:
    """The per-arm table (mean accuracy per M, then the drop) and each arm's drop."""
    small, large = min(BATCH_SIZES), max(BATCH_SIZES)
    rows = ["| M | " + " | ".join(_label(a) for a in ARMS) + " |",
            "|" + "---|" * (len(ARMS) + 1)]
    for M in BATCH_SIZES:
        cells = [f"{fmt(mean[a].get(M))} (n={len(acc.get(a, {}).get(M) or {})})" for a in ARMS]
        rows.append(f"| {M} | " + " | ".join(cells) + " |")
    drops = {a: (mean[a][large] - mean[a][small]) for a in ARMS
             if mean[a].get(large) is not None and mean[a].get(small) is not None}
    rows.append(f"| drop {large} → {small} | "
                + " | ".join(fmt(drops.get(a)) for a in ARMS) + " |")
    return rows, drops


def _advice(acc: dict, mean: dict, drops: dict[str, float]) -> list[str]:
    """Which arms keep their accuracy at the smallest batch, which lose it, and recollection."""
    small, large = min(BATCH_SIZES), max(BATCH_SIZES)
    keep = sorted((a for a in drops if drops[a] < KEEPS), key=lambda a: -mean[a][small])
    lose = sorted((a for a in drops if drops[a] >= KEEPS), key=lambda a: -mean[a][small])

    def listed(arms: list[str]) -> str:
        return "; ".join(f"{_label(a)} ({fmt(mean[a][small])}, "
                         f"n={len(acc[a][small])})" for a in arms) or "none"

    advice = [
        f"* **Keep their accuracy at M = {small}** (lose less than {KEEPS} from M = {large}): "
        f"{listed(keep)}.",
        f"* **Lose it**: {listed(lose)}.",
    ]
    if RECOLLECTED in drops and "BN" in drops:
        advice.append(
            f"* **Recollecting BN's running statistics** after training moves BN at M = {small} "
            f"from {fmt(mean['BN'][small])} to {fmt(mean[RECOLLECTED][small])}: it repairs "
            "running statistics that lag the final network, not a network trained with the "
            f"noise of {small}-sample batch statistics.")
    return advice


def render(data: dict) -> str:
    """The page's markdown for :func:`page_data`'s numbers."""
    acc = _acc(data)
    mean = {a: {M: mean_std(v.values())[0] for M, v in acc.get(a, {}).items()} for a in ARMS}
    verdict, summary = batch_size_verdict(acc, tiny=False, n_test=data["n_test"])
    rows, drops = _table(acc, mean)
    return _page(data, rows, _advice(acc, mean, drops), verdict, summary)


def _page(data: dict, rows: list[str], advice: list[str], verdict: str, summary: str) -> str:
    small, large = min(BATCH_SIZES), max(BATCH_SIZES)
    return "\n".join([
        "# Small batches: what to use",
        "",
        "BatchNorm normalizes with the statistics of the batch, so a small batch (a large model "
        "per device, detection and segmentation, high-resolution inputs) gives it noisy "
        "statistics in training and running statistics in eval that the network never trained "
        "with. This page compares what users reach for, at batch sizes M = 2 … 32, from the "
        "catalogue entry `mbn-batch-size` (`bnlab reproduce mbn-batch-size --preset smoke`):",
        "",
        "* **BN**: plain BatchNorm over the M samples (`bn`);",
        "* **MBN**: Momentum BatchNorm (Hongwei Yong, Jianqiang Huang, Deyu Meng, Xiansheng Hua, "
        "Lei Zhang, *Momentum Batch Normalization for Deep Learning with Small Batch Size*, ECCV "
        "2020; `mbn`): moving statistics whose momentum grows as M shrinks;",
        "* **BRN**: Batch Renormalization (Sergey Ioffe, *Batch Renormalization: Towards Reducing "
        "Minibatch Dependence in Batch-Normalized Models*, NIPS 2017; "
        "`brn`), its warm-up scaled to the run;",
        f"* **GN**: GroupNorm (Yuxin Wu, Kaiming He, *Group Normalization*, ECCV 2018; "
        f"`{GN_SPEC[data['preset']]}`): per-sample statistics, nothing depends on M;",
        f"* **{_label(SYNCED)}**: {SYNC_PROCESSES} processes (gloo) with M samples each, BN's "
        "statistics shared across them (`--nproc 2 --sync-norms`): statistics of "
        f"{SYNC_PROCESSES}M samples, a global batch of {SYNC_PROCESSES}M;",
        f"* **{_label(RECOLLECTED)}**: the BN runs, their running statistics recollected over "
        "the training set with the final network before eval "
        "(`bnlab.norms.recollect_running_stats`).",
        "",
        f"Measured {data['date']} at commit {data['commit']}, preset `{data['preset']}`: a "
        "3-layer MLP (width 64) on the digits data, 6 epochs, SGD with momentum 0.9 and the "
        "learning rate scaled with the global batch (0.1 at 32); final test accuracy on "
        f"{data['n_test']} images, mean over seeds (n: seeds; 3 at M = {small} and {large}, one "
        "between). An MLP on 8×8 digits is a small stand-in for the paper's CIFAR-10 networks: "
        "it ranks the methods, it does not predict a ResNet's numbers.",
        "",
        *rows,
        "",
        "## What to use",
        "",
        *advice,
        "",
        f"**The paper's claim** — MBN loses less accuracy than BN and than BRN as the batch "
        f"shrinks — is **{verdict}** under bnlab's verdict rule (each comparison pre-declared, "
        f"Welch's t on the per-seed drops, standard error floored at the binomial SE of "
        f"{data['n_test']} test images): {summary}.",
        "",
        "The other arms are reported, not judged. Reproduce the numbers and this page with",
        "",
        "```bash",
        "bnlab reproduce mbn-batch-size --preset smoke --runs-dir RUNS",
        "python -m bnlab.experiments.mbn.page RUNS --commit $(git rev-parse --short HEAD) \\",
        "    > docs/readme/small-batches.md",
        "```",
        "",
        DATA_MARK + json.dumps(data, sort_keys=True) + " -->",
        "",
    ])


def embedded(page: str) -> dict:
    """The numbers a rendered page carries at its end."""
    match = re.search(re.escape(DATA_MARK) + r"(\{.*\}) -->", page)
    if match is None:
        raise ValueError("no embedded small-batches data in the page")
    return json.loads(match[1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs_dir")
    parser.add_argument("--commit", required=True, help="the commit the runs were trained at")
    parser.add_argument("--preset", default="smoke")
    args = parser.parse_args(argv)
    sys.stdout.write(render(page_data(args.runs_dir, args.commit, args.preset)))


if __name__ == "__main__":
    main()
