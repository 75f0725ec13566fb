"""The hybrid engine (`dask_redist.engines.hybrid`) without a GPU: ranks are threads with real
`WorkerRun`s, chunks NumPy arrays standing in for CuPy ones (their ``.data.ptr`` a real address),
CUDA IPC a stand-in that maps a peer's chunk at its own address (one process), the copy kernel's
jobs replayed byte by byte, Dask's comms a transport handing packed buffers to the peer's run.

Every byte of every needed output chunk must come from the right input bytes, each piece moved
exactly once, through IPC where both ranks share a host whose every rank can be mapped, else
over comms; and a failure anywhere must end every rank's run alike, none left waiting."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
from copy_helpers import draw_placement, FakeIpc, Group, random_rechunk, replay_at_addresses, run_ranks
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_redist.config import Settings
from dask_redist.core.run import WorkerRun
from dask_redist.core.spec import CollectiveSpec, RunSpec
from dask_redist.engines.hybrid import HybridEngine
from dask_redist.engines.hybrid.routes import by_ipc
from dask_redist.errors import RedistError
from dask_redist.planning import make_plan


class Dev(np.ndarray):
    """A NumPy array read as the engine reads a CuPy one: ``.data.ptr``, its first byte's address."""

    @property
    def data(self):
        return SimpleNamespace(ptr=self.__array_interface__["data"][0])


class Ipc(FakeIpc):
    """CUDA IPC in one process: every chunk its own allocation, opened at its own address."""


class Device:
    """The engine's GPU on the CPU: the copy kernel's jobs replayed with ``memmove``."""

    def __init__(self, ipc: Ipc, fail_copy: bool = False):
        self.ipc, self.fail_copy = ipc, fail_copy
        self.pieces = 0  # pieces copied by the kernel
        self._kept: list = []

    def empty(self, shape, dtype):
        out = np.empty(shape, dtype)
        out.view(np.uint8)[...] = 0xEE
        self._kept.append(out)
        return out.view(Dev)

    def synchronize(self) -> None:
        pass

    def launch(self, jobs) -> None:
        if self.fail_copy:
            raise RuntimeError("an illegal memory access was encountered")
        self.pieces += len(jobs)
        replay_at_addresses(jobs)

    def place(self, pairs) -> None:
        for dst, src in pairs:
            dst[...] = src


class Transport:
    """Dask's comms between the threads: a packed buffer handed to the peer's run."""

    def __init__(self, runs, rank: int, sent: list):
        self.runs, self.rank, self.sent = runs, rank, sent

    def send(self, batches) -> None:
        for dst, first, packed in batches:
            self.sent.append(packed.count)
            self.runs[dst].receive(self.rank, first, packed)


def make_runs(rechunk, dtype, hosts, in_ranks, whole, needed=None):
    nranks = len(hosts)
    plan = make_plan(rechunk, in_ranks, nranks, needed=needed)
    spec = CollectiveSpec("t" * 32, "in", "out", rechunk, dtype, Settings(), "cupy")
    workers = tuple(f"tcp://{h}:{1000 + r}" for r, h in enumerate(hosts))
    runs = []
    for rank in range(nranks):
        run_spec = RunSpec(spec, 1, 1, workers, plan.in_ranks, plan.out_ranks, plan.needed, "hybrid", "cupy")
        inputs = {}
        for flat in np.flatnonzero(plan.in_ranks.ravel() == rank).tolist():
            lo, hi = rechunk.old_box(flat)
            inputs[flat] = np.ascontiguousarray(whole[tuple(slice(a, b) for a, b in zip(lo, hi))]).view(Dev)
        run = WorkerRun(run_spec, workers[rank], inputs)
        run.completes_when_aborted = True
        runs.append(run)
    return runs


def run_all(runs, devices, before=None):
    """Every rank's `HybridEngine.execute` on a thread; each rank's error or None, the group, and
    the pieces each sent over comms (own pieces counted where they were handed over)."""
    group, sent, own = Group(len(runs)), [], []
    results = [None] * len(runs)

    def one(rank):
        run = runs[rank]
        run.start()
        if before:
            before(run)
        receive = run.receive

        def counted(src, first, arrays):
            if src == rank:
                own.append(len(arrays))
            receive(src, first, arrays)

        run.receive = counted
        engine = HybridEngine(device=devices[rank], group=lambda r: group.for_rank(r.rank))
        try:
            engine.execute(run, Transport(runs, rank, sent))
        except Exception as e:  # noqa: BLE001 - what the test looks at
            results[rank] = e

    run_ranks(one, group)
    return results, sum(sent) + sum(own)


