"""bnlab.probes' __all__ in torch.nn's style, no re-exports of the run
store's files from bnlab.train, and every probe's and layer's docstring names its paper and an
equation or section."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import bnlab.probes as probes
import bnlab.store.run_files as run_files
from bnlab.norms.registry import NORMS

ROOT = Path(__file__).resolve().parents[1]

# the authors of the papers the probes and layers implement or build on (papers/README.md and the
# layers' own sources: Ioffe & Szegedy, Hoffer's ℓ∞ BN, Salimans & Kingma's WN, Wu & He's GN)
AUTHORS = re.compile(r"\b(Santurkar|Luo|Peng|Arora|Yong|Ioffe|Hoffer|Salimans|Wu)\b")
REFERENCE = re.compile(r"(\bEqs?\.\s*\d|§\s*\d|\bSection \d|\bApp\. [A-Z]|\bAlg\. \d|"
                       r"\bAlgorithm \d|\b(Theorem|Lemma|Definition|Proposition)s? [A-Z]?\d)")


@pytest.mark.parametrize("name", list(probes.PROBES))
def test_every_probe_docstring_names_its_paper_and_equation(name):
    doc = inspect.getdoc(probes.PROBES[name]) or ""
    assert AUTHORS.search(doc), f"{name}: no paper author in the docstring"
    assert REFERENCE.search(doc), f"{name}: no equation/section reference (Eq., §, Theorem...)"


LAYERS = [(name, info) for name, info in NORMS.items() if inspect.isclass(info.factory)]


@pytest.mark.parametrize("name, info", LAYERS, ids=[n for n, _ in LAYERS])
def test_every_layer_docstring_names_its_paper_and_equation(name, info):
    doc = inspect.getdoc(info.factory) or ""
    assert AUTHORS.search(doc) and REFERENCE.search(doc), f"{name}: {doc[-200:]!r}"
    # the registry's declaration (next to the class) and the docstring agree
    assert info.equation in doc and info.paper.split()[0] in doc


def test_every_registered_norm_but_identity_has_a_paper():
    assert len(LAYERS) == len(NORMS) - 1
    assert all(info.paper.strip("- ") and info.equation.strip("- ") for n, info in NORMS.items()
               if n != "none")


def test_probes_all_is_small_and_public():
    names = set(probes.__all__)
    assert len(probes.__all__) <= 25 and len(names) == len(probes.__all__)
    assert {"Lab", "create", "available", "describe", "PROBES", "Probe", "max_stable_lr"} <= names
    assert {type(p).__name__ for p in map(probes.create, probes.PROBES)} <= names
    helpers = {"Snapshot", "preserved", "simulated_step", "bn_layers", "default_range",
               "hutchinson_trace", "SEARCHES", "DEFAULT_CANDIDATES"}
    assert not helpers & names  # helpers stay attributes (documented), outside __all__
    assert all(hasattr(probes, n) for n in helpers | names)


def _store_file_names() -> set[str]:
    return {n for n, v in vars(run_files).items()
            if not n.startswith("_") and getattr(v, "__module__", None) == run_files.__name__}


def test_run_files_names_are_imported_from_the_store_not_through_train():
    names = _store_file_names()
    assert {"RunLock", "RunLockedError", "checkpoint_path", "lock_path"} <= names
    found = []
    for folder in ("bnlab", "tests", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                module = node.module if isinstance(node, ast.ImportFrom) else None
                if (module or "").startswith("bnlab.train") and any(
                        a.name in names for a in node.names):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
    import bnlab.train.checkpoint as checkpoint
    import bnlab.train.loop as loop
    import bnlab.train.record as record

    assert not hasattr(record, "RunLock") and not hasattr(loop, "RunLockedError")
    assert not {"RunLock", "RunLockedError", "lock_path", "is_locked"} & set(vars(checkpoint))
