"""Local sweeps in parallel: an entry's independent runs in worker processes, one torch thread each.

The catalogue's smoke runs train small networks (digits MLPs, narrow CNNs, 25-layer linear nets): a
second intra-op thread buys them little, while a second *process* doubles throughput — and several
threads fighting over a busy machine's cores made ``make demo`` ten times slower than on an idle
one. So every run of a local sweep trains with ``torch.set_num_threads(1)`` (in a worker process, or
in this process with the previous count restored after), and the runs go to as many worker processes
as there are free cores (:func:`free_cores`: the CPUs this process may use, less those busy now,
:func:`busy_cores`). One thread for every run, whatever the worker count, also makes the numbers
independent of the machine and of the parallelism: the same seeds give the same floats
(tests/test_newcomer.py checks it).

Progress: each run reports its steps to the parent (a queue from the workers), which shows one
tqdm bar over the sweep — runs done, fractional — with its ETA on a terminal, and otherwise a
line every :data:`LINE_SECONDS` and at every finished run (``progress=None``, the default, shows
one or the other on stderr; ``False`` is silent).
"""

from __future__ import annotations

import concurrent.futures as futures
import contextlib
import multiprocessing
import os
import queue as queue_mod
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from bnlab.callbacks import Callback

WORKERS_ENV = "BNLAB_WORKERS"  # an integer: the worker count, overriding free_cores()
LINE_SECONDS = 15.0
REPORT_SECONDS = 0.5  # a run reports its step at most this often
MIN_POOL_STEPS = 500  # fewer steps in all: train here (starting a worker costs seconds)


def cpu_times(stat: str = "/proc/stat") -> tuple[float, float] | None:
    """(busy, total) jiffies summed over all CPUs from Linux's ``/proc/stat``; None elsewhere."""
    try:
        with open(stat) as f:
            fields = [float(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 4:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_cores(cpus: int, interval: float = 0.3, stat: str = "/proc/stat") -> float:
    """How many of ``cpus`` are busy NOW: CPU time used over ``interval`` seconds (Linux), else the
    1-minute load average. The load average lags a minute: right after a job ends it still counts
    the job's core as busy (0.7 on an idle 2-core machine gave one worker instead of two)."""
    first = cpu_times(stat)
    if first is not None:
        time.sleep(interval)
        second = cpu_times(stat)
        if second is not None and second[1] > first[1]:
            share = (second[0] - first[0]) / (second[1] - first[1])
            return share * (os.cpu_count() or cpus)  # /proc/stat's first line sums every CPU
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def free_cores() -> int:
    """Cores free for new work: ``len(os.sched_getaffinity(0))`` (the CPUs this process may run on)
    less those busy now (:func:`busy_cores`), rounded, at least 1. ``BNLAB_WORKERS`` overrides
    it."""
    forced = os.environ.get(WORKERS_ENV)
    if forced:
        try:
            value = int(forced)
        except ValueError:
            raise ValueError(f"{WORKERS_ENV} must be a positive integer, got {forced!r}") from None
        if value < 1:
            raise ValueError(f"{WORKERS_ENV} must be a positive integer, got {forced!r}")
        return value
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, int(cpus - busy_cores(cpus) + 0.5)))


_THREADS_LOCK = threading.Lock()
_THREADS_HELD: list[int] = []  # the count to restore, while any one_thread() block is open


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """``torch.set_num_threads(1)`` for the block, the previous count restored when the last open
    block (of any Python thread: the count is per process) ends."""
    with _THREADS_LOCK:
        if not _THREADS_HELD:
            _THREADS_HELD.append(torch.get_num_threads())
            torch.set_num_threads(1)
        else:
            _THREADS_HELD.append(_THREADS_HELD[0])
    try:
        yield
    finally:
        with _THREADS_LOCK:
            before = _THREADS_HELD.pop()
            if not _THREADS_HELD:
                torch.set_num_threads(before)


