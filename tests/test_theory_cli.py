"""`bnlab theory`: the commands print what the theory modules compute, and --plot draws it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from bnlab.jsonsafe import jsonable
from bnlab.cli import theory as cli
from bnlab.theory import arora, luo, santurkar


def _invoke(*args: str):
    result = CliRunner().invoke(cli.theory_app, list(args))
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.parametrize("args, computed", [
    (["luo-rates", "--zeta", "0,0.1", "--eta", "0.1"],
     lambda: luo.rates_table([0.0, 0.1], eta=0.1)),
    (["luo-zeta", "--m", "8,16", "--n-batches", "200"],
     lambda: luo.zeta_table([8, 16], 1.0, 200, seed=0)),
    (["santurkar", "--m", "4", "--loss", "mse"],
     lambda: santurkar.theorems_table([4], ["mse"], gamma=1.5)),
])
def test_json_is_the_theory_functions_result(args, computed):
    out = json.loads(_invoke(*args, "--json").output)
    assert out == jsonable(computed(), nonfinite="string")


def test_arora_rate_table_is_the_modules_summary():
    res = arora.convergence_rates([0.1, 1.0], steps=40, seed=0)
    rows = arora.convergence_table(res, [0.1, 1.0])
    assert [(r["setting"], r["lr_w"]) for r in rows] == [("auto", 0.1), ("auto", 1.0),
                                                         ("projected", 0.1), ("projected", 1.0)]
    assert rows[0]["min_grad_T"] == pytest.approx(float(res["auto"]["min_grad"][0][-1]))


@pytest.mark.parametrize("args", [
    ["luo-zeta", "--m", "8,16", "--n-batches", "200"],
    ["luo-dynamics", "--t-max", "0.5", "--simulate", "30", "--students", "1"],
    ["arora-equivalence", "--steps", "10"],
])
def test_plot_writes_a_png(tmp_path, args):
    path = tmp_path / "fig" / "out.png"
    result = _invoke(*args, "--plot", str(path))
    assert path.stat().st_size > 1000 and "plot written to" in result.output
