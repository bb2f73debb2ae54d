"""bnlab.jsonsafe: the one JSON sanitizer (store columns, catalogue results, `bnlab theory
--json`)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from bnlab.jsonsafe import dumps, jsonable


def test_nested_numbers_arrays_and_tensors_become_plain_json():
    value = {1: (np.float32(0.5), np.int64(3), np.bool_(True)), "a": np.arange(3),
             "t": torch.tensor([[1.5, 2.0]])}
    out = jsonable(value)
    assert out == {"1": [0.5, 3, True], "a": [0, 1, 2], "t": [[1.5, 2.0]]}
    assert type(out["1"][1]) is int and type(out["1"][2]) is bool
    assert json.loads(dumps(value)) == out


def test_non_finite_floats_by_mode():
    value = [math.nan, math.inf, -np.inf, 1.0]
    assert jsonable(value) == [None, None, None, 1.0]
    assert jsonable(value, nonfinite="string") == ["nan", "inf", "-inf", 1.0]
    kept = jsonable(value, nonfinite="keep")
    assert math.isnan(kept[0]) and kept[1:] == [math.inf, -math.inf, 1.0]
    assert dumps(value) == "[null, null, null, 1.0]"
    with pytest.raises(ValueError, match="null, string, keep"):
        jsonable(value, nonfinite="drop")


def test_objects_only_when_asked():
    @dataclasses.dataclass
    class Point:
        x: float

    class Plain:
        def __init__(self):
            self.y = np.float64(2.0)

    assert jsonable({"p": Point(math.nan), "q": Plain(), "s": "s"}, objects=True) == \
        {"p": {"x": None}, "q": {"y": 2.0}, "s": "s"}
    point = Point(1.0)
    assert jsonable(point) is point  # left for json.dumps to refuse
    with pytest.raises(TypeError):
        dumps(point)


def test_reproduce_json_is_strict(monkeypatch, tmp_path):
    # `bnlab reproduce --json` printed NaN (invalid JSON) for a quantity that could not be measured.
    from typer.testing import CliRunner

    from bnlab.cli import experiments as cli
    from bnlab.experiments.base import Outcome

    monkeypatch.setattr(cli, "get", lambda experiment_id: type("E", (), {"id": experiment_id})())
    monkeypatch.setattr(cli, "reproduce", lambda *a, **k: Outcome([tmp_path / "f.png"], [
        {"quantity": "slope", "ours": math.nan,
         "paper": np.float64(0.5)}], "inconclusive", "no finite slope"))
    monkeypatch.setattr(cli, "write_report", lambda runs_dir: tmp_path / "index.html")
    app = __import__("typer").Typer()
    cli.register(app)
    result = CliRunner().invoke(app, ["reproduce", "toy", "--runs-dir", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output,
                     parse_constant=lambda name: pytest.fail(f"non-JSON constant {name}"))
    assert out["toy"]["table"] == [{"quantity": "slope", "ours": None, "paper": 0.5}]
    assert out["toy"]["figures"] == [str(tmp_path / "f.png")]
