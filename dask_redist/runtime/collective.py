"""The collective thread of a worker: runs execute one at a time, in one global order.

Every worker has ONE collective thread (`CollectiveThread`) that executes runs
strictly by their sequence number, so two rechunks running at the same time (two
threads, two clients, one graph) can never wait on each other crosswise; engines whose
ranks make collective calls need that, since every rank must make them in the same order.

`RunExecutor` runs each on its engine with a `CommsTransport`, reports a failing
rank to the scheduler (which aborts the run everywhere, so nobody waits for it), and,
for engines whose thread can block behind work only peers can finish (``watched``),
keeps a watchdog: a run aborted while its engine sits in such a call, or past the
timeouts, ends the process so that its nanny starts a fresh one
(``redist.nvshmem.exit-when-stuck``).
"""

from __future__ import annotations

import asyncio
import faulthandler
import heapq
import itertools
import logging
import os
import threading
import time
from typing import Callable

from dask_redist.core import messages as m
from dask_redist.core.run import WorkerRun, without_locals
from dask_redist.engines import get_engine
from dask_redist.engines.choice import passed_over_from_now_on, untrusts_world
from dask_redist.engines.registry import description
from dask_redist.errors import (
    EngineUnavailableError,
    RedistError,
    failure_of,
)
from dask_redist.runtime.transport import CommsTransport

logger = logging.getLogger("dask_redist")

#: Seconds an engine with peer-dependent work in flight may take to return once its run was
#: aborted (or past its collective timeout) before the watchdog ends the process (`RunExecutor._watch`).
STUCK_GRACE_S = 10.0
#: Seconds a run submitted behind an aborted one that is still executing waits for its thread
#: before it gets a new one (`CollectiveThread`): an engine notices an abort at its next wait
#: (the `dask` engine within `dask_redist.runtime.transport.STOP_POLL_S`), which an ordinary
#: cancel followed at once by another rechunk reaches before that thread did.
ABANDON_AFTER_S = 2.0


def _saying_what_follows(error: RedistError, run: WorkerRun) -> RedistError:
    """``error``, the run's failure on this rank, with what it means for later rechunks where
    it leaves the world of the run's engine untrusted (`untrusts_world`, the scheduler's rule too):
    of the failures the user sees, an error or a timeout (a restart, or an engine that could not
    start, is the scheduler's to retry)."""
    d, failure = description(run.spec.engine, run.spec.collective.settings), failure_of(error)
    if failure not in ("error", "timeout") or not untrusts_world(d, failure):
        return error
    later = passed_over_from_now_on(d, "after this failure")  # (the error names the run already)
    return type(error)(f"{error} ({later})")


