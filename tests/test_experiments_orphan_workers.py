"""A sweep's pool workers end when the sweep process dies: before, SIGTERM to ``bnlab reproduce``
ended the parent while its two workers went on training the queued runs as orphans (seen on
2026-11-26, until killed with -9). The workers run ``parallel._init_worker``, whose watcher thread
sends the worker SIGTERM once its parent is gone."""

import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

SCRIPT = textwrap.dedent("""
    import multiprocessing, sys, time
    from bnlab.experiments import parallel

    def child():
        parallel._init_worker(None)  # no progress queue: progress is best effort
        print("worker", multiprocessing.current_process().pid, flush=True)
        time.sleep(120)

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("spawn")
        proc = ctx.Process(target=child)
        proc.start()
        time.sleep(120)
""")


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its new parent) counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_pool_worker_exits_when_its_sweep_is_killed(tmp_path):
    script = tmp_path / "sweep.py"
    script.write_text(SCRIPT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        line = _read_line(parent, timeout=120)
        assert line.startswith("worker "), line
        worker = int(line.split()[1])
        assert _alive(worker)
        parent.send_signal(signal.SIGKILL)  # the sweep dies without a chance to stop its pool
        parent.wait(timeout=30)
        deadline = time.monotonic() + 20
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(worker), "the orphaned worker is still running"
    finally:  # whatever failed, leave no process behind
        try:
            os.killpg(parent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
