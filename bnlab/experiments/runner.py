"""Run catalogue entries: sweeps of training runs (locally or on Ray), computations, stored
results."""

from __future__ import annotations

import inspect
import json
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Iterable, Iterator

import bnlab.train as train
from bnlab.jsonsafe import jsonable
from bnlab.store import Store, StoreIntegrityError
from bnlab.train import launcher
from bnlab.store.run_files import RunLockedError

from . import outcomes, parallel
from .base import Outcome, Plan, RunSpec, check_preset, get, shrink
from .views import AnalysisContext, RunView


class ResultStore:
    """Entry-level results beside the run store: the ``experiments`` table of the same SQLite file,
    read and written through :class:`bnlab.store.Store` (one access path: its busy timeout, retries,
    schema version and read-only opening).

    For each (experiment, preset): the run ids by label with their factors, and the JSON data of the
    entry's computations. Together with the runs' metrics this is all the report needs.

    ``store``: an open :class:`Store` of ``runs_dir`` to read and write through (not closed by
    :meth:`close`: its opener closes it); by default one is opened here.
    """

    def __init__(self, runs_dir: str | Path, *, store: Store | None = None):
        self.runs_dir = Path(runs_dir)
        self.path = self.runs_dir / "bnlab.db"
        self._owned = store is None
        self._store = Store(self.path) if store is None else store

    def close(self) -> None:
        if self._owned:
            self._store.close()

    def save(self, experiment_id: str, preset: str, runs: list[dict], data: dict, tiny: bool,
             seconds: float) -> None:
        # tensors/arrays as lists, other objects as their fields; NaN kept as the analyses read it
        # back
        data = jsonable(data, nonfinite="keep", objects=True)
        self._store.save_entry(experiment_id, preset, runs, data, tiny=tiny, seconds=seconds)

    def load(self, experiment_id: str, preset: str) -> dict | None:
        return self._store.load_entry(experiment_id, preset)

    def entries(self) -> list[tuple[str, str]]:
        return self._store.entries()


# ---- sweeps ------------------------------------------------------------------------------------

LOCK_POLL_SECONDS = 2.0


