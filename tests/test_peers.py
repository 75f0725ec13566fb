"""PEs on one GPU copying chunk to chunk through CUDA IPC (`dask_redist.engines.cufftmp.peers`),
without a GPU: ranks are threads, the GPU's memory one byte buffer, IPC a stand-in that maps a
peer's allocation at another address of it (an alias, as another process sees it), and the copy
kernel's jobs are replayed byte by byte. Every needed output chunk must come out as NumPy cuts it,
whichever rank wrote its pieces; and every way a rank can fail must end every rank's run alike,
none of them left waiting."""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from copy_helpers import (
    draw_placement,
    Bump,
    FakeIpc,
    Group,
    copy_rows,
    random_rechunk,
    run_ranks,
    write_chunk,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_redist.config import Settings
from dask_redist.core.spec import CollectiveSpec, RunSpec
from dask_redist.engines.cufftmp import hostfiles, peers
from dask_redist.engines.cufftmp.world import DaskProcessGroup
from dask_redist.engines.cufftmp.engine import _piece_table
from dask_redist.engines.exchange import empty_outputs, rounded_empty
from dask_redist.errors import RedistError
from dask_redist.planning import make_plan

#: A peer's allocation, opened by rank r, appears ``ALIAS * (r + 1)`` bytes further on.
ALIAS = 1 << 40


class Ipc(FakeIpc):
    """CUDA IPC on the byte buffer: allocations are ``block`` bytes each from address 0 (a pool
    hands out parts of them), a handle names one, and rank ``rank`` maps it at an alias."""

    def __init__(self, rank: int, block: int, fail: str = ""):
        super().__init__(fail)
        self.rank, self.block = rank, block

    def allocation(self, ptr: int) -> int:
        return ptr // self.block * self.block

    def mapped_at(self, base: int) -> int:
        return base + ALIAS * (self.rank + 1)


def replay(jobs, memory: np.ndarray) -> None:
    """The kernel's work, on the byte buffer: an aliased address is the same byte."""
    for src, dst, *rows in jobs.tolist():
        copy_rows(*rows, memory, src % ALIAS, memory, dst % ALIAS)


def world(rechunk, dtype, nranks: int, in_ranks, needed=None, **nvshmem):
    """Every rank's run of one rechunk (``in_ranks``: each old chunk's rank; ``nvshmem``: the
    cufftmp engine's settings, ``redist.nvshmem.*``)."""
    plan = make_plan(rechunk, in_ranks, nranks, needed=needed)
    section = tuple(sorted((k.replace("_", "-"), v) for k, v in nvshmem.items()))
    settings = Settings(sections=(("nvshmem", section),))
    spec = CollectiveSpec("t" * 32, "in", "out", rechunk, dtype, settings, "cupy")
    workers = tuple(f"tcp://w{r}" for r in range(nranks))
    runs = []
    for rank in range(nranks):
        run_spec = RunSpec(spec, 1, 1, workers, plan.in_ranks, plan.out_ranks, plan.needed, "cufftmp", "cupy")
        runs.append(
            SimpleNamespace(
                spec=run_spec,
                plan=run_spec.plan,
                rank=rank,
                state="running",
                inputs={},
                gone=False,
                error=RedistError("run t/1 was cancelled"),
                name=lambda: "run t/1",
            )
        )
        run = runs[-1]
        run.must_stop = lambda run=run: run.state == "failed" and run.gone
        run.failure = lambda run=run: run.error
    return runs


def place(runs, whole: np.ndarray, memory: np.ndarray, at: int, block: int = 64):
    """Every rank's input chunks into the buffer from ``at`` on, then each rank's outputs
    (allocated as the engine does, from an allocation of ``block`` bytes of its own on);
    returns each rank's outputs."""
    rechunk = runs[0].spec.collective.rechunk
    in_ranks = runs[0].plan.in_ranks.ravel()
    for flat in range(int(np.prod(rechunk.old_grid))):
        runs[in_ranks[flat]].inputs[flat], at = write_chunk(memory, at, whole, *rechunk.old_box(flat))
    outputs, allocator = [], Bump(at)
    for run in runs:
        allocator.at = -(-allocator.at // block) * block  # (no allocation shared by two processes)
        outputs.append(empty_outputs(run, allocator))
    assert allocator.at <= len(memory)
    return outputs


class Files(Group):
    """The PEs' all-gather through files (`hostfiles.FileExchange`), agreed on through `Group`."""

    def __init__(self, nranks: int):
        super().__init__(nranks)
        self._groups = [None] * nranks
        self._world = Group(nranks)  # (the scheduler's, to agree on the directory)

    def for_rank(self, rank: int):
        if self._groups[rank] is None:
            files = hostfiles.agree(self._world.for_rank(rank), timeout=30)
            assert files is not None
            self._groups[rank] = DaskProcessGroup("peers", rank, len(self._groups), files)
        counted, group = self._groups[rank], self

        class Counted:
            def allgather(self, obj, stop=None):
                group.calls[rank] += 1
                return counted.allgather(obj, stop)

        return Counted()

    def close(self) -> str:
        """Every rank's files closed (as each rank's world does when it is left); the directory."""
        for group in self._groups:
            group._exchange.close()
        return self._groups[0]._exchange.directory


def run_all(runs, outputs, ipcs, memory, copy=None, before=None, group=None):
    """`peers.run_peers` on a thread per rank; each rank's result or the exception it raised
    (``group``: the all-gather, a `Group` unless given)."""
    group = Group(len(runs)) if group is None else group
    results = [None] * len(runs)
    copies, finished = [], []

    def one(rank):
        run = runs[rank]
        if before:
            before(run)

        def replayed(run, jobs):
            copies.append(rank)
            (copy or replay)(jobs, memory)

        try:
            results[rank] = peers.run_peers(
                run,
                outputs[rank],
                lambda: (_piece_table(run, {}, run.rank), ipcs[rank]),
                group.for_rank(rank),
                replayed,
                lambda: finished.append(rank),
            )
        except Exception as e:  # noqa: BLE001 - what the test looks at
            results[rank] = e

    run_ranks(one, group)
    # outputs are finished exactly where a rank's run came to an end on this path
    assert sorted(finished) == [r for r, result in enumerate(results) if result is None]
    return results, copies


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_every_rank_copies_its_pieces_into_whichever_output_chunk_they_belong_to(data):
    """2-4 ranks, random chunkings and placements, some output chunks not needed, allocations
    holding several chunks: every needed output chunk equals the array's box, each peer's
    allocation was opened only by the others (a process cannot open its own) and closed again."""
    shape, dtype, rechunk = random_rechunk(data, 8)
    nranks = data.draw(st.integers(2, 4))
    in_ranks, needed = draw_placement(data, rechunk, nranks)
    runs = world(rechunk, dtype, nranks, in_ranks, needed)
    whole = (np.arange(int(np.prod(shape))) % 113 + 1).astype(dtype).reshape(shape)
    block = data.draw(st.sampled_from([8, 64, 4096]))  # (bytes per allocation)
    memory = np.zeros(2 * whole.nbytes + (nranks + 1) * block + 64, np.uint8)
    outputs = place(runs, whole, memory, data.draw(st.integers(1, 32)), block)
    ipcs = [Ipc(r, block) for r in range(nranks)]
    results, _ = run_all(runs, outputs, ipcs, memory)
    assert results == [None] * nranks
    assert sorted(f for o in outputs for f in o) == np.flatnonzero(runs[0].plan.needed).tolist()
    for rank_outputs in outputs:
        for flat, chunk in rank_outputs.items():
            lo, hi = rechunk.new_box(flat)
            got = memory[chunk.data.ptr : chunk.data.ptr + int(np.prod(chunk.shape)) * dtype.itemsize]
            want = whole[tuple(slice(a, b) for a, b in zip(lo, hi))]
            np.testing.assert_array_equal(got.view(dtype).reshape(chunk.shape), want)
    for rank, ipc in enumerate(ipcs):
        own = {ipc.allocation(c.data.ptr) for c in outputs[rank].values()}
        opened = [p % ALIAS for p in ipc.opened]
        assert not set(opened) & own and len(set(opened)) == len(opened)  # peers' only, once each
        assert sorted(ipc.opened) == sorted(ipc.closed)


def _slabs(nranks=2):
    """A (8, 6, 4) float64 array, 4 slabs to 4 slabs along another axis, ranks by slab."""
    from dask_redist.planning import RechunkSpec

    rechunk = RechunkSpec(((2, 2, 2, 2), (6,), (4,)), ((8,), (2, 2, 2), (4,)), 8)
    whole = np.arange(8 * 6 * 4, dtype=np.float64).reshape(8, 6, 4)
    in_ranks = (np.arange(4) * nranks // 4).reshape(4, 1, 1)
    runs = world(rechunk, np.dtype(np.float64), nranks, in_ranks)
    memory = np.zeros(4 * whole.nbytes, np.uint8)
    return runs, place(runs, whole, memory, 8), memory


@pytest.mark.parametrize("nranks", [2, 4])
def test_the_ranks_all_gather_through_files_where_they_share_a_machine(nranks):
    """The same run with the all-gathers through `hostfiles` (the world's choice where every PE
    is on one GPU): every output chunk right, both all-gathers made, no file left behind."""
    runs, outputs, memory = _slabs(nranks)
    files = Files(nranks)
    results, _ = run_all(runs, outputs, [Ipc(r, 64) for r in range(nranks)], memory, group=files)
    assert results == [None] * nranks and files.calls == [2] * nranks
    whole = np.arange(8 * 6 * 4, dtype=np.float64).reshape(8, 6, 4)
    for rank_outputs in outputs:
        for flat, chunk in rank_outputs.items():
            lo, hi = runs[0].spec.collective.rechunk.new_box(flat)
            nbytes = 8 * int(np.prod(chunk.shape))
            got = memory[chunk.data.ptr : chunk.data.ptr + nbytes].view(np.float64).reshape(chunk.shape)
            np.testing.assert_array_equal(got, whole[tuple(slice(a, b) for a, b in zip(lo, hi))])
    directory = files.close()
    assert not os.path.exists(directory)


def test_a_rank_that_cannot_export_sends_every_rank_to_the_heaps_rounds_before_any_copy():
    runs, outputs, memory = _slabs(3)
    ipcs = [Ipc(0, 64), Ipc(1, 64, fail="export"), Ipc(2, 64)]
    results, copies = run_all(runs, outputs, ipcs, memory)
    assert all(isinstance(r, peers.Refused) and "rank 1 (tcp://w1)" in r.why for r in results), results
    assert "CUDA IPC" in results[0].why and results[0].lasting and not copies
    assert all(not ipc.opened for ipc in ipcs)


def test_outputs_an_fft_gave_that_cannot_be_exported_send_this_run_alone_to_the_heaps_rounds():
    """An FFT's leg in writes into the transform's operand (``run.into``), memory of the symmetric
    heap, which has no CUDA IPC handle: that run takes the heap's rounds, and the world's later
    rechunks, whose outputs CuPy allocates, keep this path (the refusal is not lasting)."""
    runs, outputs, memory = _slabs(2)
    for run, own in zip(runs, outputs):
        run.into = dict(own)
    ipcs = [Ipc(0, 64, fail="export"), Ipc(1, 64, fail="export")]
    results, copies = run_all(runs, outputs, ipcs, memory)
    assert all(isinstance(r, peers.Refused) and "CUDA IPC" in r.why for r in results), results
    assert not any(r.lasting for r in results) and not copies


def test_an_input_chunk_not_c_contiguous_sends_this_run_alone_to_the_heaps_rounds():
    runs, outputs, memory = _slabs(2)
    next(iter(runs[1].inputs.values())).flags.c_contiguous = False
    results, copies = run_all(runs, outputs, [Ipc(0, 64), Ipc(1, 64)], memory)
    assert all(isinstance(r, peers.Refused) and "not C-contiguous" in r.why for r in results), results
    assert not any(r.lasting for r in results) and not copies


def test_a_rank_that_cannot_map_its_peers_chunks_sends_every_rank_to_the_heaps_rounds():
    runs, outputs, memory = _slabs(2)
    ipcs = [Ipc(0, 64, fail="open"), Ipc(1, 64)]
    results, _ = run_all(runs, outputs, ipcs, memory)
    assert all(isinstance(r, peers.Failed) and r.unmapped for r in results), results
    assert "rank 0 (tcp://w0) could not map" in results[1].why
    assert sorted(ipcs[1].opened) == sorted(ipcs[1].closed)


def test_a_copy_that_fails_fails_every_rank_naming_it_and_the_switch():
    runs, outputs, memory = _slabs(2)

    def copy(jobs, memory):
        if threading.current_thread().name == "rank-0":
            raise RuntimeError("an illegal memory access was encountered")
        replay(jobs, memory)

    results, _ = run_all(runs, outputs, [Ipc(0, 64), Ipc(1, 64)], memory, copy=copy)
    for r in results:
        assert isinstance(r, RedistError), results
        assert "rank 0 (tcp://w0) failed in phase 'exchange'" in str(r) and "illegal memory" in str(r)
        assert "shared-gpu-copies" in str(r)


def test_an_aborted_rank_ends_every_ranks_run_and_none_copies():
    runs, outputs, memory = _slabs(2)
    runs[1].state = "failed"  # (aborted before it started: executed dry)
    outputs[1] = {}
    results, copies = run_all(runs, outputs, [Ipc(0, 64), Ipc(1, 64)], memory)
    assert results[1] is runs[1].error
    assert isinstance(results[0], RedistError) and "rank 1 (tcp://w1) was aborted" in str(results[0])
    assert not copies


def test_a_rank_aborted_after_exporting_still_agrees_and_skips_its_copies(monkeypatch):
    """Aborted between the two all-gathers: it copies nothing, yet takes part in the second (its
    peers, which wrote into its chunks, wait for it there), then raises the abort."""
    runs, outputs, memory = _slabs(2)
    real = peers.refusal

    def then_aborted(run, everyone):
        refused = real(run, everyone)
        if run.rank == 1:
            run.state = "failed"
        return refused

    monkeypatch.setattr(peers, "refusal", then_aborted)
    results, copies = run_all(runs, outputs, [Ipc(0, 64), Ipc(1, 64)], memory)
    assert results[1] is runs[1].error and results[0] is None
    assert copies == [0]


@pytest.mark.parametrize("through", ["files", "scheduler"])
def test_an_all_gather_is_given_up_once_a_rank_is_gone(through, tmp_path):
    """A peer that died never answers: the wait ends once the scheduler says a rank is gone, with
    the run's error, through files (this rank's file of the step removed) and through the
    scheduler's all-gather (left on its thread)."""
    runs, _, _ = _slabs(2)
    run = runs[0]
    if through == "files":
        exchange = hostfiles.FileExchange(str(tmp_path), 0, 2, timeout=60)
    else:

        def exchange(tag, payload):  # (the scheduler, waiting for a rank that never asks)
            time.sleep(60)

    group = DaskProcessGroup("peers", 0, 2, exchange)

    def gone_soon():
        time.sleep(0.2)
        run.state, run.gone = "failed", True

    threading.Thread(target=gone_soon, daemon=True).start()
    start = time.monotonic()
    with pytest.raises(RedistError, match="cancelled"):  # (the run's error)
        peers.gather(run, group, None)
    assert time.monotonic() - start < 5
    assert list(tmp_path.iterdir()) == []


def test_which_runs_take_the_path():
    """Several PEs on one GPU, CuPy chunks of at most 3 axes, the switch on, pieces and chunks per
    rank within the limits; the same answer on every rank."""
    from dask_redist.planning import RechunkSpec

    runs, _, _ = _slabs(2)
    assert all(peers.applies(r, True, 1 << 16) for r in runs)
    assert not peers.applies(runs[0], False, 1 << 16)  # PEs on separate GPUs
    assert not peers.applies(runs[0], True, 3)  # more pieces than that
    off = world(
        runs[0].spec.collective.rechunk,
        np.dtype(np.float64),
        2,
        runs[0].plan.in_ranks,
        shared_gpu_copies=False,
    )
    assert not peers.applies(off[0], True, 1 << 16)
    four_d = RechunkSpec(((2, 2), (2,), (2,), (2,)), ((4,), (1, 1), (2,), (2,)), 8)
    assert not peers.applies(
        world(four_d, np.dtype(np.float64), 2, np.array([0, 1]).reshape(2, 1, 1, 1))[0], True, 1 << 16
    )
    many = RechunkSpec(((1,) * 600,), ((1,) * 600,), 8)  # 300 output chunks a rank
    assert not peers.applies(world(many, np.dtype(np.float64), 2, np.zeros(600, np.int64))[0], True, 1 << 16)
    for limit, taken in ((300, True), (299, False)):  # redist.nvshmem.shared-gpu-max-chunks
        run = world(many, np.dtype(np.float64), 2, np.zeros(600, np.int64), shared_gpu_max_chunks=limit)[0]
        assert peers.applies(run, True, 1 << 16) is taken


def test_the_stats_say_how_much_of_the_peers_memory_was_mapped_once():
    ipc = SimpleNamespace(opened_bytes=[512 * 2**20, 2**30])
    assert peers.opened_since(ipc) == {"mapped allocations": 2, "mapped MiB": 1536.0}
    assert peers.opened_since(ipc) == {"mapped allocations": 0, "mapped MiB": 0.0}
    assert peers.opened_since(object()) == {"mapped allocations": 0, "mapped MiB": 0.0}


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(0, 40), min_size=0, max_size=3).map(tuple),
    dtype=st.sampled_from(["uint8", "float32", "float64", "complex128"]),
    round_to=st.sampled_from([0, 64, 4096]),
)
def test_an_output_chunk_starts_an_allocation_rounded_to_whole_pages(shape, dtype, round_to):
    """`rounded_empty` (the output chunks a peer maps through CUDA IPC): NumPy's chunk of that
    shape and dtype, C-contiguous and writable, at the start of an allocation of a multiple of
    ``round_to`` bytes where it has that many or more."""
    a = rounded_empty(np, shape, dtype, round_to)
    assert a.shape == shape and a.dtype == np.dtype(dtype) and a.flags.c_contiguous
    whole = a
    while whole.base is not None:
        whole = whole.base
    assert whole.__array_interface__["data"][0] == a.__array_interface__["data"][0]
    if round_to and a.nbytes >= round_to:
        assert whole.nbytes % round_to == 0 and whole.nbytes - a.nbytes < round_to
    else:
        assert whole.nbytes == a.nbytes
    expected = np.arange(a.size).reshape(shape).astype(dtype)
    a[...] = expected
    np.testing.assert_array_equal(a, expected)
