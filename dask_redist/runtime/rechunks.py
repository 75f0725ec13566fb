"""The scheduler's state of each collective rechunk across its runs.

A rechunk (one token) can run several times: a worker that held staged inputs
leaves, a rank finds its state stale, an engine cannot start under ``engine: auto``.
`Rechunk` keeps what spans those runs (restarts, the active run, a restart
waiting for the barrier task: `PendingRestart`); `ActiveRun` what one run pinned and
waits for; `RunIds` each rechunk's next run id. Restarts themselves are
`dask_redist.runtime.lifecycle`'s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from dask_redist.core.spec import RunSpec


@dataclass
class ActiveRun:
    """A run the scheduler started and has not finished: what it pinned, what it waits for."""

    spec: RunSpec
    pending: set  # keys of unpack tasks not yet in memory
    restrictions: dict  # original worker restrictions of the pinned unpack tasks
    nbytes: int
    moved: int
    started: float = field(default_factory=time.time)
    #: unpack tasks that failed on their own, the run done (a step fused into them raised), and
    #: their errors: the run's other outputs stand (`lifecycle.Rechunks`)
    erred: dict = field(default_factory=dict)

    def history(self, outcome: str, ended: str | None = None) -> dict:
        """This run's entry of the history (``dask_redist.status(client)["history"]``): its why is
        why the run ended so where it did not end done (``ended``: the abort's reason), the
        engine's reason after it."""
        why = self.spec.reason
        if self.erred:
            key, error = next(iter(self.erred.items()))
            which = f"{len(self.erred)} output tasks failed after the exchange, the first {key}"
            which = which if len(self.erred) > 1 else f"output task {key} failed after the exchange"
            why = f"{which}: {error or 'no error text'} (engine: {why})"
        elif ended:
            why = f"{ended} (engine: {why})"
        return {
            "token": self.spec.token,
            "run": self.spec.run_id,
            "engine": self.spec.engine,
            "why": why,
            "workers": len(self.spec.workers),
            "bytes": self.nbytes,
            "bytes moved": self.moved,
            "seconds": round(time.time() - self.started, 6),
            "outcome": outcome,
        }


@dataclass
class PendingRestart:
    """A restart asked for while the barrier task was still processing (module docstring)."""

    run_id: int  # the run it restarts: dropped if another run is active by then
    reason: str  # the first reason given
    stale: list  # stage keys whose staged chunks are gone, accumulated


@dataclass
class Rechunk:
    """One collective rechunk (one token) across its runs."""

    token: str
    restarts: int = 0  # restarts since a run last finished (bounded by redist.retries)
    active: ActiveRun | None = None
    pending_restart: PendingRestart | None = None
    #: (barrier TaskState, run id, needed) of the last run started: a barrier result that is not
    #: that run is stale (a cancelled execution distributed re-adopted for a resubmitted key), and
    #: so is one for an output the run did not include (`barrier_is_current`)
    barrier: tuple | None = None


class RunIds:
    """The next run id of each rechunk. Ids count on across a rechunk's lifetimes: a token
    persisted again after it was forgotten must not reuse an id that a worker (or a late
    message) may still know. The ``kept`` most recently used tokens are remembered."""

    def __init__(self, kept: int = 100_000):
        self.kept = kept
        self._last: dict[str, int] = {}

    def next(self, token: str) -> int:
        self._last[token] = self._last.pop(token, 0) + 1  # (moved to the end: the newest)
        while len(self._last) > self.kept:
            del self._last[next(iter(self._last))]
        return self._last[token]


def barrier_is_current(rechunk: Rechunk | None, ts, run_id: int, index: int) -> bool:
    """Whether output chunk ``index`` is still owed by run ``run_id``, the run started for barrier
    task ``ts`` as it is now; if not, the barrier's result is stale for it
    (`RedistSchedulerPlugin.stale`). It is stale when

    * no run was started for this barrier task (distributed re-adopted a cancelled execution);
    * the run did not include the output: the rechunk persisted again onto a live barrier task,
      its outputs released one by one meanwhile, adds outputs that the run does not hold;
    * the run delivered it already, or has ended: the output task runs again (its key was
      forgotten and submitted again, or its chunk was lost with a worker).
    """
    if rechunk is None or rechunk.barrier is None or rechunk.active is None:
        return False
    barrier_ts, barrier_run, needed = rechunk.barrier
    run = rechunk.active
    return (
        barrier_ts is ts
        and barrier_run == run_id == run.spec.run_id
        and bool(needed[index])
        and run.spec.collective.output_key(index) in run.pending
    )


def ranks_of(workers: list[str], holders: list[int], alive) -> tuple[list[str], np.ndarray]:
    """The run's ranks (every worker alive, and those holding inputs) and each input chunk's rank."""
    ranks = sorted(set(alive) | set(workers))
    position = {w: i for i, w in enumerate(ranks)}
    return ranks, np.array([position[workers[h]] for h in holders], dtype=np.int64)
