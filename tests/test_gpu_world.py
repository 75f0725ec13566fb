"""The NVSHMEM world as the cluster changes (marker ``gpu``; needs 2 GPUs, or ``REDIST_TEST_PES=2``).

Each test starts a cluster of its own (after tests/test_gpu.py let go of the GPUs): one that
grows from one worker to two, one whose GPUs an RMM pool holds, one of `dask cuda worker`
processes started apart. A LocalCUDACluster on 2 GPUs, or with ``REDIST_TEST_PES`` > 1 worker
processes sharing the GPUs (`dask_redist.bench.gpu_cluster`).
"""

from __future__ import annotations

import os

import dask
import pytest
from conftest import gpu_hosts, gpu_layout, scheduler_history
from distributed import wait

import dask_redist
from dask_redist.bench import check, placed_array
from dask_redist.bench.gpu_cluster import SharedGPUCluster
from test_gpu import CASES, run_case

pytestmark = pytest.mark.gpu


def _cluster(n_workers: int, **kwargs):
    cupy = pytest.importorskip("cupy")
    pytest.importorskip("dask_cuda")
    pytest.importorskip("nvmath")
    from dask_cuda import LocalCUDACluster

    _, pes = gpu_layout()
    if pes > 1:  # (REDIST_TEST_HOSTS=2: its workers split into 2 pseudo-hosts)
        return SharedGPUCluster(n_workers, pes, hosts=min(gpu_hosts(), n_workers), **kwargs)
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs 2 GPUs, or REDIST_TEST_PES=2 to share one")
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", "4G")
    return LocalCUDACluster(n_workers=n_workers, dashboard_address=None, CUDA_VISIBLE_DEVICES="0,1", **kwargs)


def _rechunk(client, seed, **options):
    """CASES[0] rechunked under ``options``; values checked; the scheduler's record of the run."""
    x = placed_array(client, CASES[0], seed, kind="cupy")
    with dask_redist.enable(**options):
        y = x.rechunk(CASES[0].new).persist()
        wait(y)
    assert check(y, CASES[0], seed)
    return scheduler_history(client)[-1]


def test_a_worker_joins_then_bootstrap_reforms_the_world():
    """Finalize and initialize in the same processes when no PE died: after a worker joined,
    GPU rechunks run on the dask engine (never a hang) until bootstrap forms the new world."""
    from distributed import Client

    with _cluster(1) as cluster, Client(cluster.scheduler_address) as client:
        first = _rechunk(client, 31, engine="cufftmp")  # an NVSHMEM world of one PE
        assert first["engine"] == "cufftmp" and first["outcome"] == "done", first
        pids = client.run(os.getpid)

        cluster.scale(2)
        client.wait_for_workers(2)
        joined = _rechunk(client, 32, engine="auto")
        assert joined["engine"] == "dask" and "worker set changed" in joined["why"], joined

        info = dask_redist.bootstrap(client)  # the first worker leaves its world of one
        assert len(info) == 2 and all(s["bootstrap_s"] is not None for s in info.values()), info
        assert pids.items() <= client.run(os.getpid).items()  # in the same process, not restarted
        run_case(client, CASES[1], seed=33, engine="auto")  # asserts every run went through cufftmp


def test_an_rmm_pool_that_leaves_no_room_for_nvshmem():
    """The pool holds the GPU: auto falls back to the dask engine saying which key to change;
    bootstrap raises the same; with a heap that fits, cufftmp runs next to the pool."""
    cupy = pytest.importorskip("cupy")
    pytest.importorskip("rmm")
    from distributed import Client

    if gpu_hosts() > 1 and not os.environ.get("NVSHMEM_REMOTE_TRANSPORT"):
        pytest.skip(
            "pseudo-hosts without a remote transport run hybrid for their hosts, before any heap check"
        )
    free, total = cupy.cuda.runtime.memGetInfo()
    _, pes = gpu_layout()
    sharing = min(2, pes)  # the cluster's 2 workers: one per GPU, or both on GPU 0 where PEs share it
    # pools that leave about 12 GiB per GPU, less the CUDA contexts
    pool = (total - 12 * 2**30) // sharing // 2**20 * 2**20
    with _cluster(2, rmm_pool_size=pool) as cluster, Client(cluster.scheduler_address) as client:
        with dask.config.set({"redist.nvshmem.symmetric-size": "32GiB"}):
            fell_back = _rechunk(client, 41, engine="auto")
            fallback = "hybrid" if gpu_hosts() > 1 else "dask"  # (CuPy chunks on 2 pseudo-hosts)
            assert fell_back["engine"] == fallback and "redist.nvshmem.symmetric-size" in fell_back["why"], (
                fell_back
            )
            assert "RMM" in fell_back["why"], fell_back
            with pytest.raises(dask_redist.RedistError, match="rmm_pool_size"):
                dask_redist.bootstrap(client)
        with dask.config.set({"redist.nvshmem.symmetric-size": "4GiB"}):
            dask_redist.bootstrap(client)
            run_case(client, CASES[1], seed=42, engine="auto")


