"""A failed run lets go of what it was moving, and an aborted run's sends are not waited out.

No cluster here: the dask engine runs in this process on the rank's own thread, with a transport
that fails as Dask's comms do when a peer leaves, or a fake worker whose peer never answers.
A user-style session found both (docs/reliability.md, "Staged chunks that would pause a worker
for good"): after a failed run a worker stayed paused, its memory held by the frames of the
run's error, and a restarted run's rank sat in its `send` phase after the abort.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import traceback
import weakref
from types import SimpleNamespace

import numpy as np
import pytest

from dask_redist.config import Settings
from dask_redist.core.run import WorkerRun
from dask_redist.core.spec import CollectiveSpec, RunSpec
from dask_redist.engines import get_engine
from dask_redist.errors import RedistConsistencyError, RedistError
from dask_redist.planning import RechunkSpec, make_plan
from dask_redist.runtime.transport import CommsTransport

WORKERS = ("tcp://a:1", "tcp://b:1")
N = 512  # rows and columns of float64: 2 MiB, in two row slabs of 1 MiB (one per rank)


def two_rank_run(rank: int = 0, timeout: float = 60.0) -> WorkerRun:
    """Rank ``rank`` of a run taking a (N, N) array from two row slabs to four column slabs."""
    rechunk = RechunkSpec(((N // 2,) * 2, (N,)), ((N,), (N // 4,) * 4), 8)
    plan = make_plan(rechunk, [0, 1], 2)
    settings = Settings(collective_timeout=timeout)
    spec = CollectiveSpec("f" * 32, "x", "y", rechunk, np.dtype("float64"), settings)
    run_spec = RunSpec(spec, 1, 1, WORKERS, plan.in_ranks, plan.out_ranks, plan.needed, "dask")
    return WorkerRun(run_spec, WORKERS[rank], {rank: np.ones((N // 2, N))})


class Peer:
    """A worker's rpc to a peer: it takes the pieces and answers, never (``answers=False``: busy or
    stopped), or by resetting the connection, as Dask's comm does when the peer left mid-send.
    Keeps weak references to the buffers it was sent."""

    def __init__(self, answers: bool | None = None):
        self.answers = answers
        self.buffers: list[weakref.ref] = []
        self.waiting, self.cancelled = threading.Event(), threading.Event()

    def rpc(self, address):
        return self

    async def redist_receive(self, **kwargs):
        self.buffers.append(weakref.ref(kwargs["data"].data))
        if self.answers is None:
            raise ConnectionResetError("[Errno 104] Connection reset by peer")
        self.waiting.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


@pytest.fixture
def event_loop_thread():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def worker_on(loop, peer: Peer):
    """What `CommsTransport` uses of a Worker: its event loop and its rpc."""
    return SimpleNamespace(loop=SimpleNamespace(asyncio_loop=loop), rpc=peer.rpc)


def test_a_failed_run_keeps_nothing_its_engine_was_moving(event_loop_thread):
    """The error a failed run keeps (until the scheduler forgets the rechunk, or runs it again)
    held the frames of the engine's failure and their locals: the packed send buffers, the pieces
    cut from the input chunks (views, so the chunks too) and the message being written; the frames
    also hold their functions, and the send's closures the buffers by peer. A worker stayed paused
    over them. Now the run keeps its errors without those locals, the send lets go of its buffers,
    and no garbage collection is needed to free them; the traceback's lines stay."""
    peer = Peer()
    run = two_rank_run()
    chunk = weakref.ref(run.inputs[0])
    run.start()
    gc.disable()  # (what is freed here is freed without the cycle collector)
    try:
        try:
            get_engine("dask").execute(run, CommsTransport(worker_on(event_loop_thread, peer), run))
        except RedistError as e:  # as the collective thread reports it: held until the scheduler aborts
            run.hold(e)
        run.aborted("restart", "worker tcp://b:1 left during the run")
        assert peer.buffers, "the engine sent nothing"
        assert all(b() is None for b in peer.buffers), "a packed send buffer is still held"
        assert chunk() is None, "the input chunk is still held"
    finally:
        gc.enable()
    assert run.state == "failed" and isinstance(run.error.__cause__, RedistConsistencyError)
    lines = "".join(traceback.format_tb(run.error.__cause__.__traceback__))
    assert "send_pieces" in lines and "to_peer" in lines  # (where it failed still shows)


def test_an_aborted_run_stops_waiting_for_its_sends(event_loop_thread):
    """A rank whose peer does not answer its pieces waited for the collective timeout even once
    the scheduler had aborted the run (a restart, a failure elsewhere): its collective thread sat
    in phase 'send', holding the packed buffers. Now the abort ends the wait with the abort's
    error, and the send on the event loop is cancelled."""
    peer = Peer(answers=False)
    worker = worker_on(event_loop_thread, peer)
    run = two_rank_run(timeout=3600)  # (only the abort can end the wait)
    run.start()
    got = {}

    def send():
        try:
            get_engine("dask").execute(run, CommsTransport(worker, run))
        except RedistError as e:
            got["error"] = e

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    assert peer.waiting.wait(30), "the pieces never reached the peer"
    run.aborted("restart", "worker tcp://c:1 left during the run")
    sender.join(30)
    assert not sender.is_alive(), "the send was waited out after the abort"
    assert isinstance(got["error"], RedistConsistencyError)
    assert str(got["error"]) == "worker tcp://c:1 left during the run"
    assert peer.cancelled.wait(30) and run.phase == "send"
