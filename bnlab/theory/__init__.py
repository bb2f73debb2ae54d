"""bnlab.theory: the papers' closed forms and simulators, one module per paper.

* :mod:`bnlab.theory.luo`       — Luo et al., regularization in BN (ζ, generalization, dynamics).
* :mod:`bnlab.theory.mbn`       — Yong et al., Momentum BN (batch-noise laws, expansion, moving
  stats).
* :mod:`bnlab.theory.santurkar` — Santurkar et al., Theorems 4.1/4.2 and Lemma 4.5 on real BN
  layers.
* :mod:`bnlab.theory.arora`     — Arora et al., auto rate-tuning (Theorem 2.5, Theorem 3.1).
* :mod:`bnlab.theory.peng`      — Peng et al., Theorem 1's terms T₁, T₂, T₃ from recorded
  statistics.

Results are plain dicts of floats and numpy arrays. Submodules are imported on first access so
that ``bnlab --help`` does not pay for torch/scipy imports.
"""

from __future__ import annotations

import importlib

__all__ = ["luo", "mbn", "santurkar", "arora", "peng"]


def __getattr__(name: str):
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