@pytest.fixture(autouse=True)
def _hosts_from_addresses(monkeypatch):
    """Each rank's host is its address's (no ``redist.host`` in this process)."""
    import dask

    monkeypatch.delenv("DASK_REDIST__HOST", raising=False)
    with dask.config.set({"redist.host": None}):
        yield


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_byte_lands_right_and_every_piece_moves_once_by_ipc_or_comms(data):
    """2-5 ranks on 1-3 hosts, random chunkings and placements, some output chunks not needed,
    some ranks that cannot export or cannot map: every needed output chunk equals the array's box;
    pieces between ranks of one host whose every rank can be mapped went through the copy kernel,
    all others over comms, each exactly once."""
    shape, dtype, rechunk = random_rechunk(data, 8)
    nranks = data.draw(st.integers(2, 5))
    hosts = [f"h{data.draw(st.integers(0, 2))}" for _ in range(nranks)]
    in_ranks, needed = draw_placement(data, rechunk, nranks)
    fails = [data.draw(st.sampled_from(["", "", "", "export", "open"])) for _ in range(nranks)]
    whole = (np.arange(int(np.prod(shape))) % 113 + 1).astype(dtype).reshape(shape)
    runs = make_runs(rechunk, dtype, hosts, in_ranks, whole, needed)
    devices = [Device(Ipc(f)) for f in fails]
    results, by_comms = run_all(runs, devices)
    assert results == [None] * nranks, results

    plan = runs[0].plan
    for run in runs:
        assert sorted(run.outputs) == plan.owned(run.rank)
        for flat, chunk in run.outputs.items():
            lo, hi = rechunk.new_box(flat)
            np.testing.assert_array_equal(
                np.asarray(chunk), whole[tuple(slice(a, b) for a, b in zip(lo, hi))]
            )
    # each piece once: by the kernel exactly where the rule says, the rest over comms
    t = plan.transfers
    # (a rank without output chunks exports nothing, so cannot fail to; one maps only where it
    # copies into a peer's chunk)
    mappable = [not (f == "export" and plan.owned(r)) for r, f in enumerate(fails)]
    expected = by_ipc(t.src, t.dst, hosts, mappable)
    tried = expected & (t.src != t.dst)
    unmapped = [f == "open" and bool((tried & (t.src == r)).any()) for r, f in enumerate(fails)]
    if any(unmapped):  # a host with a rank that could not map: all of its pieces over comms instead
        expected = by_ipc(t.src, t.dst, hosts, [m and not u for m, u in zip(mappable, unmapped)])
    assert sum(d.pieces for d in devices) == int(expected.sum())
    assert by_comms == int((~expected).sum())
    for d in devices:
        assert sorted(d.ipc.opened) == sorted(d.ipc.closed)


