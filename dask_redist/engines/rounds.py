"""Rounds of collective calls queued on a device, and how an abort ends them.

An engine whose ranks make collective calls (cufftmp: every round is an NVSHMEM reshape
that completes only once every rank queued it) queues its rounds asynchronously and
tracks each by an event (anything with a ``done`` property: a CUDA event on the GPU, a
stand-in in tests). Its thread never blocks inside a device call, which a reshape
waiting for a dead peer could hold forever: it waits here, by polling, where it sees
aborts and timeouts. At most `ROUNDS_AHEAD` rounds are queued ahead.

**Aborts are completed, dry.** A rank that stopped at its next round boundary would
leave every peer that had queued more rounds waiting inside a reshape that never ends
(its worker would then have to exit), and the runs that follow would pair one rank's
calls with another run's. So once a run is aborted (a cancel, released outputs, a
superseded run, or this rank's own work failing) each rank still queues the reshape of
every remaining round, its copies skipped, and a run aborted before its rank started it
is executed the same way (`dask_redist.runtime.collective.RunExecutor`); then every
rank raises. An aborted run costs at most its own exchange time, and no worker. Only
when a rank is gone (`WorkerRun.must_stop`: the scheduler saw it leave, in the abort or
in a ``redist-gone`` message for runs aborted before) can nothing complete those calls:
the queued rounds get `DRAIN_S`, then the device counts as stuck
(``redist.nvshmem.exit-when-stuck``; docs/reliability.md).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable

from dask_redist.errors import RedistTimeoutError

#: Rounds queued on the device ahead of the one it runs. Bounded so that the engine's thread
#: never blocks inside a device call (a launch into a full queue) behind a reshape that waits
#: for a dead peer: it waits in `Rounds.wait`, where it sees aborts and timeouts.
ROUNDS_AHEAD = 4
#: Seconds the rounds queued by a run that must stop may take to complete before the device
#: counts as stuck (shorter than the watchdog's grace, `dask_redist.runtime.collective.STUCK_GRACE_S`).
DRAIN_S = 5.0


class Rounds:
    """The rounds one engine has queued on its device, oldest first.

    ``mark``: a function returning a new event recorded after all work queued so far.
    ``stuck``/``broken`` tell the engine's `Health` that queued work can never finish.
    """

    poll_s = 0.0001  # between looks at an event: about the shortest round on the GPU, so a wait adds little

    def __init__(self, mark: Callable[[], object]):
        self._mark = mark
        self.pending: deque = deque()  # (event after a round's reshape, when it was queued)
        self.in_flight_since: float | None = None  # the oldest work not yet seen done was queued then
        self.stuck = False
        self.broken: str | None = None
        self.ahead_s = 0.0  # the current run's time waiting for a place in the queue (`next_round`)

    def reset(self) -> None:
        """A new run (an earlier run that raised has drained by now)."""
        self.pending.clear()
        self.in_flight_since = None
        self.ahead_s = 0.0

    def queued(self, event) -> None:
        """A round's reshape was queued; ``event`` completes after it."""
        now = time.monotonic()
        self.pending.append((event, now))
        if self.in_flight_since is None:
            self.in_flight_since = now

    def next_round(self, run) -> bool:
        """Before queuing a round: keep `ROUNDS_AHEAD` at most queued; False once the run was
        aborted (the round's reshape is then queued alone); raises if the run must stop."""
        since = time.monotonic()
        while len(self.pending) >= ROUNDS_AHEAD:
            self.wait(run, self.pending[0][0], dry=True)
        self.ahead_s += time.monotonic() - since
        if run.must_stop():
            self.wait(run)  # raises, and marks the device stuck if it still waits on a peer
        return run.state != "failed"

    def run(self, run, count: int, exchange: Callable[[int], None], work) -> None:
        """Queue ``count`` rounds: ``work(k, go)`` stages round k, calls ``go()`` (which calls
        ``exchange(k)``, the round's reshape) once, and unstages. Once the run is aborted, or
        ``work`` raised, the remaining rounds are queued dry, their reshapes alone; this
        rank's own error is raised after (an abort's error: by the engine's last `wait`)."""
        error = None
        for k in range(count):
            queued = []

            def go(k=k, queued=queued):
                exchange(k)
                queued.append(k)

            if self.next_round(run) and error is None:
                try:
                    work(k, go)
                except Exception as e:  # noqa: BLE001 - the peers' rounds must still be matched
                    error = e
            if not queued:
                go()
        if error is not None and run.state != "failed":
            self.wait(run, dry=True)
            raise error

    def wait(self, run, event=None, dry: bool = False) -> None:
        """Wait for ``event`` (default: all work queued so far) without blocking in the device.

        ``dry``: an abort does not end this wait (the run is being completed) unless the run
        must stop. Otherwise an abort lets the queued rounds drain for `DRAIN_S`, since the
        peers complete them too; if the device still waits inside a collective then (a peer
        died, or stopped before queuing a round this rank queued), or the run times out,
        that collective can never finish: ``broken`` (later runs fail fast and the
        scheduler moves them to the dask engine) and ``stuck`` (the worker may exit).
        """
        everything = event is None
        if everything:
            event = self._mark()
        deadline, drained_by = time.monotonic() + run.timeout, None
        while not event.done:
            now = time.monotonic()
            if drained_by is None and run.state == "failed" and (not dry or run.must_stop()):
                drained_by = now + DRAIN_S
            if (drained_by is not None and now > drained_by) or now > deadline:
                self.broken = f"{run.name()} was left unfinished on the GPU"
                self.stuck = True  # that kernel never ends: see redist.nvshmem.exit-when-stuck
                if run.state == "failed":
                    raise run.failure()
                raise RedistTimeoutError(
                    f"{run.name()} timed out after {run.timeout:g}s in phase 'exchange' on the GPU "
                    "(a peer never joined the reshape); raise redist.timeouts.collective if it is just slow"
                )
            time.sleep(self.poll_s)
        while self.pending and self.pending[0][0].done:
            self.pending.popleft()
        self.in_flight_since = self.pending[0][1] if self.pending else None
        if run.state == "failed" and (not dry or run.must_stop()):
            if not everything:  # rounds queued after ``event`` may still wait for a peer
                self.wait(run)  # (raises)
            raise run.failure()
