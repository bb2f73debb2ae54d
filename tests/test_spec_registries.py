"""Every registry of bnlab on the one spec mechanism (bnlab.spec), parametrized over what is
registered: each entry's default spec reads back as its defaults, and an unknown key fails naming
the valid keys."""

from __future__ import annotations

import pytest

import bnlab.data as data
import bnlab.models as models
import bnlab.norms.registry as norm_registry
import bnlab.probes as probes
from bnlab.probes.gradients import GradStatsProbe
from bnlab.spec import Registry
from bnlab.train.loop import parse_probe_spec

REGISTRIES = {"norms": norm_registry.REGISTRY, "probes": probes.PROBES, "models": models.MODEL_INFO,
              "data": data.SOURCES}
ENTRIES = [(kind, name) for kind, reg in REGISTRIES.items() for name in reg]


def test_every_registry_is_a_spec_registry():
    assert all(isinstance(reg, Registry) for reg in REGISTRIES.values())
    assert len(ENTRIES) >= 12 + 11 + 11 + 6  # nothing fell out of a registry


@pytest.mark.parametrize("kind, name", ENTRIES)
def test_default_spec_round_trips(kind, name):
    reg = REGISTRIES[kind]
    entry = reg.entry(name)
    _, kwargs = reg.lookup(entry.signature())
    assert kwargs == {k: p.default for k, p in entry.params.items()}


@pytest.mark.parametrize("kind, name", ENTRIES)
def test_unknown_key_names_the_valid_keys(kind, name):
    reg = REGISTRIES[kind]
    with pytest.raises(ValueError, match="bogus_key") as info:
        reg.lookup(f"{name}(bogus_key=1)")
    message = str(info.value)
    assert all(key in message for key in reg.entry(name).params)
    assert "(none)" in message or reg.entry(name).params


@pytest.mark.parametrize("kind", list(REGISTRIES))
def test_unknown_name_lists_every_registered_name(kind):
    with pytest.raises(ValueError, match="not_registered") as info:
        REGISTRIES[kind].lookup("not_registered")
    assert all(name in str(info.value) for name in REGISTRIES[kind])


@pytest.mark.parametrize("name", list(probes.PROBES))
def test_every_probe_builds_from_its_default_spec(name):
    probe = probes.create(probes.PROBES.entry(name).signature())
    assert type(probe) is probes.PROBES[name] and probe.every == 1


@pytest.mark.parametrize("word, expected",
                         [("no", False), ("off", False), ("0", False), ("False", False),
                          ("yes", True), ("on", True), ("1", True), ("TRUE", True)])
def test_grad_stats_per_layer_reads_bool_words(word, expected):
    # Before bnlab.spec, --probe "grad_stats(per_layer=no)" gave per_layer='no' (a truthy string),
    # so the per-layer output was switched on; cbn(amat=no) and YAML `no` gave False.
    assert parse_probe_spec(f"grad_stats(per_layer={word})") == (
        "grad_stats", {"per_layer": expected})
    probe = probes.create(f"grad_stats(per_layer={word}, every=3)")
    assert isinstance(probe, GradStatsProbe) and probe.per_layer is expected and probe.every == 3
    assert norm_registry.lookup(f"cbn(amat={word})")[1]["amat"] is expected


def test_probe_options_are_typed_and_checked():
    with pytest.raises(ValueError, match="grad_stats: per_layer='maybe': expected true or false"):
        parse_probe_spec("grad_stats(per_layer=maybe)")
    with pytest.raises(ValueError, match="grad_stats: k='x': expected an integer"):
        probes.create("grad_stats", k="x")
    assert parse_probe_spec("ics(layers=[fc1, fc2])") == ("ics", {"layers": ["fc1", "fc2"]})


def test_model_and_data_options_are_typed():
    model = models.create("mlp", norm="none", input_shape=(4,), num_classes=2, depth="2",
                          width=3, logit_bn="no")
    assert model.spec["depth"] == 2 and model.spec["logit_bn"] is False
    with pytest.raises(ValueError, match="depth must be >= 2"):
        models.create("mlp", input_shape=(4,), num_classes=2, depth=1)
    with pytest.raises(ValueError, match="dln: unknown option\\(s\\) wdth; valid options: "
                                         "depth, width, bias"):
        models.create("dln", input_shape=(4,), num_classes=2, wdth=3)
    ds = data.load("Gaussian-Regression", d="3", n=8, n_test=0)
    assert tuple(ds.x_train.shape) == (8, 3)
    with pytest.raises(ValueError, match="gaussian_regression: n='many': expected an integer"):
        data.load("gaussian_regression", n="many")


def test_training_config_probes_get_typed_options_and_cadence():
    from bnlab.train.config import TrainConfig
    from bnlab.train.prepare import _probe_callbacks

    spec_probe, plain = _probe_callbacks(TrainConfig(
        probes=["grad_stats(per_layer=no, every=3)", "grad_stats"], probe_every=5, steps=1))
    # the spec's every wins over probe_every
    assert (spec_probe.per_layer, spec_probe.every) == (False, 3)
    assert (plain.per_layer, plain.every) == (False, 5)
