"""One way in for plugins (bnlab/plugins.py, bnlab/spec/params.py's signature_params,
bnlab/spec/plugins.py): docs/readme/plugins.md's worked example, run as written — registered from a
user module, used through spec strings, ``bnlab.train.run`` and the ``bnlab train`` CLI."""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Literal, Optional

import pytest
import torch

import bnlab.data as data
import bnlab.models as models
import bnlab.norms as norms
import bnlab.probes as probes
import bnlab.train as train
from bnlab.data.sources import COMMON_ARGUMENTS
from bnlab.norms.registry import NORMS
from bnlab.plugins import Param, model, norm, probe, source
from bnlab.spec import Registry, plugins, signature_params
from bnlab.store import Store

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "readme" / "plugins.md"
MODULE = "my_bnlab_plugins"
NAMES = {"data": "blobs", "model": "two_layer", "norm": "rms_bn", "probe": "logit_scale"}


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), flags=re.S)


def _unregister() -> None:
    for registry, name in ((data.SOURCES, "blobs"), (models.MODEL_INFO, "two_layer"),
                           (NORMS, "rms_bn"), (probes.PROBES, "logit_scale")):
        if name in registry:
            registry.remove(name)
    sys.modules.pop(MODULE, None)


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    """The page's module, written where Python finds it and imported; unregistered afterwards so
    the rest of the suite sees bnlab's own catalogues."""
    folder = tmp_path_factory.mktemp("plugins")
    (folder / f"{MODULE}.py").write_text(blocks("python")[0])
    sys.path.insert(0, str(folder))
    try:
        importlib.import_module(MODULE)
        yield folder
    finally:
        sys.path.remove(str(folder))
        _unregister()


def test_each_kind_is_registered_with_its_options_read_from_the_signature(plugin_dir):
    assert data.SOURCES.entry("blobs").signature() == "blobs(n=256, classes=3, spread=0.5)"
    assert models.MODEL_INFO.entry("two_layer").signature() == "two_layer(hidden=16)"
    assert NORMS.entry("rms_bn").signature() == "rms_bn(eps=1e-05, affine=true)"
    assert probes.PROBES.entry("logit_scale").signature() == "logit_scale(every=1, reduce=mean)"
    # annotations → types and choices: a spec's text is read as the annotation says
    assert data.SOURCES.lookup("blobs(n=64, spread=1)")[1] == {"n": 64, "classes": 3,
                                                               "spread": 1.0}
    assert probes.PROBES.lookup("logit_scale(reduce=max)")[1]["reduce"] == "max"


def test_the_example_is_used_by_name_everywhere(plugin_dir):
    ds = data.load("blobs", n=64, seed=1)
    assert ds.x_train.shape == (64, 2) and ds.num_outputs == 3
    net = models.create("two_layer", norm="rms_bn(eps=1e-4)", input_shape=(2,), num_classes=3,
                        hidden=8)
    layer = next(m for m in net.modules() if type(m).__name__ == "RMSBatchNorm")
    assert layer.eps == 1e-4
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    # the layer against its formula in float64
    ref = x.double() / (x.double().pow(2).mean(0, keepdim=True) + 1e-4).sqrt()
    torch.testing.assert_close(layer(x).double(), ref, rtol=1e-5, atol=1e-6)
    assert isinstance(norms.create("rms_bn", 4), torch.nn.Module)
    assert probes.create("logit_scale(reduce=max)").reduce == "max"