def _train_one(config: dict, callbacks: list | tuple = ()) -> dict:
    """Train one config; a crash becomes a 'failed' record instead of stopping the sweep. A run
    another process is training (a second sweep on the same runs dir) is waited for, then read:
    it is that process's run, not a failure of this one. ``callbacks`` only observe (progress).
    The record gets ``seconds``: this call's wall time."""
    # bnlab.train.run looked up at call time: a test may replace it
    # nproc > 1: data-parallel
    run = launcher.train if int(config.get("nproc") or 1) > 1 else train.run

    said = False
    started = time.perf_counter()
    try:
        while True:
            try:
                kwargs = {"callbacks": list(callbacks)} if callbacks else {}
                record = run(config, progress=False, **kwargs).to_dict()
                return {**record, "seconds": time.perf_counter() - started}
            except RunLockedError as err:
                if not said:
                    print(f"waiting: {err}", file=sys.stderr, flush=True)
                    said = True
                time.sleep(LOCK_POLL_SECONDS)
    except Exception as err:  # the sweep must go on; the error is recorded
        try:  # the stored run's id (run identity covers more than the config), else the config's
            run_id = getattr(err, "bnlab_run_id", None) or train.TrainConfig.coerce(config).run_id()
        except Exception:
            run_id = None
        return {"id": run_id, "status": "failed", "steps": 0, "config": config, "metrics": {},
                "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc(limit=5)}


def run_sweep(configs: list[dict], *, ray_address: str | None = None, progress: bool | None = None,
              workers: int | None = None, desc: str = "runs") -> list[dict]:
    """Train every config; finished runs in the store are skipped (``bnlab.train.run`` resumes).

    Locally the runs go to ``workers`` processes (default
    :func:`~bnlab.experiments.parallel.free_cores`; 1: one after another in this process), each with
    one torch thread, so the numbers do not depend on the worker count
    (:mod:`bnlab.experiments.parallel`); data-parallel runs (``nproc`` > 1) start their own
    processes and go one at a time after the others. With ``ray_address`` each run is a Ray task
    (``"local"`` starts a local Ray instance) writing to the same store. A failed or diverged run
    never stops the others. Returns the records in the order of ``configs``; a config given more
    than once (entries that share runs: Peng's Figs 4–5 and its tables) is trained once, its record
    repeated: two workers never train one run side by side.
    """
    distinct, where = _distinct(configs)
    if len(distinct) < len(configs):
        records = run_sweep(distinct, ray_address=ray_address, progress=progress, workers=workers,
                            desc=desc)
        return [dict(records[i]) for i in where]
    if ray_address is not None:
        return _run_on_ray(configs, ray_address, progress)
    workers = parallel.free_cores() if workers is None else workers
    single = [i for i, c in enumerate(configs) if int(c.get("nproc") or 1) <= 1]
    multi = [i for i, c in enumerate(configs) if int(c.get("nproc") or 1) > 1]
    records: list[dict | None] = [None] * len(configs)
    for indices, count, label in ((single, workers, desc), (multi, 1, f"{desc}, data-parallel")):
        if indices:
            done = parallel.run_parallel([configs[i] for i in indices], _train_one, workers=count,
                                         progress=progress, desc=label)
            for i, record in zip(indices, done):
                records[i] = record
    return records  # type: ignore[return-value]


def _distinct(configs: list[dict]) -> tuple[list[dict], list[int]]:
    """The distinct configs in first-seen order, and for each config its index among them."""
    index: dict[str, int] = {}
    distinct: list[dict] = []
    where = []
    for config in configs:
        key = json.dumps(config, sort_keys=True, default=str)
        if key not in index:
            index[key] = len(distinct)
            distinct.append(config)
        where.append(index[key])
    return distinct, where


def _run_on_ray(configs: list[dict], address: str, progress: bool | None) -> list[dict]:
    try:
        import ray
    except ImportError:
        raise ValueError("--ray needs the 'ray' package: pip install 'bnlab[ray]'") from None
    started = False
    # ray.init installs its own SIGTERM handler (sys.exit) in this process and ray.shutdown leaves
    # it there: a run trained here afterwards could no longer defer SIGTERM (bnlab.train.interrupt)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    if not ray.is_initialized():
        kwargs = {"include_dashboard": False, "log_to_driver": False}
        ray.init(address=None if address == "local" else address, **kwargs)
        started = True
    try:
        task = ray.remote(num_cpus=1)(_train_one)
        pending = {task.remote(c): i for i, c in enumerate(configs)}
        records: list[dict | None] = [None] * len(configs)
        bar = _bar(len(configs), progress)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            index = pending.pop(done[0])
            try:
                records[index] = ray.get(done[0])
            except Exception as err:  # a lost worker is a failed run, not a failed sweep
                records[index] = {"id": None, "status": "failed", "steps": 0,
                                  "config": configs[index],
                                  "metrics": {}, "error": f"{type(err).__name__}: {err}"}
            bar.update()
        bar.close()
        return records  # type: ignore[return-value]
    finally:
        if started:
            ray.shutdown()
            if threading.current_thread() is threading.main_thread():
                for signum, handler in handlers.items():
                    signal.signal(signum, handler)


def _bar(total: int, progress: bool | None):
    from tqdm.auto import tqdm

    disable = (not sys.stderr.isatty()) if progress is None else not progress
    return tqdm(total=total, desc="runs", unit="run", disable=disable, leave=False)


# ---- reproduce ---------------------------------------------------------------------------------

TINY_STEPS = 6


def reproduce(experiment_id: str, preset: str = "smoke", *, runs_dir: str | Path = "runs",
              ray_address: str | None = None, tiny: bool = False, progress: bool | None = None,
              report: bool = False, nproc: int | None = None,
              workers: int | None = None) -> Outcome:
    """Run one entry end to end: its training runs and computations, stored, then analysed.

    ``tiny`` cuts every run to a few steps (the test suite's reduced form); results are stored under
    the same (id, preset) but marked tiny in the report. ``nproc`` trains every run without probes
    (and without its own ``nproc``) data-parallel on that many processes (bnlab.train.distributed).
    ``workers``: local worker processes for the entry's independent runs (default: the free cores;
    every run has one torch thread whatever the count, so the numbers do not depend on it).

    The report is not written here: it sits a layer above the catalogue. Call
    ``bnlab.report.write_report(runs_dir)`` after the entries (``bnlab reproduce`` does);
    ``report=True`` is refused with that advice rather than silently ignored.
    """
    if report:
        raise ValueError("reproduce() no longer writes the report (the report layer sits above the "
                         "catalogue): call bnlab.report.write_report(runs_dir) after reproducing")
    return next(iter(reproduce_many([experiment_id], preset, runs_dir=runs_dir,
                                    ray_address=ray_address,
                                    tiny=tiny, progress=progress, nproc=nproc, workers=workers)))[1]


def reproduce_many(experiment_ids: list[str], preset: str = "smoke", *,
                   runs_dir: str | Path = "runs", ray_address: str | None = None,
                   tiny: bool = False, progress: bool | None = None, nproc: int | None = None,
                   workers: int | None = None) -> Iterator[tuple[str, Outcome]]:
    """:func:`reproduce` for several entries with one sweep over all their runs (no core idles
    while one entry's last run finishes) and their computations beside it, on a thread (those that
    train: after it); yields ``(id, outcome)`` in the given order once the runs are done and the
    entry's results stored."""
    exps = [get(i) for i in experiment_ids]
    check_preset(preset)
    runs_dir = Path(runs_dir)
    plans: list[Plan] = [exp.plan(preset) for exp in exps]
    specs = [[RunSpec(s.label, _prepare_config(s.config, runs_dir, tiny, nproc), s.factors)
              for s in plan.runs] for plan in plans]
    configs = [s.config for entry in specs for s in entry]
    desc = experiment_ids[0] if len(experiment_ids) == 1 else f"{len(experiment_ids)} entries"

    # the computations that train nothing (closed forms, simulations: a minute for luo-fig2) go
    # beside the training runs; those that train (they take ``runs_dir``) after them, here: training
    # seeds torch's global generator, which two runs in one process must not share at once
    computed = parallel.in_background(lambda: _computations(plans, tiny, runs_dir, trains=False))
    records = iter(run_sweep(configs, ray_address=ray_address, progress=progress, workers=workers,
                             desc=desc))
    beside = computed()
    after = _computations(plans, tiny, runs_dir, trains=True)
    for exp, plan, entry, (data, compute_seconds), (trained, train_seconds) in zip(
            exps, plans, specs, beside, after):
        data = {name: {**data, **trained}[name] for name in plan.compute}  # the plan's order
        compute_seconds += train_seconds
        done = [next(records) for _ in entry]
        runs = [{"label": s.label, "factors": s.factors, "id": r.get("id"),
                 "status": r.get("status"), "error": r.get("error")} for s, r in zip(entry, done)]
        seconds = compute_seconds + sum(float(r.get("seconds") or 0.0) for r in done)
        with Store(runs_dir / "bnlab.db") as store:  # one open (and check) per entry
            ResultStore(runs_dir, store=store).save(exp.id, preset, runs, data, tiny, seconds)
            outcome = analyze(exp.id, preset, runs_dir=runs_dir, store=store)
        yield exp.id, outcome


def _computations(plans: list[Plan], tiny: bool, runs_dir: Path,
                  trains: bool) -> list[tuple[dict, float]]:
    """Per plan, (its computations' data by name, seconds): those that train (they take
    ``runs_dir``: :func:`_trains`) when ``trains``, else the others."""
    out = []
    for plan in plans:
        start = time.perf_counter()
        with parallel.one_thread():  # their numbers, like the runs', do not depend on the cores
            data = {name: fn(**_compute_kwargs(fn, tiny=tiny, runs_dir=str(runs_dir)))
                    for name, fn in plan.compute.items() if _trains(fn) == trains}
        out.append((data, time.perf_counter() - start))
    return out


def _trains(fn) -> bool:
    """Whether a computation trains runs: it takes the run store's ``runs_dir``."""
    return "runs_dir" in _compute_kwargs(fn, runs_dir=None)


def _compute_kwargs(fn, **offered) -> dict:
    """The keywords of ``offered`` a computation takes: ``tiny``, and ``runs_dir`` for one that
    trains (through the run store, so its runs resume and are not trained twice)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    return {k: v for k, v in offered.items() if k in params}


def _prepare_config(config: dict, runs_dir: Path, tiny: bool, nproc: int | None = None) -> dict:
    config = shrink(config, TINY_STEPS) if tiny else dict(config)
    config["runs_dir"] = str(runs_dir)
    if nproc is not None and nproc > 1 and not config.get("probes") and "nproc" not in config:
        config["nproc"] = nproc  # probes run in one process only
    return config


def analysis_context(experiment_id: str, preset: str, *, runs_dir: str | Path = "runs",
                     report_dir: str | Path | None = None,
                     store: Store | None = None) -> AnalysisContext:
    """``report_dir`` (default ``<runs_dir>/report``) receives the figures: a read-only runs dir
    is analysed with a report folder elsewhere. The context holds the run store open for its views'
    series: use it in a ``with`` block (or call ``close()``).

    ``store``: an open :class:`Store` of ``runs_dir`` to read through, left open by ``close()``
    (several entries analysed on one open: the store is opened, and checked, once); by default the
    context opens its own and closes it."""
    exp = get(experiment_id)
    check_preset(preset)  # a preset read from the store names a folder: only the catalogue's names
    runs_dir = Path(runs_dir)
    report_dir = Path(report_dir) if report_dir is not None else runs_dir / "report"
    owned = store is None
    if store is None:
        store = Store(runs_dir / "bnlab.db")
    try:
        saved = ResultStore(runs_dir, store=store).load(exp.id, preset)
        if saved is None:
            raise ValueError(f"no stored results for {experiment_id} ({preset}) in {runs_dir}; "
                             f"run `bnlab reproduce {experiment_id} --preset {preset}` first")
        views = _run_views(saved["runs"], store)
    except BaseException:
        if owned:
            store.close()
        raise
    return AnalysisContext(exp, preset, views, saved["data"],
                           report_dir / "figures" / exp.id / preset, saved["tiny"], store, owned)


def _run_views(runs: list[dict[str, Any]], store: Store) -> list[RunView]:
    views = []
    for r in runs:
        unstored = {"status": r.get("status", "failed"), "metrics": {}, "error": r.get("error")}
        try:  # every run verified against its seal; a damaged one is shown as such, never analysed
            row = store.get_run(r["id"]) if r.get("id") else None
        except StoreIntegrityError as err:
            row, r = None, {**r, "id": None}
            unstored = {"status": "damaged", "metrics": {}, "error": str(err)}
        record = _record_dict(row) if row else unstored
        views.append(RunView(r["label"], r.get("factors") or {}, r.get("id"),
                             record.get("status", "failed"), record, store))
    return views


def _record_dict(row: dict) -> dict:
    return train.RunRecord.from_store(row).to_dict(copy=False)  # row: decoded for this view


def analyze(experiment_id: str, preset: str, *, runs_dir: str | Path = "runs",
            store: Store | None = None) -> Outcome:
    """One stored entry's outcome (``store``: as in :func:`analysis_context`): its stored one
    while current, else analysed now and stored with its runs (:func:`outcomes.analysed`)."""
    with analysis_context(experiment_id, preset, runs_dir=runs_dir, store=store) as ctx:
        return outcomes.analysed(ctx, ctx.store)


def stored_entries(runs_dir: str | Path) -> list[tuple[str, str]]:
    if not (Path(runs_dir) / "bnlab.db").exists():
        return []
    with Store(Path(runs_dir) / "bnlab.db") as store:
        return store.entries()


def iter_outcomes(runs_dir: str | Path, report_dir: str | Path | None = None, *,
                  figures: bool = True
                  ) -> Iterable[tuple[str, str, AnalysisContext, Outcome | Exception]]:
    """Every stored entry's outcome: ``(id, preset, context, outcome or the error it raised)``,
    the stored one while current (:func:`outcomes.analysed`; with ``figures``, only where its
    figures are in ``report_dir``), else analysed now and stored.

    The store is opened once for the whole pass (its open runs ``PRAGMA quick_check`` over the
    whole file: seconds for a large store) and closed when the iteration ends or is abandoned."""
    if not (Path(runs_dir) / "bnlab.db").exists():
        return
    with Store(Path(runs_dir) / "bnlab.db") as store:
        for experiment_id, preset in store.entries():
            try:
                ctx = analysis_context(experiment_id, preset, runs_dir=runs_dir,
                                       report_dir=report_dir, store=store)
            except StoreIntegrityError as err:  # a damaged entry: named, never silently left out
                print(f"warning: {err}", file=sys.stderr, flush=True)
                continue
            except ValueError:
                continue  # an entry that no longer exists in the catalogue
            try:
                outcome: Outcome | Exception = outcomes.analysed(ctx, store, figures=figures)
            except Exception as err:  # one broken entry must not hide the others
                outcome = err
            try:
                yield experiment_id, preset, ctx, outcome
            finally:  # the consumer is done with this entry's views
                ctx.close()
