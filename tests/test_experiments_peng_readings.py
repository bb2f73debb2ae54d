"""Peng's ResNet tables under the readings the paper leaves open (peng.readings): which runs are the
main arms, each other reading judged by the primary's rule, "reading-dependent" when a verdict
flips, and the β-swamping mechanism var/(var + β²) read from the cbn_ratios probe."""

from dataclasses import dataclass, field

import pytest

from bnlab.experiments.peng import readings as PR
from bnlab.experiments.peng import tables as T
from bnlab.experiments.peng.verdict import table_design

SHARE = "probe/cbn_ratios/var_share_q50/"


@dataclass
class Run:
    """A stored run as the analysis reads it (label, factors, status, final values)."""

    row: str
    act: str
    reading: str
    seed: int
    acc: float
    shares: dict = field(default_factory=dict)
    status: str = "finished"

    def __post_init__(self):
        self.label = f"{self.row} {self.act} {self.reading} {self.seed}"
        self.factors = {"row": self.row, "activation": self.act, "seed": self.seed,
                        "reading": self.reading, "lr_reading": "paper"}

    def final(self, name, default=None):
        return self.acc if name == "test_accuracy" else default

    def series(self, name, partial_batches=False):
        """Probe readings: the share falls from 1 to its last value."""
        last = self.shares.get(name[len(SHARE):])
        return ([], []) if last is None else ([48, 96], [1.0, last])

    def metric_names(self, prefix=""):
        return sorted(SHARE + k for k in self.shares if (SHARE + k).startswith(prefix))


JITTER = (-0.004, 0.0, 0.004)


def _runs(eq7_cbn=0.10, head_cbn=0.87):
    runs = []
    for seed, j in enumerate(JITTER):
        for act in ("sigmoid", "tanh", "selu"):
            runs += [Run("①", act, "he", seed, 0.88 + j), Run("②", act, "he", seed, 0.885 - j,
                                                              {"a": 0.4, "b": 0.3}),
                     Run("①", act, "eq7", seed, 0.87 + j),
                     Run("②", act, "eq7", seed, (eq7_cbn if act == "sigmoid" else 0.87) + j,
                         {"a": 0.5, "b": 2e-4 * (seed + 1)}),
                     Run("①", act, "eq7_head", seed, 0.86 + j),
                     Run("②", act, "eq7_head", seed, head_cbn - j)]
        runs.append(Run("②", "sigmoid", "he_literal", seed, 0.60 + j))
    return runs


def test_reading_of_and_the_main_arms():
    # stores written before readings were recorded: the residual form says which
    assert PR.reading_of({"residual": "peng"}) == "eq7"
    assert PR.reading_of({"residual": "he"}) == "he"
    assert PR.reading_of({"residual": None}) == "plain"
    assert PR.is_main({"reading": "he"}, 1) and not PR.is_main({"reading": "eq7"}, 1)
    assert PR.is_main({"residual": None}, 2)  # VGG: one form
    assert not PR.is_main({"reading": "he", "lr_reading": "half"}, 1)
    assert PR.is_main({"reading": "he", "table": 3}, None)  # Figs 4-5 carry their table
    assert PR.side_readings(1) == ("eq7", "eq7_head", "he_literal") and PR.side_readings(2) == ()


def test_other_readings_are_judged_and_a_flip_is_reported():
    from bnlab.experiments.readings import combine_readings

    design = table_design(1)
    rows, judged = PR.reading_report(_runs(head_cbn=0.95), 1, 0.1, False, design)
    verdicts = {title: v for title, v, _ in judged}
    # Eq. 7: CBN + Sigmoid collapses (10 % against 87 %): not held under that reading
    assert verdicts["Eq. 7's block (activation before the sum)"] == "not held"
    # with a norm before the classifier CBN gains 9 points: held
    assert verdicts["Eq. 7's block + the norm in front of the classifier"] == "held"
    # the literal order (CBN alone) is judged against the primary reading's BN: 60 % vs 88 %
    literal = "He's block, CBN in Algorithm 1's literal order (BN: the primary reading's)"
    assert verdicts[literal] == "not held"
    # the catalogue's rule: the readings disagree, so the entry is reading-dependent
    verdict, text = combine_readings([("He's block", "not held", "primary"), *judged])
    assert verdict == "inconclusive" and "reading-dependent" in text
    # the mechanism: the smallest layer's share, median over seeds (4e-4 of 2e-4, 4e-4, 6e-4)
    by = PR.runs_by_reading(_runs(), 1)
    mech = PR.mechanism(by)
    assert "Eq. 7's block (activation before the sum): Sigmoid share 0.0004" in mech
    assert f"|β|/SD {PR.fmt(PR.beta_over_sd(4e-4))}" in mech
    assert "He's block (activation after the sum): Sigmoid share 0.3" in mech
    quantities = [r["quantity"] for r in rows]
    assert "reading · Eq. 7's block (activation before the sum) · Sigmoid · ① BN / ② CBN (%)" \
        in quantities
    row = next(r for r in rows if "literal" in r["quantity"] and "Sigmoid" in r["quantity"])
    assert "(BN: the primary reading's)" in row["ours"]


def test_beta_over_sd_inverts_the_share():
    # share = var/(var + β²): β = 3·SD gives 0.1
    assert PR.beta_over_sd(0.1) == pytest.approx(3.0)
    assert PR.beta_over_sd(1.0) == 0.0 and PR.beta_over_sd(0.0) is None


def test_no_flip_no_reading_dependence():
    _, judged = PR.reading_report(_runs(), 1, 0.1, False, table_design(1))
    assert {v for _, v, _ in judged} == {"not held"}
    assert PR.reading_report([], 1, 0.1, False, table_design(1)) == ([], [])


def test_the_table_entry_judges_the_primary_reading_only():
    """The primary reading's cells decide; the Eq. 7 collapse is beside it, not in it."""
    runs = [r for r in _runs() if r.reading == "he"]
    cells = PR.cells_of([r for r in runs if PR.is_main(r.factors, 1)], 0.1)
    assert cells[("②", "sigmoid")] == pytest.approx([0.889, 0.885, 0.881])
    arms = T.main_arm_runs(type("Ctx", (), {"runs": _runs()})(), 1)
    assert {len(v) for v in arms.values()} == {3} and all(
        r.factors["reading"] == "he" for v in arms.values() for r in v)
