"""One registration mechanism (bnlab.spec.Registry with declared, typed parameters)
for norms, probes, models, data sources and experiments, and one parser per mini-grammar (schedules,
--log-to, norm '+' joins, KEY=VALUE) with one "valid choices" error style."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import bnlab.data as data
import bnlab.models as models
import bnlab.norms as norms
from bnlab.data.base import source
from bnlab.models.catalog import MODEL_INFO, model
from bnlab.spec import Param, Registry, check_choice, declared, split_joined, split_tagged
from bnlab.train.schedules import parse_schedule
from bnlab.train.trackers import parse_log_to

ROOT = Path(__file__).resolve().parents[1] / "bnlab"


def _functions_named(name: str) -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{path.relative_to(ROOT)}:{node.lineno}" for node in ast.walk(tree)
                  if isinstance(node, ast.FunctionDef) and node.name == name]
    return found


@pytest.mark.parametrize("name", ["check_choice", "as_choice"])
def test_one_choice_validator(name):
    # before: models/blocks.py and theory/_common.py each had a check_choice (two error styles),
    # data/base.py an as_choice
    expected = ["spec/grammar.py"] if name == "check_choice" else []
    assert [f.split(":")[0] for f in _functions_named(name)] == expected


def test_check_choice_message_and_bool_is_not_int():
    assert check_choice("size", 16, (8, 16, 32)) == 16
    with pytest.raises(ValueError, match=r"^unknown loss 'x'; valid losses: mse, ce$"):
        check_choice("loss", "x", ("mse", "ce"))
    with pytest.raises(ValueError, match="valid sizes: 1, 2"):
        check_choice("size", True, (1, 2))  # True == 1 in Python, but a flag is not a size


# --------------------------------------------------------------------------------- '+' joins

def test_plus_inside_brackets_does_not_split_a_norm_spec():
    # before: spec.split("+") cut "bn(eps=1e+0)" into "bn(eps=1e" and "0)" and refused it
    assert split_joined("wn + mean_only_bn") == ["wn", "mean_only_bn"]
    assert split_joined("bn(eps=1e+0)+bn") == ["bn(eps=1e+0)", "bn"]
    layer = norms.create("bn(eps=1e+0)", 4)
    reference = torch.nn.BatchNorm1d(4, eps=float("1e+0"))
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(layer(x), reference(x))
    norms.validate("wn+bn(eps=1e+0)")
    with pytest.raises(ValueError, match="empty part in normalization spec 'bn\\+'"):
        norms.validate("bn+")


# ------------------------------------------------------------------------ KIND:REST grammars

FORMS = {"constant": "constant", "exp": "exp:GAMMA"}


@pytest.mark.parametrize("text, message", [
    ("cosine", "unknown schedule 'cosine'; valid forms: constant | exp:GAMMA"),
    ("cos:1", "unknown schedule 'cos'; valid forms: constant | exp:GAMMA"),
    ("exp", "bad schedule 'exp'; expected exp:GAMMA"),
    ("constant:2", "bad schedule 'constant:2'; expected constant"),
])
def test_split_tagged_errors_name_the_valid_forms(text, message):
    with pytest.raises(ValueError, match=f"^{message.replace('|', '[|]')}$"):
        split_tagged(text, "schedule", FORMS)
    assert split_tagged("exp:0.9", "schedule", FORMS) == ("exp", "0.9")


def test_schedules_and_log_to_share_the_grammar_and_error_style():
    assert parse_schedule("Step:60,100:0.2")(0, 100) == pytest.approx(0.2**2)
    assert parse_schedule("constant")(5, 5) == 1.0
    cases = ((parse_schedule, "cosine", "schedule"), (parse_log_to, "wandb:x", "tracker"))
    for parse, text, kind in cases:
        with pytest.raises(ValueError, match=f"unknown {kind} .*; valid forms: "):
            parse(text)
    with pytest.raises(ValueError, match="bad tracker 'mlflow'; expected mlflow:URI"):
        parse_log_to("mlflow")


# ------------------------------------------------------------------ declared, typed parameters

def test_model_options_are_declared_not_guessed_from_names():
    # before: _option_param gave any option named "depth" a minimum of 2 and left str options
    # (residual, padding_mode) unchecked until the builder ran
    @model("test_decl_depth", "-", images_only=False, params={"depth": Param(1, int, minimum=1)})
    def one_layer(f, input_shape, num_classes, *, depth: int = 1):
        return torch.nn.Linear(input_shape[0], num_classes)

    try:
        assert MODEL_INFO.lookup("test_decl_depth(depth=1)")[1] == {"depth": 1}
    finally:
        MODEL_INFO.remove("test_decl_depth")
    assert "test_decl_depth" not in MODEL_INFO
    with pytest.raises(ValueError, match="residual='x' is not allowed; valid values: he, peng"):
        MODEL_INFO.lookup("resnet20(residual=x)")
    with pytest.raises(ValueError, match="padding_mode='reflect' .*valid values: zeros, replicate"):
        models.create("vgg16", padding_mode="reflect")


def test_a_declaration_that_drifts_from_the_signature_is_refused_at_import():
    with pytest.raises(TypeError, match="declared parameters"):
        @model("test_drift", "-", images_only=False, params={"width": Param(2, int)})
        def drift(f, input_shape, num_classes, *, width: int = 3):
            return torch.nn.Identity()
    with pytest.raises(TypeError, match="declared parameters"):
        @source("test_drift", {"n": Param(2, int)})
        def loader(*, device="cpu", seed=0, data_dir=None, verify=True, download=False, n=1, m=2):
            return None
    with pytest.raises(TypeError, match="declared parameters k are not keyword parameters"):
        @source("test_drift", {"k": Param(1, int)})
        def loader_k(*, device="cpu", seed=0, data_dir=None, verify=True, download=False, n=1):
            return None
    assert "test_drift" not in MODEL_INFO and "test_drift" not in data.SOURCES
    # declaring some options is not drift: the others are read from the signature
    @source("test_partial", {"n": Param(1, int, minimum=1)})
    def partial(*, device="cpu", seed=0, data_dir=None, verify=True, download=False, n=1, m=2):
        return None
    try:
        params = data.SOURCES.entry("test_partial").params
        assert list(params) == ["n", "m"] and params["n"].minimum == 1 and params["m"].type is int
    finally:
        data.SOURCES.remove("test_partial")
    assert declared(lambda *, a=1: a, {"a": Param(1, int)}) == {"a": Param(1, int)}


def test_data_source_options_are_validated_by_the_registry():
    # before: the types were read from the loaders' defaults, so digits(size=9) passed the
    # registry and only the loader's own check caught it
    with pytest.raises(ValueError, match="size='9' is not allowed; valid values: 8, 16, 32"):
        data.SOURCES.lookup("digits(size=9)")
    with pytest.raises(ValueError, match="standardize='x' .*; valid values: channel, pixel, none"):
        data.load("digits", standardize="x")
    with pytest.raises(ValueError, match="teacher_student: P must be >= 1, got '0'"):
        data.SOURCES.lookup("teacher_student(P=0)")
    options = data.SOURCES.lookup("imagefolder(max_per_class=none, cache=memory)")[1]
    assert options["cache"] == "memory" and options["max_per_class"] is None


def test_experiments_are_a_registry_in_the_declared_order():
    from bnlab.experiments import base

    catalogue = base.load_catalogue()
    assert isinstance(catalogue, Registry) and catalogue is base.CATALOGUE
    ranks = [base._rank(e) for e in catalogue.values()]
    assert ranks == sorted(ranks) and ranks[-1] < len(base.ENTRY_MODULES)
    with pytest.raises(ValueError, match="unknown experiment 'nope'; valid ids: ") as info:
        base.get("nope")
    assert all(i in str(info.value) for i in catalogue)
    with pytest.raises(ValueError, match="unknown paper 'ioffe'; valid papers: santurkar"):
        base.register(base.Experiment("x", "ioffe", "", "", "", "", {}, base.Plan, None))


def test_registry_sort_and_remove():
    reg: Registry[int] = Registry("thing", names_label="things")
    for name, value in (("b", 2), ("a", 1), ("c", 3)):
        reg.add(name, value)
    reg.sort(key=lambda entry: entry.target)
    assert list(reg) == ["a", "b", "c"]
    assert reg.remove("b") == 2 and list(reg) == ["a", "c"]
    with pytest.raises(ValueError, match="unknown thing 'b'; valid things: a, c"):
        reg.remove("b")


def test_verdict_settling_reads_schedules_with_the_one_parser():
    # before: experiments/verdicts.py split "step:..." by hand and missed "Step:60", which
    # training accepts (parse_schedule is case-insensitive), so the run settled at 2/3 instead
    from bnlab.experiments.run_facts import settle_fraction

    for text in ("step:60", "Step:60", " STEP:60:0.2"):
        assert settle_fraction({"schedule": text, "epochs": 120}) == pytest.approx((60 + 30) / 120)
    assert settle_fraction({"schedule": "exp:0.99", "epochs": 120}) == pytest.approx(2 / 3)