class CollectiveThread:
    """Executes runs one at a time, lowest sequence number first.

    A run aborted while its thread is inside a call that cannot be interrupted
    (NVSHMEM's bootstrap retrying a dead peer, a GPU wait) would hold up every
    later run on this worker, the restarted one included. So a run submitted
    while the current one is already aborted gets a fresh thread where the aborted
    one has not returned `ABANDON_AFTER_S` later; the old one exits whenever its call
    returns (``on_abandon`` is told, once). Most aborted runs return within that time
    (a cancel, then another rechunk at once): the next run then keeps the thread.
    """

    def __init__(self, execute: Callable[[WorkerRun], None], name: str, on_abandon=None):
        self._execute = execute
        self._name = name
        self._on_abandon = on_abandon
        self._heap: list[tuple[int, int, WorkerRun]] = []
        self._tie = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._current: WorkerRun | None = None  # the run the current thread is executing
        self._timed: WorkerRun | None = None  # the aborted run `_abandon` will look at

    def submit(self, run: WorkerRun) -> None:
        with self._cond:
            if self._closed:
                run.fail(RedistError(f"{run.name()}: worker is closing"))
                return
            heapq.heappush(self._heap, (run.spec.seq, next(self._tie), run))
            current = self._current  # (one aborted before it started returns at once)
            if (
                current is not None
                and current.must_stop()
                and current.phase != "queued"
                and self._timed is not current
            ):
                self._timed = current  # (one timer per aborted run, however many are queued behind it)
                later = threading.Timer(ABANDON_AFTER_S, self._abandon, args=(current,))
                later.daemon = True
                later.start()
            self._start_thread()
            self._cond.notify_all()

    def _start_thread(self) -> None:
        """A thread for the queue where there is none (holding ``_cond``)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()

    def _abandon(self, run: WorkerRun) -> None:
        """``run``, aborted, is still executing `ABANDON_AFTER_S` after a run was submitted behind
        it: the queue gets a new thread, and ``on_abandon`` is told (nothing where it returned)."""
        with self._cond:
            if self._timed is run:
                self._timed = None
            if self._closed or self._current is not run:
                return
            self._current, self._thread = None, None
            if self._heap:
                self._start_thread()
            self._cond.notify_all()
        if self._on_abandon is not None:
            self._on_abandon(run)

    def _loop(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                while not self._heap and not self._closed and self._thread is me:
                    self._cond.wait()
                if self._closed or self._thread is not me:
                    return
                _, _, run = heapq.heappop(self._heap)
                self._current = run
            try:
                self._execute(run)
            except Exception as e:  # noqa: BLE001 - one run's bug must not stop the runs after it
                logger.exception("%s: the collective thread caught an error", run.name())
                run.fail(RedistError(f"{run.name()}: {type(e).__name__}: {e}"))
            with self._cond:
                if self._thread is me:
                    self._current = None

    def close(self, timeout: float = 10) -> None:
        """Fail the queued runs and the one executing (so that its waits end), then wait up to
        ``timeout`` seconds for the thread: longer only where it is inside a call that cannot be
        interrupted, which it leaves behind (a daemon)."""
        with self._cond:
            self._closed = True
            pending = [r for _, _, r in self._heap]
            self._heap.clear()
            current, thread = self._current, self._thread
            self._cond.notify_all()
        if current is not None and current.state not in ("done", "failed"):
            pending.append(current)
        for run in pending:
            run.fail(RedistError(f"{run.name()}: worker is closing"))
        if thread is not None:
            thread.join(timeout)


class RunExecutor:
    """Executes a worker's runs on its collective thread; reports failures to the scheduler."""

    def __init__(self, worker, mark: Callable[[str], None]):
        self.worker = worker
        self._mark = mark
        self.thread = CollectiveThread(self._execute, f"redist-collective-{worker.address}", self._abandoned)

    def submit(self, run: WorkerRun) -> None:
        self.thread.submit(run)

    def close(self) -> None:
        self.thread.close()

    def _execute(self, run: WorkerRun) -> None:
        try:
            engine = get_engine(run.spec.engine, run.spec.collective.settings)
        except Exception as e:  # noqa: BLE001 - an engine this worker cannot load fails the run, not this thread
            if run.start():
                what = f"{type(e).__name__}: {e}"
                self.fail(
                    run,
                    EngineUnavailableError(
                        f"{run.name()}: cannot load engine {run.spec.engine!r} here: {what}"
                    ),
                )
            return
        run.completes_when_aborted = engine.completes_aborted_runs
        if not run.start() and run.must_stop():  # (else aborted before it started: completed, dry)
            return
        self._mark("execute")
        returned = threading.Event()
        if run.spec.collective.settings.exit_when_stuck and engine.watched:
            watch = threading.Thread(target=self._watch, args=(run, engine, returned), name="redist-watchdog")
            watch.daemon = True
            watch.start()
        try:
            run.inputs_as_declared()
            engine.execute(run, CommsTransport(self.worker, run))
            self._mark("executed")
        except BaseException as e:  # noqa: B036 - every failure must reach the other ranks
            without_locals(e)  # (what the engine's frames held, its packed buffers and pieces, goes now)
            if run.state == "failed":  # aborted from outside; the scheduler knows
                return
            if not isinstance(e, RedistError):
                e = RedistError(f"{run.name()} failed in phase '{run.phase}': {type(e).__name__}: {e}")
            e = _saying_what_follows(e, run)
            logger.warning("%s", e)
            self.fail(run, e)
        finally:
            returned.set()
            if engine.health().stuck and run.spec.collective.settings.exit_when_stuck:
                self._exit_stuck(run, engine)

    def _watch(self, run: WorkerRun, engine, returned: threading.Event) -> None:
        """End the process if ``run``'s engine blocks behind GPU work only dead peers can finish.

        The engine notices an abort or a timeout only between native calls: a thread
        blocked inside one (an NVSHMEM call waiting for a dead peer, a CUDA call
        queued behind such a wait) never gets there. Once the run was aborted, or its
        oldest peer-dependent GPU work has been in flight past the collective timeout,
        the engine gets `STUCK_GRACE_S` to return before this ends the process. A call that
        blocks holding the interpreter lock stops this thread too: then `faulthandler`'s
        timer, re-armed here every half second, ends the process after the same limit.
        (It is the process's one such timer: a worker's own ``dump_traceback_later`` is
        replaced while a watched run executes.)
        """
        limit = run.timeout + STUCK_GRACE_S
        try:
            while True:
                # a dead man's switch: faulthandler's own thread ends the process (its stacks in the
                # log) unless this loop re-arms it first, which it cannot once a native call holds
                # the interpreter lock (NVSHMEM's host-side wait for a dead PE did, on PEs sharing a GPU)
                faulthandler.dump_traceback_later(limit, exit=True)
                if returned.wait(0.5):
                    return
                now, since = time.monotonic(), engine.health().in_flight_since
                aborted = (
                    run.must_stop() and now - run.failed_at > STUCK_GRACE_S
                )  # (a completing run: its rounds' age)
                if aborted or (since is not None and now - since > limit):
                    how = f" (its thread, in phase {run.phase!r}, did not return: watchdog)"
                    self._exit_stuck(run, engine, how)
        finally:
            faulthandler.cancel_dump_traceback_later()

    def _exit_stuck(self, run: WorkerRun, engine, how: str = "") -> None:
        """End this process: its engine waits on work that only a gone peer could finish.

        Every later call of the engine would wait behind that work, and so might a
        normal shutdown. The nanny starts a fresh process; the scheduler sees a worker
        leave, restarts the rechunk, and Dask recomputes what this worker held.
        """
        logger.error(
            "%s left this worker's %s%s; exiting so that the nanny starts a fresh process "
            "(redist.nvshmem.exit-when-stuck)",
            run.name(),
            engine.stuck_wording,
            how,
        )
        for handler in logging.getLogger().handlers + logger.handlers:
            handler.flush()
        os._exit(70)

    def fail(self, run: WorkerRun, error: RedistError) -> None:
        """Have the scheduler abort ``run`` on every rank, this one included.

        The error is held (`WorkerRun.hold`), not applied here first: the scheduler may answer
        any failure with a restart (stale state; an engine that could not start, under
        ``engine: auto``; a timeout, where the peer waited for turns out to have left; any
        failure of a run that a worker left), and this rank's unpack tasks would then fail the
        user's computation before the restart releases them. The scheduler's abort follows the
        report; if the report cannot be made, or the scheduler no longer runs ``run``, the error
        is applied here.
        """
        run.hold(error)
        self._report(run, error)

    def _abandoned(self, run: WorkerRun) -> None:
        logger.warning(
            "%s was aborted but its engine has not returned (phase %r); later runs use a new thread",
            run.name(),
            run.phase,
        )
        get_engine(run.spec.engine, run.spec.collective.settings).abandoned(run)

    def _report(self, run: WorkerRun, error: RedistError) -> None:
        """Tell the scheduler, which aborts the run on every rank (fire and forget)."""

        async def report():
            try:
                failed = m.Failed(
                    run.spec.token, run.run_id, self.worker.address, str(error), failure_of(error)
                )
                taken = await failed.call(self.worker.scheduler)
            except Exception:  # the scheduler may be gone; the other ranks time out on their own
                logger.exception("could not report the failure of %s", run.name())
                taken = False
            if not taken:
                run.fail(error)

        asyncio.run_coroutine_threadsafe(report(), self.worker.loop.asyncio_loop)
