"""The hybrid engine on GPU workers of 2 pseudo-hosts (marker ``gpu``; skipped without GPUs, and
unless the workers span 2 hosts): CuPy pieces through CUDA IPC between the workers of one host,
over Dask's comms between hosts (`dask_redist.engines.hybrid`).

On the GPU node (tools/gpu/pseudo-hosts.sh, step ``hybrid``)::

    REDIST_TEST_GPUS=1 REDIST_TEST_PES=4 REDIST_TEST_HOSTS=2 pytest tests/test_gpu_hybrid.py -m gpu -v

Random rechunks against NumPy, both routes taken; a worker killed mid-run (the rechunk restarts
over the workers there are then, and finishes right); a cancel mid-run (no worker lost, the next
rechunk right); and ``auto`` taking it where no NVSHMEM world can form across the hosts.
"""

from __future__ import annotations

import math
import threading
import time

import conftest
import dask.array as da
import numpy as np
import pytest
from conftest import scheduler_history
from distributed import wait
from gpu_helpers import case, kill_one_worker, worker_pid
from test_gpu import run_case

import dask_redist
from dask_redist.bench import check, contiguous, engine_stats, placed_array

pytestmark = pytest.mark.gpu

HOLD_S = 60  # the longest a held rank waits for the abort (`_hold`)


@pytest.fixture(scope="module")
def gpu_client():
    if conftest.gpu_hosts() < 2 or math.prod(conftest.gpu_layout()) < 4:
        pytest.skip(
            "the hybrid engine's GPU tests need 2 pseudo-hosts x 2 workers: REDIST_TEST_HOSTS=2 REDIST_TEST_PES=4"
        )
    yield from conftest.gpu_client()


def _random_case(rng):
    """A 1-4-D shape and two random chunkings of it."""
    ndim = int(rng.integers(1, 5))
    shape = tuple(int(rng.integers(4, 41 if ndim < 4 else 9)) for _ in range(ndim))

    def chunking(n):
        cuts = sorted(set(rng.integers(1, n, size=int(rng.integers(0, 4))).tolist()))
        return tuple(np.diff([0, *cuts, n]).tolist())

    dtype = str(rng.choice(["float64", "float32", "int8", "complex128"]))
    return case(shape, tuple(map(chunking, shape)), tuple(map(chunking, shape)), dtype)


def _rechunked(client, c, seed, placement=contiguous, **options):
    return run_case(client, c, placement, seed, expect="hybrid", **{"engine": "hybrid", **options})


@pytest.mark.parametrize("seed", range(8))
def test_random_rechunks_equal_numpy(gpu_client, seed):
    _rechunked(gpu_client, _random_case(np.random.default_rng(seed)), seed)


def test_slabs_go_through_ipc_within_a_host_and_comms_between(gpu_client):
    """4 workers, 2 per host: slab to slab crosses every pair, so both routes are taken."""
    _rechunked(gpu_client, case((64, 48, 32), (8, 48, 32), (64, 6, 32), name="slab->slab"), 3)
    last = [s["last"] for s in engine_stats(gpu_client, "hybrid").values()]
    assert all(s["hosts"] == 2 for s in last), last
    assert sum(s["pieces by ipc"] for s in last) > 0 and sum(s["pieces by comms"] for s in last) > 0, last


def test_auto_takes_it_where_no_world_forms_across_the_hosts():
    """Its own cluster without a remote transport (NVSHMEM_REMOTE_TRANSPORT empty, no InfiniBand):
    auto passes cufftmp over, saying why, and takes hybrid; the values are right."""
    pytest.importorskip("cupy")
    pytest.importorskip("dask_cuda")
    from distributed import Client

    from dask_redist.bench.gpu_cluster import SharedGPUCluster

    from dask_redist.engines.cufftmp import remote

    if conftest.gpu_hosts() < 2:
        pytest.skip("REDIST_TEST_HOSTS=2")
    if remote.ib_devices():
        pytest.skip("this host has InfiniBand devices: NVSHMEM's default transport could serve")
    with (
        SharedGPUCluster(4, 4, hosts=2, env={"NVSHMEM_REMOTE_TRANSPORT": ""}) as cluster,
        Client(cluster.scheduler_address) as client,
    ):
        c = case((64, 48, 32), (8, 48, 32), (64, 6, 32), name="slab->slab")
        x = placed_array(client, c, 44, kind="cupy")
        with dask_redist.enable(engine="auto"):
            y = x.rechunk(c.new).persist()
            wait(y)
            explained = dask_redist.explain(x.rechunk(c.new))
        assert check(y, c, 44)
        last = scheduler_history(client)[-1]
        assert last["engine"] == "hybrid" and last["outcome"] == "done", last
        assert (
            "workers on 2 hosts (hostA, hostB)" in last["why"] and "CUDA IPC within a host" in last["why"]
        ), last
        assert explained[0].engine.startswith("hybrid"), explained[0]
        assert "auto` picks for CuPy chunks: hybrid" in str(dask_redist.doctor(client))


