"""The hybrid engine end to end on CPU worker processes of 2 pseudo-hosts x 2 workers: the
scheduler's all-gathers, Dask's comms between the pseudo-hosts, "CUDA IPC" within one (shared
memory standing in for GPU memory: tests/hybrid_cpu.py), the runtime around them. Every value
NumPy's, both routes taken, per worker."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from conftest import pseudo_hosts_cluster, wait_for_active_run

import dask_redist

HOSTS = ("hostA", "hostA", "hostB", "hostB")
ENGINE = "hybrid_cpu:CpuHybridEngine"


@pytest.fixture(scope="module")
def pseudo_client():
    from distributed import Client

    with pseudo_hosts_cluster(HOSTS) as cluster, Client(cluster) as client:
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


def _pid() -> int:
    import os

    return os.getpid()


def test_a_cancel_mid_run_costs_no_worker_and_the_next_rechunk_is_right(pseudo_client):
    """Cancelled while rank 0 holds before its copies (its peers wait in the last all-gather): every
    rank returns, the run is recorded cancelled, no worker process is replaced."""
    import time

    from distributed import wait

    pids = pseudo_client.run(_pid)
    x = da.random.default_rng(48).random((64, 48), chunks=(8, 48)).persist()
    wait(x)
    with dask_redist.enable(engine="hybrid_cpu:HeldHybridEngine"):
        y = x.rechunk((64, 6)).persist()
        deadline = time.monotonic() + 60  # (for both waits)
        wait_for_active_run(pseudo_client, 60)
        time.sleep(0.5)  # (every rank in the run: rank 0 holds, the others wait for it)
        pseudo_client.cancel(y)
        del y
        while dask_redist.status(pseudo_client)["history"][-1]["outcome"] != "cancelled":
            assert time.monotonic() < deadline, dask_redist.status(pseudo_client)["history"][-1:]
            time.sleep(0.05)
    time.sleep(1)
    assert pseudo_client.run(_pid) == pids
    with dask_redist.enable(engine=ENGINE):
        np.testing.assert_array_equal(x.rechunk((64, 6)).compute(), x.compute())


def test_a_rank_aborted_after_the_first_all_gather_makes_the_next_ones_as_its_peers(pseudo_client):
    """Cancelled while rank 1 holds between the first all-gather and the next (it learns of the
    abort there, its peers do not): it makes the next all-gathers as they do, so no rank waits
    out the all-gathers' timeout, and the next rechunk runs at once, with NumPy's values."""
    import time

    from distributed import wait

    x = da.random.default_rng(50).random((64, 48), chunks=(8, 48)).persist()
    wait(x)
    expected = x.compute()
    with dask_redist.enable(
        engine="hybrid_cpu:AbortedAfterExportHybridEngine", timeouts={"bootstrap": "60s"}
    ):
        y = x.rechunk((64, 6)).persist()
        wait_for_active_run(pseudo_client, 60)
        time.sleep(0.5)  # (rank 1 holds after the first all-gather, the others wait in the next)
        pseudo_client.cancel(y)
        del y
    start = time.monotonic()
    with dask_redist.enable(engine=ENGINE):
        np.testing.assert_array_equal(x.rechunk((64, 12)).compute(), expected)
    assert time.monotonic() - start < 20, "a rank waited out the all-gathers' timeout"
    last = dask_redist.status(pseudo_client)["history"][-1]
    assert last["engine"] == ENGINE and last["outcome"] == "done", last


def test_a_worker_killed_mid_run_recovers_with_numpys_values(pseudo_client):
    """Rank 0 killed while it holds before its copies: the rechunk restarts over the workers there
    are then (its nanny's new one) and finishes with NumPy's values."""
    import os
    import signal
    import time

    _forget_holds()
    x = da.random.default_rng(49).random((64, 48), chunks=(8, 48))  # (recomputable anywhere)
    expected = x.compute()
    before = len(dask_redist.status(pseudo_client)["history"])
    victim = sorted(pseudo_client.scheduler_info()["workers"])[0]
    pid = pseudo_client.run(_pid, workers=[victim])[victim]
    with dask_redist.enable(engine="hybrid_cpu:HeldOnceHybridEngine", timeouts={"collective": "60s"}):
        y = x.rechunk((64, 6)).persist()
        wait_for_active_run(pseudo_client, 60)
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        np.testing.assert_array_equal(y.compute(), expected)
    runs = dask_redist.status(pseudo_client)["history"][before:]
    assert runs[0]["outcome"] != "done" and runs[-1]["outcome"] == "done", runs
    pseudo_client.wait_for_workers(len(HOSTS), timeout=60)
    _forget_holds()


def _forget_holds() -> None:
    """No rechunk marked held (`hybrid_cpu.HeldOnceHybridEngine`): a token repeats across runs."""
    import glob
    import os
    import tempfile

    for marker in glob.glob(os.path.join(tempfile.gettempdir(), "redist-hybrid-held-*")):
        os.unlink(marker)
