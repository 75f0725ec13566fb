"""Scheduler side of the collective: runs, their global order, owners, restarts.

The barrier task of a collective rechunk calls `RedistSchedulerPlugin.barrier`
with where every input chunk is staged. The plugin then

1. chooses the engine (`dask_redist.engines.choice`) and the owner of every output
   chunk (the pure planner),
2. numbers the run: a run id per attempt of this rechunk, and a sequence number
   in one global order over all runs,
3. pins every unpack task to its owner (``worker_restrictions``),
4. sends ``redist-start`` to every worker of the run, in sequence order.

It watches the unpack tasks: when all are in memory the run is cleaned up on the
workers; when one errs the run is aborted everywhere. When a worker of an active
run leaves, or a rank reports that a run's state was lost, the run is restarted
(`dask_redist.runtime.rechunks`): the barrier and the unfinished unpack tasks are
released, so dask runs the barrier again (re-staging what was lost) under a new
run id, up to ``redist.retries`` times; the stage tasks of a worker that left run
again too (copies of their markers may live on, the staged chunks died with it).
A rank that fails for any other reason has the run aborted on every rank with its
error, so no rank is left waiting.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque

import numpy as np
from distributed.comm import CommClosedError
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.protocol.pickle import dumps
from distributed.protocol.serialize import ToPickle
from distributed.utils import log_errors, offload

from dask_redist.config import Settings
from dask_redist.core.spec import BARRIER_PREFIX, STAGE_PREFIX, BarrierTask, CollectiveSpec, RunSpec, stage_token
from dask_redist.engines.choice import EngineSelector
from dask_redist.engines.cufftmp.host import host_dtype_problem
from dask_redist.errors import KINDS
from dask_redist.runtime import ordering
from dask_redist.runtime.rechunks import (
    ActiveRun, Rechunk, RunIds, barrier_is_current, over_memory, ranks_of, restart_recommendations,
)  # fmt: skip
from dask_redist.runtime.rendezvous import Rendezvous, ask_each

logger = logging.getLogger("dask_redist")
HISTORY_KEPT = 200  # finished runs kept for status()/explain(), newest last
STATUS_TIMEOUT_S = 10.0  # for each worker's answer to status()


class RedistSchedulerPlugin(SchedulerPlugin):
    name = "redist"
    idempotent = True  # registered by every first barrier and by status(): the first one stays

    def __init__(self, worker_plugin=None):
        self.worker_plugin = worker_plugin  # registered on every worker when this plugin starts
        self.scheduler = None
        self.rechunks: dict[str, Rechunk] = {}
        self.run_ids = RunIds()
        self.by_output: dict = {}  # output key of an active run -> its token
        self.stage_home: dict = {}  # stage key -> worker holding its chunks
        self.history: deque = deque(maxlen=HISTORY_KEPT)
        self.engines = EngineSelector()
        self.rendezvous = Rendezvous()
        self.timeline: dict[str, float] = {}  # wall-clock marks of the latest run, for diagnostics
        self._seq = itertools.count(1)
        self._ready: asyncio.Event | None = None

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
                "redist_status": self.get_status,
                "redist_forget_world": self.forget_world,
                "redist_allgather": self.rendezvous.handle,
                "redist_probe": self.probe,
                "redist_stale": self.stale,
            }
        )
        if self.worker_plugin is not None:
            # Scheduler.register_worker_plugin, except that a worker dying (or stopped) now does not
            # fail it or hold it (workers that join later get it from scheduler.worker_plugins)
            plugin = dumps(self.worker_plugin)
            scheduler.worker_plugins[self.worker_plugin.name] = plugin
            msg = {"op": "plugin-add", "plugin": plugin, "name": self.worker_plugin.name}
            await ask_each(scheduler, msg, scheduler.workers, Settings.from_config().barrier_timeout)
        self._ready.set()

    # -- handlers -------------------------------------------------------------------

    @log_errors
    async def barrier(self, token: str, workers: list[str], holders: list[int], homes: list, kind: str) -> dict:
        """Start a run of rechunk ``token`` over the chunks the stage tasks staged."""
        self.timeline = {"barrier called": time.time()}
        await self._ready.wait()
        ts = self.scheduler.tasks.get(BARRIER_PREFIX + token)
        if not self._processing(ts):  # released (a cancel): this call's result goes nowhere
            return {"status": "stale", "message": f"barrier task {BARRIER_PREFIX + token} is not processing"}
        spec: CollectiveSpec = ts.run_spec.spec
        if lost := self._lost(workers, homes, spec, "holding staged inputs left before the run started"):
            return lost
        # (the plugin may have been registered by this barrier, after the stage tasks: learn from the markers)
        for tail, h in homes:
            self.stage_home.setdefault((spec.stage_name, *tail), workers[h])
        ranks, in_ranks = ranks_of(workers, holders, self.scheduler.workers)
        tasks = self.scheduler.tasks
        # outputs of this graph only: an output key resubmitted with another grouping belongs to another barrier
        wanted = (k in tasks and tasks[k].state != "memory" and ts in tasks[k].dependencies for k in spec.output_keys())
        needed = np.fromiter(wanted, dtype=bool)
        if not needed.any():  # every output was released (a cancel) or is in memory already
            self.history.append({"token": token, "outcome": "cancelled", "why": "no output of it is wanted"})
            return {"status": "OK", "run_id": 0}
        engine, reason = await self._choose_engine(spec, kind, ranks)
        if problem := spec.run_problem(engine, kind, len(ranks)):  # (a distributed FFT: cufftmp only)
            return {"status": "error", "fatal": True, "message": f"{problem} ({reason})"}
        if engine == "cufftmp" and kind == "numpy" and (problem := host_dtype_problem(spec.dtype)):
            return {"status": "error", "fatal": True, "message": problem}
        self.engines.run_started(engine, ranks)  # (a worker leaving while we plan breaks that world)
        plan = await offload(spec.plan_run, in_ranks, len(ranks), needed)
        if kind == "numpy" and (too_big := over_memory(plan, ranks, self.scheduler.workers)):
            return {"status": "error", "fatal": True, "message": too_big}
        if lost := self._lost(ranks, homes, spec, "left while the run was planned", workers):
            return lost
        if self.scheduler.tasks.get(ts.key) is not ts or not self._processing(ts):  # released meanwhile
            return {"status": "stale", "message": f"barrier task {ts.key} was released while the run was planned"}
        run = self._start(spec, ranks, plan, needed, engine, kind, reason)
        self.rechunks[spec.token].barrier = (ts, run.run_id, needed)
        return {"status": "OK", "run_id": run.run_id}

    def stale(self, token: str, run_id: int, index: int) -> dict:
        """An unpack task found output chunk ``index`` of run ``run_id`` missing: is its barrier's
        result stale (`rechunks.barrier_is_current`)? Then the rechunk is restarted (the barrier
        released with the unpack tasks not done) and runs again for every output still wanted.
        """
        ts = self.scheduler.tasks.get(BARRIER_PREFIX + token)
        if barrier_is_current(self.rechunks.get(token), ts, run_id, index):
            return {"stale": False}
        if ts is None or ts.state != "memory":
            return {"stale": True, "released": False}
        logger.debug("%s: result of run %d is stale for output %d; running it again", ts.key, run_id, index)
        self._restart(token, f"output chunk {index} is not in run {run_id} (stale barrier result)")
        return {"stale": True, "released": True}

    @staticmethod
    def _processing(ts) -> bool:
        return ts is not None and ts.state == "processing" and isinstance(ts.run_spec, BarrierTask)

    def _lost(self, who: list[str], homes: list, spec: CollectiveSpec, what: str, holders=None) -> dict | None:
        """Restart the rechunk if any of ``who`` left; the barrier's answer then."""
        lost = [w for w in who if w not in self.scheduler.workers]
        if not lost:
            return None
        holders = who if holders is None else holders
        # stage markers of a worker that left may live on (a copy fetched by the barrier's
        # worker) while the staged chunks died with it: released too, or the barrier loops
        stale = [(spec.stage_name, *tail) for tail, h in homes if holders[h] in lost]
        self._restart(spec.token, f"workers {lost} {what}", stale, spec.settings)
        return {"status": "error", "message": f"workers {lost} left"}

    def _start(self, spec: CollectiveSpec, ranks, plan, needed, engine: str, kind: str, reason: str) -> RunSpec:
        """Number the run, pin its unpack tasks to their owners, send every rank the start."""
        rechunk = self.rechunks.setdefault(spec.token, Rechunk(spec.token))
        if rechunk.active is not None:
            self._abort(spec.token, "superseded by a new run", kind="restart")
        run = RunSpec(
            collective=spec, run_id=self.run_ids.next(spec.token), seq=next(self._seq), workers=tuple(ranks),
            in_ranks=plan.in_ranks, out_ranks=plan.out_ranks, needed=needed, engine=engine, kind=kind, reason=reason,
        )  # fmt: skip
        pending, restrictions, pins = set(), {}, {}
        owners = plan.out_ranks.ravel()
        tasks = self.scheduler.tasks
        for flat in np.flatnonzero(needed):
            out_key = spec.output_key(int(flat))
            if out_key not in tasks:  # released while the run was planned (a cancel): nobody waits for it
                continue
            restrictions[out_key] = tasks[out_key].worker_restrictions
            pins[out_key] = {ranks[owners[flat]]}
            self.by_output[out_key] = spec.token
            pending.add(out_key)
        self.scheduler.set_restrictions(pins)
        rechunk.active = ActiveRun(run, pending, restrictions, plan.nbytes, plan.moved_bytes)
        message = {"op": "redist-start", "run": ToPickle(run)}
        self._send(ranks, message)  # no await since the sequence number: starts leave in seq order
        self.timeline["start sent"] = time.time()
        logger.debug("started %s on %d workers (engine %s)", run.name(), len(ranks), engine)
        if not pending:
            self._finish(spec.token)
        return run

    async def _choose_engine(self, spec: CollectiveSpec, kind: str, ranks: list[str]) -> tuple[str, str]:
        """The engine for a run and why; asks workers what they can run the first time it matters."""
        await self._learn(self.engines.needs_probe(spec, kind, ranks))
        return self.engines.choose(spec, kind, ranks)

    async def _learn(self, workers: list[str]) -> None:
        if workers:
            timeout = Settings.from_config().barrier_timeout  # (probing imports CuPy and nvmath: seconds)
            answers = await ask_each(self.scheduler, {"op": "redist_capabilities"}, workers, timeout)
            self.engines.learn(answers)

    async def probe(self) -> dict:
        """The engines' state once every worker said what it can run (for ``explain``)."""
        await self._learn([w for w in self.scheduler.workers if w not in self.engines.capabilities])
        return self.engines.state()

    @log_errors
    def failed(self, token: str, run_id: int, address: str, message: str, kind: str) -> None:
        """A rank's run failed (``kind``: see `dask_redist.errors.KINDS`): restart it, on the dask
        engine if its own could not start under ``auto``, or abort it."""
        rechunk = self.rechunks.get(token)
        run = rechunk.active if rechunk else None
        if run is None or run.spec.run_id != run_id:  # an old run's late report, or no such rechunk
            return
        if address not in run.spec.workers or kind not in KINDS:  # not a rank of this run: refused
            logger.debug("ignored a failure report for %s from %s (kind %r)", run.spec.name(), address, kind)
            return
        logger.warning("%s failed on %s: %s", run.spec.name(), address, message)
        unavailable = kind == "unavailable"
        self.engines.run_failed(run.spec.engine, unavailable, message if unavailable else f"{run.spec.name()} failed on {address}")
        if kind == "restart" or (unavailable and run.spec.collective.settings.engine == "auto"):
            self._restart_once_barrier_done(token, message)
        else:
            self._abort(token, message, kind=kind)

    def forget_world(self) -> None:
        """The next cufftmp run bootstraps NVSHMEM over the workers of that moment."""
        self.engines.world.forget()

    def get_history(self) -> list[dict]:
        return list(self.history)

    async def get_status(self) -> dict:
        """Runs finished, runs active, the engines' state, and what every worker holds."""
        answers = await ask_each(self.scheduler, {"op": "redist_status"}, self.scheduler.workers, STATUS_TIMEOUT_S)
        return {
            "history": list(self.history),
            "active": [r.active.spec.name() for r in self.rechunks.values() if r.active is not None],
            "timeline": dict(self.timeline),
            "engines": self.engines.state(),
            "workers": {w: a for w, a in answers.items() if isinstance(a, dict)},
            "unanswered": {w: str(a) for w, a in answers.items() if not isinstance(a, dict)},
        }

    # -- run lifecycle ----------------------------------------------------------------

    def _send(self, workers, message) -> None:
        """To each of ``workers`` still connected (remove_worker restarts what a leaving one was in)."""
        for w in workers:
            if (comm := self.scheduler.stream_comms.get(w)) is not None:
                try:
                    comm.send(message)
                except CommClosedError:
                    logger.debug("%s: not sent to %s, which is leaving", message["op"], w)

    def _deactivate(self, token: str, outcome: str) -> ActiveRun | None:
        rechunk = self.rechunks.get(token)
        if rechunk is None or rechunk.active is None:
            return None
        run, rechunk.active, rechunk.pending_restart = rechunk.active, None, None
        for key, original in run.restrictions.items():
            self.by_output.pop(key, None)
            if key in self.scheduler.tasks:
                self.scheduler.set_restrictions({key: original})
        self.history.append(run.history(outcome))
        return run

    def _finish(self, token: str) -> None:
        self.timeline["outputs in memory"] = time.time()
        run = self._deactivate(token, "done")
        if run is not None:
            self._send(run.spec.workers, {"op": "redist-cleanup", "token": token, "run_id": run.spec.run_id})
            self.rechunks[token].restarts = 0

    def _abort(self, token: str, reason: str, *, kind: str, outcome: str | None = None) -> None:
        """Fail the run on every rank with ``reason``, as the error `dask_redist.errors.KINDS` names;
        ``outcome`` for the history (default: restarted or failed, by ``kind``)."""
        run = self._deactivate(token, outcome or ("restarted" if kind == "restart" else "failed"))
        if run is None:
            return
        logger.debug("aborting %s (%s): %s", run.spec.name(), kind, reason)
        gone = [w for w in run.spec.workers if w not in self.scheduler.workers]  # (their calls never come)
        self._send(
            run.spec.workers,
            {"op": "redist-abort", "token": token, "run_id": run.spec.run_id, "reason": reason, "kind": kind, "gone": gone},
        )

    def _restart(self, token: str, reason: str, stale: list = (), settings=None) -> None:
        """Abort the run and release the barrier and unfinished unpack tasks: dask reruns them
        (and the ``stale`` stage tasks, whose staged chunks are gone). ``settings``: for a
        restart before the run started."""
        rechunk = self.rechunks.setdefault(token, Rechunk(token))
        settings = rechunk.active.spec.collective.settings if rechunk.active else settings
        rechunk.restarts += 1
        if settings is not None and rechunk.restarts > settings.retries:
            self._abort(
                token, f"{reason} (gave up after {settings.retries} restarts, see redist.retries)", kind="error"
            )
            return
        self._abort(token, reason, kind="restart")
        logger.warning("restarting rechunk %s: %s", token[:8], reason)
        if recs := restart_recommendations(self.scheduler.tasks, token, stale):
            stimulus = f"redist-restart-{token}-{time.time()}"
            self.scheduler.transitions(recs, stimulus_id=stimulus)
            self.scheduler.stimulus_queue_slots_maybe_opened(stimulus_id=stimulus)

    def _restart_once_barrier_done(self, token: str, reason: str, stale: list = ()) -> None:
        """`_restart` the active run, at once or, while the barrier task is still processing,
        once it is in memory (`dask_redist.runtime.rechunks`)."""
        barrier = self.scheduler.tasks.get(BARRIER_PREFIX + token)
        if barrier is None or barrier.state != "processing":
            self._restart(token, reason, stale)
            return
        rechunk = self.rechunks[token]
        logger.debug("%s: the restart waits for the barrier task's result", rechunk.active.spec.name())
        rechunk.defer_restart(reason, stale)

    def _restart_pending(self, token: str) -> None:
        """The barrier task is in memory: do the restart it held back, if its run is still active."""
        rechunk = self.rechunks.get(token)
        pending = rechunk.pending_restart if rechunk else None
        if pending is None:
            return
        rechunk.pending_restart = None
        if rechunk.active is not None and rechunk.active.spec.run_id == pending.run_id:
            self._restart(token, pending.reason, pending.stale)

    # -- scheduler hooks ------------------------------------------------------------------

    def transition(self, key, start, finish, *args, stimulus_id: str, **kwargs) -> None:
        if (stage := stage_token(key)) is not None:
            self._stage_transition(stage, key, start, finish, kwargs.get("worker"))
        elif (token := self.by_output.get(key)) is not None:
            self._output_transition(token, key, finish)
        elif type(key) is str and key.startswith(BARRIER_PREFIX):
            self._barrier_transition(key[len(BARRIER_PREFIX) :], finish, stimulus_id)

    def _stage_transition(self, token: str, key, start: str, finish: str, worker: str | None) -> None:
        if finish == "memory" and worker is not None:
            self.stage_home[key] = worker
        elif start == "memory" and (home := self.stage_home.pop(key, None)) is not None:
            self._send([home], {"op": "redist-drop", "token": token, "index": key[1:]})

    def _output_transition(self, token: str, key, finish: str) -> None:
        rechunk = self.rechunks.get(token)
        run = rechunk.active if rechunk else None
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
            if not run.pending:  # a cancel: nobody waits for any output of the run
                self._abort(token, "all outputs forgotten", kind="error", outcome="cancelled")

    def _barrier_transition(self, token: str, finish: str, stimulus_id: str) -> None:
        rechunk = self.rechunks.get(token)
        if finish == "memory":
            if rechunk is not None and rechunk.pending_restart is not None:  # after this transition
                self.scheduler.loop.add_callback(self._restart_pending, token)
        elif finish in ("released", "erred", "forgotten"):
            if rechunk is not None and rechunk.active is not None:
                kind = "restart" if finish == "released" else "error"
                self._abort(token, f"barrier {finish} ({stimulus_id})", kind=kind)
            if finish == "forgotten":  # nobody can ask for this rechunk again: workers forget it too
                self.rechunks.pop(token, None)
                self._send(list(self.scheduler.workers), {"op": "redist-forget", "token": token})

    def remove_worker(self, scheduler, worker: str, *, stimulus_id: str, **kwargs) -> None:
        self.engines.worker_left(worker)
        self._send(list(self.scheduler.workers), {"op": "redist-gone", "worker": worker})  # (aborted runs stop completing)
        # its staged chunks are gone, while copies of their stage markers may live on
        stale = [k for k, w in self.stage_home.items() if w == worker]
        for key in stale:
            del self.stage_home[key]
        for token, rechunk in list(self.rechunks.items()):
            run = rechunk.active
            if run is not None and worker in run.spec.workers:
                mine = [k for k in stale if k[0] == STAGE_PREFIX + token]
                self._restart_once_barrier_done(token, f"worker {worker} left during {run.spec.name()}", mine)

    def restart(self, scheduler) -> None:
        self.rechunks.clear()
        self.by_output.clear()
        self.stage_home.clear()
