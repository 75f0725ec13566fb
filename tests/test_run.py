"""WorkerRun and the dask engine driven in one process with a loopback transport.

No cluster here: each rank's run executes on its own thread, as on a worker's
collective thread, and a fake transport hands pieces straight to the peer.
"""

from __future__ import annotations

import threading
import time
import traceback

import numpy as np
import pytest
from distributed.protocol import deserialize, serialize

from hypothesis import given, settings
from hypothesis import strategies as st
from planning_helpers import box_placements, chunk_box, random_placements, rechunk_specs

from dask_redist.core.assemble import Assembly
from dask_redist.core.run import WorkerRun
from dask_redist.core.spec import CollectiveSpec, RunSpec
from dask_redist.core.wire import Packed
from dask_redist.config import Settings
from dask_redist.engines import get_engine
from dask_redist.engines.dask import box_transfers_of
from dask_redist.errors import RedistConsistencyError, RedistError, RedistTimeoutError
from dask_redist.planning import RechunkSpec, make_plan


class Loopback:
    """Delivers batches to the peer runs directly (copies, as a wire would)."""

    def __init__(self, runs: list[WorkerRun], src: int, fail: bool = False):
        self.runs, self.src, self.fail = runs, src, fail

    def send(self, batches):
        if self.fail:
            raise ConnectionError("peer unreachable")
        for dst, first, packed in batches:
            buffer = deserialize(*serialize(packed.buffer))  # through the wire, as Dask's comms do
            assert buffer is not packed.buffer
            self.runs[dst].receive(self.src, first, Packed(packed.count, buffer))