def in_background(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Start ``fn()`` on a daemon thread (an interrupted sweep does not wait for it); the returned
    function waits for it and returns its value or raises its exception."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # handed to the caller
            box["error"] = err

    thread = threading.Thread(target=target, name="bnlab-computations", daemon=True)
    thread.start()

    def result() -> Any:
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    return result


class StepReporter(Callback):
    """Sends ``(key, step, total_steps)`` to ``send`` at the start, every :data:`REPORT_SECONDS`
    and at the end of a run. It only reads the loop: it never enters the run id."""

    name = "bnlab.sweep_progress"

    def __init__(self, key: int, send: Callable[[tuple[int, int, int]], Any]) -> None:
        self.key, self.send, self.last = key, send, 0.0

    def on_train_start(self, loop: Any) -> None:
        self.send((self.key, int(loop.step), _total_steps(loop)))
        self.last = time.monotonic()

    def on_train_batch_end(self, loop: Any) -> None:
        now = time.monotonic()
        if now - self.last >= REPORT_SECONDS:
            self.last = now
            self.send((self.key, int(loop.step), _total_steps(loop)))


def _total_steps(loop: Any) -> int:
    """The run's length, from the trainer or from the loop view that wraps it (``loop.trainer``)."""
    total = getattr(loop, "total_steps", None)
    if total is None:
        total = getattr(getattr(loop, "trainer", None), "total_steps", 0)
    return int(total or 0)


_QUEUE: Any = None  # a worker's end of the progress queue (set by _init_worker)


def _init_worker(progress_queue: Any) -> None:
    global _QUEUE
    torch.set_num_threads(1)
    _QUEUE = progress_queue
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True,
                     name="bnlab-parent-watch").start()


PARENT_POLL_SECONDS = 1.0
ORPHAN_GRACE_SECONDS = 30.0


