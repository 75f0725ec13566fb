"""One rank's part of one run of a collective rechunk, agnostic of the cluster.

A `WorkerRun` holds the inputs staged on this rank, collects the pieces
other ranks send, and hands out the output chunks. It knows nothing of dask
workers or comms: the engine that executes it is given a transport, so tests
drive several runs in one process with a fake one.

What an engine uses of it: ``spec``, ``plan``, ``rank``, ``inputs`` (flat index ->
chunk), ``timeout``, ``state``/``error`` (aborts), ``set_phase``, ``receive``,
``wait_received``, ``assemblies`` and ``finish`` (flat index -> output chunk).

Thread model: the run is *executed* on the worker's collective thread, pieces
*arrive* on the worker's event loop, outputs are *taken* by unpack tasks on
the worker's task threads. One condition variable guards the state; every
wait on it has a timeout.
"""

from __future__ import annotations

import copy
import threading
import time
import traceback
from typing import Any

import numpy as np

from dask_redist.core.assemble import Assembly
from dask_redist.core.spec import RunSpec
from dask_redist.core.wire import Packed, unpack_views
from dask_redist.errors import (
    FAILURES,
    RedistConsistencyError,
    RedistError,
    RedistTimeoutError,
    failure_of,
)
from dask_redist.planning import Plan, Transfers


