"""Constants and helpers shared by the Luo et al. 2019 entries (:mod:`bnlab.experiments.luo`)."""

from __future__ import annotations

import math
import tempfile
from typing import Any, Callable, Sequence

from bnlab.jsonsafe import jsonable
from bnlab.store import Store
import bnlab.train as bnlab_train  # looked up on use: a test can patch bnlab.train.run

from ..base import shrink
from bnlab.formatting import finite_or_none
from ..common import Comparison, compare_arms
from ..runner import TINY_STEPS

NOISE_VAR = 0.25          # §4.1: "let the noise variance ϵ of the teacher be 0.25"
FIG2_ZETAS = (0.014, 0.25)  # the two WN curves of Fig. 2
FIG3_ZETA = 0.014          # Fig. 3's WN with regularization
TRAIN_SIZES = {"cifar10": 50000}
_TOL = math.log(1.5)       # "matches within a factor 1.5" for ratios compared in the verdicts


def jsonable_copy(obj: Any) -> Any:
    """JSON-able copy: arrays to lists, non-finite floats to None (strict JSON, plots skip None)."""
    return jsonable(obj)


def plot_points(xs: Sequence[float],
                ys: Sequence[float | None]) -> tuple[list[float], list[float | None]]:
    # plots.panels draws a single point with its own marker; doubling it keeps our marker style.
    xs, ys = list(xs), list(ys)
    return (xs * 2, ys * 2) if len(xs) == 1 else (xs, ys)


def train_collecting(config: dict, *, callbacks: Sequence[Any] = (),
                     model_factory: Callable | None = None, tiny: bool = False,
                     runs_dir: str | None = None) -> dict:
    """Train one config and return its final record and every metric series.

    For the entries whose runs need Python objects a config cannot hold (a model folded from another
    run, a callback measuring something no probe does). ``runs_dir``: the entry's run store, where
    the run is trained, resumed after an interruption and, once ended, read back without training
    (the runner passes it; give such a run a ``model`` label of its own with ``model_factory``, so
    it is not the plain config's run); None trains in a throw-away store. ``tiny`` cuts the run as
    the runner does. Returns ``{"status", "metrics", "series": {name: [[step, value], ...]}}``;
    never raises for a run that diverged or failed (the error is in ``"error"``).
    """
    config = shrink(config, TINY_STEPS) if tiny else dict(config)
    if runs_dir is not None:
        return _train_in(runs_dir, config, callbacks, model_factory)
    with tempfile.TemporaryDirectory(prefix="bnlab-entry-") as tmp:
        return _train_in(tmp, config, callbacks, model_factory)


def _train_in(runs_dir: str, config: dict, callbacks: Sequence[Any],
              model_factory: Callable | None) -> dict:
    config = {**config, "runs_dir": str(runs_dir)}
    try:
        record = bnlab_train.run(config, callbacks=list(callbacks), progress=False,
                                 model_factory=model_factory)
    except Exception as err:  # a failed computation is reported, not fatal
        return {"status": "failed", "metrics": {}, "series": {},
                "error": f"{type(err).__name__}: {err}"}
    with Store(f"{runs_dir}/bnlab.db") as store:
        series = {name: [[s, v] for s, v in rows]
                  for name, rows in store.metrics(record.id).items()}
    return {"status": record.status, "metrics": jsonable_copy(record.metrics),
            "series": jsonable_copy(series), "error": record.error}


def unfinished_status(data: dict, *keys: str, default: str = "recorded too little") -> str:
    """Why a computed result has no values: the first status among ``data[key]`` (or
    ``data["branches"][key]``) that is not "finished" (e.g. "diverged"), else ``default``."""
    records = [data.get(k) or (data.get("branches") or {}).get(k) or {} for k in keys]
    return next((r["status"] for r in records if r.get("status") not in (None, "finished")),
                default)


def collected_series(data: dict, name: str) -> tuple[list[float], list[float]]:
    rows = (data.get("series") or {}).get(name) or []
    return [r[0] for r in rows], [r[1] for r in rows]


