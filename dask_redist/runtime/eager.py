"""Starting a run as soon as its stage tasks are done, before its barrier task asks.

The barrier task can only ask for a run once it runs: the scheduler sends it to a worker on
its batched stream (every 5 ms), that worker fetches the other workers' markers and calls
back. Each stage task therefore also tells the scheduler what it staged (`messages.StageDone`,
an event on the worker's stream, written with the task's own result and just ahead of it),
and when the barrier task becomes ready the scheduler plugin has everything the barrier would
send and starts the run at once. The barrier task's call, when it comes, is answered with that
run (`EagerStarts.started`).

A stage task whose event is missing (the plugin was registered after it ran) or does not match
where its key lives now, or chunks of mixed types, leave the start to the barrier task, as
without this.
"""

from __future__ import annotations

import asyncio
import logging

from dask_redist.core import messages as m
from dask_redist.core.spec import STAGE_PREFIX

logger = logging.getLogger("dask_redist")


class EagerStarts:
    """What the stage tasks said they staged (by stage key), and the runs started from it (by
    token, with the barrier task they answer)."""

    def __init__(self):
        self._staged: dict = {}  # stage key -> (worker, indices, chunk type)
        self._started: dict = {}  # token -> (barrier TaskState, future of the barrier's reply)

    def staged(self, worker: str, event: m.StageDone, tasks) -> bool:
        """Keep what a stage task staged, unless its task (in ``tasks``, the scheduler's) is no
        longer processing: released meanwhile (a cancel), its result is ignored and nothing would
        drop the event."""
        key = (STAGE_PREFIX + event.token, *event.tail)
        if (ts := tasks.get(key)) is None or ts.state != "processing":
            return False
        self._staged[key] = (worker, list(event.indices), event.chunk_type)
        return True

    def dropped(self, stage_key) -> None:
        """The stage key left memory (its chunks are dropped)."""
        self._staged.pop(stage_key, None)

    def request(self, token: str, barrier) -> m.Barrier | None:
        """What barrier task ``barrier`` (its TaskState, ready) would send, from the stage tasks'
        events; None where one is missing or stale, or the chunks' types differ."""
        stages = []
        for dep in barrier.dependencies:
            seen = self._staged.get(dep.key)
            if seen is None or dep.state != "memory" or seen[2] == "mixed":
                return None
            worker, indices, chunk_type = seen
            if worker not in {ws.address for ws in dep.who_has}:
                return None
            stages.append((worker, dep.key[1:], indices, {chunk_type}))  # (the key's tail)
        try:
            return m.Barrier.of(token, stages, token)
        except TypeError:  # (the barrier task raises it, naming the rechunk)
            return None

    def start(self, token: str, barrier, reply) -> None:
        """``reply`` (a coroutine) starts the run that answers ``barrier``; run now."""
        future = asyncio.ensure_future(reply)
        future.add_done_callback(_log_failure)
        self._started[token] = (barrier, future)

    def started(self, token: str, barrier):
        """The reply to ``barrier``'s call, where its run was started here (a future), else None."""
        started = self._started.get(token)
        return started[1] if started is not None and started[0] is barrier else None

    def barrier_left(self, token: str) -> None:
        """The barrier task is no longer processing: whatever it answers was answered."""
        self._started.pop(token, None)

    def clear(self) -> None:
        self._staged.clear()
        self._started.clear()


def _log_failure(future: asyncio.Future) -> None:
    if not future.cancelled() and (e := future.exception()) is not None:
        logger.error("starting a run before its barrier task asked failed", exc_info=e)


def forget_events(scheduler, topic: str) -> None:
    """Drop the events of ``topic`` that ``scheduler`` keeps, once read: distributed keeps the last
    ``distributed.admin.low-level-log-length`` of every topic for the session, and a stage task's
    event carries the indices of its chunks (thousands, with one stage task per worker).
    ``Scheduler._broker`` is private: where it is missing, they stay."""
    truncate = getattr(getattr(scheduler, "_broker", None), "truncate", None)
    if truncate is not None:
        truncate(topic)