class WorkerRun:
    """The state of one run on one rank."""

    def __init__(self, spec: RunSpec, address: str, inputs: dict[int, Any]):
        self.spec = spec
        self.address = address
        self.rank = spec.workers.index(address)
        self.inputs = inputs
        self.timeout = spec.collective.settings.collective_timeout
        self._cond = threading.Condition()
        self.state = "queued"  # queued -> running -> done | failed
        self.phase = "queued"
        self.error: BaseException | None = None
        self.failed_at: float | None = None  # time.monotonic() of the abort
        self.gone: tuple[str, ...] = ()  # ranks the scheduler saw leave, as of the abort
        self.held: RedistError | None = None  # this rank's own failure, until the abort (`hold`)
        #: set by an engine whose ranks must make matching calls (``completes_aborted_runs``)
        self.completes_when_aborted = False
        self.outputs: dict[int, Any] = {}
        self.started = time.time()
        self._inbox: list[tuple[int, int, list]] = []  # pieces as they arrive, sorted out later
        self._when_finished: list = []  # callbacks for the end of the run (`when_finished`)

    @property
    def plan(self) -> Plan:
        return self.spec.plan

    @property
    def run_id(self) -> int:
        return self.spec.run_id

    def name(self) -> str:
        return self.spec.name(self.rank)

    # -- event loop side --------------------------------------------------------------

    def receive(self, src: int, first: int, arrays: list | Packed) -> None:
        """Pieces ``first ..`` of what ``src`` sends this rank: a list, or `Packed`.

        Only queued here (cheap, on the event loop); `wait_received` sorts them.
        """
        with self._cond:
            if self.state not in ("done", "failed"):
                self._inbox.append((src, first, arrays))
                self._cond.notify_all()

    def fail(self, error: BaseException, gone=()) -> None:
        """Abort the run: every wait on it raises ``error`` from now on (kept without its frames'
        locals: `without_locals`). ``gone``: ranks that left (a later abort of the same run may add
        to them)."""
        without_locals(error)
        with self._cond:
            self.gone = tuple(sorted(set(self.gone) | set(gone)))
            if self.state == "failed":
                return
            self.state = "failed"
            self.error = error
            self.failed_at = time.monotonic()
            self.inputs = {}
            self._inbox = []
            self.outputs = {}
            self._cond.notify_all()
        self._finished_now()

    def hold(self, error: RedistError) -> None:
        """This rank's own failure, reported to the scheduler and not applied yet: the scheduler may
        answer it with a restart, and this rank's unpack tasks must not fail the user's
        computation before that. The scheduler's abort applies it (`aborted`). Kept without its
        frames' locals (`without_locals`)."""
        self.held = without_locals(error)

    def aborted(self, failure: str, reason: str, gone=()) -> None:
        """The scheduler's abort: fail with ``failure``'s error (`dask_redist.errors.FAILURES`)
        saying ``reason``. Where that is this rank's own held failure, that error itself (its
        traceback and cause); else one caused by it."""
        held = self.held
        if held is not None and failure_of(held) == failure and str(held) == reason:
            error = held
        else:
            error = FAILURES[failure](reason)
            error.__cause__ = held
        self.fail(error, gone)

    def must_stop(self) -> bool:
        """Aborted, and not to be completed: its engine needs no completion, or a rank is gone
        (nothing could complete the calls it shares with that rank)."""
        return self.state == "failed" and (bool(self.gone) or not self.completes_when_aborted)

    # -- collective thread side ---------------------------------------------------------

    def start(self) -> bool:
        """Mark the run as executing; False if it was aborted meanwhile."""
        with self._cond:
            if self.state != "queued":
                return False
            self.state = "running"
            self.phase = "started"
            return True

    def inputs_as_declared(self) -> None:
        """Input chunks whose dtype is not the array's (a ``map_blocks`` or ``from_delayed`` given
        another ``dtype=``) converted to the array's: the engines move a chunk's bytes and read them
        as the array's dtype, so pieces that crossed to another rank were the chunk's bytes
        reinterpreted (int64 read as float64), while those kept here were converted on the copy.
        (Not for a distributed FFT's run, whose geometry names the dtype it takes.)"""
        dtype = self.spec.collective.dtype
        if self.spec.collective.fft is not None:
            return
        with self._cond:
            if self.state != "running":  # (an abort empties the inputs)
                return
            other = {i: a for i, a in self.inputs.items() if a.dtype != dtype}
            if other:
                self.inputs = {**self.inputs, **{i: a.astype(dtype) for i, a in other.items()}}

    def set_phase(self, phase: str) -> None:
        """Enter ``phase``; raises the abort's error unless the run is being completed (`must_stop`)."""
        self.phase = phase
        if self.must_stop():
            raise self.failure()

    def failure(self) -> BaseException:
        """The abort's error to raise, a new exception each time (caused by the one stored).
        Every unpack task of a failed run raises it: one object raised again and again gathers
        every raise's frames (the last unpack task of a run of many chunks would log a traceback
        of a frame per task before it)."""
        try:
            error = copy.copy(self.error)
        except Exception:  # (an exception type that cannot be rebuilt from its args)
            return self.error
        if type(error) is not type(self.error) or error is self.error:
            return self.error
        error.__cause__ = self.error
        return error

    def _raise_if_failed(self):
        if self.state == "failed":
            raise self.failure()

    def wait_received(self, recv: Transfers | None = None) -> dict[int, list]:
        """Block until every expected piece arrived; the pieces by source rank.

        ``recv``: what this rank receives, in the order both ends agree on (by default the
        plan's pieces; an engine may move other boxes, e.g. input chunks cut to output boxes).
        """
        self.set_phase("exchange")
        recv = self.plan.receives(self.rank) if recv is None else recv
        slots = {int(s): [None] * int(n) for s, n in zip(*np.unique(recv.src, return_counts=True))}
        missing = {s: len(v) for s, v in slots.items()}
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while True:
                self._raise_if_failed()
                for src, first, arrays in self._inbox:
                    if isinstance(arrays, Packed):  # a buffer from a peer
                        arrays = self._unpacked(recv, src, first, arrays)
                    slot = slots.get(src)
                    if slot is None or first + len(arrays) > len(slot):
                        raise RedistError(
                            f"{self.name()}: unexpected pieces {first}..{first + len(arrays)} from rank {src}"
                        )
                    for i, a in enumerate(arrays):
                        missing[src] -= slot[first + i] is None
                        slot[first + i] = a
                self._inbox.clear()
                if not any(missing.values()):
                    return slots
                left = deadline - time.monotonic()
                if left <= 0:
                    late = sorted(s for s, n in missing.items() if n)
                    raise RedistTimeoutError(
                        f"{self.name()} timed out after {self.timeout:g}s in phase 'exchange' waiting for "
                        f"pieces from ranks {late} ({', '.join(self.spec.workers[s] for s in late)}); "
                        "raise redist.timeouts.collective if the run is just slow"
                    )
                self._cond.wait(left)

    def _unpacked(self, recv, src: int, first: int, packed: Packed) -> list:
        mine = np.flatnonzero(recv.src == src)[first : first + packed.count]
        if len(mine) != packed.count:
            raise RedistError(
                f"{self.name()}: unexpected pieces {first}..{first + packed.count} from rank {src}"
            )
        shapes = [tuple(int(h - l) for l, h in zip(recv.lo[i], recv.hi[i])) for i in mine]
        return unpack_views(packed.buffer, shapes, self.spec.collective.dtype)

    def finish(self, outputs: dict[int, Any]) -> None:
        with self._cond:
            if self.state == "failed":
                return
            self.outputs = outputs
            self.inputs = {}
            self.state = "done"
            self.phase = "done"
            self._cond.notify_all()
        self._finished_now()

    def when_finished(self, callback) -> None:
        """Call ``callback()`` once the run is done or failed: at once if it is, else from the
        thread that ends it."""
        with self._cond:
            if not self.finished:
                self._when_finished.append(callback)
                return
        callback()

    def _finished_now(self) -> None:
        with self._cond:
            callbacks, self._when_finished = self._when_finished, []
        for callback in callbacks:
            callback()

    # -- task side ------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")

    @property
    def outputs_timeout(self) -> float:
        """How long an unpack task waits for the run to end (`runtime.worker._finished`): every
        phase of a run has its own timeout and a failing rank aborts the run everywhere, so this
        wait is only a backstop, twice as long, so that the error users see names the phase
        that stalled."""
        return 2 * self.timeout + 5

    def outputs_timed_out(self) -> RedistTimeoutError:
        return RedistTimeoutError(
            f"{self.name()} timed out after {self.outputs_timeout:g}s waiting for its outputs "
            f"(run is in phase '{self.phase}'); raise redist.timeouts.collective if it is just slow"
        )

    def pop_output(self, index: int):
        """Output chunk ``index`` of a finished run (an `Assembly` or an array), handed out once."""
        with self._cond:
            self._raise_if_failed()
            try:
                return self.outputs.pop(index)
            except KeyError:
                raise RedistConsistencyError(
                    f"{self.name()}: output chunk {index} is not here (owned by rank "
                    f"{int(self.plan.out_ranks.ravel()[index])}, or already taken)"
                ) from None

    def put_back(self, index: int, chunk) -> None:
        """Output chunk ``index`` (`pop_output`) is here again: its unpack task failed in the step
        fused into it, and a retry of that task takes the chunk again (not once the run failed)."""
        with self._cond:
            if self.state != "failed":
                self.outputs[index] = chunk

    # -- helpers for engines ----------------------------------------------------------

    def assemblies(self, received: dict[int, list]) -> dict[int, Assembly]:
        """Output chunks of this rank as pieces, from the received pieces by source rank."""
        spec = self.spec.collective
        recv = self.plan.receives(self.rank)
        like = self.like_array(received)
        out: dict[int, Assembly] = {}
        for flat in self.plan.owned(self.rank):
            lo, hi = spec.rechunk.new_box(flat)
            out[flat] = Assembly(lo, hi, spec.dtype, like, [])
        position = {s: 0 for s in received}
        for i in range(len(recv)):
            s = int(recv.src[i])
            a = received[s][position[s]]
            position[s] += 1
            assembly = out[int(recv.new_block[i])]
            assembly.parts.append((recv.lo[i], recv.hi[i], a))
            assembly.shared |= s != self.rank
        return out

    def like_array(self, received: dict[int, list]):
        """An array of the run's namespace (NumPy or CuPy, on this device), for allocating outputs."""
        for arrays in received.values():
            if arrays:
                return arrays[0]
        for a in self.inputs.values():
            return a
        if self.spec.chunk_type == "cupy":  # pragma: no cover - needs a GPU
            import cupy

            return cupy.empty(0, dtype=self.spec.collective.dtype)
        return np.empty(0, dtype=self.spec.collective.dtype)


def without_locals(error: BaseException | None) -> BaseException | None:
    """``error``, its frames cleared of their local variables, and those of its causes and contexts
    (the traceback's lines stay). A failed run keeps its error as long as the worker keeps the run
    (until the scheduler forgets the rechunk, or runs it again), and the frames of the engine's
    failure hold what it was moving: the packed buffers of a send, the pieces cut from the inputs
    (views keeping the input chunks), the message being written. Memory Dask does not manage, which
    kept a worker paused after a failed run (docs/reliability.md). A frame still executing (where
    the error is being handled) is left as it is."""
    seen: set[int] = set()
    pending = [error]
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        pending += [e.__cause__, e.__context__]
    return error
