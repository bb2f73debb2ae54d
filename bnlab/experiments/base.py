"""The shape of a catalogue entry.

An :class:`Experiment` is declarative: ``plan(preset)`` says which training runs (each a
``bnlab.train`` config) and which pure computations (theory, simulations) make up the figure or
table; ``analyze(ctx)`` draws the figures and fills the table from what was stored, so the report
can be rebuilt from the store without training anything again.
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from bnlab.spec import Registry, check_choice

from .resolution import Resolution
from .verdict_data import Verdict
from .verdicts import RULE

PRESETS = ("smoke", "paper")
PAPERS = {
    "santurkar": "Santurkar et al. 2018, How does batch normalization help optimization?",
    "luo": "Luo et al. 2019, Towards understanding regularization in batch normalization",
    "peng": "Peng et al., Complete batch normalization (CBN)",
    "arora": ("Arora, Li & Lyu 2019, Theoretical analysis of auto rate-tuning by batch "
              "normalization"),
    "mbn": "Yong et al. 2020, Momentum batch normalization for deep learning with small batch size",
}


@dataclass(frozen=True)
class RunSpec:
    """One training run of an entry: a label for plots/tables, its config, and its factors."""

    label: str
    config: dict[str, Any]
    factors: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    """What an entry executes for one preset."""

    runs: list[RunSpec] = field(default_factory=list)
    # Pure computations (theory, simulators): name -> callable returning JSON-able data.
    compute: dict[str, Callable[[], Any]] = field(default_factory=dict)


@dataclass
class Outcome:
    """What ``analyze`` returns: figures written, our numbers beside the paper's, the verdict."""

    figures: list[Path]
    table: list[dict[str, Any]]  # rows with at least "quantity", "ours", "paper"
    verdict: str                 # "held", "not held" or "inconclusive"
    summary: str                 # one or two sentences: what was compared and what we saw
    # the verdict as data (the primary comparison's numbers); an entry that gives none gets
    # Verdict.text_only from Experiment.outcome
    record: Verdict | None = None


@dataclass
class Experiment:
    id: str
    paper: str
    target: str          # "Fig. 9", "Table 1", "App. D.1"
    title: str
    claim: str
    smoke_changes: str   # what the smoke preset changes from the paper, and why
    cost: dict[str, str]  # preset -> rough cost ("≈1 min on 2 CPU cores")
    plan: Callable[[str], Plan]
    analyze: Callable[["AnalysisContext"], Outcome]  # noqa: F821 (defined in runner)
    resolution: Resolution | None = None  # what the smoke can decide, stated in advance

    def outcome(self, ctx) -> Outcome:
        """``analyze(ctx)`` with the runs that crashed named at the end of its summary (whatever
        the entry does with them: they were "—" in a table and nowhere else when a sweep's
        data-parallel runs all failed) and its verdict as data (:class:`Verdict`; the verdict
        and the rule alone where the entry gives none)."""
        outcome = self.analyze(ctx)
        record = outcome.record
        if record is None:
            record = Verdict.text_only(outcome.verdict, RULE)
        elif record.verdict != outcome.verdict:
            raise ValueError(f"{self.id}: its verdict record says {record.verdict!r}, its "
                             f"outcome {outcome.verdict!r}; they must be the same")
        note = crashed_note(ctx.runs)
        return replace(outcome, summary=outcome.summary + note, record=record)

    def describe(self) -> dict[str, Any]:
        resolution = None if self.resolution is None else asdict(self.resolution)
        return {"id": self.id, "paper": self.paper, "paper_title": PAPERS[self.paper],
                "target": self.target, "title": self.title, "claim": self.claim,
                "smoke_changes": self.smoke_changes, "cost": self.cost,
                "resolution": resolution}


# id -> Experiment: a bnlab.spec Registry like every catalogue (entries without parameters), so an
# unknown id fails naming the valid ones; the order is ENTRY_MODULES', set by load_catalogue.
CATALOGUE: Registry[Experiment] = Registry("experiment", names_label="ids", sort_names=True)


CRASHED = ("failed", "interrupted", "damaged")  # a run without results (diverged runs have theirs)


def crashed_note(runs) -> str:
    """"; k of n runs crashed, not analysed: label (error), …" for the runs whose status is in
    :data:`CRASHED` (the first three named, the first error's first line), else ""."""
    crashed = [r for r in runs if r.status in CRASHED]
    if not crashed:
        return ""
    named = ", ".join(r.label for r in crashed[:3]) + (", …" if len(crashed) > 3 else "")
    errors = [str(r.record["error"]).strip() for r in crashed if r.record.get("error")]
    error = errors[0].splitlines()[0][:200] if errors and errors[0] else crashed[0].status
    return f"; {len(crashed)} of {len(runs)} runs crashed, not analysed: {named} ({error})"


def register(experiment: Experiment) -> Experiment:
    check_choice("paper", experiment.paper, PAPERS)
    return CATALOGUE.add(experiment.id, experiment)


# The catalogue's order, declared: the entry modules of each paper's package
# (``bnlab.experiments.<paper>``), in the order ``bnlab experiments list`` and the report show them.
# Each module registers its entries when imported; load_catalogue imports them all and then sorts
# the catalogue by this list, so the order does not depend on which module some caller happened to
# import first.
ENTRY_MODULES = (
    "santurkar.vgg", "santurkar.moments", "santurkar.dln", "santurkar.predictiveness",
    "santurkar.lp",
    "luo.student", "luo.fig3", "luo.cnn", "luo.fig5", "luo.fold", "luo.dropout", "luo.table2",
    "peng.tables", "peng.curves", "peng.components", "peng.figures", "peng.amat", "peng.imagenet",
    "arora.entries", "mbn.entries",
    "peng.theorems", "arora.rates", "mbn.theorems",
)


def _rank(experiment: Experiment) -> int:
    """The position of the module that registered ``experiment`` in :data:`ENTRY_MODULES` (others
    last)."""
    package = __name__.rpartition(".")[0]
    module = getattr(experiment.analyze, "__module__", "")
    names = [f"{package}.{name}" for name in ENTRY_MODULES]
    return names.index(module) if module in names else len(names)


def load_catalogue() -> Registry[Experiment]:
    """Import every entry module of :data:`ENTRY_MODULES` and return the catalogue in that order."""
    package = __name__.rpartition(".")[0]
    for name in ENTRY_MODULES:
        importlib.import_module(f"{package}.{name}")
    # stable: a module's entries keep their order
    CATALOGUE.sort(key=lambda entry: _rank(entry.target))
    return CATALOGUE


def get(experiment_id: str) -> Experiment:
    """The entry ``experiment_id``; an unknown id raises ``ValueError`` naming the valid ids."""
    return load_catalogue().entry(experiment_id).target


def check_preset(preset: str) -> str:
    return check_choice("preset", preset, PRESETS)


def shrink(config: dict[str, Any], steps: int) -> dict[str, Any]:
    """A copy of ``config`` cut to at most ``steps`` optimizer steps (used by the tests' 'tiny'
    runs)."""
    out = copy.deepcopy(config)
    out.pop("epochs", None)
    out["steps"] = min(int(out.get("steps") or steps), steps)
    if out.get("checkpoint_every"):
        out["checkpoint_every"] = None
    return out