def _hold(seconds: float) -> None:
    """On a worker: its next hybrid run waits before its copies until it is aborted (or ``seconds``)."""
    from dask_redist.engines import get_engine

    engine = get_engine("hybrid")
    real = type(engine)._copy
    engine.held = False

    def held(run, *args):
        engine.held = True
        deadline = time.monotonic() + seconds
        while run.state != "failed" and time.monotonic() < deadline:
            time.sleep(0.01)
        vars(engine).pop("_copy", None)
        return real(run, *args)

    engine._copy = held


def _held() -> bool:
    from dask_redist.engines import get_engine

    return getattr(get_engine("hybrid"), "held", False)


def _wait_held(client, worker: str) -> None:
    deadline = time.monotonic() + 120
    while not client.run(_held, workers=[worker]).get(worker):
        assert time.monotonic() < deadline, (
            f"the run never reached its copies: {scheduler_history(client)[-1:]}"
        )
        time.sleep(0.01)


def test_a_cancel_mid_run_costs_no_worker(gpu_client):
    """A persist cancelled while one rank holds the run before its copies (its peers wait on it):
    the run is recorded cancelled, every rank returns (no worker replaced), and the next rechunk
    on hybrid is right."""
    c = case((256, 128, 64), (32, 128, 64), (256, 16, 64), name="64 MiB")
    x = placed_array(gpu_client, c, 5, kind="cupy")
    pids = gpu_client.run(worker_pid)
    slow = sorted(pids)[0]
    gpu_client.run(_hold, HOLD_S, workers=[slow])
    with dask_redist.enable(engine="hybrid"):
        y = x.rechunk(c.new).persist()
        _wait_held(gpu_client, slow)
        gpu_client.cancel(y)
        del y
        deadline = time.monotonic() + 120
        while (scheduler_history(gpu_client) or [{"outcome": None}])[-1]["outcome"] != "cancelled":
            assert time.monotonic() < deadline, scheduler_history(gpu_client)[-1:]
            time.sleep(0.05)
    time.sleep(5)
    assert gpu_client.run(worker_pid) == pids
    del x
    _rechunked(gpu_client, case((64, 48, 32), (8, 48, 32), (64, 6, 32)), 23)


def test_a_worker_killed_mid_run_recovers(gpu_client):
    """A rank killed while it holds the run before its copies: the rechunk restarts over the
    workers there are then (the nanny's new one) and finishes with NumPy's values."""
    import cupy

    c = case((256, 128, 64), (32, 128, 64), (256, 16, 64), name="64 MiB")
    # chunks Dask can recompute anywhere (the killed worker's are lost with it)
    x = da.arange(math.prod(c.shape), chunks=math.prod(c.shape) // 8, dtype="float64").reshape(c.shape)
    x = x.rechunk(c.old).map_blocks(cupy.asarray).persist()
    wait(x)
    expected = np.arange(math.prod(c.shape), dtype="float64").reshape(c.shape)
    victim = sorted(gpu_client.scheduler_info()["workers"])[0]
    gpu_client.run(_hold, HOLD_S, workers=[victim])
    before = len(scheduler_history(gpu_client))
    killed: list = []

    def killer():
        _wait_held(gpu_client, victim)
        killed.append(kill_one_worker(gpu_client, pick=0))

    thread = threading.Thread(target=killer)
    with dask_redist.enable(engine="hybrid", timeouts={"collective": "60s"}):
        thread.start()
        y = x.rechunk(c.new).persist()
        wait(y)
        thread.join()
    assert killed == [victim]
    np.testing.assert_array_equal(cupy.asnumpy(y.compute()), expected)
    runs = scheduler_history(gpu_client)[before:]
    assert runs[0]["outcome"] != "done" and runs[-1]["outcome"] == "done", runs
    assert runs[-1]["engine"] == "hybrid", runs