def test_two_worker_processes_that_each_see_one_gpu():
    """As on separate nodes: each worker is its own ``dask cuda worker`` process that sees only
    its GPU (CUDA_VISIBLE_DEVICES=0 and =1, or both =0 with REDIST_TEST_PES=2), joined to a
    scheduler started apart. The rechunk is right either way; it runs on cufftmp if NVSHMEM
    connects such processes, and otherwise falls back to the dask engine with a reason that
    names NVSHMEM (never a hang)."""
    cupy = pytest.importorskip("cupy")
    pytest.importorskip("dask_cuda")
    pytest.importorskip("nvmath")
    from distributed import Client

    _, pes = gpu_layout()
    if cupy.cuda.runtime.getDeviceCount() * pes < 2:
        pytest.skip("needs 2 GPUs, or REDIST_TEST_PES=2 to share one")
    with (
        SharedGPUCluster(2, pes, hosts=min(gpu_hosts(), 2)) as cluster,
        Client(cluster.scheduler_address) as client,
    ):
        seen = sorted(client.run(lambda: os.environ["CUDA_VISIBLE_DEVICES"]).values())
        assert seen == sorted(cluster.gpus[i // pes] for i in range(2))
        record = _rechunk(client, 51, engine="auto")
        assert record["outcome"] == "done", record
        assert record["engine"] == "cufftmp" or "NVSHMEM" in record["why"], record
        print(f"two `dask cuda worker` processes on GPUs {seen}: engine {record['engine']} ({record['why']})")


def test_no_infiniband_error_line_on_one_host(capfd):
    """NVSHMEM's default remote transport (ibrc) wrote "ibrc.cpp:...: no IB devices found" into every
    GPU worker's log at every bootstrap on a host without InfiniBand (issue 26, item 10): a world
    on one host now starts without a remote transport, and doctor says so."""
    from distributed import Client

    from dask_redist.engines.cufftmp import remote

    if remote.ib_devices():
        pytest.skip("this host has InfiniBand devices: NVSHMEM's default transport stays")
    if gpu_hosts() > 1:
        pytest.skip("REDIST_TEST_HOSTS > 1: the workers are on several (pseudo-)hosts")
    with _cluster(2) as cluster, Client(cluster.scheduler_address) as client:
        run = _rechunk(client, 41, engine="cufftmp")
        assert run["engine"] == "cufftmp" and run["outcome"] == "done", run
        transport = client.run(lambda: os.environ.get("NVSHMEM_REMOTE_TRANSPORT"))
        text = str(dask_redist.doctor(client))
    assert set(transport.values()) == {"none"}, transport
    out = capfd.readouterr()
    assert "no IB devices found" not in out.err + out.out, (out.err + out.out)[-3000:]
    assert "NVSHMEM remote transport none (every worker on one host" in text, text


def test_pseudo_hosts_without_a_remote_transport_keep_cufftmp_off():
    """Issue 44: 2 pseudo-hosts x 2 `dask cuda worker` processes on one GPU (DASK_REDIST__HOST hostA,
    hostB) and no remote transport (NVSHMEM_REMOTE_TRANSPORT empty, no InfiniBand): auto takes the
    hybrid engine (CUDA IPC within a host, comms between) with cufftmp's reason and remedy, a named cufftmp is refused before anything starts (no
    NVSHMEM world forms, nothing hangs), and doctor counts 2 hosts."""
    pytest.importorskip("cupy")
    pytest.importorskip("dask_cuda")
    pytest.importorskip("nvmath")
    from distributed import Client

    from dask_redist.engines.cufftmp import remote

    if remote.ib_devices():
        pytest.skip("this host has InfiniBand devices: NVSHMEM's default transport could serve")
    with (
        SharedGPUCluster(4, 4, hosts=2, env={remote.VARIABLE: ""}) as cluster,
        Client(cluster.scheduler_address) as client,
    ):
        record = _rechunk(
            client, 44, engine="auto"
        )  # (CuPy chunks: the hybrid engine, tests/test_gpu_hybrid.py)
        assert record["engine"] == "hybrid" and record["outcome"] == "done", record
        assert "workers on 2 hosts (hostA, hostB)" in record["why"], record
        assert "set NVSHMEM_REMOTE_TRANSPORT (ucx, libfabric)" in record["why"], record
        with pytest.raises(dask_redist.RedistError, match="redist.engine is cufftmp, but cufftmp cannot run"):
            _rechunk(client, 45, engine="cufftmp")
        text = str(dask_redist.doctor(client))
        assert "hosts: 2 (hostA: 2 workers, hostB: 2 workers)" in text, text
        assert "keep cufftmp to one node" in text, text
        states = dask_redist.status(client)["workers"]
        assert sorted(s["host"] for s in states.values()) == ["hostA", "hostA", "hostB", "hostB"]
        assert not any(s["engines"].get("cufftmp", {}).get("broken") for s in states.values()), states
