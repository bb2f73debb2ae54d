"""The public packages export what a user needs, in torch.nn's style: the registry's
internals stay in ``bnlab.norms.registry``, theory's estimators stay out of ``bnlab.probes``, the
old callback protocol is gone from ``bnlab.train``, and the run store is one package."""

from __future__ import annotations

import importlib

import pytest

PUBLIC = ("bnlab.norms", "bnlab.probes", "bnlab.train", "bnlab.store")


@pytest.mark.parametrize("name", PUBLIC)
def test_every_exported_name_exists_once(name):
    module = importlib.import_module(name)
    assert len(module.__all__) == len(set(module.__all__)), "a name listed twice"
    assert [n for n in module.__all__ if not hasattr(module, n)] == []


def test_norms_keeps_its_registry_internals_in_the_registry_module():
    import bnlab.norms as norms
    from bnlab.norms import registry

    for name in ("REGISTRY", "Param", "lookup", "parse_spec"):
        assert name not in norms.__all__ and not hasattr(norms, name), name
        assert hasattr(registry, name), name
    # what a user does with the package: build a layer, list the catalogue
    assert "create" in norms.__all__ and "describe" in norms.__all__ \
        and "BatchNorm" in norms.__all__
    assert [info.name for info in norms.describe()] == list(registry.REGISTRY)


def test_probes_and_train_export_no_other_layers_names():
    import bnlab.probes as probes
    import bnlab.train as train
    from bnlab.probes.bn_regularization import luo_zeta  # the probe's tensor form, in its module

    assert "luo_zeta" not in probes.__all__ and not hasattr(probes, "luo_zeta") \
        and callable(luo_zeta)
    assert "StepContext" not in train.__all__ and not hasattr(train, "StepContext")


def test_store_is_one_package_with_the_store_and_its_errors():
    import bnlab.store as store
    from bnlab.store.database import Store

    assert store.Store is Store
    assert {"Store", "StoreIntegrityError", "StoreVersionError", "StoreCorruptError",
            "ReadOnlyStoreError"} <= set(store.__all__)
    assert "dumps" not in store.__all__ and not hasattr(store, "dumps")  # bnlab.jsonsafe's
