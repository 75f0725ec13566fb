from __future__ import annotations

import importlib.util
import os
import sys
import time

import pytest


# The third engine's package (tests/third_party_engine), on the path as an editable install puts
# it, before any cluster starts (worker processes inherit the path); it is registered only where a
# test installs its metadata (its entry point) or names it in redist.engines.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "third_party_engine"))


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
    # The tests rechunk small arrays of few chunks through the collective, which the default
    # (`redist.min-bytes: auto`) leaves to Dask where Dask is faster (2 slabs to 2 slabs):
    # the tests decide by bytes; `test_optimize.py` checks the default on its own.
    dask.config.set({"redist.min-bytes": 0})


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

    options = {
        "threads_per_worker": 2,
        "processes": True,
        "dashboard_address": None,
        "worker_dashboard_address": None,
    }
    return LocalCluster(n_workers=n_workers, **{**options, **kwargs})


def pseudo_hosts_cluster(hosts):
    """A cluster of worker processes (nannies, one thread each), worker ``i`` on pseudo-host
    ``hosts[i]`` (``DASK_REDIST__HOST``), without dashboards."""
    from distributed import Nanny, Scheduler, SpecCluster

    workers = {
        f"w{i}": {
            "cls": Nanny,
            "options": {"nthreads": 1, "dashboard": False, "env": {"DASK_REDIST__HOST": h}},
        }
        for i, h in enumerate(hosts)
    }
    return SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {"dashboard_address": None}})


def gpu_layout() -> tuple[int, int]:
    """(GPUs, workers per GPU) the GPU tests use: ``REDIST_TEST_GPUS`` (default 2) and
    ``REDIST_TEST_PES`` (default 1; more: that many `dask cuda worker` processes share each GPU,
    one NVSHMEM PE each, as `dask_redist.bench.gpu_cluster` starts them)."""
    return int(os.environ.get("REDIST_TEST_GPUS", "2")), int(os.environ.get("REDIST_TEST_PES", "1"))


def gpu_hosts() -> int:
    """Pseudo-hosts the GPU tests split their workers into: ``REDIST_TEST_HOSTS`` (default 1; 2:
    `dask cuda worker` processes with ``DASK_REDIST__HOST`` hostA, hostB, as
    `dask_redist.bench.gpu_cluster.pseudo_host` assigns them)."""
    return int(os.environ.get("REDIST_TEST_HOSTS", "1"))


def gpu_client(**cluster_options):
    """A Client on ``REDIST_TEST_GPUS`` GPUs with ``REDIST_TEST_PES`` workers each (`gpu_layout`):
    a LocalCUDACluster at one per GPU, else a `SharedGPUCluster`; skips where the GPUs or the GPU
    packages are missing. A generator: ``yield from`` it."""
    cupy = pytest.importorskip("cupy")
    pytest.importorskip("dask_cuda")
    pytest.importorskip("nvmath")
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    # REDIST_TEST_GPUS=1 runs what one GPU can (a world of one PE); REDIST_TEST_PES=2 gives it peers
    want, pes = gpu_layout()
    n = min(want, cupy.cuda.runtime.getDeviceCount())
    if n < want or n < 1:
        pytest.skip(f"needs {want} GPUs")
    # (LocalCUDACluster replaces a worker's `env` with its CUDA_VISIBLE_DEVICES: workers that
    # need an environment of their own are started as dask cuda worker processes)
    if pes > 1 or gpu_hosts() > 1 or "env" in cluster_options:
        from dask_redist.bench.gpu_cluster import SharedGPUCluster

        tests = os.path.dirname(os.path.abspath(__file__))  # (functions the tests run there live here)
        path = os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))
        env = {"PYTHONPATH": path, **cluster_options.pop("env", {})}
        with (
            SharedGPUCluster(n * pes, pes, env=env, hosts=gpu_hosts(), **cluster_options) as shared,
            Client(shared.scheduler_address) as client,
        ):
            yield client
        return
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", "4G")  # inherited by the workers
    with (
        LocalCUDACluster(n_workers=n, dashboard_address=None, **cluster_options) as cluster,
        Client(cluster) as client,
    ):
        yield client


@pytest.fixture(scope="session")
def cluster():
    """One LocalCluster of worker processes for the whole session (starting one costs seconds)."""
    with local_cluster(int(os.environ.get("REDIST_TEST_WORKERS", "3"))) as cluster:
        yield cluster


@pytest.fixture
def client(cluster):
    """A Client of the session's cluster, the scheduler's history of runs emptied (it keeps the
    last `runtime.lifecycle.HISTORY_KEPT`: tests count the runs they start)."""
    from distributed import Client

    with Client(cluster) as client:
        client.wait_for_workers(len(cluster.workers))
        client.run_on_scheduler(_forget_history)
        yield client


def _forget_history(dask_scheduler=None):
    plugin = dask_scheduler.plugins.get("redist")
    if plugin is not None:
        plugin.rechunks.history.clear()


def scheduler_history(client) -> list[dict]:
    """Runs the scheduler plugin finished, oldest first."""
    import dask_redist

    return dask_redist.status(client)["history"]


def wait_for_active_run(client, within: float, what: str = "the run never started") -> None:
    """Until the scheduler has a run under way (``status()["active"]``), at most ``within`` s."""
    import dask_redist

    deadline = time.monotonic() + within
    while not dask_redist.status(client)["active"]:
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def runs_since(client, before: list[dict]) -> list[dict]:
    """The runs finished since ``before`` (an earlier `scheduler_history`): by (token, run id), as
    the scheduler keeps only the latest 200 (their count stops growing in a long session)."""
    seen = {(r["token"], r["run"]) for r in before}
    return [r for r in scheduler_history(client) if (r["token"], r["run"]) not in seen]


def worker_leftovers(client, timeout: float = 10) -> dict:
    """Staged chunks, runs and early pieces still held by the workers, by worker and kind
    (waits for cleanup)."""

    import dask_redist
    from dask_redist.bench.soak import HELD

    def held(s):
        counts = {k: s[k] for k in HELD}
        return {k: n for k, n in {**counts, "runs": len(s["runs"])}.items() if n}

    deadline = time.monotonic() + timeout
    while True:
        left = {w: n for w, s in dask_redist.status(client)["workers"].items() if (n := held(s))}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)