def _watch_parent(parent: int) -> None:
    """End this pool worker once the sweep that started it is gone (SIGTERM or SIGKILL to
    ``bnlab reproduce``): an orphan would go on training the queued runs. It is sent SIGTERM, which
    a run takes as a Ctrl-C at its next step (checkpoint, status "interrupted"), and exits after a
    grace period if it has not by then."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_SECONDS)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(ORPHAN_GRACE_SECONDS)
    os._exit(1)


def _send(message: tuple[int, int, int]) -> None:
    if _QUEUE is not None:
        with contextlib.suppress(Exception):  # progress is best effort; training goes on
            _QUEUE.put_nowait(message)


def _worker_run(train_one: Callable[..., dict], key: int, config: dict) -> dict:
    return train_one(config, callbacks=[StepReporter(key, _send)])


class SweepProgress:
    """The sweep's progress: a tqdm bar on a terminal, else occasional lines; runs done as a
    fraction (a run half-way counts ½), so tqdm's rate and ETA cover partial runs."""

    def __init__(self, total: int, desc: str, enabled: bool | None) -> None:
        self.total, self.desc = total, desc
        tty = _is_tty()
        self.enabled = True if enabled is None else bool(enabled)  # lines when not a terminal
        self.fractions: dict[int, float] = {}
        self.ended: set[int] = set()
        self.done = 0
        self.start = self.last_line = time.monotonic()
        self.bar = None
        if self.enabled and tty:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=total,
                desc=desc,
                unit="run",
                file=sys.stderr,
                dynamic_ncols=True,
                leave=False,
                bar_format="{l_bar}{bar}| {n:.1f}/{total} runs [{elapsed}<{remaining}{postfix}]",
            )

    def step(self, key: int, step: int, total: int) -> None:
        if key in self.ended:  # a report that arrived after the run's record
            return
        self.fractions[key] = min(step / total, 1.0) if total > 0 else 0.0
        self._show(False)

    def finished(self, key: int, status: str) -> None:
        self.fractions.pop(key, None)
        self.ended.add(key)
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(status, refresh=False)
        self._show(True)

    @property
    def progress(self) -> float:
        return self.done + sum(self.fractions.values())

    def _show(self, force: bool) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.n = self.progress
            self.bar.refresh()
            return
        now = time.monotonic()
        if force or now - self.last_line >= LINE_SECONDS:
            self.last_line = now
            print(self.line(now), file=sys.stderr, flush=True)

    def line(self, now: float | None = None) -> str:
        """``desc: 3.4/6 runs, 1:12 elapsed, ETA 0:54`` (the ETA from the rate so far)."""
        from tqdm import tqdm

        elapsed = (time.monotonic() if now is None else now) - self.start
        done = self.progress
        eta = tqdm.format_interval(elapsed / done * (self.total - done)) if done > 0 else "?"
        return (
            f"{self.desc}: {done:.1f}/{self.total} runs, {tqdm.format_interval(elapsed)} elapsed, "
            f"ETA {eta}"
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_parallel(
    configs: list[dict],
    train_one: Callable[..., dict],
    *,
    workers: int,
    progress: bool | None = None,
    desc: str = "runs",
) -> list[dict]:
    """``train_one(config, callbacks=[...])`` for every config, on ``workers`` processes (1: here),
    each run with one torch thread. Returns the records in the order of ``configs``.

    Worker processes start with ``spawn``, which imports the calling script again: a script
    without ``if __name__ == "__main__":`` cannot start them, and its runs then go one after another
    in this process, with a message saying so (the numbers are the same either way)."""
    bar = SweepProgress(len(configs), desc, progress)
    records: list[dict | None] = [None] * len(configs)
    try:
        left = list(range(len(configs)))
        if workers > 1 and len(configs) > 1 and worth_a_pool(configs):
            left = _run_in_pool(configs, train_one, min(workers, len(configs)), bar, records)
        with one_thread():
            for key in left:
                # a data-parallel run sends its callbacks to its ranks' processes: this reporter
                # (a closure over the bar) cannot go there, and sweeps' nproc > 1 runs all failed
                # on it ("Can't pickle local object"); their bar moves when they end
                callbacks = ([StepReporter(key, lambda m: bar.step(*m))]
                             if int(configs[key].get("nproc") or 1) <= 1 else [])
                records[key] = train_one(configs[key], callbacks=callbacks)
                bar.finished(key, str(records[key].get("status")))  # type: ignore[union-attr]
        return records  # type: ignore[return-value]
    finally:
        bar.close()


def worth_a_pool(configs: list[dict]) -> bool:
    """Whether starting worker processes (seconds each: torch is imported again) pays off: at least
    :data:`MIN_POOL_STEPS` steps in all (a run given in epochs counts as many)."""
    return sum(int(c.get("steps") or MIN_POOL_STEPS) for c in configs) >= MIN_POOL_STEPS


def _run_in_pool(
    configs: list[dict],
    train_one: Callable[..., dict],
    workers: int,
    bar: SweepProgress,
    records: list[dict | None],
) -> list[int]:
    """Train in worker processes; returns the keys left to train here if the pool broke."""
    # spawn: no forked OpenMP pool or SQLite connection in the children (the parent holds both)
    context = multiprocessing.get_context("spawn")
    progress_queue = context.Queue()
    broken: list[int] = []
    with futures.ProcessPoolExecutor(
        workers, mp_context=context, initializer=_init_worker, initargs=(progress_queue,)
    ) as pool:
        pending = {
            pool.submit(_worker_run, train_one, key, config): key
            for key, config in enumerate(configs)
        }
        while pending:
            done, _ = futures.wait(
                pending, timeout=REPORT_SECONDS, return_when=futures.FIRST_COMPLETED
            )
            _drain(progress_queue, bar)
            for future in done:
                key = pending.pop(future)
                try:
                    records[key] = future.result()
                except futures.process.BrokenProcessPool:
                    broken.append(key)
                    continue
                except Exception as err:  # a lost run fails, not the sweep
                    records[key] = {
                        "id": None,
                        "status": "failed",
                        "steps": 0,
                        "config": configs[key],
                        "metrics": {},
                        "error": f"{type(err).__name__}: {err}",
                    }
                bar.finished(key, str(records[key].get("status")))  # type: ignore[union-attr]
    progress_queue.close()
    if broken:
        print(
            f"bnlab: the worker processes stopped ({len(broken)} run(s) left); "
            "if this is a script, "
            'put its top-level code under `if __name__ == "__main__":` (worker processes import '
            "it again); training the rest here, one after another",
            file=sys.stderr,
            flush=True,
        )
    return sorted(broken)


def _drain(progress_queue: Any, bar: SweepProgress) -> None:
    while True:
        try:
            key, step, total = progress_queue.get_nowait()
        except queue_mod.Empty:
            return
        bar.step(key, step, total)


def _is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
