"""bnlab.spec: the one parser of ``name(key=value, ...)`` specs, typed parameters and registries."""

from __future__ import annotations

import math

import pytest

from bnlab.spec import (Param, Registry, format_value, parse, params_from_signature,
                        read_pairs, read_value)


def test_parse_splits_only_at_top_level_commas():
    assert parse("ics") == ("ics", {})
    assert parse("  ics( )  ") == ("ics", {})
    name, raw = parse("x(a=(1, 2), b='c, d', c=[1, (2, 3)], d=\"e=f\", e = 3 )")
    assert name == "x"
    assert raw == {"a": "(1, 2)", "b": "'c, d'", "c": "[1, (2, 3)]", "d": '"e=f"', "e": "3"}


@pytest.mark.parametrize("bad, message", [
    ("ics(5)", "key=value"), ("ics(a=1, a=2)", "given twice"), ("1ics", "cannot parse"),
    ("ics(a=(1, 2)", "cannot parse|unbalanced"), ("ics(a='x)", "unbalanced"),
    ("ics(=1)", "key=value"),
])
def test_parse_rejects_malformed_specs(bad, message):
    with pytest.raises(ValueError, match=message):
        parse(bad)


def test_parse_rejects_non_strings():
    with pytest.raises(ValueError, match="must be a string"):
        parse(3)


@pytest.mark.parametrize("word", ["no", "No", "NO", "false", "False", "off", "OFF", "0"])
def test_bool_param_reads_false_words(word):
    assert Param(True, bool).convert("p", "k", word, text=True) is False


@pytest.mark.parametrize("word", ["yes", "YES", "true", "True", "on", "1"])
def test_bool_param_reads_true_words(word):
    assert Param(False, bool).convert("p", "k", word, text=True) is True


def test_bool_param_takes_yaml_booleans_and_rejects_the_rest():
    param = Param(False, bool)
    assert param.convert("p", "k", False) is False and param.convert("p", "k", True) is True
    for bad in ("maybe", "2", 1, 0.0, None):
        with pytest.raises(ValueError, match="expected true or false"):
            param.convert("p", "k", bad, text=isinstance(bad, str))


def test_typed_params_coerce_and_check_constraints():
    # where declared
    assert Param(1.0, float, finite=False).convert("p", "x", "inf", text=True) == math.inf
    # numbers are finite by default
    for hostile in ("inf", "1e400", "1" * 100_000, "nan"):
        with pytest.raises(ValueError, match="finite"):
            Param(1.0, float).convert("p", "x", hostile, text=True)
    assert Param(1.0, float).convert("p", "x", 2) == 2.0 \
        and isinstance(Param(1.0, float).convert("p", "x", 2), float)
    assert Param(1, int).convert("p", "n", " 7 ", text=True) == 7
    with pytest.raises(ValueError, match="expected an integer"):
        Param(1, int).convert("p", "n", True)
    with pytest.raises(ValueError, match="expected an integer"):
        Param(1, int).convert("p", "n", "1.5", text=True)
    with pytest.raises(ValueError, match="must be > 0"):
        Param(1.0, float, positive=True).convert("p", "x", "0", text=True)
    with pytest.raises(ValueError, match="must be >= 2"):
        Param(2, int, minimum=2).convert("p", "depth", 1)
    with pytest.raises(ValueError, match="must be finite"):
        Param(1.0, float, finite=True).convert("p", "x", "inf", text=True)
    with pytest.raises(ValueError, match="valid values: 1, 2, inf"):
        Param("2", str, choices=("1", "2", "inf")).convert("p", "p", "3", text=True)
    assert Param(0.1, float, nullable=True).convert("p", "m", "None", text=True) is None
    with pytest.raises(ValueError, match="expected a number"):
        Param(0.1, float).convert("p", "m", "none", text=True)


def test_tuple_params_check_each_element():
    param = Param((), tuple, item=int, minimum=1)
    assert param.convert("m", "fc", "[512, 256]", text=True) == (512, 256)
    assert param.convert("m", "fc", [3]) == (3,)
    with pytest.raises(ValueError, match="must be >= 1"):
        param.convert("m", "fc", [0])
    with pytest.raises(ValueError, match="expected a list"):
        param.convert("m", "fc", 5)


def test_read_value_literals():
    assert read_value("no") is False and read_value("On") is True
    # a bare 1 is a number, not a bool
    assert read_value("1") == 1 and isinstance(read_value("1"), int)
    assert read_value("1e-3") == 1e-3  # YAML 1.1 would keep this a string
    assert read_value("-inf") == -math.inf and read_value("null") is None \
        and read_value("~") is None
    assert read_value("'no'") == "no" and read_value("abc") == "abc"
    assert read_value("[1, two, [3]]") == [1, "two", [3]]
    assert read_value("(0.5, 1,)") == (0.5, 1) and read_value("()") == ()


