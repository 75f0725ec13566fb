"""Output chunks a fused consumer reads are kept for the next run (`core.buffers.KeptBuffers`,
`engines.exchange.output_allocator`), and never handed out again while anything holds them."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from distributed import get_worker, wait

import dask_redist
from dask_redist.core.buffers import KeptBuffers

pytestmark = pytest.mark.filterwarnings("ignore:Sending large graph:UserWarning")


def test_a_buffer_is_given_back_only_once_nothing_holds_it():
    pool = KeptBuffers(keep=8 * 2**20)
    chunk = pool.array((64, 32), np.complex128)
    assert chunk.flags.c_contiguous and chunk.shape == (64, 32) and chunk.dtype == np.complex128
    buffer_id = id(chunk.base)
    view = chunk[3:5]
    lease = pool.lease(chunk)
    del chunk
    assert not pool.give_back_if_alone(lease)  # (the view holds it)
    assert pool.nbytes == 0
    chunk = view.base  # (lent still: a second lease finds it)
    lease = pool.lease(view)
    del chunk, view
    assert pool.give_back_if_alone(lease) and pool.nbytes == 2**20
    again = pool.array((16,), np.float64)
    assert id(again.base) == buffer_id  # the same memory, its pages filled before
    assert pool.lease(np.zeros(3)) == [] and not pool.give_back_if_alone([])  # (not lent by it)
    lent = pool.array((8,), np.int8)
    del lent  # (lent and dropped without being given back: freed as any array, not kept)
    assert pool.nbytes == 0
    big = pool.take(4 * 2**20)
    pool.give_back([big])
    small = pool.array((2**10,), np.float64)  # (8 KiB: the 4 MiB buffer is too large for it)
    assert small.base is not big and pool.nbytes == 4 * 2**20
    assert pool.array((2**19,), np.float64).base is big  # (4 MiB)


def _kept_buffers(dask_worker=None) -> list:
    from dask_redist.engines import exchange

    return sorted(id(b) for b in exchange.kept_buffers._free)


@pytest.fixture
def enabled():
    with dask_redist.enable(engine="dask", min_bytes=0):
        yield


def test_a_fused_consumer_s_chunks_serve_the_next_run(client, enabled):
    a = np.random.default_rng(3).standard_normal((64, 32, 16))
    x = da.from_array(a, chunks=(8, 32, 16)).persist()
    wait(x)
    kept = []
    for k in range(3):
        y = ((x + k).rechunk((64, 4, 16))) ** 2
        np.testing.assert_allclose(y.compute(), (a + k) ** 2)
        kept.append(client.run(_kept_buffers))
    assert all(kept[0].values()), kept[0]  # every worker kept its output chunks' buffers
    assert kept[1] == kept[2], kept  # and the next runs filled the same ones, none new


def _keep_block(block):
    _stash().append(block)  # (a consumer that keeps a reference to what it read)
    return block.sum(axis=0, keepdims=True)


def _stash(dask_worker=None) -> list:
    worker = dask_worker or get_worker()
    if not hasattr(worker, "_kept_outputs_test"):
        worker._kept_outputs_test = []
    return worker._kept_outputs_test


def _stashed_copies(dask_worker=None) -> list:
    return [b.copy() for b in _stash(dask_worker)]


def test_memory_a_result_or_a_consumer_still_holds_is_never_filled_again(client, enabled):
    a = np.random.default_rng(4).standard_normal((64, 32, 16))
    x = da.from_array(a, chunks=(8, 32, 16)).persist()
    views = (2 * x).rechunk((64, 4, 16)).map_blocks(lambda b: b[::2])  # results that are views of it
    kept = (
        (3 * x)
        .rechunk((64, 4, 16))
        .map_blocks(_keep_block, chunks=((1,), (4,) * 8, (16,)), meta=a[:0, :0, :0])
    )
    views, kept = views.persist(), kept.persist()
    wait([views, kept])
    stashed = client.run(_stashed_copies)
    for k in range(4):  # later runs of the same shapes, their outputs all given back
        y = ((x - k).rechunk((64, 4, 16))) ** 3
        np.testing.assert_allclose(y.compute(), (a - k) ** 3)
    np.testing.assert_array_equal(views.compute(), (2 * a)[::2])
    np.testing.assert_allclose(kept.compute(), (3 * a).sum(axis=0, keepdims=True))
    now = client.run(_stashed_copies)
    assert sum(map(len, now.values())) == 8
    for worker, blocks in now.items():
        for before, block in zip(stashed[worker], blocks, strict=True):
            np.testing.assert_array_equal(block, before)
