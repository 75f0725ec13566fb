"""The wire format: batches of pieces, packed or sent as they are, and back to views."""

from __future__ import annotations

import numpy as np
from distributed.protocol import deserialize, serialize
from hypothesis import given
from hypothesis import strategies as st

from dask_redist.core.wire import AS_IS_BYTES, SendBuffers, as_is, batches, pack, unpack_views


@given(
    st.lists(st.tuples(st.integers(0, 5000), st.booleans()), max_size=40),
    st.integers(1, 8000),
)
def test_batches_cover_every_piece_once_within_the_budget(pieces, budget):
    nbytes = np.array([n for n, _ in pieces], dtype=np.int64)
    alone = np.array([a for _, a in pieces], dtype=bool)
    ranges = batches(nbytes, budget, alone)
    assert [i for first, stop in ranges for i in range(first, stop)] == list(range(len(pieces)))
    for first, stop in ranges:
        assert stop > first
        if stop - first > 1:
            assert not alone[first:stop].any()
            assert nbytes[first:stop].sum() <= budget


def test_a_large_contiguous_piece_travels_as_it_is():
    chunk = np.arange(2 * AS_IS_BYTES // 8, dtype=np.float64).reshape(64, -1)
    pieces = [chunk, chunk[:, :3], chunk[:2]]  # contiguous and large; strided; contiguous, small
    nbytes = np.array([p.nbytes for p in pieces], dtype=np.int64)
    assert as_is(pieces, nbytes).tolist() == [True, False, False]
    assert batches(nbytes, 2**30, as_is(pieces, nbytes)) == [(0, 1), (1, 3)]
    buffer = pack(pieces[:1], nbytes[:1])
    assert np.shares_memory(buffer, chunk) and buffer.dtype == np.uint8  # no copy
    packed = pack(pieces[1:], nbytes[1:])
    assert not np.shares_memory(packed, chunk)
    for ranges, sent in (((0, 1), buffer), ((1, 3), packed)):
        received = deserialize(*serialize(sent))  # through the wire, as Dask's comms carry it
        views = unpack_views(received, [p.shape for p in pieces[slice(*ranges)]], np.float64)
        for view, piece in zip(views, pieces[slice(*ranges)]):
            np.testing.assert_array_equal(view, piece)


def test_send_buffers_are_reused_and_kept_within_their_bound():
    pool = SendBuffers(keep=3 * 2**20)
    first = pool.take(2**20 + 5)
    assert first.nbytes == 2 * 2**20  # (rounded up to a MiB)
    pool.give_back([first[: 2**20 + 5]])  # (what was packed: a view of it)
    again = pool.take(2**20)
    assert again is first  # the same memory, its pages filled before
    other = pool.take(2**20)
    assert other is not first
    pool.give_back([again[:10], other, np.zeros(4, np.uint8)])  # (a view of memory not lent: passed over)
    assert pool.nbytes == 3 * 2**20
    big = pool.take(8 * 2**20)
    pool.give_back([big])  # larger than the bound: not kept
    assert pool.nbytes == 3 * 2**20
    lost = pool.take(2**20)
    pool.give_back([lost], keep=False)  # (a failed send may still read it): forgotten
    assert pool.nbytes == 2 * 2**20 and pool.take(2**20) is not lost


def test_explain_counts_the_messages_the_tcp_comm_limits():
    """The dask engine's mapping line: over TCP a message is at most the comm's shard size too
    (`exchange.send_pieces`), so twice the shard to a peer under a larger budget is 2 messages there."""
    from types import SimpleNamespace

    from distributed.comm.tcp import TCP

    from dask_redist.engines.registry import description

    d, shard = description("dask"), TCP.max_shard_size
    plan = SimpleNamespace(traffic=np.array([[0, 2 * shard], [shard // 2, 0]]))
    line, _, _ = d.mapping(plan, SimpleNamespace(memory_budget=16 * shard))
    assert "(up to 2 over TCP, 1 over UCX message(s) per peer, all sent at once)" in line, line
    line, _, _ = d.mapping(plan, SimpleNamespace(memory_budget=shard // 2))
    assert "(up to 4 message(s) per peer, all sent at once)" in line, line


def test_a_worker_keeps_send_buffers_within_a_share_of_its_memory_limit():
    """The packed buffers kept from run to run are memory Dask does not manage: at most a
    sixteenth of the worker's memory limit (and at most `SEND_BUFFERS_KEPT`), set when the
    collective's worker plugin starts; what is kept already shrinks to a new bound."""
    from conftest import local_cluster
    from distributed import Client

    from dask_redist.cluster import ensure_scheduler_plugin
    from dask_redist.engines import exchange

    def kept(dask_worker=None):
        return exchange._send_buffers.keep

    with local_cluster(1, threads_per_worker=1, memory_limit="512MiB") as cluster, Client(cluster) as client:
        ensure_scheduler_plugin(client)
        client.wait_for_workers(1)
        assert list(client.run(kept).values()) == [32 * 2**20]
    pool = SendBuffers(exchange.SEND_BUFFERS_KEPT)
    buffers = [pool.take(2**20) for _ in range(3)]
    pool.give_back(buffers)
    assert pool.nbytes == 3 * 2**20
    pool.bound(2 * 2**20)
    assert pool.nbytes == 2 * 2**20
    try:
        assert exchange.bound_send_buffers(2**40) == exchange.SEND_BUFFERS_KEPT
        assert exchange.bound_send_buffers(2**30) == 2**26
    finally:
        assert exchange.bound_send_buffers(None) == exchange.SEND_BUFFERS_KEPT
