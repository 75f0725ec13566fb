"""A rank's timeout, on the scheduler: the run is aborted once its ranks answered, or once the
silent ones had the grace their watchdog gives them to leave.

A peer frozen inside a native call that holds the interpreter lock answers nothing, and its own
watchdog ends its process a grace after its own timeout (`dask_redist.runtime.collective`),
which may come after this rank's: the restart once it leaves finishes the rechunk, rather than
the timeout failing the user's computation. So ranks that do not answer get that grace to leave;
if every rank answers, the run is aborted at once.
"""

from __future__ import annotations

import asyncio
import time

from dask_redist.core.spec import RunSpec
from dask_redist.errors import FAILURES
from dask_redist.runtime import collective
from dask_redist.runtime.rendezvous import ask_each

PEER_ANSWER_S = 5.0  # for each rank's answer after a run timed out (`TimedOutRuns.hold`)
PEER_ANSWER_MIN_S = 1.0  # ... at least, whatever the collective timeout (a live worker answers in time)


class TimedOutRuns:
    """The runs whose timeout waits on silent ranks, of the scheduler plugin's ``rechunks``
    (`dask_redist.runtime.lifecycle.Rechunks`, which knows the scheduler)."""

    def __init__(self, rechunks):
        self.rechunks = rechunks
        self._held: set = set()  # (token, run id)

    def abort_unless_a_rank_leaves(self, spec: RunSpec, message: str) -> None:
        """Abort run ``spec`` for a rank's timeout, once its ranks answered, or the silent ones had
        the time to leave (`hold`). The first timeout of a run is the one held."""
        if (spec.token, spec.run_id) not in self._held:
            self._held.add((spec.token, spec.run_id))
            self.rechunks.scheduler.loop.add_callback(self.hold, spec, message)

    async def hold(self, spec: RunSpec, message: str) -> None:
        """Ask the ranks of ``spec`` whether they are there, wait for the silent ones to leave, then
        abort the run unless a rank left (its restart is under way). The wait is at most the
        collective timeout too (the unpack tasks give up a timeout and 5 s later), the question at
        least a second (a timeout far too short, a wrong unit, named every live worker "stopped or
        frozen")."""
        timeout = spec.collective.settings.collective_timeout
        deadline = time.monotonic() + min(collective.STUCK_GRACE_S + PEER_ANSWER_S, timeout)
        try:
            ask = min(PEER_ANSWER_S, max(timeout, PEER_ANSWER_MIN_S))
            answers = await ask_each(self.rechunks.scheduler, {"op": "identity"}, spec.workers, ask)
            silent = [w for w, a in answers.items() if not isinstance(a, dict)]
            while silent and time.monotonic() < deadline and self._undecided(spec):
                await asyncio.sleep(0.1)
            if self._undecided(spec):
                if silent:
                    message += f" (workers {silent} answered nothing either: stopped or frozen?)"
                self.rechunks.abort(spec.token, message, failure="timeout")
                if silent:  # (its barrier or unpack tasks may be waiting for one of them)
                    self.rechunks.fail_stuck(spec.collective, FAILURES["timeout"](message), silent)
        finally:
            self._held.discard((spec.token, spec.run_id))

    def _undecided(self, spec: RunSpec) -> bool:
        """Is run ``spec`` still active, with no worker of it gone (whose restart is under way)?"""
        active = self.rechunks.active(spec.token, spec.run_id) is not None
        return active and not self.rechunks.worker_left_during(spec.token)