def test_the_pages_script_trains_with_every_plugin(plugin_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(blocks("python")[1], scope)  # the page's own script
    record = scope["record"]
    assert record.status == "finished" and record.steps == 20
    values = _series(tmp_path / "runs" / "bnlab.db", record.id)["probe/logit_scale/value"]
    assert len(values) == 20 and all(0 < v < float("inf") for _, v in values)


def test_mistakes_name_the_valid_choices(plugin_dir):
    with pytest.raises(ValueError, match="reduce='median' is not allowed; valid values: mean, max"):
        probes.create("logit_scale(reduce=median)")
    with pytest.raises(ValueError, match="unknown option.* m; valid options: n, classes, spread"):
        data.load("blobs", m=3)
    with pytest.raises(ValueError, match="valid models: .*two_layer"):
        models.create("three_layer")
    with pytest.raises(ValueError, match="rms_bn: eps='x': expected a number"):
        norms.create("rms_bn(eps=x)", 4)
    for line in blocks("text")[0].splitlines():  # the page's transcript, as printed
        if line.startswith("ValueError: "):
            assert re.search(r"valid (values|options): ", line)


def test_the_cli_finds_the_plugin_through_the_environment(plugin_dir, tmp_path):
    command = blocks("bash")[0].replace("\\\n", " ")
    env_assignment, *argv = shlex.split(command)
    assert env_assignment == f"BNLAB_PLUGINS={MODULE}" and argv[0] == "bnlab"
    env = {**os.environ, "BNLAB_PLUGINS": MODULE, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "bnlab.cli", *argv[1:], "--runs-dir", "runs"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = _rows(tmp_path / "runs" / "bnlab.db")
    record = train.RunRecord.from_store(row)
    assert record.status == "finished" and record.steps == 20
    assert (record.config["model"], record.config["data"]) == ("two_layer", "blobs")
    assert record.config["norm"] == "rms_bn(eps=1e-4)"
    assert len(_series(tmp_path / "runs" / "bnlab.db", record.id)["probe/logit_scale/value"]) == 20
    # without the variable the same command says what it lacks and names what it knows
    env.pop("BNLAB_PLUGINS")
    done = subprocess.run([sys.executable, "-m", "bnlab.cli", *argv[1:], "--runs-dir", "runs2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert re.search(r"unknown (data source 'blobs'|model 'two_layer'); valid \w+: ", done.stderr)


def _rows(db: Path) -> list[dict]:
    with Store(db) as store:
        return store.list_runs()


def _series(db: Path, run_id: str) -> dict[str, list]:
    with Store(db) as store:
        return store.metrics(run_id)


# ---- the rule itself ---------------------------------------------------------------------------

def _loader(*, device="cpu", seed=0, data_dir=None, verify=True, download=False,
            n: int = 8, scale: Optional[float] = None, mode: Literal["a", "b"] = "a",
            sizes: tuple[int, ...] = (1, 2), tag="x"):
    return None


def test_signature_params_reads_names_defaults_and_annotations():
    params = signature_params(_loader, skip=COMMON_ARGUMENTS)
    assert list(params) == ["n", "scale", "mode", "sizes", "tag"]
    assert (params["n"].type, params["scale"].type, params["scale"].nullable) == (int, float, True)
    assert (params["mode"].type, params["mode"].choices) == (str, ("a", "b"))
    assert (params["sizes"].type, params["sizes"].item) == (tuple, int)
    assert params["tag"].type is str  # no annotation: the default's type
    reg = Registry("thing", key_label="option")
    reg.register("t", skip=COMMON_ARGUMENTS)(_loader)
    assert reg.lookup("t(sizes=[3, 4], scale=none, mode=b)")[1] == {
        "n": 8, "scale": None, "mode": "b", "sizes": (3, 4), "tag": "x"}
    with pytest.raises(ValueError, match="mode='c' is not allowed; valid values: a, b"):
        reg.lookup("t(mode=c)")


def test_declared_params_win_and_are_checked_against_the_signature():
    declared = signature_params(_loader, {"n": Param(8, int, minimum=1, help="count")},
                                skip=COMMON_ARGUMENTS)
    assert declared["n"].minimum == 1 and list(declared)[0] == "n"
    assert set(declared) == {"n", "scale", "mode", "sizes", "tag"}  # the rest inferred
    with pytest.raises(TypeError, match="declared parameters {'n': 9} differ"):
        signature_params(_loader, {"n": Param(9, int)}, skip=COMMON_ARGUMENTS)
    with pytest.raises(TypeError, match="declared parameters width are not keyword parameters"):
        signature_params(_loader, {"width": Param(1, int)}, skip=COMMON_ARGUMENTS)


def test_the_four_decorators_behave_alike_without_declared_params():
    """Before, ``@source(name)`` and ``@model(name, ...)`` without ``params`` raised
    "declared parameters {} differ from its signature's ...": only probes read signatures."""
    @source("test_plugin_source")
    def loader(*, device="cpu", seed=0, data_dir=None, verify=True, download=False, n: int = 4):
        return None

    @model("test_plugin_model", "-", images_only=False)
    def build(f, input_shape, num_classes, *, hidden: int = 4):
        return torch.nn.Identity()

    @norm("test_plugin_norm", "identity", "-", "-")
    class Layer(torch.nn.Identity):
        def __init__(self, num_features: int, gain: float = 1.0, device=None, dtype=None):
            super().__init__()

    @probe("test_plugin_probe")
    class Quiet(probes.Probe):
        name = "test_plugin_probe"

        def __init__(self, every: int = 1, depth: int = 2):
            super().__init__(every)

        def measure(self, ctx):
            return {}

    try:
        found = [data.SOURCES.entry("test_plugin_source").params,
                 models.MODEL_INFO.entry("test_plugin_model").params,
                 NORMS.entry("test_plugin_norm").params,
                 probes.PROBES.entry("test_plugin_probe").params]
        assert [list(p) for p in found] == [["n"], ["hidden"], ["gain"], ["every", "depth"]]
        assert [p[k].type for p, k in zip(found, ("n", "hidden", "gain", "depth"))] == [
            int, int, float, int]
    finally:
        data.SOURCES.remove("test_plugin_source")
        models.MODEL_INFO.remove("test_plugin_model")
        NORMS.remove("test_plugin_norm")
        probes.PROBES.remove("test_plugin_probe")


def test_a_plugin_that_fails_to_import_is_named(monkeypatch):
    monkeypatch.setenv(plugins.PLUGINS_ENV, "no_such_bnlab_plugin_module")
    monkeypatch.setattr(plugins, "_loaded", set())
    with pytest.raises(ImportError, match="bnlab plugin 'no_such_bnlab_plugin_module'"):
        data.SOURCES.entry("not_a_source")