def test_read_pairs():
    assert read_pairs(["width=8", "bias=no", "fc_widths=[4, 4]", "name = x=y"], "--opt") == {
        "width": 8, "bias": False, "fc_widths": [4, 4], "name": "x=y"}
    with pytest.raises(ValueError, match="--opt expects KEY=VALUE"):
        read_pairs(["width"], "--opt")


def test_format_value_is_what_a_spec_reads_back():
    for value in (True, False, None, math.inf, 0.5, 3, "linear"):
        assert read_value(format_value(value)) == value


def _probe(every: int = 1, k: int = 8, per_layer: bool = False, layers=None,
           mode: str | None = None, ratio=0.5):
    return dict(every=every, k=k, per_layer=per_layer, layers=layers, mode=mode, ratio=ratio)


def test_params_from_signature_types():
    params = params_from_signature(_probe, skip=("every",))
    assert list(params) == ["k", "per_layer", "layers", "mode", "ratio"]
    assert (params["k"].type, params["per_layer"].type, params["ratio"].type) == (int, bool, float)
    assert params["layers"].type is None and params["layers"].nullable
    assert params["mode"].type is str and params["mode"].nullable


def _registry() -> Registry:
    reg = Registry("probe", names_label="probes", key_label="option")
    reg.register("toy")(_probe)
    reg.register("plain", params={})(lambda: None)
    return reg


def test_registry_lookup_types_values_and_fills_defaults():
    reg = _registry()
    entry, kwargs = reg.lookup("toy(per_layer=no, layers=[a, b], k=3)")
    assert entry.target is _probe and entry.name == "toy"
    assert kwargs == {"every": 1, "k": 3, "per_layer": False, "layers": ["a", "b"],
                      "mode": None, "ratio": 0.5}
    assert reg.lookup("toy(k=3)", defaults=False)[1] == {"k": 3}
    assert reg.names() == ["toy", "plain"] and set(reg) == {"toy", "plain"} and reg["toy"] is _probe
    assert dict(reg.describe())["toy"] == ("toy(every=1, k=8, per_layer=false, layers=none, "
                                           "mode=none, ratio=0.5)")


def test_registry_errors_name_the_choices():
    reg = _registry()
    with pytest.raises(ValueError, match="unknown probe 'tooy'; valid probes: toy, plain"):
        reg.lookup("tooy")
    with pytest.raises(ValueError, match="toy: unknown option\\(s\\) kk; valid options: "
                                         "every, k, per_layer"):
        reg.lookup("toy(kk=1)")
    with pytest.raises(ValueError,
                       match="plain: unknown option\\(s\\) k; valid options: \\(none\\)"):
        reg.lookup("plain(k=1)")
    with pytest.raises(ValueError, match="toy: k='x': expected an integer"):
        reg.lookup("toy(k=x)")
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("toy")(_probe)


def test_registry_normalizes_names():
    reg = Registry("data source", normalize=lambda s: s.strip().lower().replace("-", "_"))
    reg.register("teacher_student", params={})(object)
    assert reg.entry("Teacher-Student").name == "teacher_student"


def test_mbn_tau0_is_a_decay_in_zero_one():
    """Yong et al.'s inference EMA keeps τ = τ0^(m/m0) of the old value; τ0 > 1 made the running
    update's momentum 1 − τ negative and the running statistics run away. Refused by the spec (the
    parameter's maximum) and by the constructor, with the valid range named."""
    import bnlab.norms as N
    from bnlab.norms.variants.momentum import MomentumBatchNorm

    with pytest.raises(ValueError, match="tau0 must be <= 1"):
        N.create("mbn(tau0=2)", 4)
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match=r"tau0 must be in \[0, 1\]"):
            MomentumBatchNorm(4, tau0=bad)
    with pytest.raises(ValueError, match="ideal_batch must be a positive integer"):
        MomentumBatchNorm(4, ideal_batch=0)
    assert N.create("mbn(tau0=1)", 4).tau0 == 1.0 and N.create("mbn(tau0=0)", 4).tau0 == 0.0


def test_param_maximum_is_inclusive():
    from bnlab.spec.params import Param

    p = Param(0.5, float, minimum=0.0, maximum=1.0)
    assert p.convert("x", "k", "1", text=True) == 1.0
    with pytest.raises(ValueError, match="must be <= 1"):
        p.convert("x", "k", "1.01", text=True)