def _slabs(hosts=("a", "a", "b", "b")):
    """A (8, 6, 4) float64 array, 4 slabs to 3 slabs along another axis, ranks by slab."""
    from dask_redist.planning import RechunkSpec

    rechunk = RechunkSpec(((2, 2, 2, 2), (6,), (4,)), ((8,), (2, 2, 2), (4,)), 8)
    whole = np.arange(8 * 6 * 4, dtype=np.float64).reshape(8, 6, 4)
    in_ranks = (np.arange(4) * len(hosts) // 4).reshape(4, 1, 1)
    return make_runs(rechunk, np.dtype(np.float64), list(hosts), in_ranks, whole), whole


def test_the_routes_are_per_pair_of_ranks_and_per_host():
    src, dst = np.array([0, 0, 1, 2, 3, 2]), np.array([1, 2, 0, 3, 2, 2])
    hosts = ["a", "a", "b", "b"]
    assert by_ipc(src, dst, hosts, [True] * 4).tolist() == [True, False, True, True, True, True]
    # one rank of host b cannot be mapped: every piece of host b over comms, host a's unchanged
    assert by_ipc(src, dst, hosts, [True, True, True, False]).tolist() == [
        True,
        False,
        True,
        False,
        False,
        False,
    ]


def test_a_copy_that_fails_fails_every_rank_naming_it():
    runs, _ = _slabs()
    devices = [Device(Ipc(), fail_copy=(r == 0)) for r in range(4)]
    results, _ = run_all(runs, devices)
    from dask_redist.errors import EngineUnavailableError

    for r in results:  # (unavailable: under auto the rechunk restarts on another engine)
        assert isinstance(r, EngineUnavailableError), results
        assert "rank 0 (tcp://a:1000) failed in phase 'exchange'" in str(r) and "illegal memory" in str(r)


def test_an_aborted_rank_ends_every_ranks_run_before_anything_moves():
    runs, _ = _slabs()
    cancelled = RedistError("run t/1 was cancelled")
    devices = [Device(Ipc()) for _ in range(4)]

    def before(run):
        if run.rank == 2:
            run.fail(cancelled)

    results, moved = run_all(runs, devices, before=before)
    assert str(results[2]) == str(cancelled)
    assert all("rank 2 (tcp://b:1002) was aborted" in str(results[r]) for r in (0, 1, 3)), results
    assert moved == 0 and sum(d.pieces for d in devices) == 0


def test_numpy_chunks_are_refused_naming_the_engine_and_auto():
    runs, _ = _slabs()
    run = runs[0]
    run.spec = SimpleNamespace(chunk_type="numpy", name=run.spec.name, collective=run.spec.collective)
    with pytest.raises(RedistError, match="CuPy chunks only.*auto"):
        HybridEngine(device=Device(Ipc())).execute(run, None)


class Scheduler:
    """The scheduler's all-gather as the engine gets it (`engines.ipc.ExchangeGroup`), for one rank whose peers never
    come: it blocks until ``answer`` is set, then raises what is in it."""

    def __init__(self):
        self.answer, self.error = threading.Event(), None

    def exchange_factory(self, rank, nranks):
        def exchange(tag, payload):
            self.answer.wait(30)
            raise self.error

        return exchange


def test_a_gone_rank_ends_the_wait_of_every_all_gather():
    """Rank 1 never comes (its worker died); once the scheduler says it is gone, rank 0 gives its
    all-gather up at once and raises the abort, without waiting for the timeout."""
    import time

    runs, _ = _slabs(("a", "a"))
    run, scheduler = runs[0], Scheduler()
    run.start()
    left = RedistError("workers ['tcp://a:1001'] left")
    threading.Timer(0.3, lambda: run.fail(left, gone=(1,))).start()
    start = time.monotonic()
    with pytest.raises(RedistError, match="left"):
        HybridEngine(device=Device(Ipc())).execute(run, scheduler)
    assert time.monotonic() - start < 10
    scheduler.answer.set()


def test_an_all_gather_that_times_out_names_the_run_rank_phase_and_setting():
    from dask_redist.errors import RedistTimeoutError

    runs, _ = _slabs(("a", "a"))
    run, scheduler = runs[0], Scheduler()
    run.start()
    scheduler.error = RedistTimeoutError(
        "step hybrid/t/1/1: ranks [1] did not answer (see redist.timeouts.bootstrap)"
    )
    scheduler.answer.set()
    with pytest.raises(RedistTimeoutError) as info:
        HybridEngine(device=Device(Ipc())).execute(run, scheduler)
    text = str(info.value)
    assert "rank 0 (tcp://a:1000)" in text and "phase 'all-gather chunks'" in text, text
    assert "redist.timeouts.bootstrap" in text, text


def test_a_rank_that_fails_before_the_first_all_gather_ends_every_ranks_run_naming_it():
    """Its outputs could not be allocated (out of GPU memory): it says so in the first all-gather,
    so no peer waits for it; every rank raises, nothing moved."""
    runs, _ = _slabs()
    devices = [Device(Ipc()) for _ in range(4)]

    def out_of_memory(shape, dtype):
        raise MemoryError("Out of memory allocating 1,024 bytes")

    devices[1].empty = out_of_memory
    results, moved = run_all(runs, devices)
    for r in results:
        assert isinstance(r, RedistError), results
        assert "rank 1 (tcp://a:1001) failed in phase 'export': MemoryError: Out of memory" in str(r), results
    assert moved == 0 and sum(d.pieces for d in devices) == 0