def make_runs(data, old, new, nranks, in_ranks=None, timeout=30.0, budget=2**20, out_ranks=None):
    spec = RechunkSpec(old, new, data.dtype.itemsize)
    settings = Settings(collective_timeout=timeout, memory_budget=budget)
    collective = CollectiveSpec("tok", "x", "y", spec, data.dtype, settings)
    grid = spec.old_grid
    if in_ranks is None:
        in_ranks = (np.arange(int(np.prod(grid))) * nranks // int(np.prod(grid))).reshape(grid)
    plan = make_plan(spec, in_ranks, nranks, out_ranks=out_ranks)
    workers = tuple(f"w{i}" for i in range(nranks))
    run_spec = RunSpec(collective, 1, 1, workers, plan.in_ranks, plan.out_ranks, plan.needed, "dask")
    runs = []
    for r, w in enumerate(workers):
        inputs = {}
        for flat, idx in enumerate(np.ndindex(*grid)):
            if plan.in_ranks[idx] == r:
                lo, hi = chunk_box(spec.old, idx)
                inputs[flat] = data[tuple(slice(a, b) for a, b in zip(lo, hi))]
        runs.append(WorkerRun(run_spec, w, inputs))
    return runs


def execute_all(runs, fail_rank=None):
    engine = get_engine("dask")
    errors = {}

    def go(r, run):
        run.start()
        try:
            engine.execute(run, Loopback(runs, r, fail=r == fail_rank))
        except Exception as e:
            errors[r] = e
            run.fail(e)

    threads = [threading.Thread(target=go, args=(r, run)) for r, run in enumerate(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


def take_output(run: WorkerRun, index: int, timeout: float = 60):
    """Output chunk ``index`` as an unpack task gets it, waiting on this thread for the run to end."""
    ended = threading.Event()
    run.when_finished(ended.set)
    if not ended.wait(timeout):
        raise AssertionError(f"{run.name()} did not end within {timeout}s")
    out = run.pop_output(index)
    return out.build() if isinstance(out, Assembly) else out


def unpack_on_a_thread(run: WorkerRun, index: int) -> tuple[threading.Thread, dict]:
    """`take_output` on a thread of its own, started; the dict gets its ``"error"``, if any."""
    got = {}

    def unpack():
        try:
            take_output(run, index)
        except RedistError as e:
            got["error"] = e

    t = threading.Thread(target=unpack)
    t.start()
    return t, got


def collect(runs, data, new):
    spec = runs[0].spec
    for flat, idx in enumerate(np.ndindex(*[len(c) for c in new])):
        owner = runs[int(spec.out_ranks[idx])]
        lo, hi = chunk_box(new, idx)
        got = take_output(owner, flat)
        np.testing.assert_array_equal(got, data[tuple(slice(a, b) for a, b in zip(lo, hi))])


@pytest.mark.parametrize(
    "shape, old, new, nranks",
    [
        ((12, 10), ((6, 6), (10,)), ((12,), (5, 5)), 2),
        ((12, 10), ((4, 4, 4), (3, 7)), ((5, 7), (2, 2, 6)), 3),
        ((7, 5, 3), ((7,), (5,), (3,)), ((1, 2, 4), (5,), (1, 1, 1)), 4),
        ((9,), ((2, 0, 7),), ((9,),), 2),
    ],
)
def test_exchange_matches_numpy(shape, old, new, nranks):
    data = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) * 1.5 - 7
    runs = make_runs(data, old, new, nranks)
    assert execute_all(runs) == {}
    collect(runs, data, new)


def test_small_budget_sends_many_batches():
    data = np.arange(4096, dtype=np.int32).reshape(64, 64)
    runs = make_runs(data, ((32, 32), (64,)), ((64,), (8,) * 8), 2, budget=256)
    assert execute_all(runs) == {}
    collect(runs, data, ((64,), (8,) * 8))


def test_failed_sender_times_out_peers_with_a_clear_error():
    data = np.arange(100.0).reshape(10, 10)
    runs = make_runs(data, ((5, 5), (10,)), ((10,), (5, 5)), 2, timeout=0.5)
    errors = execute_all(runs, fail_rank=0)
    assert isinstance(errors[0], ConnectionError)
    assert isinstance(errors[1], RedistTimeoutError)
    message = str(errors[1])
    assert "rank 1 (w1)" in message and "'exchange'" in message and "ranks [0] (w0)" in message
    with pytest.raises(RedistTimeoutError):
        take_output(runs[1], 1)


def test_abort_releases_a_waiting_unpack_at_once():
    data = np.arange(100.0).reshape(10, 10)
    runs = make_runs(data, ((5, 5), (10,)), ((10,), (5, 5)), 2, timeout=60)
    run = runs[0]
    t, got = unpack_on_a_thread(run, 0)
    time.sleep(0.1)
    start = time.monotonic()
    run.fail(RedistError("rank 1 failed in phase 'send'"))
    t.join(5)
    assert time.monotonic() - start < 2
    assert "rank 1 failed" in str(got["error"])


@pytest.mark.parametrize(
    ("failure", "reason", "expected"),
    [
        ("error", "rank 0 refused the run", "held"),  # the scheduler reports this rank's own error
        ("error", "rank 0 refused the run (gave up after 3 restarts)", RedistError),
        ("restart", "rank 0 refused the run", RedistConsistencyError),
    ],
)
def test_a_held_failure_waits_for_the_schedulers_abort(failure, reason, expected):
    """A rank's own failure is held, not applied, until the scheduler's abort: its unpack tasks
    wait (the scheduler may restart the run instead), then raise the abort's error, which is the
    held one where the scheduler reports it, and caused by it otherwise."""
    data = np.arange(100.0).reshape(10, 10)
    run = make_runs(data, ((5, 5), (10,)), ((10,), (5, 5)), 2, timeout=60)[0]
    held = RedistError("rank 0 refused the run")
    run.hold(held)
    t, got = unpack_on_a_thread(run, 0)
    time.sleep(0.2)
    assert t.is_alive() and run.state != "failed"
    run.aborted(failure, reason, gone=["w1"])
    t.join(5)
    error = got["error"]
    assert str(error) == reason and run.gone == ("w1",)
    if expected == "held":
        assert error.__cause__ is held and type(error) is RedistError
    else:
        assert type(error) is expected and error.__cause__ is run.error and run.error.__cause__ is held


def test_every_unpack_of_a_failed_run_raises_a_traceback_of_its_own():
    """One stored error raised by every unpack task gathered every raise's frames (a worker logged
    tracebacks of hundreds of frames after a peer was killed): each raise is a new exception."""
    data = np.arange(64.0).reshape(8, 8)
    run = make_runs(data, ((4, 4), (8,)), ((8,), (1,) * 8), 2)[0]
    cause = RedistTimeoutError("rank 1 (w1) left in phase 'exchange'")
    run.fail(cause)
    depths = []
    for index in range(8):
        with pytest.raises(RedistTimeoutError, match="left in phase 'exchange'") as info:
            take_output(run, index)
        assert info.value is not cause and info.value.__cause__ is cause
        depths.append(len(traceback.extract_tb(info.value.__traceback__)))
    assert len(set(depths)) == 1, depths
    assert cause.__traceback__ is None  # (the stored one is never raised itself)


@settings(max_examples=120, deadline=None)
@given(
    rechunk_specs(max_elements=2048),
    st.integers(1, 4),
    st.booleans(),
    st.booleans(),
    st.integers(1, 8),
    st.sampled_from(["eager", "lazy", "box"]),
    st.data(),
)
def test_both_paths_of_the_dask_engine_match_numpy(
    spec, nranks, box_in, box_out, budget_items, outputs, data
):
    """Input chunks cut to output boxes (outputs tiling boxes; assembled straight into the
    output chunks by the collective thread or by the unpack tasks, or through the box) or
    pieces (any placement), any input placement, every budget: the outputs equal NumPy's."""
    import dask_redist.engines.dask as dask_engine

    kept = dask_engine.DIRECT_MAX_PARTS, dask_engine.LAZY_MIN_BYTES
    dask_engine.DIRECT_MAX_PARTS = 0 if outputs == "box" else 10**9
    dask_engine.LAZY_MIN_BYTES = 0 if outputs == "lazy" else 10**18
    try:
        _both_paths(spec, nranks, box_in, box_out, budget_items, data)
    finally:
        dask_engine.DIRECT_MAX_PARTS, dask_engine.LAZY_MIN_BYTES = kept


def _both_paths(spec, nranks, box_in, box_out, budget_items, data):
    in_ranks = data.draw(
        box_placements(spec.old, nranks) if box_in else random_placements(spec.old_grid, nranks)
    )
    out_ranks = data.draw(
        box_placements(spec.new, nranks) if box_out else random_placements(spec.new_grid, nranks)
    )
    dtype = {1: np.int8, 2: np.float16, 4: np.float32, 8: np.float64, 16: np.complex128}[spec.itemsize]
    array = (np.arange(int(np.prod(spec.shape))) % 101).astype(dtype).reshape(spec.shape)
    runs = make_runs(
        array,
        spec.old,
        spec.new,
        nranks,
        in_ranks=in_ranks,
        out_ranks=out_ranks,
        budget=budget_items * spec.itemsize * 7,
    )
    if box_out:
        assert box_transfers_of(runs[0]) is not None  # the box path
    assert execute_all(runs) == {}
    collect(runs, array, spec.new)


def test_unpacks_wait_for_a_run_on_the_event_loop_woken_once_it_ends(monkeypatch):
    """Many unpack tasks waiting for one run take no thread each (runtime.worker._finished);
    they all return when the run ends on its own thread; a failed run wakes them too; a run
    that never ends times out with the run's name."""
    import asyncio

    from dask_redist.runtime.worker import _finished

    data = np.arange(16.0).reshape(4, 4)
    runs = make_runs(data, ((2, 2), (4,)), ((4,), (2, 2)), 2)

    def no_thread(*args, **kwargs):
        raise AssertionError("an unpack waited on a thread")

    async def waiting(run, n, end):
        asyncio.get_running_loop().run_in_executor = no_thread  # (what asyncio.to_thread uses)
        waits = [asyncio.ensure_future(_finished(run)) for _ in range(n)]
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waits)
        threading.Thread(target=end).start()
        await asyncio.wait_for(asyncio.gather(*waits), 5)

    asyncio.run(waiting(runs[0], 64, lambda: runs[0].finish({})))
    asyncio.run(waiting(runs[1], 8, lambda: runs[1].fail(RedistError("aborted"))))
    asyncio.run(asyncio.wait_for(_finished(runs[0]), 1))  # (ended already: at once)
    never = make_runs(data, ((2, 2), (4,)), ((4,), (2, 2)), 2)[0]
    monkeypatch.setattr(WorkerRun, "outputs_timeout", property(lambda self: 0.2))
    with pytest.raises(
        RedistTimeoutError, match=r"timed out after 0.2s waiting for its outputs \(run is in phase"
    ):
        asyncio.run(_finished(never))


class Wire(Loopback):
    """`Loopback` over a wire that copies the bytes and takes messages of at most ``limit`` bytes
    (Dask's TCP comms: `CommsTransport.wire_limit`); it keeps what was sent."""

    def __init__(self, runs, src, limit, fail=False):
        super().__init__(runs, src, fail)
        self.limit, self.sent = limit, []

    def wire_limit(self, dst):
        return self.limit

    def send(self, batches):
        self.sent += [packed for _, _, packed in batches]
        if self.fail:
            raise ConnectionError("peer unreachable")
        for dst, first, packed in batches:  # (a socket: the peer reads the bytes into memory of its own)
            self.runs[dst].receive(self.src, first, Packed(packed.count, np.array(packed.buffer, copy=True)))


def exchange_over(wires, runs):
    """Every rank of ``runs`` executed with its transport from ``wires(runs, rank)``."""
    engine, errors = get_engine("dask"), {}
    transports = [wires(runs, r) for r in range(len(runs))]

    def go(r):
        runs[r].start()
        try:
            engine.execute(runs[r], transports[r])
        except Exception as e:
            errors[r] = e
            runs[r].fail(e)

    threads = [threading.Thread(target=go, args=(r,)) for r in range(len(runs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return transports, errors


def test_over_a_copying_wire_messages_fit_its_limit_and_packed_buffers_serve_the_next_run(monkeypatch):
    """Over TCP a message above the comm's shard size is split, and the receiver copies the shards
    into a new buffer: messages stay within the wire's limit. The buffers pieces were packed into
    are packed into again by the next run, not fresh memory (docs/benchmarks.md, "Where the CPU
    runs' slow mode came from")."""
    from dask_redist.core.wire import SendBuffers
    from dask_redist.engines import exchange as engine_module

    pool = SendBuffers(keep=2**30)
    monkeypatch.setattr(engine_module, "_send_buffers", pool)
    data = np.arange(64 * 64, dtype=np.float64).reshape(64, 64)
    old, new = ((8,) * 8, (64,)), ((64,), (32, 32))  # 4 strided pieces of 2 KiB to the peer: packed
    runs = make_runs(data, old, new, 2, budget=2**20)
    first, errors = exchange_over(lambda runs, r: Wire(runs, r, limit=5000), runs)
    assert errors == {}
    collect(runs, data, new)
    sent = [p for w in first for p in w.sent]
    assert len(sent) == 4 and all(p.buffer.nbytes <= 5000 for p in sent)  # (2 pieces a message, not 4)
    assert pool.nbytes > 0  # given back once sent
    runs = make_runs(data * 2, old, new, 2, budget=2**20)
    second, errors = exchange_over(lambda runs, r: Wire(runs, r, limit=5000), runs)
    assert errors == {}
    collect(runs, data * 2, new)
    again = [p.buffer for w in second for p in w.sent]
    assert any(np.shares_memory(b, p.buffer) for p in sent for b in again)
    # (the ranks' threads may overlap in one run and not in the other: two runs that need at most
    # 4 buffers at once make at most 4 buffers in all, where without reuse the second made its own)
    owners = {id(b if b.base is None else b.base) for b in again + [p.buffer for p in sent]}
    assert len(owners) <= len(sent)
    runs = make_runs(data, old, new, 2, budget=2**20, timeout=0.5)
    failed, errors = exchange_over(lambda runs, r: Wire(runs, r, limit=5000, fail=r == 0), runs)
    assert isinstance(errors[0], ConnectionError)
    lost = [p.buffer for p in failed[0].sent]
    while pool.nbytes:  # a failed send's buffers are not handed out again (it may still read them)
        kept = pool.take(1)
        assert not any(np.shares_memory(kept, b) for b in lost)


def test_without_a_wire_limit_the_budget_alone_sizes_messages_and_nothing_is_kept(monkeypatch):
    """Where the wire hands the buffer itself to the peer (inproc; `Loopback` here copies, but
    says no limit), a packed buffer is never packed into again."""
    from dask_redist.core.wire import SendBuffers
    from dask_redist.engines import exchange as engine_module

    pool = SendBuffers(keep=2**30)
    monkeypatch.setattr(engine_module, "_send_buffers", pool)
    data = np.arange(64 * 64, dtype=np.float64).reshape(64, 64)
    runs = make_runs(data, ((32, 32), (64,)), ((64,), (8,) * 8), 2, budget=2**20)
    assert execute_all(runs) == {}
    collect(runs, data, ((64,), (8,) * 8))
    assert pool.nbytes == 0


def test_the_comms_transport_limits_messages_over_tcp_only():
    from types import SimpleNamespace

    from distributed.comm.tcp import TCP

    from dask_redist.runtime.transport import CommsTransport

    workers = ("tcp://10.0.0.1:1234", "tls://10.0.0.2:1234", "ucx://10.0.0.3:1234", "inproc://10.0.0.4/1/2")
    run = SimpleNamespace(spec=SimpleNamespace(workers=workers))
    transport = CommsTransport(None, run)
    assert [transport.wire_limit(r) for r in range(4)] == [TCP.max_shard_size] * 2 + [None, None]


@pytest.mark.parametrize("transposed", [False, True])
def test_an_output_chunk_cut_from_one_input_chunk_keeps_no_view_of_it(transposed):
    """An output chunk that is a small part of one input chunk of its own rank is a copy, as
    Dask's ``getitem`` copies a selection of under half its array: a view kept the whole input
    chunk in worker memory (Dask counts the view's bytes only) and, cut from a transposed chunk,
    was strided where Dask's chunk is C-ordered, so NumPy's sums over it rounded otherwise (an
    ``xr.dot`` after a collective rechunk differed from Dask's in the last bits). A piece that is
    its whole input chunk is still handed on as it is."""
    base = np.arange(40 * 30, dtype=np.float64).reshape(40, 30) * 0.1
    data = base.T if transposed else base
    rows, cols = data.shape
    old = ((rows // 4,) * 4, (cols,))
    in_ranks = np.array([[0], [1], [0], [1]])  # (each rank's outputs no one box: cut piece by piece)
    for new, copied in [(((rows // 4,) * 4, (cols // 5,) * 5), True), (old, False)]:
        runs = make_runs(data, old, new, 2, in_ranks=in_ranks)
        for run in runs:  # (each input chunk an array of its own, as a worker's are)
            run.inputs = {i: np.array(a, order="K") for i, a in run.inputs.items()}
        inputs = [a for run in runs for a in run.inputs.values()]
        assert execute_all(runs) == {}
        for flat, idx in enumerate(np.ndindex(*[len(c) for c in new])):
            got = take_output(runs[int(runs[0].spec.out_ranks[idx])], flat)
            lo, hi = chunk_box(new, idx)
            np.testing.assert_array_equal(got, data[tuple(slice(a, b) for a, b in zip(lo, hi))])
            shares = any(np.shares_memory(got, a) for a in inputs)
            assert (got.flags.c_contiguous and not shares) if copied else shares
