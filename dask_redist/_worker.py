"""Worker side of the collective: staged inputs, runs, and the collective thread.

Every worker process has one `WorkerState`. Stage tasks put chunks into
it; the scheduler's ``redist-start`` message turns staged chunks into a
`dask_redist._run.WorkerRun`; ONE collective thread per worker executes
runs strictly by their global sequence number, so two rechunks running at the
same time can never wait on each other crosswise; unpack tasks take the
outputs. A staged chunk lives exactly as long as its stage key is in memory
on the scheduler (which sends ``redist-drop`` when it is released), so a
restarted run finds every marker it is given backed by data.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import threading
import time
import weakref
from collections import defaultdict
from typing import Any, Callable, NamedTuple

import numpy as np
from distributed import get_worker
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.protocol import to_serialize

from dask_redist._run import Packed, RunSpec, WorkerRun
from dask_redist.assemble import Assembly, array_kind
from dask_redist.engines import get_engine
from dask_redist.errors import (
    KINDS,
    EngineUnavailableError,
    RedistConsistencyError,
    RedistError,
    RedistTimeoutError,
    kind_of,
)

logger = logging.getLogger("dask_redist")

#: Output chunks assembled from pieces up to this size are built on the event loop (a copy of
#: this size takes well under a millisecond; a hand-off to a thread costs about as much).
INLINE_BUILD_BYTES = 2**20

#: Seconds an engine with peer-dependent work in flight may take to return once its run was
#: aborted (or past its collective timeout) before the watchdog ends the process (`_watch`).
STUCK_GRACE_S = 10.0


class Staged(NamedTuple):
    """What a stage task returns per chunk: where the chunk is kept, and what it is."""

    address: str
    nbytes: int
    kind: str
    index: tuple  # the chunk's index in the input grid
    stage: tuple  # the stage key's tail: (stage name, *stage)


def _worker():
    try:
        return get_worker()
    except ValueError:
        raise RedistError(
            "dask-redist's collective rechunk runs on a distributed cluster: create a "
            "distributed.Client (e.g. on a LocalCluster or LocalCUDACluster) before computing"
        ) from None


# -- tasks (called by the functions in dask_redist.layer) -----------------------------


def stage(token: str, tail: tuple, indices: list, shapes: list, chunks) -> list[Staged]:
    return get_state(_worker()).stage(token, tail, indices, shapes, chunks)


def barrier(spec, markers) -> int:
    return get_state(_worker()).barrier(spec, markers)


async def unpack(token: str, index: int, run_id: int):
    return await get_state(_worker()).unpack(token, index, run_id)


# -- the collective thread ------------------------------------------------------------


class CollectiveThread:
    """Executes runs one at a time, lowest sequence number first.

    A run aborted while its thread is inside a call that cannot be interrupted
    (NVSHMEM's bootstrap retrying a dead peer, a GPU wait) would hold up every
    later run on this worker, the restarted one included. So a run submitted
    while the current one is already aborted gets a fresh thread; the old one
    exits whenever its call returns (``on_abandon`` is told, once).
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

    def submit(self, run: WorkerRun) -> None:
        abandoned = None
        with self._cond:
            if self._closed:
                run.fail(RedistError(f"{run.name()}: worker is closing"))
                return
            heapq.heappush(self._heap, (run.spec.seq, next(self._tie), run))
            current = self._current  # (one aborted before it started returns at once)
            if current is not None and current.state == "failed" and current.phase != "queued":
                abandoned, self._current, self._thread = current, None, None
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()
        if abandoned is not None and self._on_abandon is not None:
            self._on_abandon(abandoned)

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
            self._execute(run)
            with self._cond:
                if self._thread is me:
                    self._current = None

    def close(self, timeout: float = 10) -> None:
        with self._cond:
            self._closed = True
            pending = [r for _, _, r in self._heap]
            self._heap.clear()
            self._cond.notify_all()
        for run in pending:
            run.fail(RedistError(f"{run.name()}: worker is closing"))
        if self._thread is not None:
            self._thread.join(timeout)


class CommsTransport:
    """Sends pieces to peer workers over Dask comms, all peers at once."""

    def __init__(self, state: WorkerState, run: WorkerRun):
        self.state, self.run = state, run

    def send(self, batches: list) -> None:
        run, worker = self.run, self.state.worker
        by_dst: dict[int, list] = defaultdict(list)
        for dst, first, packed in batches:
            by_dst[dst].append((first, packed))

        async def to_peer(dst, items):
            for first, packed in items:
                await worker.rpc(run.spec.workers[dst]).redist_receive(
                    token=run.spec.token, run_id=run.run_id, src=run.rank, first=first,
                    count=packed.count, data=to_serialize(packed.buffer),
                )  # fmt: skip

        async def send_all():
            await asyncio.gather(*(to_peer(d, items) for d, items in by_dst.items()))

        self.state.call(send_all, run.timeout, f"{run.name()} phase 'send'")

    def exchange_factory(self, rank: int, nranks: int):
        """The all-gather of a process group over the scheduler, for NVSHMEM's bootstrap."""
        from dask_redist.process_group import scheduler_exchange

        settings = self.run.spec.collective.settings
        return scheduler_exchange(self.state, nranks, rank, settings.bootstrap_timeout)


# -- per-worker state -----------------------------------------------------------------

_states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_states_lock = threading.Lock()
_registered: set[str] = set()  # scheduler addresses where this process registered the plugins


def get_state(worker) -> WorkerState:
    with _states_lock:
        state = _states.get(worker)
        if state is None:
            state = _states[worker] = WorkerState(worker)
        return state


class WorkerState:
    def __init__(self, worker):
        self.worker = worker
        self._lock = threading.Lock()
        self.staged: dict[tuple[str, tuple[int, ...]], Any] = {}  # (token, chunk index) -> chunk
        self.stage_keys: dict[tuple[str, tuple], list] = {}  # (token, stage key tail) -> chunk indices
        self.runs: dict[str, WorkerRun] = {}
        self.early: dict[tuple[str, int], list] = defaultdict(list)
        self.thread = CollectiveThread(self._execute, f"redist-collective-{worker.address}", self._abandoned)
        self.capabilities: dict | None = None
        self.timeline: dict[str, float] = {}  # wall-clock marks of the latest run, for diagnostics

    def mark(self, event: str, first: bool = False) -> None:
        if first:
            self.timeline.setdefault(event, time.time())
        else:
            self.timeline[event] = time.time()

    @property
    def address(self) -> str:
        return self.worker.address

    def call(self, coro_fn, timeout: float, what: str):
        """Run ``coro_fn()`` on the worker's event loop from a thread, with a timeout."""
        loop = self.worker.loop.asyncio_loop

        async def bounded():
            return await asyncio.wait_for(coro_fn(), timeout)

        try:
            return asyncio.run_coroutine_threadsafe(bounded(), loop).result()
        except asyncio.TimeoutError:
            raise RedistTimeoutError(f"{what} timed out after {timeout:g}s") from None

    # -- tasks --------------------------------------------------------------------

    def stage(self, token: str, tail: tuple, indices: list, shapes: list, chunks) -> list[Staged]:
        markers = []
        for index, shape, chunk in zip(indices, shapes, chunks):
            kind = array_kind(chunk)
            if kind not in ("numpy", "cupy"):
                raise TypeError(
                    f"dask-redist can only rechunk NumPy or CuPy chunks, got a {kind} for input chunk {tuple(index)}; "
                    "narrow redist.chunk-types or rechunk this array with dask_redist.disable()"
                )
            if tuple(chunk.shape) != tuple(shape):
                raise ValueError(
                    f"input chunk {tuple(index)} has shape {tuple(chunk.shape)} but the array's chunks say {tuple(shape)}"
                )
            markers.append(Staged(self.address, int(chunk.nbytes), kind, tuple(index), tuple(tail)))
        with self._lock:
            for index, chunk in zip(indices, chunks):
                self.staged[(token, tuple(index))] = chunk
            self.stage_keys[(token, tuple(tail))] = [tuple(i) for i in indices]
        self.mark("first stage", first=True)
        return markers

    def barrier(self, spec, groups) -> int:
        self.mark("barrier task")
        settings = spec.settings
        self._ensure_plugins(settings.barrier_timeout)
        markers = [m for group in groups for m in group]
        kinds = {m.kind for m in markers}
        if len(kinds) > 1:
            raise TypeError(f"{spec.describe()}: input chunks of mixed types {sorted(kinds)}; convert them to one type first")
        workers = sorted({m.address for m in markers})
        position = {w: i for i, w in enumerate(workers)}
        holders = np.zeros(len(markers), dtype=np.int64)
        grid = spec.rechunk.old_grid
        for m in markers:
            holders[np.ravel_multi_index(m.index, grid)] = position[m.address]
        homes = [[list(g[0].stage), position[g[0].address]] for g in groups if g]

        async def ask():
            return await self.worker.scheduler.redist_barrier(
                token=spec.token, workers=workers, holders=holders.tolist(), homes=homes,
                kind=kinds.pop() if kinds else "numpy",
            )  # fmt: skip

        response = self.call(ask, settings.barrier_timeout, f"{spec.describe()} barrier")
        self.mark("barrier reply")
        if response.get("status") != "OK":
            error = RedistError if response.get("fatal") else RedistConsistencyError
            raise error(f"{spec.describe()} barrier: {response.get('message', response)}")
        return response["run_id"]

    async def unpack(self, token: str, index: int, run_id: int):
        """Runs on the event loop (a coroutine task): no thread hand-off per output chunk.

        Only the first unpack of a run still in flight waits, in a helper thread;
        outputs that need a large copy to assemble are built off the event loop too.
        """
        self.mark("first unpack", first=True)
        with self._lock:
            run = self.runs.get(token)
        if run is None or run.run_id != run_id:
            have = "no run" if run is None else f"run {run.run_id}"
            raise RedistConsistencyError(
                f"rechunk {token[:8]}: unpack of output chunk {index} expected run {run_id} on {self.address}, found {have}"
            )
        if not run.finished:
            await asyncio.to_thread(run.wait_done)
        out = run.pop_output(index)
        if not isinstance(out, Assembly):
            return out
        if out.copies and out.nbytes > INLINE_BUILD_BYTES:
            return await asyncio.to_thread(out.build)  # a large copy: off the event loop
        return out.build()

    def _ensure_plugins(self, timeout: float) -> None:
        """Register the scheduler plugin (which registers the worker plugin) once per scheduler."""
        address = self.worker.scheduler.address
        if address in _registered:
            return
        from distributed.protocol.pickle import dumps

        from dask_redist._scheduler import RedistSchedulerPlugin

        async def register():
            await self.worker.scheduler.register_scheduler_plugin(
                plugin=dumps(RedistSchedulerPlugin()), name=RedistSchedulerPlugin.name, idempotent=True
            )

        for attempt in range(3):  # a comm can break while workers come and go
            try:
                self.call(register, timeout, "registering the dask-redist scheduler plugin")
                break
            except OSError:
                if attempt == 2:
                    raise
                time.sleep(0.5)
        _registered.add(address)

    # -- messages from the scheduler and peers (event loop) --------------------------------

    def handle_start(self, run: RunSpec) -> None:
        self.timeline = {k: v for k, v in self.timeline.items() if k in ("first stage", "barrier task", "barrier reply")}
        self.mark("start message")
        rank = run.workers.index(self.address)
        mine = np.flatnonzero(run.in_ranks.ravel() == rank)
        grid = run.collective.rechunk.old_grid
        with self._lock:
            inputs = {int(i): self.staged.get((run.token, tuple(int(v) for v in np.unravel_index(i, grid)))) for i in mine}
            old = self.runs.get(run.token)
            wr = self.runs[run.token] = WorkerRun(run, self.address, {i: a for i, a in inputs.items() if a is not None})
            early = self.early.pop((run.token, run.run_id), [])
            for key in [k for k in self.early if k[0] == run.token and k[1] < run.run_id]:
                del self.early[key]
        if old is not None and old.state in ("queued", "running"):
            old.fail(RedistConsistencyError(f"{old.name()} superseded by run {run.run_id}"))
        missing = [i for i, a in inputs.items() if a is None]
        if missing:
            self._fail(wr, RedistConsistencyError(f"{wr.name()}: staged input chunks {missing[:5]} are not on this worker"))
            return
        for src, first, arrays in early:
            wr.receive(src, first, arrays)
        self.thread.submit(wr)

    async def handle_capabilities(self) -> dict:
        """What this worker can run (cached: probing imports CuPy and nvmath)."""
        if self.capabilities is None:
            from dask_redist.engines.cufftmp import capabilities

            self.capabilities = {"cufftmp": await asyncio.to_thread(capabilities)}
        return self.capabilities

    async def handle_receive(self, token: str, run_id: int, src: int, first: int, count: int, data) -> str:
        data = Packed(count, data)
        with self._lock:
            run = self.runs.get(token)
            if run is None or run.run_id < run_id:
                self.early[(token, run_id)].append((src, first, data))
                return "OK"
        if run.run_id == run_id:
            run.receive(src, first, data)
        return "OK"

    def handle_abort(self, token: str, run_id: int, reason: str, kind: str) -> None:
        with self._lock:
            run = self.runs.get(token)
            for key in [k for k in self.early if k[0] == token and k[1] <= run_id]:
                del self.early[key]
        if run is not None and run.run_id == run_id:
            run.fail(KINDS[kind](reason))

    def handle_cleanup(self, token: str, run_id: int) -> None:
        with self._lock:
            run = self.runs.get(token)
            if run is not None and run.run_id <= run_id:
                del self.runs[token]

    def handle_drop(self, token: str, index: list[int]) -> None:
        """The scheduler released a stage key: forget the chunks it staged."""
        with self._lock:
            for chunk in self.stage_keys.pop((token, tuple(index)), ()):
                self.staged.pop((token, chunk), None)

    # -- the collective thread ---------------------------------------------------------

    def _execute(self, run: WorkerRun) -> None:
        if not run.start():
            return
        self.mark("execute")
        engine = get_engine(run.spec.engine)
        returned = threading.Event()
        if run.spec.collective.settings.exit_when_stuck and hasattr(engine, "in_flight_since"):
            watch = threading.Thread(target=self._watch, args=(run, engine, returned), name="redist-watchdog")
            watch.daemon = True
            watch.start()
        try:
            engine.execute(run, CommsTransport(self, run))
            self.mark("executed")
        except BaseException as e:  # noqa: B036 - every failure must reach the other ranks
            if run.state == "failed":  # aborted from outside; the scheduler knows
                return
            if not isinstance(e, RedistError):
                e = RedistError(f"{run.name()} failed in phase '{run.phase}': {type(e).__name__}: {e}")
            logger.warning("%s", e)
            self._fail(run, e)
        finally:
            returned.set()
            if getattr(engine, "stuck", False) and run.spec.collective.settings.exit_when_stuck:
                self._exit_stuck(run)

    def _watch(self, run: WorkerRun, engine, returned: threading.Event) -> None:
        """End the process if ``run``'s engine blocks behind GPU work only dead peers can finish.

        The engine notices an abort or a timeout only between native calls: a thread
        blocked inside one (an NVSHMEM call waiting for a dead peer, a CUDA call
        queued behind such a wait) never gets there. Once the run was aborted, or its
        oldest peer-dependent GPU work has been in flight past the collective timeout,
        the engine gets `STUCK_GRACE_S` to return before this ends the process.
        """
        while not returned.wait(0.5):
            now, since = time.monotonic(), engine.in_flight_since
            aborted = run.failed_at is not None and now - run.failed_at > STUCK_GRACE_S
            if aborted or (since is not None and now - since > run.timeout + STUCK_GRACE_S):
                self._exit_stuck(run, f" (its thread, in phase {run.phase!r}, did not return: watchdog)")

    def _exit_stuck(self, run: WorkerRun, how: str = "") -> None:
        """End this process: its GPU waits inside an NVSHMEM collective that can never finish.

        Every later GPU call would wait behind that kernel, and so would a normal
        shutdown (nvmath finalizes NVSHMEM at exit, waiting for the peer). The
        nanny starts a fresh process; the scheduler sees a worker leave, restarts
        the rechunk, and Dask recomputes what this worker held.
        """
        logger.error(
            "%s left this worker's GPU inside an NVSHMEM collective that cannot finish%s; exiting so that "
            "the nanny starts a fresh process (redist.nvshmem.exit-when-stuck)", run.name(), how,
        )  # fmt: skip
        for handler in logging.getLogger().handlers + logger.handlers:
            handler.flush()
        os._exit(70)

    def _fail(self, run: WorkerRun, error: RedistError) -> None:
        """Have the scheduler abort ``run`` on every rank, this one included.

        An error the scheduler may answer with a restart (stale state; an engine
        that could not start, under ``engine: auto``) is not applied here first:
        this rank's unpack tasks would then fail the user's computation before
        the restart releases them. The scheduler's abort follows the report; if
        the scheduler cannot be reached, the run's own timeouts end it.
        """
        if not isinstance(error, (RedistConsistencyError, EngineUnavailableError)):
            run.fail(error)
        self._report(run, error)

    def _abandoned(self, run: WorkerRun) -> None:
        logger.warning(
            "%s was aborted but its engine has not returned (phase %r); later runs use a new thread",
            run.name(), run.phase,
        )  # fmt: skip
        hook = getattr(get_engine(run.spec.engine), "abandoned", None)
        if hook is not None:
            hook(run)

    def _report(self, run: WorkerRun, error: RedistError) -> None:
        """Tell the scheduler, which aborts the run on every rank (fire and forget)."""

        async def report():
            try:
                await self.worker.scheduler.redist_failed(
                    token=run.spec.token,
                    run_id=run.run_id,
                    address=self.address,
                    message=str(error),
                    kind=kind_of(error),
                )
            except Exception:  # the scheduler may be gone; the other ranks time out on their own
                logger.exception("could not report the failure of %s", run.name())

        asyncio.run_coroutine_threadsafe(report(), self.worker.loop.asyncio_loop)

    def close(self) -> None:
        self.thread.close()
        with self._lock:
            runs = list(self.runs.values())
            self.runs.clear()
            self.staged.clear()
            self.stage_keys.clear()
            self.early.clear()
        for run in runs:
            run.fail(RedistError(f"{run.name()}: worker {self.address} closed"))


class RedistWorkerPlugin(WorkerPlugin):
    """Hooks the worker's `WorkerState` into its comms; registered by the scheduler plugin."""

    name = "redist"
    idempotent = True

    def setup(self, worker):
        state = get_state(worker)
        worker.handlers["redist_receive"] = state.handle_receive
        worker.handlers["redist_capabilities"] = state.handle_capabilities
        worker.stream_handlers.update(
            {
                "redist-start": lambda run: state.handle_start(run),
                "redist-abort": state.handle_abort,
                "redist-cleanup": state.handle_cleanup,
                "redist-drop": state.handle_drop,
            }
        )

    def teardown(self, worker):
        get_state(worker).close()
