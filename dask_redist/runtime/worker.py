"""Worker side of the collective: the runs of this worker, and the messages about them.

Every worker process has one `WorkerState`, hooked into the worker's comms by
`dask_redist.runtime.worker_plugin.RedistWorkerPlugin` (which the scheduler plugin registers
on every worker). Stage
tasks put chunks into its `StagingStore`; the scheduler's ``redist-start`` message
turns staged chunks into a `dask_redist.core.run.WorkerRun`, queued on the worker's
collective thread (`dask_redist.runtime.collective`); pieces from peers arrive
through ``redist_receive``; unpack tasks take the outputs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import asdict

import numpy as np

from dask_redist.config import Settings, host
from dask_redist.core import messages as m
from dask_redist.core.assemble import Assembly, chunk_type_of, converted
from dask_redist.core.run import WorkerRun
from dask_redist.core.spec import STAGE_PREFIX, CollectiveSpec, RunSpec, Staged
from dask_redist.core.wire import Packed
from dask_redist.engines import loaded_engines
from dask_redist.engines.registry import capabilities
from dask_redist.errors import FAILURES, RedistConsistencyError, RedistError
from dask_redist.planning.memory import staging_beyond_pause
from dask_redist.runtime import handover
from dask_redist.runtime.collective import RunExecutor
from dask_redist.runtime.early import EarlyPieces
from dask_redist.runtime.staging import StagingStore, spillable_bytes
from dask_redist.runtime.transport import call_on_loop

logger = logging.getLogger("dask_redist")

#: Output chunks assembled from pieces up to this size are built on the event loop (a copy of
#: this size takes well under a millisecond; a hand-off to a thread costs about as much).
INLINE_BUILD_BYTES = 2**20


class WorkerState:
    """One worker's staged chunks, runs, early pieces and the handlers that change them."""

    def __init__(self, worker):
        self.worker = worker
        self._lock = threading.Lock()
        self.staging = StagingStore()
        self.runs: dict[str, WorkerRun] = {}
        self.early = EarlyPieces()  # pieces for a run not started here yet; runs that ended here
        self.executor = RunExecutor(worker, self.mark)
        self.capabilities: dict[tuple[str, str], dict] = {}  # (engine name, path) -> Engine.capabilities()
        self.timeline: dict[str, float] = {}  # wall-clock marks of the latest run, for diagnostics
        self._stage_done: dict[tuple, m.StageDone] = {}  # stage key -> its event, until the task's end
        self._flush_next_result = False  # (set on the event loop, where the plugin reads it)

    @property
    def address(self) -> str:
        return self.worker.address

    def mark(self, event: str, first: bool = False) -> None:
        if first:
            self.timeline.setdefault(event, time.time())
        else:
            self.timeline[event] = time.time()

    # -- task bodies (dask_redist.runtime.tasks) ------------------------------------------

    def stage(
        self, token: str, tail: tuple, indices: list[int], shapes: list, chunks, output_type="same"
    ) -> list[Staged]:
        if "start message" in self.timeline:  # those marks are of a run that started: a new one stages
            self.timeline = {}
        markers = []
        chunks = [
            converted(c, output_type, f"input chunk {i} on {self.address}") for i, c in zip(indices, chunks)
        ]
        for index, shape, chunk in zip(indices, shapes, chunks):
            chunk_type = chunk_type_of(chunk)
            if chunk_type not in ("numpy", "cupy"):
                raise TypeError(
                    f"dask-redist can only rechunk NumPy or CuPy chunks, got a {chunk_type} for input chunk {index}; "
                    "narrow redist.chunk-types or rechunk this array with dask_redist.disable()"
                )
            if tuple(chunk.shape) != tuple(shape):
                raise ValueError(
                    f"input chunk {index} has shape {tuple(chunk.shape)} but the array's chunks say {tuple(shape)}"
                )
            markers.append(Staged(self.address, int(chunk.nbytes), chunk_type, int(index), tuple(tail)))
        self.staging.put(token, tail, {int(i): c for i, c in zip(indices, chunks)})
        if problem := self._staged_beyond_pause():
            self.staging.drop(token, tail)
            raise RedistError(f"rechunk {token[:8]}, stage task {tail} on {self.address}: {problem}")
        self.mark("first stage", first=True)
        types = {marker.chunk_type for marker in markers}
        kind = types.pop() if len(types) == 1 else "mixed" if types else ""  # ("": nothing staged)
        done = m.StageDone(token, [int(t) for t in tail], [int(i) for i in indices], kind)
        with self._lock:
            self._stage_done[(STAGE_PREFIX + token, *tail)] = done
        return markers

    def _staged_beyond_pause(self) -> str | None:
        """Why this worker, with what it has staged, would pause for good (`staging_beyond_pause`)."""
        manager = getattr(self.worker, "memory_manager", None)
        if (
            not self.staging.nbytes
            or manager is None
            or not manager.memory_limit
            or not manager.memory_pause_fraction
        ):
            return None  # (nothing staged in host memory: the process's memory is not read)
        process = self.worker.monitor.get_process_memory()
        if process <= manager.memory_pause_fraction * manager.memory_limit:
            return None  # (below the threshold whatever Dask could spill: its data is not walked)
        return staging_beyond_pause(
            process,
            spillable_bytes(getattr(self.worker, "data", None), self.staging, self.worker.state.nbytes),
            self.staging.nbytes,
            manager.memory_limit,
            manager.memory_pause_fraction,
        )

    def stage_finished(self, key, in_memory: bool) -> None:
        """Stage task ``key`` left the executing state: where its result is in memory, its
        `messages.StageDone` goes on the worker's stream now, just ahead of the task's own
        result. Sent from the stage task instead, the event would be written at once and open
        the stream's 2 ms interval, which the result would then wait out: the scheduler can
        start the run (`dask_redist.runtime.eager`) only once it has both."""
        with self._lock:
            done = self._stage_done.pop(key, None)
        if done is not None and in_memory:
            done.send(self.worker)

    def take_flush(self) -> bool:
        """Whether a run's last output here was just handed to its unpack task (then forgotten):
        that task's result, the end of the run for the scheduler, is written to the worker's
        stream at once rather than after the stream's 2 ms interval, which the run's other
        results opened."""
        flush, self._flush_next_result = self._flush_next_result, False
        return flush

    def barrier(self, spec: CollectiveSpec, groups) -> int:
        """Ask the scheduler to start a run over the staged chunks; its run id."""
        self.mark("barrier task")
        stages = [
            (g[0].address, g[0].stage, [x.index for x in g], {x.chunk_type for x in g}) for g in groups if g
        ]
        request = m.Barrier.of(spec.token, stages, spec.describe())

        async def ask() -> m.BarrierReply:
            return await request.call(self.worker.scheduler)

        response = call_on_loop(self.worker, ask, spec.settings.barrier_timeout, f"{spec.describe()} barrier")
        self.mark("barrier reply")
        if response.get("status") == "stale":  # the scheduler released this task: nobody takes its result
            logger.debug("%s barrier: %s", spec.describe(), response.get("message"))
            return 0
        if response.get("status") != "OK":
            error = RedistError if response.get("fatal") else RedistConsistencyError
            raise error(f"{spec.describe()} barrier: {response.get('message', response)}")
        return response["run_id"]

    async def unpack(self, token: str, index: int, run_id: int):
        """Runs on the event loop (a coroutine task): no thread hand-off per output chunk.

        Unpacks of a run still in flight wait on the event loop, woken once when it ends
        (`_finished`); outputs that need a large copy to assemble are built off the event loop.

        A run that is missing here or does not hold the chunk may mean a stale barrier
        result (see `RedistSchedulerPlugin.stale`): the barrier is (or was already) released,
        and this task with it, so its result goes nowhere. Otherwise the error stands.
        """
        try:
            return await self._unpack(token, index, run_id)
        except RedistConsistencyError:
            answer: m.StaleReply = await m.Stale(token, run_id, index).call(self.worker.scheduler)
            if answer.get("stale"):  # released with its barrier: this result goes nowhere
                logger.debug("rechunk %s: unpack of chunk %d had a stale run id %d", token[:8], index, run_id)
                return None
            raise

    async def _unpack(self, token: str, index: int, run_id: int):
        self.mark("first unpack", first=True)
        with self._lock:
            run = self.runs.get(token)
        if run is None or run.run_id != run_id:
            have = "no run" if run is None else f"run {run.run_id}"
            raise RedistConsistencyError(
                f"rechunk {token[:8]}: unpack of output chunk {index} expected run {run_id} on {self.address}, found {have}"
            )
        if not run.finished:
            await _finished(run)
        out = run.pop_output(index)
        if not run.outputs:  # (the run's last output here: see `take_flush`)
            self._flush_next_result = True
        self.mark("last unpack")
        if not isinstance(out, Assembly):
            return out
        if out.copies and out.nbytes > INLINE_BUILD_BYTES:
            return await asyncio.to_thread(out.build)  # a large copy: off the event loop
        return out.build()

    def put_back(self, token: str, index: int, run_id: int, chunk) -> None:
        """Output chunk ``index`` of run ``run_id`` again, for a retry of its unpack task (the step
        fused into it failed: `runtime.tasks.unpack_into`); nothing where the run is gone."""
        with self._lock:
            run = self.runs.get(token)
        if run is not None and run.run_id == run_id:
            run.put_back(index, chunk)

    # -- messages from the scheduler and peers (event loop) --------------------------------

    def handle_start(self, run: RunSpec) -> None:
        self.timeline = {
            k: v for k, v in self.timeline.items() if k in ("first stage", "barrier task", "barrier reply")
        }
        self.mark("start message")
        rank = run.workers.index(self.address)
        mine = np.flatnonzero(run.in_ranks.ravel() == rank).tolist()
        inputs = self.staging.get(run.token, mine)
        with self._lock:
            old = self.runs.get(run.token)
            wr = self.runs[run.token] = WorkerRun(run, self.address, inputs)
            early = self.early.take(run.token, run.run_id)
        if old is not None and old.state in ("queued", "running"):
            old.fail(RedistConsistencyError(f"{old.name()} superseded by run {run.run_id}"))
        missing = [i for i in mine if i not in inputs]
        if missing:
            self.executor.fail(
                wr,
                RedistConsistencyError(
                    f"{wr.name()}: staged input chunks {missing[:5]} are not on this worker"
                ),
            )
            return
        for src, first, arrays in early:
            if self._peer(wr, src):
                wr.receive(src, first, arrays)
        handover.watch(self.worker, wr, self.executor.fail)  # (its outputs on a paused worker)
        self.executor.submit(wr)

    async def handle_capabilities(self, engines: dict[str, str] | None = None) -> dict:
        """Whether this worker can run each of ``engines`` (name -> path; default the built-in ones),
        asked once per engine (probing imports CuPy and nvmath)."""
        engines = dict(Settings().engines) if engines is None else engines
        new = {n: p for n, p in engines.items() if (n, p) not in self.capabilities}
        if new:
            answers = await asyncio.to_thread(capabilities, new, self.address)
            self.capabilities.update({(n, new[n]): a for n, a in answers.items()})
        return {n: self.capabilities[(n, p)] for n, p in engines.items()}

    async def handle_receive(self, token: str, run_id: int, src: int, first: int, count: int, data) -> str:
        """Pieces from rank ``src``; kept for a run whose start has not arrived yet (for at most
        `dask_redist.runtime.early.EARLY_TTL_S`), refused from a sender that cannot be a peer of the run."""
        data = Packed(count, data)
        now = time.monotonic()
        with self._lock:
            self.early.expire(now)
            run = self.runs.get(token)
            if self.early.is_late(token, run_id):  # a late piece of a run that ended here
                return "OK"
            if run is None or run.run_id < run_id:
                self.early.keep(token, run_id, (src, first, data), now)
                return "OK"
        if run.run_id != run_id:
            return "OK"  # an older run's pieces: that run is gone
        if not self._peer(run, src):
            return "refused"
        run.receive(src, first, data)
        return "OK"

    @staticmethod
    def _peer(run: WorkerRun, src) -> bool:
        """Can rank ``src`` send ``run`` pieces over comms? (Not itself: its own pieces stay local.)"""
        if isinstance(src, int) and 0 <= src < len(run.spec.workers) and src != run.rank:
            return True
        logger.debug("%s: refused pieces claiming to come from rank %r", run.name(), src)
        return False

    def handle_abort(self, token: str, run_id: int, reason: str, failure: str, gone=()) -> None:
        with self._lock:
            run = self.runs.get(token)
            self.early.ended(token, run_id)
        if run is not None and run.run_id == run_id and failure in FAILURES:
            run.aborted(failure, reason, gone=[w for w in gone if isinstance(w, str)])

    def handle_gone(self, worker: str) -> None:
        """``worker`` left: a run already aborted that it was a rank of cannot be completed any more
        (`WorkerRun.must_stop`); one still running learns it from the abort that follows. Engines
        hear of it too (a world spanning it cannot be left normally any more)."""
        with self._lock:
            runs = [r for r in self.runs.values() if worker in r.spec.workers and r.state == "failed"]
        for run in runs:
            run.fail(run.error, gone=[worker])
        for engine in loaded_engines().values():
            engine.worker_left(worker)

    def handle_cleanup(self, token: str, run_id: int) -> None:
        """Forget the runs of ``token`` up to ``run_id`` (they are done)."""
        with self._lock:
            run = self.runs.get(token)
            self.early.ended(token, run_id)
            if run is not None and run.run_id <= run_id:
                del self.runs[token]

    def handle_forget(self, token: str) -> None:
        """The scheduler forgot the rechunk (its barrier task): nothing of it can be used again.

        Staged chunks go too: a stage task that finished after its key was released (a cancel)
        staged them where the scheduler never heard of it. The rechunk persisted again later
        stages anew (its tasks reach this worker after this message).
        """
        with self._lock:
            run = self.runs.pop(token, None)
            self.early.ended(token, max(self.early.newest(token), run.run_id if run is not None else 0))
        self.staging.drop_token(token)

    def handle_drop(self, token: str, index: list) -> None:
        """The scheduler released a stage key: forget the chunks it staged."""
        self.staging.drop(token, tuple(index))

    def handle_status(self) -> dict:
        """What this worker holds for the collective, and its engines' health (``dask_redist.status``)."""
        with self._lock:
            held = {
                "runs": {run.name(): run.phase for run in self.runs.values()},
                # (status()'s table: the run as the history names it, "failed" for an aborted one)
                "runs held": {
                    f"{r.spec.token[:8]} #{r.run_id}": "failed" if r.state == "failed" else r.phase
                    for r in self.runs.values()
                },
                "early pieces": len(self.early),
                "stage events": len(self._stage_done),  # (stage tasks running now)
            }
        engines = {name: {**asdict(e.health()), "stats": e.stats()} for name, e in loaded_engines().items()}
        return {
            "host": host(self.address),  # (its redist.host, else its address's host)
            **self.staging.counts(),
            **held,
            "timeline": dict(self.timeline),
            "engines": engines,
        }

    def close(self) -> None:
        """Fail every run (their waits end), then stop the collective thread. Blocks up to the
        thread's join: call it off the event loop."""
        with self._lock:
            runs = list(self.runs.values())
            self.runs.clear()
            self.early.clear()
            self._stage_done.clear()
        self.staging.clear()
        for run in runs:
            run.fail(RedistError(f"{run.name()}: worker {self.address} closed"))
        self.executor.close()


async def _finished(run: WorkerRun) -> None:
    """Until ``run`` is done or failed, on the event loop (no thread per waiting unpack task)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def wake() -> None:
        if not done.done():
            done.set_result(None)

    def from_any_thread() -> None:
        with contextlib.suppress(RuntimeError):  # (the loop closed: nobody waits any more)
            loop.call_soon_threadsafe(wake)

    run.when_finished(from_any_thread)
    try:
        await asyncio.wait_for(done, run.outputs_timeout)
    except asyncio.TimeoutError:
        raise run.outputs_timed_out() from None
