"""Scheduler side of the collective: runs, their global order, owners, restarts.

The barrier task of a collective rechunk calls `RedistSchedulerPlugin.barrier`
with where every input chunk is staged. The plugin then

1. chooses the engine and the owner of every output chunk (the pure planner),
2. numbers the run: a run id per attempt of this rechunk, and a sequence
   number in one global order over all runs,
3. pins every unpack task to its owner (``worker_restrictions``),
4. sends ``redist-start`` to every worker of the run, in sequence order.

It watches the unpack tasks: when all are in memory the run is cleaned up on
the workers; when one errs the run is aborted everywhere. When a worker of an
active run leaves, or a rank reports that a run's state was lost, the run is
restarted: the barrier and the unfinished unpack tasks are released, so dask
runs the barrier again (re-staging what was lost) under a new run id, up to
``redist.retries`` times; the stage tasks of a worker that left run again too
(copies of their markers may live on, the staged chunks died with it). A rank
can fail, or a worker leave, before the barrier task's own result reached the
scheduler (an engine that cannot start fails at once); that restart waits until
the barrier task is in memory, because releasing it while it is still
processing races its completion: distributed takes the late result for a stale
one and releases the task again, restarting the new run as well. A rank
that fails for any other reason has the run aborted on every rank with its
error, so no rank is left waiting.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.protocol.pickle import dumps
from distributed.protocol.serialize import ToPickle
from distributed.utils import log_errors, offload

from dask_redist import ordering
from dask_redist._run import RunSpec
from dask_redist._worker import RedistWorkerPlugin
from dask_redist.engines import choose_engine
from dask_redist.errors import RedistTimeoutError
from dask_redist.layer import BARRIER_PREFIX, STAGE_PREFIX, BarrierTask, CollectiveSpec
from dask_redist.planning import make_plan
from dask_redist.planning.geometry import chunk_nbytes
from dask_redist.process_group import Rendezvous

logger = logging.getLogger("dask_redist")


@dataclass
class ActiveRun:
    spec: RunSpec
    pending: set  # keys of unpack tasks not yet in memory
    restrictions: dict  # original worker restrictions of the pinned unpack tasks
    nbytes: int
    moved: int
    started: float = field(default_factory=time.time)


class RedistSchedulerPlugin(SchedulerPlugin):
    name = "redist"

    def __init__(self):
        self.scheduler = None
        self.active: dict[str, ActiveRun] = {}
        self.attempts: defaultdict[str, int] = defaultdict(int)
        self.restarts: defaultdict[str, int] = defaultdict(int)
        # token -> (run id, reason, stale stage keys) of a restart waiting for the barrier task
        self.deferred: dict[str, tuple[int, str, list]] = {}
        self.by_output: dict[Any, str] = {}
        self.stage_home: dict[Any, str] = {}
        self.history: deque = deque(maxlen=200)
        self._seq = itertools.count(1)
        self._ready: asyncio.Event | None = None
        self.rendezvous = Rendezvous()
        self.capabilities: dict[str, dict] = {}
        self.world: tuple[str, ...] | None = None  # workers NVSHMEM was bootstrapped over
        self.world_broken: str | None = None  # why the NVSHMEM world cannot be used any more
        # members of a world that lost a PE: NVSHMEM's finalize waits for the dead PE forever
        # (measured on the node), so these processes cannot join a new world until restarted
        self.stranded: list[str] = []
        self.timeline: dict[str, float] = {}  # wall-clock marks of the latest run, for diagnostics

    async def start(self, scheduler) -> None:
        if self.name in scheduler.plugins:  # registered concurrently by another barrier
            return
        self.scheduler = scheduler
        self._ready = asyncio.Event()
        ordering.install()  # graphs lowered on the client (expression mode) are ordered here too
        scheduler.add_plugin(self, name=self.name)
        scheduler.handlers.update(
            {
                "redist_barrier": self.barrier,
                "redist_failed": self.failed,
                "redist_history": self.get_history,
                "redist_allgather": self.allgather,
            }
        )
        # what Scheduler.register_worker_plugin does, except that a worker dying right
        # now must not fail the registration: workers that join later get the plugin
        # from scheduler.worker_plugins anyway
        plugin = dumps(RedistWorkerPlugin())
        scheduler.worker_plugins[RedistWorkerPlugin.name] = plugin
        await scheduler.broadcast(
            msg={"op": "plugin-add", "plugin": plugin, "name": RedistWorkerPlugin.name}, on_error="return"
        )
        self._ready.set()

    # -- handlers -------------------------------------------------------------------

    @log_errors
    async def barrier(self, token: str, workers: list[str], holders: list[int], homes: list, kind: str) -> dict:
        self.timeline = {"barrier called": time.time()}
        await self._ready.wait()
        key = BARRIER_PREFIX + token
        ts = self.scheduler.tasks.get(key)
        if ts is None or ts.state != "processing" or not isinstance(ts.run_spec, BarrierTask):
            return {"status": "error", "message": f"barrier task {key} is not processing"}
        spec: CollectiveSpec = ts.run_spec.spec
        # stage markers of a worker that left may live on (a copy fetched by the barrier's
        # worker) while the staged chunks died with it: released too, or the barrier loops
        def stale(lost):
            return [(spec.stage_name, *tail) for tail, h in homes if workers[h] in lost]

        if lost := [w for w in workers if w not in self.scheduler.workers]:
            reason = f"workers {lost} holding staged inputs left before the run started"
            self._restart(token, reason, stale(lost), spec.settings)
            return {"status": "error", "message": f"workers {lost} left"}

        # the plugin may have been registered by this very barrier, after the stage
        # tasks finished: learn where their chunks are from the markers
        for tail, h in homes:
            self.stage_home.setdefault((spec.stage_name, *tail), workers[h])
        ranks = sorted(set(self.scheduler.workers) | set(workers))
        position = {w: i for i, w in enumerate(ranks)}
        in_ranks = np.array([position[workers[h]] for h in holders], dtype=np.int64)
        tasks = self.scheduler.tasks
        needed = np.array(
            [(k in tasks and tasks[k].state != "memory") for k in spec.output_keys()], dtype=bool
        )
        engine, reason = await self.choose_engine(spec, kind, ranks)
        if engine == "cufftmp" and kind != "cupy":
            return {"status": "error", "fatal": True, "message": f"redist.engine=cufftmp needs CuPy chunks, got {kind}"}
        if engine == "cufftmp":
            self.world = tuple(ranks)  # the workers bootstrap over this set if they have not yet
        plan = await offload(make_plan, spec.rechunk, in_ranks, len(ranks), needed=needed)
        if kind == "numpy" and (too_big := self._over_memory(plan, ranks)):
            return {"status": "error", "fatal": True, "message": too_big}

        if lost := [w for w in ranks if w not in self.scheduler.workers]:
            self._restart(token, f"workers {lost} left while the run was planned", stale(lost), spec.settings)
            return {"status": "error", "message": f"workers {lost} left"}
        if token in self.active:
            self._abort(token, "superseded by a new run", kind="restart")
        self.attempts[token] += 1
        run = RunSpec(
            collective=spec,
            run_id=self.attempts[token],
            seq=next(self._seq),
            workers=tuple(ranks),
            in_ranks=plan.in_ranks,
            out_ranks=plan.out_ranks,
            needed=needed,
            engine=engine,
            kind=kind,
            reason=reason,
        )
        pending, restrictions, pins = set(), {}, {}
        owners = plan.out_ranks.ravel()
        for flat in np.flatnonzero(needed):
            out_key = spec.output_key(int(flat))
            restrictions[out_key] = tasks[out_key].worker_restrictions
            pins[out_key] = {ranks[owners[flat]]}
            self.by_output[out_key] = token
            pending.add(out_key)
        self.scheduler.set_restrictions(pins)
        self.active[token] = ActiveRun(run, pending, restrictions, plan.nbytes, plan.moved_bytes)
        message = {"op": "redist-start", "run": ToPickle(run)}
        for w in ranks:  # no await since the sequence number: starts leave in seq order
            self.scheduler.stream_comms[w].send(message)
        self.timeline["start sent"] = time.time()
        logger.debug("started %s on %d workers (engine %s)", run.name(), len(ranks), engine)
        if not pending:
            self._finish(token)
        return {"status": "OK", "run_id": run.run_id}

    def _over_memory(self, plan, ranks) -> str | None:
        """Why the run cannot fit a worker's memory limit (NumPy), or None.

        A collective holds a worker's inputs and outputs at once and cannot spill
        them; rather than have the nanny kill the worker, fail with the numbers.
        """
        import dask
        from dask.utils import format_bytes

        fraction = dask.config.get("distributed.worker.memory.pause") or 0.8
        in_bytes = np.bincount(
            plan.in_ranks.ravel(), weights=chunk_nbytes(plan.spec.old, plan.spec.itemsize).ravel(), minlength=len(ranks)
        )
        for r, w in enumerate(ranks):
            limit = getattr(self.scheduler.workers.get(w), "memory_limit", 0) or 0
            need = int(in_bytes[r] + plan.out_bytes[r])
            if limit and need > fraction * limit:
                return (
                    f"the rechunk needs {format_bytes(need)} at once on worker {w}, over {fraction:.0%} of its "
                    f"memory limit ({format_bytes(limit)}); the collective cannot spill to disk. Use more workers "
                    "or more memory per worker, or keep dask's rechunk for this array (redist.min-bytes, "
                    "dask_redist.disable())"
                )
        return None

    async def choose_engine(self, spec: CollectiveSpec, kind: str, ranks: list[str]) -> tuple[str, str]:
        """The engine for a run and why (`dask_redist.engines.choose_engine`)."""
        setting = spec.settings.engine
        caps = await self.worker_capabilities(ranks) if setting == "auto" and kind == "cupy" else {}
        return choose_engine(setting, kind, caps, ranks, self.world, self.world_broken)

    async def worker_capabilities(self, workers: list[str]) -> dict[str, dict]:
        missing = [w for w in workers if w not in self.capabilities]
        if missing:
            answers = await self.scheduler.broadcast(
                msg={"op": "redist_capabilities"}, workers=missing, on_error="return"
            )
            for w, a in answers.items():
                if isinstance(a, dict):
                    self.capabilities[w] = a
        return self.capabilities

    async def allgather(self, tag: str, rank: int, nranks: int, payload: bytes, timeout: float) -> dict:
        try:
            values = await self.rendezvous.gather(tag, rank, nranks, payload, timeout)
        except RedistTimeoutError as e:
            return {"status": "error", "message": str(e)}
        return {"status": "OK", "values": values}

    @log_errors
    def failed(self, token: str, run_id: int, address: str, message: str, kind: str) -> None:
        """A rank's run failed (``kind``: see `dask_redist.errors.KINDS`): restart it, on the dask
        engine if its own could not start under ``auto``, or abort it."""
        run = self.active.get(token)
        if run is None or run.spec.run_id != run_id:
            return
        logger.warning("%s failed on %s: %s", run.spec.name(), address, message)
        if kind == "unavailable":  # checked before NVSHMEM started: bootstrap may try again once fixed
            self.world_broken = message  # choose_engine answers "dask" from now on, with this reason
        elif run.spec.engine == "cufftmp":
            self.world_broken = f"{run.spec.name()} failed on {address}"
        if kind == "restart" or (kind == "unavailable" and run.spec.collective.settings.engine == "auto"):
            self._restart_once_barrier_done(token, message)
        else:
            self._abort(token, message, kind=kind)

    def forget_world(self) -> None:
        """The next cufftmp run bootstraps NVSHMEM over the workers of that moment."""
        self.world = None
        self.world_broken = None
        self.stranded = []

    def get_history(self) -> list[dict]:
        return list(self.history)

    # -- run lifecycle ----------------------------------------------------------------

    def _send(self, workers, message) -> None:
        for w in workers:
            if (comm := self.scheduler.stream_comms.get(w)) is not None:
                comm.send(message)

    def _deactivate(self, token: str, outcome: str) -> ActiveRun | None:
        run = self.active.pop(token, None)
        self.deferred.pop(token, None)
        if run is None:
            return None
        for key, original in run.restrictions.items():
            self.by_output.pop(key, None)
            if key in self.scheduler.tasks:
                self.scheduler.set_restrictions({key: original})
        self.history.append(
            {
                "token": token,
                "run": run.spec.run_id,
                "engine": run.spec.engine,
                "why": run.spec.reason,
                "workers": len(run.spec.workers),
                "bytes": run.nbytes,
                "bytes moved": run.moved,
                "seconds": round(time.time() - run.started, 6),
                "outcome": outcome,
            }
        )
        return run

    def _finish(self, token: str) -> None:
        self.timeline["outputs in memory"] = time.time()
        run = self._deactivate(token, "done")
        if run is not None:
            self._send(run.spec.workers, {"op": "redist-cleanup", "token": token, "run_id": run.spec.run_id})
            self.restarts.pop(token, None)

    def _abort(self, token: str, reason: str, *, kind: str) -> None:
        """Fail the run on every rank with ``reason``, as the error `dask_redist.errors.KINDS` names."""
        run = self._deactivate(token, "restarted" if kind == "restart" else "failed")
        if run is None:
            return
        logger.debug("aborting %s (%s): %s", run.spec.name(), kind, reason)
        self._send(
            run.spec.workers,
            {"op": "redist-abort", "token": token, "run_id": run.spec.run_id, "reason": reason, "kind": kind},
        )

    def _restart(self, token: str, reason: str, stale: list = (), settings=None) -> None:
        """Abort the run and release the barrier and unfinished unpack tasks: dask reruns them
        (and the ``stale`` stage tasks, whose staged chunks are gone). ``settings``: for a
        restart before the run started."""
        spec_run = self.active.get(token)
        settings = spec_run.spec.collective.settings if spec_run else settings
        self.restarts[token] += 1
        if settings is not None and self.restarts[token] > settings.retries:
            self._abort(
                token, f"{reason} (gave up after {settings.retries} restarts, see redist.retries)", kind="error"
            )
            return
        self._abort(token, reason, kind="restart")
        logger.warning("restarting rechunk %s: %s", token[:8], reason)
        barrier = self.scheduler.tasks.get(BARRIER_PREFIX + token)
        if barrier is None:
            return
        recs = {dt.key: "released" for dt in barrier.dependents if dt.state in ("processing", "waiting", "no-worker")}
        if barrier.state in ("memory", "processing"):
            recs[barrier.key] = "released"
        tasks = self.scheduler.tasks
        recs.update({k: "released" for k in stale if k in tasks and tasks[k].state == "memory"})
        stimulus = f"redist-restart-{token}-{time.time()}"
        self.scheduler.transitions(recs, stimulus_id=stimulus)
        self.scheduler.stimulus_queue_slots_maybe_opened(stimulus_id=stimulus)

    def _restart_once_barrier_done(self, token: str, reason: str, stale: list = ()) -> None:
        """`_restart` the active run, at once or, while the barrier task is still processing,
        once it is in memory (see the module docstring)."""
        barrier = self.scheduler.tasks.get(BARRIER_PREFIX + token)
        if barrier is None or barrier.state != "processing":
            self._restart(token, reason, stale)
            return
        run_id = self.active[token].spec.run_id
        logger.debug("%s: the restart waits for the barrier task's result", self.active[token].spec.name())
        _, first, earlier = self.deferred.get(token, (run_id, reason, []))
        self.deferred[token] = (run_id, first, [*earlier, *stale])

    def _restart_run(self, token: str, run_id: int, reason: str, stale: list) -> None:
        """`_restart`, if run ``run_id`` is still the active one."""
        run = self.active.get(token)
        if run is not None and run.spec.run_id == run_id:
            self._restart(token, reason, stale)

    # -- scheduler hooks ------------------------------------------------------------------

    def transition(self, key, start, finish, *args, stimulus_id: str, **kwargs) -> None:
        if type(key) is tuple and key and type(key[0]) is str and key[0].startswith(STAGE_PREFIX):
            if finish == "memory" and "worker" in kwargs:
                self.stage_home[key] = kwargs["worker"]
            elif start == "memory" and (home := self.stage_home.pop(key, None)) is not None:
                self._send([home], {"op": "redist-drop", "token": key[0][len(STAGE_PREFIX) :], "index": key[1:]})
            return
        token = self.by_output.get(key)
        if token is not None:
            run = self.active.get(token)
            if run is None:
                return
            if finish == "memory":
                run.pending.discard(key)
                if not run.pending:
                    self._finish(token)
            elif finish == "erred":
                self._abort(token, f"output task {key} failed", kind="error")
            elif finish == "forgotten":
                run.pending.discard(key)
                if not run.pending:
                    self._abort(token, "all outputs forgotten", kind="error")
            return
        if not (type(key) is str and key.startswith(BARRIER_PREFIX)):
            return
        token = key[len(BARRIER_PREFIX) :]
        if finish == "memory":
            if (deferred := self.deferred.pop(token, None)) is not None:  # after this transition
                self.scheduler.loop.add_callback(self._restart_run, token, *deferred)
        elif finish in ("released", "erred", "forgotten"):
            if token in self.active:
                kind = "restart" if finish == "released" else "error"
                self._abort(token, f"barrier {finish} ({stimulus_id})", kind=kind)
            if finish == "forgotten":  # nobody can ask for this rechunk again: workers forget it too
                self.attempts.pop(token, None)
                self.restarts.pop(token, None)
                self._send(list(self.scheduler.workers), {"op": "redist-cleanup", "token": token, "run_id": 2**62})

    def remove_worker(self, scheduler, worker: str, *, stimulus_id: str, **kwargs) -> None:
        self.capabilities.pop(worker, None)
        # its staged chunks are gone, while copies of their stage markers may live on
        stale = [k for k, w in self.stage_home.items() if w == worker]
        for key in stale:
            del self.stage_home[key]
        if self.world is not None and worker in self.world:
            self.world_broken = f"worker {worker} left the NVSHMEM world"
            self.stranded = sorted(set(self.world) - {worker})
        for token, run in list(self.active.items()):
            if worker in run.spec.workers:
                mine = [k for k in stale if k[0] == STAGE_PREFIX + token]
                self._restart_once_barrier_done(token, f"worker {worker} left during {run.spec.name()}", mine)

    def restart(self, scheduler) -> None:
        self.active.clear()
        self.deferred.clear()
        self.by_output.clear()
        self.stage_home.clear()
        self.attempts.clear()
        self.restarts.clear()
