"""Every catalogue entry states, before its verdict, the effect the paper reports,
the effect its smoke preset can resolve, and the pilot (or computation) behind that number; the
report prints it above the verdict and `bnlab experiments list --long` beside the claim."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from bnlab.experiments import runner
from bnlab.experiments.base import CATALOGUE, Experiment, Outcome, Plan, load_catalogue, register
from bnlab.experiments.common import DesignSD, design_mde
from bnlab.experiments.resolution import Resolution, design_resolution, family_resolution
from bnlab.experiments.verdicts import Design


def test_every_entry_states_what_its_smoke_can_decide():
    missing = [e.id for e in load_catalogue().values() if not isinstance(e.resolution, Resolution)]
    assert not missing, f"entries without a Resolution: {missing}"
    for entry in load_catalogue().values():
        described = entry.describe()["resolution"]
        assert set(described) == {"paper", "resolvable", "pilot"}
        assert all(len(v) > 10 for v in described.values()), entry.id


def test_resolution_fields_must_be_stated():
    with pytest.raises(ValueError, match="Resolution.pilot must be a non-empty string"):
        Resolution("+6.2 points", "≥ 4 points", " ")


def test_design_resolution_is_the_designs_own_numbers():
    design = Design("CBN − BN accuracy", 0.062, 0.03, 5, "pilot: synthetic", n_test=2000)
    res = design_resolution(design, scale=100, unit=" points")
    assert f"≥ {100 * design.mde():.2g} points with 5 seeds per arm" in res.resolvable
    assert res.paper.startswith("+6.2 points") and "pilot: synthetic" in res.pilot
    # an effect below the design's resolution: the entry says what would resolve it
    small = Design("gain", 0.02, 0.03, 3, "pilot: synthetic", n_test=2000)
    n = small.seeds_to_resolve()
    from dataclasses import replace

    assert replace(small, n_seeds=n).mde() <= 0.02 < replace(small, n_seeds=n - 1).mde()
    assert f"needs {n} seeds per arm" in design_resolution(small).resolvable
    # a binomial floor above the effect: no number of seeds resolves it
    tiny = Design("gain", 0.001, 0.0, 3, "pilot: synthetic", n_test=100)
    assert tiny.seeds_to_resolve(limit=50) is None
    assert "no number of seeds" in design_resolution(tiny).resolvable
    direction = Design("loss", -1.0, 0.1, 3, "pilot: synthetic", magnitude_known=False)
    assert design_resolution(direction).paper == "direction only: loss lower"


@pytest.fixture
def computed_entry():
    exp = Experiment(
        id="test-resolution", paper="mbn", target="Thm 0", title="toy", claim="squares grow",
        smoke_changes="none", cost={"smoke": "instant"},
        plan=lambda preset: Plan(compute={"square": lambda: {"y": [1, 4, 9]}}),
        analyze=lambda ctx: Outcome([], [], "held", "squares grew"),
        resolution=Resolution("y grows (Thm 0)", "any growth ≥ 1", "a computation"))
    register(exp)
    yield exp
    CATALOGUE.remove(exp.id)


def test_report_states_the_resolution_above_the_verdict(computed_entry, tmp_path):
    from bnlab.report import write_report

    runner.reproduce("test-resolution", "smoke", runs_dir=tmp_path, progress=False, report=False)
    write_report(tmp_path)
    for name in ("index.md", "index.html"):
        text = (tmp_path / "report" / name).read_text()
        section = text[text.index("test-resolution"):]
        assert "What the smoke can decide" in section, name
        assert section.index("What the smoke can decide") < section.index("Verdict: held")
        assert "any growth ≥ 1" in section and "a computation" in section


def test_experiments_list_prints_the_resolution():
    from bnlab.cli import app

    result = CliRunner().invoke(app, ["experiments", "list", "--long"])
    assert result.exit_code == 0, result.output
    entry = load_catalogue().entry("peng-table2").target
    assert f"resolves: {entry.resolution.resolvable}" in result.output


def test_family_resolution_states_each_comparison_and_the_seeds_the_paper_needs():
    design = DesignSD({"loss": 0.2, "drift": 0.05}, "pilot: synthetic")
    res = family_resolution("direction only: both lower", design, 3)
    assert f"loss ≥ {design_mde(0.2, 3, 3):.2g}; drift ≥ {design_mde(0.05, 3, 3):.2g}" \
        in res.resolvable
    assert res.pilot == design.text()
    one = DesignSD(0.26, "pilot: synthetic")
    res = family_resolution("+5.6 points", one, 3, scale=100, unit=" points per cell",
                            smallest_effect=0.056)
    n = int(res.resolvable.split("needs ")[1].split(" seeds")[0])
    # the widest comparison's resolution first reaches the paper's smallest effect at n seeds
    assert design_mde(0.26, n, n) <= 0.056 < design_mde(0.26, n - 1, n - 1)
    assert "+5.6 points, needs" in res.resolvable and "design SD 26 points" in res.pilot
    resolved = family_resolution("+50 points", one, 3, smallest_effect=5.0)
    assert "needs" not in resolved.resolvable
