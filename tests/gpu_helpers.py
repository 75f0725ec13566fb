"""What the GPU test modules share: cases, a run's layouts, and functions run on the workers
(importable by the workers: the tests' folder is on their path)."""

from __future__ import annotations

import os
import time

import dask.array as da
from conftest import scheduler_history
from distributed import wait

import dask_redist
from dask_redist.bench import Case, check, contiguous, engine_stats, placed_array


def case(shape, old, new, dtype="float64", name=""):
    normalize = da.core.normalize_chunks
    return Case(name or f"{shape} {dtype}", shape, dtype, normalize(old, shape), normalize(new, shape))


def layouts_of_a_run(client, c: Case, seed: int, placement=contiguous, **options) -> list[str]:
    """The layout of each worker's last cufftmp run, after checking the run's values and that it
    ran on cufftmp to its end."""
    x = placed_array(client, c, seed, kind="cupy", placement=placement)
    before = len(scheduler_history(client))
    with dask_redist.enable(engine="cufftmp", **options):
        y = x.rechunk(c.new).persist()
        wait(y)
    assert check(y, c, seed), f"{c.name}: values differ"
    runs = scheduler_history(client)[before:]
    assert runs and all(r["engine"] == "cufftmp" and r["outcome"] == "done" for r in runs), runs
    return [s["last"]["layout"] for s in engine_stats(client, "cufftmp").values()]


def worker_pid() -> int:
    return os.getpid()


def engine_health() -> dict:
    """On a worker: the cufftmp engine's `Health`, as a dict to compare."""
    from dask_redist.engines import get_engine

    h = get_engine("cufftmp").health()
    return {"broken": h.broken, "stuck": h.stuck, "in flight": h.in_flight_since is not None}


def kill_one_worker(client, pick=-1) -> str:
    """SIGKILL one worker process; wait until the nanny brought a new one up. Returns the dead address."""
    import signal

    before = set(client.scheduler_info()["workers"])
    pids = client.run(worker_pid)
    victim = sorted(pids)[pick]
    os.kill(pids[victim], signal.SIGKILL)
    deadline = time.monotonic() + 120
    while True:  # a new address, and as many workers as before
        workers = set(client.scheduler_info()["workers"])
        if len(workers) >= len(before) and victim not in workers:
            return victim
        assert time.monotonic() < deadline, "the nanny did not bring the worker back"
        time.sleep(0.5)
