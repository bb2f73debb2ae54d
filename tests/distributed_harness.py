"""Run a function on N gloo ranks over loopback, bounded in time, every process reaped.

``run_ranks(world, target, *args)`` spawns ``world`` processes (the ``spawn`` start method: no
forked OpenMP or gloo state), each joins a gloo process group on a free loopback port and calls
``target(rank, world, *args)``; the return values come back in rank order. A rank that raises fails
the call with its traceback; a run over ``timeout`` seconds fails too. In every case all processes
are joined, and killed if they do not exit.
"""

from __future__ import annotations

import os
import queue as queue_mod
import socket
import time
import traceback
from datetime import timedelta

import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port free on loopback now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, target, args, results, collective_timeout):
    import torch
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only; never the machine's network
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=collective_timeout))
        try:
            value = target(rank, world, *args)
        finally:
            dist.destroy_process_group()
        results.put((rank, True, value))
    except BaseException:  # reported to the parent with the traceback
        results.put((rank, False, traceback.format_exc()))


def run_ranks(world: int, target, *args, timeout: float = 60.0,
              collective_timeout: float = 30.0) -> list:
    """``[target(0, world, *args), ..., target(world-1, world, *args)]``, each on its own gloo
    rank."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry,
                         args=(r, world, port, target, args, results, collective_timeout),
                         daemon=True) for r in range(world)]
    values, errors = {}, {}
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.start()
        while len(values) + len(errors) < world and not errors:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{world} ranks did not finish within {timeout:.0f} s")
            try:
                rank, ok, payload = results.get(timeout=min(remaining, 0.5))
            except queue_mod.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead and results.empty():
                    raise RuntimeError(
                        f"a rank died without a report (exit codes {dead})") from None
                continue
            (values if ok else errors)[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())) if not errors else 0.5)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
    if errors:
        raise AssertionError(
            "\n".join(f"rank {r} failed:\n{tb}" for r, tb in sorted(errors.items())))
    return [values[r] for r in range(world)]
