"""Luo, Wang, Shao & Peng 2019 — Towards understanding regularization in batch normalization.

Paper: Luo, Wang, Shao & Peng, ICLR 2019. Entries, by module (all registered when this module is imported):

``luo_student``:

* ``luo-fig2`` — ε_gen against the load α = P/N: Eq. 14 (vanilla SGD, sign-corrected), Eqs. 15–16
  (WN + ζγ², Krogh–Hertz ridge) for ζ = 0.014, 0.25 and Eq. 13's ζ, and the BN student simulated by
  minibatch SGD (``bnlab.theory.luo.simulate_teacher_student``); the ζ that best fits the BN points.
* ``luo-fig3`` — validation loss over epochs at α = 1: vanilla SGD, BN (M = 32), WN + ζγ² (ζ = 0.014).
``luo_cnn``:

* ``luo-fig4`` — the CNN of §5 (``luo_cnn``): SGD, BN, WN, WN + mean-only BN, WN + variance-only BN.
* ``luo-fig5`` — γ² (probe ``gamma``) and ζ (probe ``bn_regularization``, Theorem 1) against the batch size.
* ``luo-fig6`` — fine-tuning with BN folded into the weights (``bnlab.norms.fold``) against going on with BN.
* ``luo-fig7`` — BN at M = 64 and 256, WN at 256, and both with dropout after each block (see
  the entry's ``smoke_changes``).

``luo_table2``: ``luo-table2`` — Table 2's fixed points, η_max and η_eff against simulation.

Conventions: the generalization error of Fig. 2 is the excess test error of Eqs. 14–16; in Figs 3–7
"generalization error" is validation loss − training loss (§4.1, §5).
"""

from __future__ import annotations

import math
import tempfile
from typing import Any, Callable, Sequence

import numpy as np

from bnlab.jsonsafe import jsonable

from .base import shrink
from .common import finite_or_none

NOISE_VAR = 0.25          # §4.1: "let the noise variance ϵ of the teacher be 0.25"
FIG2_ZETAS = (0.014, 0.25)  # the two WN curves of Fig. 2
FIG3_ZETA = 0.014          # Fig. 3's WN with regularization
TRAIN_SIZES = {"cifar10": 50000}
_TOL = math.log(1.5)       # "matches within a factor 1.5" for ratios compared in the verdicts


def _fmt(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}g}"


def _clean(obj: Any) -> Any:
    """JSON-able copy: arrays to lists, non-finite floats to None (strict JSON, plots skip None)."""
    return jsonable(obj)


def _points(xs: Sequence[float], ys: Sequence[float | None]) -> tuple[list[float], list[float | None]]:
    # plots.panels draws a single point with its own marker; doubling it keeps our marker style.
    xs, ys = list(xs), list(ys)
    return (xs * 2, ys * 2) if len(xs) == 1 else (xs, ys)


def train_collecting(config: dict, *, callbacks: Sequence[Any] = (), model_factory: Callable | None = None,
                     tiny: bool = False) -> dict:
    """Train one config in a throw-away store and return its final record and every metric series.

    For the entries whose runs need Python objects a config cannot hold (a model folded from another
    run, a callback measuring something no probe does). ``tiny`` cuts the run as the runner does.
    Returns ``{"status", "metrics", "series": {name: [[step, value], ...]}}``; never raises for a run
    that diverged or failed (the error is in ``"error"``).
    """
    from bnlab.store import Store
    from bnlab.train import run

    from .runner import TINY_STEPS

    config = shrink(config, TINY_STEPS) if tiny else dict(config)
    with tempfile.TemporaryDirectory(prefix="bnlab-entry-") as tmp:
        config["runs_dir"] = tmp
        try:
            record = run(config, callbacks=list(callbacks), progress=False, model_factory=model_factory)
        except Exception as err:  # noqa: BLE001 — a failed computation is reported, not fatal
            return {"status": "failed", "metrics": {}, "series": {}, "error": f"{type(err).__name__}: {err}"}
        store = Store(f"{tmp}/bnlab.db")
        try:
            series = {name: [[s, v] for s, v in rows] for name, rows in store.metrics(record.id).items()}
        finally:
            store.close()
    return {"status": record.status, "metrics": _clean(record.metrics), "series": _clean(series), "error": record.error}


def _series(data: dict, name: str) -> tuple[list[float], list[float]]:
    rows = (data.get("series") or {}).get(name) or []
    return [r[0] for r in rows], [r[1] for r in rows]


# The entries register themselves on import (the catalogue imports this module only); the names below are
# re-exported for callers of the single-module layout.
from .luo_student import (  # noqa: E402,F401  (figs 2, 3 first: the catalogue keeps registration order)
    _FIG2_SIZES, _FIG3_LABELS, PopulationStatisticsEval, fig2_data, fig2_verdict, fig3_verdict,
)
from .luo_cnn import _FIG6  # noqa: E402,F401
from . import luo_table2  # noqa: E402,F401
