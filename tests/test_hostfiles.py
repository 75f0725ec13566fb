"""The PEs' all-gather through files (dask_redist.engines.cufftmp.hostfiles): ranks are threads
here, each with its own `FileExchange`, as each worker process has."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from test_peers import Group

from dask_redist.engines.cufftmp import hostfiles
from dask_redist.errors import RedistTimeoutError


def on_threads(nranks: int, body) -> list:
    """``body(rank)`` on a thread per rank; each one's result or the exception it raised."""
    results = [None] * nranks

    def one(rank):
        try:
            results[rank] = body(rank)
        except Exception as e:  # noqa: BLE001 - what the test looks at
            results[rank] = e

    threads = [threading.Thread(target=one, args=(r,)) for r in range(nranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank was left waiting"
    return results


def test_every_rank_gets_every_payload_in_rank_order_step_after_step(tmp_path):
    nranks, steps = 3, 40
    rng = np.random.default_rng(0)
    sizes = rng.integers(0, 3 << 20, size=(steps, nranks)).tolist()  # (some empty, some of megabytes)
    sizes[0] = [0] * nranks

    def payload(step, rank):
        return bytes([step % 251, rank]) * (sizes[step][rank] // 2)

    def body(rank):
        exchange = hostfiles.FileExchange(str(tmp_path), rank, nranks, timeout=30)
        for step in range(steps):
            values = exchange(f"peers/{step}", payload(step, rank))
            assert values == [payload(step, r) for r in range(nranks)], (rank, step)
            time.sleep(0.001 * rank * (step % 3))  # (ranks out of step with each other)
        return exchange

    exchanges = on_threads(nranks, body)
    assert all(isinstance(e, hostfiles.FileExchange) for e in exchanges), exchanges
    # each rank's file of the last step is all that is left, until the world is left
    assert sorted(os.listdir(tmp_path)) == [f"peers_{steps - 1}.{r}" for r in range(nranks)]
    for e in exchanges:
        e.close()
    assert not tmp_path.exists()


def test_a_rank_that_never_comes_is_named_once_the_timeout_passes(tmp_path):
    exchange = hostfiles.FileExchange(str(tmp_path), 0, 3, timeout=0.3)
    start = time.monotonic()
    with pytest.raises(RedistTimeoutError, match=r"step peers/1 .*ranks \[1, 2\] did not answer within 0.3s"):
        exchange("peers/1", b"x")
    assert time.monotonic() - start < 5


def test_every_rank_agrees_on_one_directory_that_only_this_user_can_use():
    group = Group(3)
    exchanges = on_threads(3, lambda r: hostfiles.agree(group.for_rank(r), timeout=30))
    directory = exchanges[0].directory
    assert all(e.directory == directory for e in exchanges) and os.listdir(directory) == []  # (probes gone)
    assert os.stat(directory).st_mode & 0o077 == 0
    assert on_threads(3, lambda r: exchanges[r]("peers/1", bytes([r]))) == [[b"\0", b"\1", b"\2"]] * 3
    for e in exchanges:
        e.close()
    assert not os.path.exists(directory)


def test_a_rank_that_cannot_use_the_directory_leaves_every_rank_on_the_scheduler():
    """Rank 2 sees another file system (as a worker in another container would): no rank uses
    files, and rank 0's directory is gone."""
    group, made = Group(3), []

    def body(rank):
        one, real = group.for_rank(rank), group.for_rank(rank).allgather
        first = []

        def allgather(obj):
            values = real(obj)
            if not first:  # (the directory rank 0 made)
                first.append(values[0])
                made.append(values[0])
                if rank == 2:
                    return ["/nonexistent/elsewhere", *values[1:]]
            return values

        one.allgather = allgather
        return hostfiles.agree(one, timeout=30)

    assert on_threads(3, body) == [None, None, None]
    assert made and not os.path.exists(made[0])