# ---- the stated rules of the Luo verdicts: seeds, factors, settling ------------------------------

SETTLE_RULE = ("settled when the verdict from the values at 2/3 of training (each the mean of the "
               "3 records up to that point) is the verdict at the end; otherwise inconclusive "
               "(still changing)")


def window_mean(steps: Sequence[float], values: Sequence[float | None], fraction: float = 1.0,
                k: int = 3) -> float | None:
    """Mean of the last ``k`` finite values recorded at or before ``fraction`` × the last recorded
    step.

    ``fraction`` = 1: the end of the run (a noisy curve read as the mean of its last 3 records);
    2/3: the same quantity a third of the run earlier, for :func:`settle`. None when no finite value
    is there.
    """
    if not steps:
        return None
    limit = steps[-1] * fraction
    kept = [v for s, v in zip(steps, values) if s <= limit and finite_or_none(v) is not None]
    return float(sum(kept[-k:]) / len(kept[-k:])) if kept else None


def factor_test(reference: Sequence[float], values: Sequence[float],
                factor: float = 1.5) -> tuple[str, Comparison]:
    """Whether ``values`` lie within a factor ``factor`` of ``reference`` (positive per-seed
    values), by :func:`common.compare_arms` on logarithms: two one-sided Welch tests (TOST, α = 0.05
    each).

    "within": ln b is significantly below ln a + ln f and significantly above ln a − ln f; "beyond":
    significantly above ln a + ln f or below ln a − ln f; "unresolved" otherwise (too few seeds or
    too much spread). A constant ``reference`` (a theory value repeated) makes each test a
    one-sample t-test. Returns the decision and the plain comparison of ln b with ln a (its ``text``
    gives the log-ratio).
    """
    la = [math.log(v) for v in reference if finite_or_none(v) is not None and v > 0]
    lb = [math.log(v) for v in values if finite_or_none(v) is not None and v > 0]
    shift = math.log(factor)
    upper = compare_arms([v + shift for v in la], lb).decision
    lower = compare_arms([v - shift for v in la], lb).decision
    plain = compare_arms(la, lb)
    if upper == "higher" or lower == "lower":
        return "beyond", plain
    if upper == "lower" and lower == "higher":
        return "within", plain
    return "unresolved", plain


# ---- luo-fig2: BN's batch noise's share of the fitted ridge, ζ against run length ------------

def zeta_share(bn: dict, control: dict) -> list[float]:
    """BN's batch noise's share of the fitted ridge ζ (Luo et al. 2019, Fig. 2), per seed:
    ζ_BN,s − ζ_control,s, where the control is the same student trained on the same data in the same
    minibatch order without batch noise, so the difference pairs seed by seed and cancels what both
    share (early stopping, finite N). [] when either block lacks a finite per-seed fit or the two
    blocks have different numbers of seeds."""
    a = [finite_or_none(v) for v in (bn or {}).get("seed_fit_zeta") or []]
    b = [finite_or_none(v) for v in (control or {}).get("seed_fit_zeta") or []]
    if not a or len(a) != len(b) or None in a or None in b:
        return []
    return [x - y for x, y in zip(a, b)]


def zeta_by_epochs(data: dict, pairs: Sequence[tuple[str, str]]) -> list[dict]:
    """ζ against run length: for each (BN block key, control block key) of ``data`` holding both,
    a row ``{"epochs", "bn", "control", "share"}`` with the per-seed fitted ζ of each arm and their
    paired difference (:func:`zeta_share`); sorted by epochs. Blocks without per-seed fits are left
    out."""
    rows = []
    for bn_key, control_key in pairs:
        bn, control = data.get(bn_key) or {}, data.get(control_key) or {}
        share = zeta_share(bn, control)
        if share and bn.get("epochs") is not None:
            rows.append({"epochs": bn["epochs"], "bn": list(bn["seed_fit_zeta"]),
                         "control": list(control["seed_fit_zeta"]), "share": share})
    return sorted(rows, key=lambda r: r["epochs"])
