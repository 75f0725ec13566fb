"""DaskProcessGroup: nvmath's ProcessGroup collectives through the Dask scheduler, on worker processes."""

from __future__ import annotations

import numpy as np
import pytest

from dask_redist.errors import RedistTimeoutError


def _member(name, rank, nranks, timeout):
    from distributed import get_worker

    from dask_redist.engines.cufftmp.world import DaskProcessGroup
    from dask_redist.runtime.tasks import ensure_plugins
    from dask_redist.runtime.transport import scheduler_exchange

    worker = get_worker()
    ensure_plugins(worker, 30)
    return DaskProcessGroup(name, rank, nranks, scheduler_exchange(worker, nranks, rank, timeout))


def _collectives(name, rank, nranks):
    group = _member(name, rank, nranks, 30)
    buf = np.full(4, rank + 10, dtype=np.int64) if rank == 1 else np.zeros(4, dtype=np.int64)
    group.broadcast_buffer(buf, root=1)
    total = np.arange(3, dtype=np.float64) * (rank + 1)
    group.allreduce_buffer(total, op=0)
    largest = np.array([rank * 5.0])
    group.allreduce_buffer(largest, op=2)

    def mutating_union(a, b):  # like nvmath 1.0's Box reducer: changes its first argument
        a.update(b)
        return a

    merged = group.allreduce_object({rank: rank * rank}, op=mutating_union)
    group.barrier()
    return buf.tolist(), total.tolist(), largest.tolist(), merged


def test_collectives_across_worker_processes(client):
    workers = sorted(client.scheduler_info()["workers"])[:3]
    n = len(workers)
    futures = [
        client.submit(_collectives, "pg-test", r, n, workers=[w], pure=False) for r, w in enumerate(workers)
    ]
    results = client.gather(futures)
    tri = sum(range(1, n + 1))
    for buf, total, largest, merged in results:
        assert buf == [11] * 4
        assert total == [0.0, tri * 1.0, tri * 2.0]
        assert largest == [(n - 1) * 5.0]
        assert merged == {r: r * r for r in range(n)}


def _lonely(name):
    group = _member(name, 0, 2, 0.5)
    group.barrier()


def test_a_missing_rank_times_out_with_a_clear_error(client):
    future = client.submit(_lonely, "pg-lonely", pure=False)
    with pytest.raises(RedistTimeoutError, match=r"pg-lonely/1.*ranks \[1\]"):
        future.result(timeout=60)
