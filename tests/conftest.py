from __future__ import annotations

import importlib.util
import os
import time

import pytest


def _gpus() -> int:
    if importlib.util.find_spec("cupy") is None:
        return 0
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


def pytest_configure(config):
    import dask

    # Tests kill workers and expect their nannies to start new ones. LocalCluster closes the
    # nanny of a worker name that is absent `lost-worker-timeout` (15 s) after *any* earlier loss
    # of that name: a second kill within 15 s of the first then shrank the cluster for good
    # (seen on the GPU node: the nanny closed while its new worker was starting).
    dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"})


def pytest_collection_modifyitems(config, items):
    if _gpus():
        return
    skip = pytest.mark.skip(reason="needs NVIDIA GPUs with CuPy (the `gpu` marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def local_cluster(n_workers: int, **kwargs):
    """A LocalCluster of worker processes (under nannies), without dashboards."""
    from distributed import LocalCluster

    options = {"threads_per_worker": 2, "processes": True, "dashboard_address": None, "worker_dashboard_address": None}
    return LocalCluster(n_workers=n_workers, **{**options, **kwargs})


@pytest.fixture(scope="session")
def cluster():
    """One LocalCluster of worker processes for the whole session (starting one costs seconds)."""
    with local_cluster(int(os.environ.get("REDIST_TEST_WORKERS", "3"))) as cluster:
        yield cluster


@pytest.fixture
def client(cluster):
    from distributed import Client

    with Client(cluster) as client:
        client.wait_for_workers(len(cluster.workers))
        yield client


def scheduler_history(client) -> list[dict]:
    """Runs the scheduler plugin finished, oldest first."""

    def history(dask_scheduler):
        plugin = dask_scheduler.plugins.get("redist")
        return list(plugin.history) if plugin else []

    return client.run_on_scheduler(history)


def worker_leftovers(client, timeout: float = 10) -> dict:
    """Staged chunks, runs and early pieces still held by the workers (waits for cleanup)."""

    def leftovers(dask_worker):
        from dask_redist._worker import get_state

        s = get_state(dask_worker)
        return len(s.staged) + len(s.stage_keys) + len(s.runs) + len(s.early)

    deadline = time.monotonic() + timeout
    while True:
        left = {w: n for w, n in client.run(leftovers).items() if n}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)
