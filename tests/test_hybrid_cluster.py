"""The hybrid engine end to end on CPU worker processes of 2 pseudo-hosts x 2 workers: the
scheduler's all-gathers, Dask's comms between the pseudo-hosts, "CUDA IPC" within one (shared
memory standing in for GPU memory: tests/hybrid_cpu.py), the runtime around them. Every value
NumPy's, both routes taken, per worker."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

import dask_redist

HOSTS = ("hostA", "hostA", "hostB", "hostB")
ENGINE = "hybrid_cpu:CpuHybridEngine"


@pytest.fixture(scope="module")
def pseudo_client():
    from distributed import Client, Nanny, Scheduler, SpecCluster

    workers = {
        f"w{i}": {
            "cls": Nanny,
            "options": {"nthreads": 1, "dashboard": False, "env": {"DASK_REDIST__HOST": h}},
        }
        for i, h in enumerate(HOSTS)
    }
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": None}}
    with SpecCluster(workers=workers, scheduler=scheduler) as cluster, Client(cluster) as client:
        client.wait_for_workers(len(HOSTS))
        yield client


def _stats(client) -> list[dict]:
    workers = dask_redist.status(client)["workers"].values()
    return [s["engines"][ENGINE]["stats"]["last"] for s in workers if ENGINE in s["engines"]]


@pytest.mark.parametrize(
    "shape, old, new",
    [((64, 48, 8), (8, 48, 8), (64, 6, 8)), ((90, 70), (13, 70), (90, 9)), ((500,), (37,), (61,))],
)
def test_numpys_values_through_ipc_within_a_host_and_comms_between(pseudo_client, shape, old, new):
    x = da.random.default_rng(46).random(shape, chunks=old).persist()
    expected = x.compute()
    with dask_redist.enable(engine=ENGINE):
        got = x.rechunk(new).compute()
    np.testing.assert_array_equal(got, expected)
    last = dask_redist.status(pseudo_client)["history"][-1]
    assert last["engine"] == ENGINE and last["outcome"] == "done", last
    stats = _stats(pseudo_client)
    assert len(stats) == 4 and all(s["hosts"] == 2 for s in stats), stats
    assert sum(s["bytes by ipc"] for s in stats) > 0 and sum(s["bytes by comms"] for s in stats) > 0, stats


def test_a_rank_whose_sends_fail_ends_every_ranks_run_at_once_naming_it(pseudo_client):
    """No rank waits for the pieces it never sent (nor for a timeout): every rank raises at the
    last all-gather, naming rank 0 and why."""
    import time

    x = da.random.default_rng(47).random((64, 48), chunks=(8, 48)).persist()
    start = time.monotonic()
    with dask_redist.enable(engine="hybrid_cpu:FailingSendHybridEngine"):
        with pytest.raises(
            dask_redist.RedistError, match=r"rank 0 \(.*\) failed in phase 'exchange'.*TypeError"
        ):
            x.rechunk((64, 6)).compute()
    assert time.monotonic() - start < 60
