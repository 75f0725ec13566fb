"""Scheduler side of the collective: runs, their global order, owners, restarts.

When the barrier task of a collective rechunk becomes ready, the plugin knows where every
input chunk is staged from the stage tasks' events (`dask_redist.runtime.eager`), or else
the barrier task calls `RedistSchedulerPlugin.barrier` with it. The plugin then

1. chooses the engine (`dask_redist.engines.choice`: it asks the registry, never a
   named engine) and the owner of every output
   chunk (the pure planner),
2. numbers the run: a run id per attempt of this rechunk, and a sequence number
   in one global order over all runs,
3. pins every unpack task to its owner (``worker_restrictions``),
4. sends ``redist-start`` to every worker of the run, in sequence order.

Its handlers decide; `dask_redist.runtime.lifecycle.Rechunks` carries the runs out and
watches their tasks: when all unpack tasks are in memory the run is cleaned up on the
workers; when one errs the run is aborted everywhere. When a worker of an active
run leaves, or a rank reports that a run's state was lost, the run is restarted
(`dask_redist.runtime.rechunks`): the barrier and the unfinished unpack tasks are
released, so dask runs the barrier again (re-staging what was lost) under a new
run id, up to ``redist.retries`` times (`dask_redist.runtime.lifecycle`, the one home of restarts); the stage tasks of a worker that left run
again too (copies of their markers may live on, the staged chunks died with it).
A rank that fails for any other reason has the run aborted on every rank with its
error, so no rank is left waiting; after a timeout, once every rank answered or a rank
that did not had the grace its watchdog gives it to leave (`dask_redist.runtime.timeouts`).
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.protocol.pickle import dumps
from distributed.utils import log_errors, offload

from dask_redist.config import Settings, process_barrier_timeout
from dask_redist.core import messages as m
from dask_redist.core.spec import BARRIER_PREFIX, BarrierTask, CollectiveSpec, stage_token
from dask_redist.engines import Request
from dask_redist.engines.choice import EngineSelector, fft_engines
from dask_redist.errors import FAILURES
from dask_redist.runtime import ordering, submitted
from dask_redist.runtime.eager import EagerStarts, forget_events
from dask_redist.runtime.lifecycle import Rechunks
from dask_redist.planning import PlanError
from dask_redist.planning.memory import over_memory, pause_fraction
from dask_redist.runtime.rechunks import barrier_is_current, ranks_of
from dask_redist.runtime.restrictions import allowed_owners, restricted_plan
from dask_redist.runtime.rendezvous import Rendezvous, ask_each
from dask_redist.runtime.timeouts import TimedOutRuns

logger = logging.getLogger("dask_redist")
STATUS_TIMEOUT_S = 10.0  # for each worker's answer to status()
RUN_PLANS_KEPT = 8  # plans kept for a repeated rechunk (`RedistSchedulerPlugin._plan`) ...
RUN_PLAN_KEPT_PIECES = 4096  # ... of at most this many pieces each


class RedistSchedulerPlugin(SchedulerPlugin):
    name = "redist"
    idempotent = True  # registered by every first barrier and by status(): the first one stays

    def __init__(self, worker_plugin=None):
        self.worker_plugin = worker_plugin  # registered on every worker when this plugin starts
        self.scheduler = None
        self.rechunks = Rechunks()
        self.engines = EngineSelector()
        self.rendezvous = Rendezvous()
        self.eager = EagerStarts()
        self._plans: dict = {}  # the last plans by geometry, placement and outputs wanted (`_plan`)
        self._ready: asyncio.Event | None = None
        self.timeouts = TimedOutRuns(self.rechunks)

    def __reduce__(self):
        """The plugin travels (registered from a task, `runtime.tasks.register`) as what it is,
        never with its state: runs, locks and events stay in the scheduler that holds them."""
        return (type(self), (self.worker_plugin,))

    async def start(self, scheduler) -> None:
        if self.name in scheduler.plugins:  # registered concurrently by another barrier
            return
        self.scheduler = self.rechunks.scheduler = scheduler
        self._ready = asyncio.Event()
        ordering.install()  # graphs lowered on the client (expression mode) are ordered here too
        submitted.install(scheduler)  # compute(retries=...) keeps producers apart (graph.stages)
        scheduler.add_plugin(self, name=self.name)
        scheduler.handlers.update(
            {
                m.Barrier.op: self.barrier,
                m.Failed.op: self.failed,
                m.SchedulerStatus.op: self.get_status,
                m.ForgetWorld.op: self.forget_world,
                m.Allgather.op: self.rendezvous.handle,
                m.Probe.op: self.probe,
                m.Stale.op: self.stale,
            }
        )
        if self.worker_plugin is not None:
            # Scheduler.register_worker_plugin, except that a worker dying (or stopped) now does not
            # fail it or hold it (workers that join later get it from scheduler.worker_plugins)
            plugin = dumps(self.worker_plugin)
            scheduler.worker_plugins[self.worker_plugin.name] = plugin
            msg = {"op": "plugin-add", "plugin": plugin, "name": self.worker_plugin.name}
            self.rechunks.hold(workers := list(scheduler.workers))  # (their streams' handlers come with it)
            answers = await ask_each(scheduler, msg, workers, process_barrier_timeout())
            self.rechunks.release(
                w for w, a in answers.items() if isinstance(a, dict) and a.get("status") == "OK"
            )
        self._ready.set()

    # -- handlers -------------------------------------------------------------------

    @log_errors
    async def barrier(
        self, token: str, workers: list[str], holders: list[int], homes: list, chunk_type: str
    ) -> m.BarrierReply:
        """Start a run of rechunk ``token`` over the chunks the stage tasks staged, unless it was
        started already, when this barrier task became ready (`dask_redist.runtime.eager`)."""
        await self._ready.wait()
        ts = self.scheduler.tasks.get(BARRIER_PREFIX + token)
        if (started := self.eager.started(token, ts)) is not None:
            return await started
        return await self._start(ts, m.Barrier(token, workers, holders, homes, chunk_type))

    def _start_early(self, token: str) -> None:
        """Start the run of ``token`` now if its barrier task is ready and every stage task said
        what it staged (`dask_redist.runtime.eager`)."""
        ts = self.scheduler.tasks.get(BARRIER_PREFIX + token)
        if self._ready is None or not self._ready.is_set() or not self._processing(ts):
            return
        if self.eager.started(token, ts) is None and (request := self.eager.request(token, ts)) is not None:
            self.eager.start(token, ts, self._start(ts, request))

    async def _start(self, ts, asked: m.Barrier) -> m.BarrierReply:
        """Start a run over what ``asked`` says was staged, for barrier task ``ts``."""
        self.rechunks.timeline = {"run asked": time.time()}
        token, workers, holders, homes, chunk_type = (
            asked.token,
            asked.workers,
            asked.holders,
            asked.homes,
            asked.chunk_type,
        )
        if not self._processing(ts):  # released (a cancel): this call's result goes nowhere
            return m.BarrierReply(
                status="stale", message=f"barrier task {BARRIER_PREFIX + token} is not processing"
            )
        spec: CollectiveSpec = ts.run_spec.spec
        if lost := self._lost(workers, homes, spec, "holding staged inputs left before the run started"):
            return lost
        # (the plugin may have been registered by this barrier, after the stage tasks: learn from the markers)
        for tail, h in homes:
            self.rechunks.stage_home.setdefault((spec.stage_name, *tail), workers[h])
        ranks, in_ranks = ranks_of(workers, holders, self.scheduler.workers)
        tasks, keys = self.scheduler.tasks, spec.output_keys()
        # outputs of this graph only: an output key resubmitted with another grouping belongs to another barrier
        wanted = (k in tasks and tasks[k].state != "memory" and ts in tasks[k].dependencies for k in keys)
        needed = np.fromiter(wanted, dtype=bool)
        if not needed.any():  # every output was released (a cancel) or is in memory already
            self.rechunks.history.append(
                {"token": token, "outcome": "cancelled", "why": "no output of it is wanted"}
            )
            return m.BarrierReply(status="OK", run_id=0)
        request = Request.of(spec, chunk_type)
        engine, reason = await self._choose_engine(request, ranks, token)
        self.rechunks.timeline["engine chosen"] = time.time()
        if problem := spec.run_problem(engine, chunk_type, len(ranks), fft_engines(spec.settings)):
            return m.BarrierReply(status="error", fatal=True, message=f"{problem} ({reason})")
        if problem := self.engines.refusal(engine, request, ranks):
            return m.BarrierReply(status="error", fatal=True, message=problem)
        self.engines.run_started(
            engine, spec.settings, ranks
        )  # (a worker leaving while we plan breaks that world)
        plan = await self._plan(spec, in_ranks, len(ranks), needed)
        if (allowed := allowed_owners(self.scheduler, keys, needed, ranks)) is not None:
            try:
                plan = restricted_plan(spec, plan, allowed, ranks)
            except PlanError as e:
                return m.BarrierReply(status="error", fatal=True, message=str(e))
        self.rechunks.timeline["planned"] = time.time()
        limits = [getattr(self.scheduler.workers.get(w), "memory_limit", 0) or 0 for w in ranks]
        if chunk_type == "numpy" and (too_big := over_memory(plan, ranks, limits, pause_fraction())):
            return m.BarrierReply(status="error", fatal=True, message=too_big)
        if lost := self._lost(ranks, homes, spec, "left while the run was planned", workers):
            return lost
        if self.scheduler.tasks.get(ts.key) is not ts or not self._processing(ts):  # released meanwhile
            return m.BarrierReply(
                status="stale", message=f"barrier task {ts.key} was released while the run was planned"
            )
        run = self.rechunks.start(spec, ranks, plan, needed, engine, chunk_type, reason)
        self.rechunks.by_token[spec.token].barrier = (ts, run.run_id, needed)
        return m.BarrierReply(status="OK", run_id=run.run_id)

    async def _plan(self, spec: CollectiveSpec, in_ranks: np.ndarray, nranks: int, needed: np.ndarray):
        """The plan of a run (off the event loop), or the same plan again for a rechunk of the same
        geometry, placement and outputs wanted as one of the last `RUN_PLANS_KEPT` (plans of at most
        `RUN_PLAN_KEPT_PIECES` pieces are kept)."""
        key = (spec.rechunk, spec.fft, nranks, in_ranks.tobytes(), needed.tobytes())
        plan = self._plans.pop(key, None)
        if plan is None:
            plan = await offload(spec.plan_run, in_ranks, nranks, needed)
        if plan.piece_count > RUN_PLAN_KEPT_PIECES:  # (planning is a small part of such a run)
            return plan
        self._plans[key] = plan  # (the most recently used last)
        while len(self._plans) > RUN_PLANS_KEPT:
            del self._plans[next(iter(self._plans))]
        return plan

    def stale(self, token: str, run_id: int, index: int) -> m.StaleReply:
        """An unpack task found output chunk ``index`` of run ``run_id`` missing: is its barrier's
        result stale (`rechunks.barrier_is_current`)? Then the rechunk is restarted (the barrier
        released with the unpack tasks not done) and runs again for every output still wanted:
        an expected recovery (an output run again while its barrier's result was still held),
        logged at INFO, not as a warning.
        """
        ts = self.scheduler.tasks.get(BARRIER_PREFIX + token)
        if barrier_is_current(self.rechunks.by_token.get(token), ts, run_id, index):
            return m.StaleReply(stale=False)
        if ts is None or ts.state != "memory":
            return m.StaleReply(stale=True, released=False)
        logger.debug("%s: result of run %d is stale for output %d; running it again", ts.key, run_id, index)
        reason = f"output chunk {index} is not in run {run_id} (stale barrier result)"
        self.rechunks.restart(token, reason, level=logging.INFO)
        return m.StaleReply(stale=True, released=True)

    @staticmethod
    def _processing(ts) -> bool:
        return ts is not None and ts.state == "processing" and isinstance(ts.run_spec, BarrierTask)

    def _lost(
        self, who: list[str], homes: list, spec: CollectiveSpec, what: str, holders=None
    ) -> m.BarrierReply | None:
        """Restart the rechunk if any of ``who`` left; the barrier's answer then."""
        lost = [w for w in who if w not in self.scheduler.workers]
        if not lost:
            return None
        holders = who if holders is None else holders
        # stage markers of a worker that left may live on (a copy fetched by the barrier's
        # worker) while the staged chunks died with it: released too, or the barrier loops
        stale = [(spec.stage_name, *tail) for tail, h in homes if holders[h] in lost]
        self.rechunks.restart(spec.token, f"workers {lost} {what}", stale, spec.settings)
        return m.BarrierReply(status="error", message=f"workers {lost} left")

    async def _choose_engine(self, request: Request, ranks: list[str], token: str) -> tuple[str, str]:
        """The engine for a run of rechunk ``token`` and why; asks workers what they can run the
        first time it matters. A restart after a worker left may take another (`EngineSelector.choose`)."""
        await self._learn(self.engines.needs_probe(request, ranks), dict(request.settings.engines))
        restarting = getattr(self.rechunks.by_token.get(token), "restarts", 0) > 0
        return self.engines.choose(request, ranks, restarting, token)

    async def _learn(self, workers: list[str], engines: dict[str, str]) -> None:
        """Ask ``workers`` which of ``engines`` (name -> path) they can run."""
        if workers:
            timeout = process_barrier_timeout()  # (probing imports CuPy and nvmath: seconds)
            answers = await ask_each(self.scheduler, m.Capabilities(engines).to_dict(), workers, timeout)
            self.engines.learn(answers)

    async def probe(self, engines: dict[str, str] | None = None, keys=()) -> dict:
        """The engines' state once every worker said which of ``engines`` (name -> path; default
        the built-in ones) it can run, the workers (for ``explain``), and for each of ``keys`` the
        workers holding it in memory (none where it is not)."""
        engines = dict(Settings().engines) if engines is None else engines
        known = self.engines.capabilities
        await self._learn(
            [w for w in self.scheduler.workers if not set(engines) <= set(known.get(w, {}))], engines
        )
        tasks = self.scheduler.tasks
        holders = [
            sorted(ws.address for ws in ts.who_has)
            if (ts := tasks.get(k)) is not None and ts.state == "memory"
            else []
            for k in keys
        ]
        return {**self.engines.state(), "workers": sorted(self.scheduler.workers), "holders": holders}

    @log_errors
    def failed(self, token: str, run_id: int, address: str, message: str, failure: str) -> bool:
        """A rank's run failed (``failure``: see `dask_redist.errors.FAILURES`): restart it, on the
        next engine if its own could not start under ``auto``, or abort it. A failure of a run that
        a worker left (its restart waits for the barrier task, or the rank's failure came first)
        is that worker's doing: the restart finishes the rechunk (on ``dask`` where the engine's
        world lost it: a survivor of an NVSHMEM world says so as it refuses the run), never the
        user's error. Returns whether the report was taken (an abort of the run follows)."""
        run = self.rechunks.active(token, run_id)
        if run is None:  # an old run's late report, or no such rechunk
            return False
        if address not in run.spec.workers or failure not in FAILURES:  # not a rank of this run: refused
            logger.debug(
                "ignored a failure report for %s from %s (failure %r)", run.spec.name(), address, failure
            )
            return False
        logger.warning("%s failed on %s: %s", run.spec.name(), address, message)
        unavailable = failure == "unavailable"
        why = message if unavailable else f"{run.spec.name()} failed on {address}"
        if later := self.engines.run_failed(run.spec.engine, run.spec.collective.settings, failure, why):
            logger.warning("%s", later)  # (the rank's error says so too: `collective._saying_what_follows`)
        if (
            failure == "restart"
            or (unavailable and run.spec.collective.settings.engine == "auto")
            or self.rechunks.worker_left_during(token)
        ):
            self.rechunks.restart_once_barrier_done(token, message)
        elif failure == "timeout":
            self.timeouts.abort_unless_a_rank_leaves(run.spec, message)
        else:
            self.rechunks.abort(token, message, failure=failure)
        return True

    def forget_world(self, engine: str | None = None) -> None:
        """The next run of ``engine`` (of every engine: None) starts its world over the workers of
        that moment, and is tried again if it could not start."""
        self.engines.forget(engine)

    async def get_status(self) -> dict:
        """Runs finished, runs active, the engines' state, and what every worker holds."""
        answers = await ask_each(
            self.scheduler, m.WorkerStatus().to_dict(), self.scheduler.workers, STATUS_TIMEOUT_S
        )
        return {
            "history": list(self.rechunks.history),
            "active": [r.active.spec.name() for r in self.rechunks.by_token.values() if r.active is not None],
            "in flight": [r.active.history("in flight") for r in self.rechunks.by_token.values() if r.active],
            "timeline": dict(self.rechunks.timeline),
            "engines": self.engines.state(),
            "workers": {w: a for w, a in answers.items() if isinstance(a, dict)},
            "unanswered": {w: str(a) for w, a in answers.items() if not isinstance(a, dict)},
        }

    # -- scheduler hooks ------------------------------------------------------------------

    @property
    def history(self):
        """The runs finished, newest last (`dask_redist.runtime.lifecycle.Rechunks.history`)."""
        return self.rechunks.history

    def transition(self, key, start, finish, *args, stimulus_id: str, **kwargs) -> None:
        self.rechunks.transition(key, start, finish, *args, stimulus_id=stimulus_id, **kwargs)
        if type(key) is str and key.startswith(BARRIER_PREFIX):
            if finish == "processing":
                self._start_early(key[len(BARRIER_PREFIX) :])
            elif start == "processing":
                self.eager.barrier_left(key[len(BARRIER_PREFIX) :])
        elif start == "memory" and stage_token(key) is not None:
            self.eager.dropped(key)

    def log_event(self, topic: str, msg) -> None:
        if topic == m.StageDone.op and isinstance(msg, dict):
            fields = {k: msg[k] for k in m.StageDone.__dataclass_fields__ if k in msg}
            if self.eager.staged(msg.get("worker"), m.StageDone(**fields), self.scheduler.tasks):
                self._start_early(fields["token"])
            forget_events(self.scheduler, topic)

    def remove_worker(self, scheduler, worker: str, *, stimulus_id: str, **kwargs) -> None:
        self.engines.worker_left(worker, self.rechunks.under_way())
        self.rechunks.worker_left(worker)

    def restart(self, scheduler) -> None:
        """distributed's hook: the cluster restarted (``Client.restart``); not a rechunk's restart."""
        self.rechunks.clear()
        self.eager.clear()
