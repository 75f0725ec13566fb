"""The scheduler's runs: starting, finishing, aborting and restarting them (the one home of restarts).

`Rechunks` holds what the scheduler plugin (`dask_redist.runtime.scheduler`) knows of every
collective rechunk (`dask_redist.runtime.rechunks.Rechunk`) and applies what happens to
their tasks: an unpack task in memory, erred or forgotten; a barrier task released; a stage
key released (its staged chunks dropped on the worker); a worker leaving. The plugin's
message handlers decide when a run starts or fails; this module carries it out.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import numpy as np
from distributed.comm import CommClosedError
from distributed.core import Status, error_message
from distributed.protocol.serialize import ToPickle

from dask_redist.compat import fail_unrunnable
from dask_redist.core import messages as m
from dask_redist.core.spec import BARRIER_PREFIX, STAGE_PREFIX, CollectiveSpec, RunSpec, stage_token
from dask_redist.errors import FAILURES
from dask_redist.runtime.rechunks import ActiveRun, PendingRestart, Rechunk, RunIds
from dask_redist.runtime.transport import send_now

logger = logging.getLogger("dask_redist")
HISTORY_KEPT = 200  # finished runs kept for status()/explain(), newest last


class Rechunks:
    """Every collective rechunk the scheduler knows (`by_token`: each one's state across its runs),
    and what it does to their runs (`restart`: a rechunk's restart; a cluster's is `clear`)."""

    def __init__(self):
        self.scheduler = None  # set when the plugin starts
        self.by_token: dict[str, Rechunk] = {}
        self.run_ids = RunIds()
        self.by_output: dict = {}  # output key of an active run -> its token
        self.stage_home: dict = {}  # stage key -> worker holding its chunks
        self.history: deque = deque(maxlen=HISTORY_KEPT)
        self.timeline: dict[str, float] = {}  # wall-clock marks of the latest run, for diagnostics
        self._last_seq = 0  # (an int, not itertools.count: Python 3.14 cannot pickle that)
        self._held: dict[str, list] = {}  # worker the worker plugin is being added to -> messages

    def _next_seq(self) -> int:
        """The next run's number in the one global order over all runs."""
        self._last_seq += 1
        return self._last_seq

    def active(self, token: str, run_id: int | None = None) -> ActiveRun | None:
        """The active run of rechunk ``token`` (if it is run ``run_id``, where given), or None."""
        rechunk = self.by_token.get(token)
        run = rechunk.active if rechunk is not None else None
        return run if run is not None and run_id in (None, run.spec.run_id) else None

    def start(
        self, spec: CollectiveSpec, ranks, plan, needed, engine: str, chunk_type: str, reason: str
    ) -> RunSpec:
        """Number the run, pin its unpack tasks to their owners, send every rank the start."""
        rechunk = self.by_token.setdefault(spec.token, Rechunk(spec.token))
        if rechunk.active is not None:
            self.abort(spec.token, "superseded by a new run", failure="restart")
        run = RunSpec(
            collective=spec,
            run_id=self.run_ids.next(spec.token),
            seq=self._next_seq(),
            workers=tuple(ranks),
            in_ranks=plan.in_ranks,
            out_ranks=plan.out_ranks,
            needed=needed,
            engine=engine,
            chunk_type=chunk_type,
            reason=reason,
        )
        pending, restrictions, pins = set(), {}, {}
        owners = plan.out_ranks.ravel()
        tasks = self.scheduler.tasks
        keys = spec.output_keys()  # (all at once: one by one, they were most of this loop's time)
        for flat in np.flatnonzero(needed).tolist():
            out_key = keys[flat]
            if out_key not in tasks:  # released while the run was planned (a cancel): nobody waits for it
                continue
            restrictions[out_key] = tasks[out_key].worker_restrictions
            pins[out_key] = {ranks[owners[flat]]}
            self.by_output[out_key] = spec.token
            pending.add(out_key)
        self.scheduler.set_restrictions(pins)
        rechunk.active = ActiveRun(run, pending, restrictions, plan.nbytes, plan.moved_bytes)
        # now, not after the stream's interval (the barrier task was just sent on it); no await
        # since the sequence number: starts leave in seq order
        self.send(ranks, m.Start(ToPickle(run)), now=True)
        self.timeline["start sent"] = time.time()
        logger.debug("started %s on %d workers (engine %s)", run.name(), len(ranks), engine)
        if not pending:
            self.finish(spec.token)
        return run

    def send(self, workers, message: m.Message, now: bool = False) -> None:
        """To each of ``workers`` still connected (remove_worker restarts what a leaving one was in),
        on its stream: behind what the stream carries already; ``now``: without waiting out the
        stream's batching interval (`send_now`)."""
        msg = message.to_dict()
        for w in workers:
            if w in self._held:  # (its stream's handler is not there yet: sent once it is)
                self._held[w].append((msg, now))
            else:
                self._send(w, msg, now)

    def _send(self, worker: str, msg: dict, now: bool) -> None:
        if (comm := self.scheduler.stream_comms.get(worker)) is not None:
            try:
                send_now(comm, msg) if now else comm.send(msg)
            except CommClosedError:
                logger.debug("%s: not sent to %s, which is leaving", msg["op"], worker)

    def hold(self, workers) -> None:
        """Keep what is sent to ``workers`` until `release`: the worker plugin is being added to
        them, over a comm of its own, so a message on their streams could come first, and a worker
        whose stream gets an op it has no handler for closes its connection (and dies)."""
        self._held = {w: [] for w in workers}

    def release(self, plugged) -> None:
        """Send what `hold` kept to the workers of ``plugged`` (which have the plugin now), in order."""
        held, self._held = self._held, {}
        for w in set(plugged) & set(held):
            for msg, now in held[w]:
                self._send(w, msg, now)

    def _deactivate(self, token: str, outcome: str, reason: str | None = None) -> ActiveRun | None:
        rechunk = self.by_token.get(token)
        if rechunk is None or rechunk.active is None:
            return None
        run, rechunk.active, rechunk.pending_restart = rechunk.active, None, None
        outcome = "outputs failed" if run.erred else outcome  # (however it ends: the user saw those errors)
        for key, original in run.restrictions.items():
            self.by_output.pop(key, None)
            if key in self.scheduler.tasks:
                self.scheduler.set_restrictions({key: original})
        self.history.append(run.history(outcome, reason))
        return run

    def finish(self, token: str) -> None:
        self.timeline["outputs in memory"] = time.time()
        run = self._deactivate(token, "done")
        if run is not None:
            self.send(run.spec.workers, m.Cleanup(token, run.spec.run_id))
            self.by_token[token].restarts = 0

    def abort(self, token: str, reason: str, *, failure: str, outcome: str | None = None) -> None:
        """Fail the run on every rank with ``reason``, as the error `dask_redist.errors.FAILURES` names;
        ``outcome`` for the history (default: restarted or failed, by ``failure``)."""
        run = self._deactivate(token, outcome or ("restarted" if failure == "restart" else "failed"), reason)
        if run is None:
            return
        logger.debug("aborting %s (%s): %s", run.spec.name(), failure, reason)
        gone = [w for w in run.spec.workers if w not in self.scheduler.workers]  # (their calls never come)
        self.send(run.spec.workers, m.Abort(token, run.spec.run_id, reason, failure, gone))
        # (unpack tasks on a paused worker would raise the run's error once they start: never)
        paused = [
            w for w, ws in self.scheduler.workers.items() if getattr(ws, "status", None) == Status.paused
        ]
        if paused and failure != "restart":
            self.fail_stuck(run.spec.collective, FAILURES[failure](reason), paused)

    def fail_stuck(self, spec: CollectiveSpec, error: Exception, silent: list[str]) -> None:
        """Fail with ``error`` the tasks of ``spec`` that the ``silent`` workers hold up: its
        unpack tasks raise an aborted run's error, but only once they run, and they wait for the
        barrier task. That task may be fetching a stage marker from a stopped worker, or running on
        it (a run starts before its barrier task has run: `runtime.eager`); or it finished there,
        and the unpack tasks elsewhere wait to fetch its result, as any Dask task would, until
        distributed's worker-ttl. Unpack tasks on a silent worker cannot report either."""
        barrier = self.scheduler.tasks.get(spec.barrier_key)
        if barrier is None:
            return
        if barrier.state == "processing":
            self._fail([barrier], spec, error)  # (its unpack tasks err with it)
            return
        silent = set(silent)
        cut_off = not {ws.address for ws in barrier.who_has or ()} - silent

        def held_up(ts) -> bool:
            if ts.state == "no-worker":  # (pinned to a paused worker: the scheduler gives it none)
                return set(ts.worker_restrictions or ()) <= silent
            on = ts.processing_on
            return ts.state == "processing" and on is not None and (cut_off or on.address in silent)

        outputs = map(self.scheduler.tasks.get, dict.fromkeys(spec.output_keys()))
        self._fail([ts for ts in outputs if ts is not None and held_up(ts)], spec, error)

    def _fail(self, tasks: list, spec: CollectiveSpec, error: Exception) -> None:
        if not tasks:
            return
        logger.warning(
            "failing %d task(s) of %s (%s, ...): %s", len(tasks), spec.describe(), tasks[0].key, error
        )
        details = {k: v for k, v in error_message(error).items() if k != "status"}
        stimulus_id = f"redist-abort-{spec.token}-{time.time()}"
        for ts in tasks:
            if ts.state == "no-worker":
                fail_unrunnable(self.scheduler, ts.key, stimulus_id, **details)
                continue
            if ts.state != "processing" or ts.processing_on is None:  # (an earlier one's transitions)
                continue
            # The worker still counts the task as its own, and a stopped one may resume fetching
            # its inputs: once they arrive it reports them (add-keys), the scheduler, which
            # released them with the failed task, asks it to drop them, and a worker asked that
            # while the task executes closes. So it is told first, as when the scheduler
            # releases a processing task: its stream delivers this before that answer.
            self.scheduler.worker_send(
                ts.processing_on.address,
                {"op": "free-keys", "keys": [ts.key], "stimulus_id": stimulus_id},
            )
            self.scheduler.handle_task_erred(
                key=ts.key,
                stimulus_id=stimulus_id,
                worker=ts.processing_on.address,
                run_id=ts.run_id,
                **details,
            )

    def restart(
        self, token: str, reason: str, stale: list = (), settings=None, *, level: int = logging.WARNING
    ) -> None:
        """Abort the run and release the barrier and unfinished unpack tasks: dask reruns them
        (and the ``stale`` stage tasks, whose staged chunks are gone). ``settings``: for a
        restart before the run started. ``level``: of the log record saying so (a recovery the
        user need not act on, such as a stale barrier result, is logged below warnings)."""
        rechunk = self.by_token.setdefault(token, Rechunk(token))
        settings = rechunk.active.spec.collective.settings if rechunk.active else settings
        rechunk.restarts += 1
        if settings is not None and rechunk.restarts > settings.retries:
            self.abort(
                token,
                f"{reason} (gave up after {settings.retries} restarts, see redist.retries)",
                failure="error",
            )
            return
        self.abort(token, reason, failure="restart")
        logger.log(level, "restarting rechunk %s: %s", token[:8], reason)
        if recs := _restart_recommendations(self.scheduler.tasks, token, stale):
            stimulus = f"redist-restart-{token}-{time.time()}"
            self.scheduler.transitions(recs, stimulus_id=stimulus)
            self.scheduler.stimulus_queue_slots_maybe_opened(stimulus_id=stimulus)

    def worker_left_during(self, token: str) -> bool:
        """Did a worker leave during the active run of ``token``: its restart is held back until the
        barrier task is in memory, or a rank of it is no longer among the scheduler's workers."""
        rechunk = self.by_token.get(token)
        run = rechunk.active if rechunk else None
        if run is None:
            return False
        return rechunk.pending_restart is not None or any(
            w not in self.scheduler.workers for w in run.spec.workers
        )

    def restart_once_barrier_done(self, token: str, reason: str, stale: list = ()) -> None:
        """`restart` the active run, at once or, while the barrier task is still processing,
        once it is in memory.

        A rank can fail, or a worker leave, before the barrier task's own result reached the
        scheduler (an engine that cannot start fails at once). Releasing the barrier task while
        it is still processing races its completion: distributed takes the late result for a
        stale one and releases the task again, restarting the new run as well. So such a restart
        is kept (`PendingRestart`) and done once the barrier task is in memory (`_restart_pending`)."""
        barrier = self.scheduler.tasks.get(BARRIER_PREFIX + token)
        if barrier is None or barrier.state != "processing":
            self.restart(token, reason, stale)
            return
        rechunk = self.by_token[token]
        logger.debug("%s: the restart waits for the barrier task's result", rechunk.active.spec.name())
        if (earlier := rechunk.pending_restart) is None:  # (the first reason is kept)
            rechunk.pending_restart = PendingRestart(rechunk.active.spec.run_id, reason, list(stale))
        else:
            earlier.stale.extend(stale)

    def _restart_pending(self, token: str) -> None:
        """The barrier task is in memory: do the restart it held back, if its run is still active."""
        rechunk = self.by_token.get(token)
        pending = rechunk.pending_restart if rechunk else None
        if pending is None:
            return
        rechunk.pending_restart = None
        if self.active(token, pending.run_id) is not None:
            self.restart(token, pending.reason, pending.stale)

    # -- the scheduler's transitions --------------------------------------------------------

    def transition(self, key, start, finish, *args, stimulus_id: str, **kwargs) -> None:
        if (stage := stage_token(key)) is not None:
            self._stage_transition(stage, key, start, finish, kwargs.get("worker"))
        elif (token := self.by_output.get(key)) is not None:
            self._output_transition(token, key, finish, kwargs.get("exception_text"))
        elif type(key) is str and key.startswith(BARRIER_PREFIX):
            self._barrier_transition(
                key[len(BARRIER_PREFIX) :], finish, stimulus_id, kwargs.get("exception_text")
            )

    def _stage_transition(self, token: str, key, start: str, finish: str, worker: str | None) -> None:
        if finish == "memory" and worker is not None:
            self.stage_home[key] = worker
        elif start == "memory" and (home := self.stage_home.pop(key, None)) is not None:
            self.send([home], m.Drop(token, key[1:]))

    def _output_transition(self, token: str, key, finish: str, error: str | None = None) -> None:
        run = self.active(token)
        if run is None:
            return
        if finish in ("memory", "erred"):
            # erred: the task failed on its own (a step fused into it raised) and the run's other
            # outputs stand, as Dask's own tasks after a rechunk would; a failure of the run
            # itself reaches the scheduler from its rank (`RunExecutor.fail`) and aborts it
            if finish == "erred":
                run.erred[key] = error
            run.pending.discard(key)
            if not run.pending:
                self.finish(token)
        elif finish == "forgotten":
            run.pending.discard(key)
            if not run.pending:  # a cancel (a compute given up on an output's error): nobody waits
                self.abort(token, "all outputs forgotten", failure="error", outcome="cancelled")

    def _barrier_transition(self, token: str, finish: str, stimulus_id: str, error: str | None) -> None:
        rechunk = self.by_token.get(token)
        if finish == "memory":
            if rechunk is not None and rechunk.pending_restart is not None:  # after this transition
                self.scheduler.loop.add_callback(self._restart_pending, token)
        elif finish in ("released", "erred", "forgotten"):
            if self.active(token) is not None:
                failure = "restart" if finish == "released" else "error"
                self.abort(token, f"barrier {finish} ({stimulus_id})", failure=failure)
            elif finish == "erred" and self._last_outcome(token) != "failed":
                # refused at its barrier (memory, engine) or a task before it failed: no run ended so
                blame = getattr(self.scheduler.tasks.get(BARRIER_PREFIX + token), "exception_blame", None)
                text = error or getattr(blame, "exception_text", None)  # (None for a KilledWorker)
                why = f"{blame.key if blame else 'its barrier'} failed ({stimulus_id})" + (
                    f": {text}" if text else ""
                )
                self.history.append({"token": token, "outcome": "failed", "why": why})
            if finish == "forgotten":  # nobody can ask for this rechunk again: workers forget it too
                self.by_token.pop(token, None)
                self.send(list(self.scheduler.workers), m.Forget(token))

    def _last_outcome(self, token: str) -> str | None:
        """The outcome of the latest entry of the history for rechunk ``token``, or None."""
        return next((h["outcome"] for h in reversed(self.history) if h["token"] == token), None)

    def under_way(self) -> list[str]:
        """The rechunks (tokens) whose barrier task the scheduler holds: submitted, not forgotten.
        Read from the tasks (a plugin registered by a stage task missed their first transitions);
        a scan of every key, done when a worker leaves."""
        n = len(BARRIER_PREFIX)
        return [k[n:] for k in self.scheduler.tasks if type(k) is str and k.startswith(BARRIER_PREFIX)]

    def worker_left(self, worker: str) -> None:
        """``worker`` left: runs it was a rank of restart, its staged chunks are gone."""
        self.send(list(self.scheduler.workers), m.Gone(worker))  # (aborted runs stop completing)
        # its staged chunks are gone, while copies of their stage markers may live on
        stale = [k for k, w in self.stage_home.items() if w == worker]
        for key in stale:
            del self.stage_home[key]
        for token, rechunk in list(self.by_token.items()):
            run = rechunk.active
            if run is not None and worker in run.spec.workers:
                mine = [k for k in stale if k[0] == STAGE_PREFIX + token]
                self.restart_once_barrier_done(token, f"worker {worker} left during {run.spec.name()}", mine)

    def clear(self) -> None:
        """The cluster restarted (distributed's ``restart`` hook): every run and staged chunk is gone."""
        self.by_token.clear()
        self.by_output.clear()
        self.stage_home.clear()


def _restart_recommendations(tasks: dict, token: str, stale=()) -> dict:
    """What to release so that dask runs the rechunk's barrier again: the barrier, its unpack
    tasks not yet done, and the ``stale`` stage keys (their staged chunks are gone)."""
    barrier = tasks.get(BARRIER_PREFIX + token)
    if barrier is None:
        return {}
    recs = {
        dt.key: "released" for dt in barrier.dependents if dt.state in ("processing", "waiting", "no-worker")
    }
    if barrier.state in ("memory", "processing"):
        recs[barrier.key] = "released"
    recs.update({k: "released" for k in stale if k in tasks and tasks[k].state == "memory"})
    return recs
