"""What the runtime asks of an engine, and what an engine may ask of the runtime.

An engine moves one rank's pieces of a run. The worker side of the runtime asks it to

* ``execute(run, transport)``: do this rank's part of ``run`` (a `dask_redist.core.run.WorkerRun`)
  and finish it with its output chunks; raise to fail it;
* ``abandoned(run)``: ``run`` was aborted while ``execute`` was inside a call that ignores
  aborts, and later runs go on without it;
* ``worker_left(address)``: a worker of the cluster left (died or retired); an engine that
  keeps a world spanning it learns that the world cannot be left normally any more;
* ``health()``: whether it can still run here (`Health`): read after every run, and by the
  watchdog while a run is in flight;
* ``stats()``: counters for benchmarks and ``bootstrap()``;
* ``capabilities()``: whether this process can run it at all (probed once per worker and
  reported to the scheduler, which chooses engines with `dask_redist.engines.choice`).

The runtime gives it a `Transport`: how to reach the other ranks. Engines know nothing else
of the cluster. Its scheduler side is ``description``, an
`dask_redist.engines.description.EngineDescription` subclass. An engine of one's own:
subclass both, and name the engine class in ``redist.engines`` (docs/design.md, "Add an engine").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from dask_redist.engines.description import EngineDescription

if TYPE_CHECKING:
    from dask_redist.core.run import WorkerRun


@dataclass(frozen=True)
class Health:
    """An engine's state in this process, as the runtime needs it."""

    #: why this engine cannot be trusted in this process any more (later runs fail fast), or None
    broken: str | None = None
    #: work of an aborted run can never finish in this process (a GPU kernel waiting for a dead
    #: peer): the worker exits so that its nanny starts a fresh one (redist.nvshmem.exit-when-stuck)
    stuck: bool = False
    #: ``time.monotonic()`` when the oldest work that only peers can complete was queued, or None;
    #: the watchdog ends the process if ``execute`` blocks behind such work past the timeouts
    in_flight_since: float | None = None


class Transport(Protocol):
    """How an engine reaches the other ranks of a run (injected, so tests can fake it)."""

    def send(self, batches: list) -> None:
        """Deliver ``(dst_rank, first, Packed)`` batches; raise on failure or timeout."""

    def exchange_factory(self, rank: int, nranks: int) -> Callable[[str, bytes], list]:
        """An all-gather among the run's ranks (through the scheduler), for bootstraps."""

    def wire_limit(self, dst: int) -> int | None:
        """Optional. Where messages to rank ``dst`` are copied through a socket: the most bytes a
        message should hold (a larger one the wire splits, and the receiver copies back together).
        None: messages are not copied (a buffer sent may still be in use once ``send`` returned)."""


class Engine:
    """Base of every engine: the protocol, with the defaults of an engine that keeps no state."""

    name: str = ""
    #: its scheduler side: what it refuses, when ``auto`` takes it, its world, its lines
    description: type[EngineDescription] = EngineDescription
    #: whether ``execute`` can block behind work only peers can complete (then a watchdog runs)
    watched: bool = False
    #: whether every rank must make the same sequence of calls (NVSHMEM collectives): then a run
    #: whose start reached this rank is executed to its end even when aborted, its copies
    #: skipped (`WorkerRun.must_stop` says when not: a rank is gone)
    completes_aborted_runs: bool = False
    #: what a stuck run (`Health.stuck`) left on this worker, as the log line of its exit says it
    stuck_wording: str = "engine waiting on work that only a gone peer could finish"

    def execute(self, run: WorkerRun, transport: Transport) -> None:
        raise NotImplementedError

    def abandoned(self, run: WorkerRun) -> None:
        """``run`` was aborted but ``execute`` never returned; later runs use a new thread."""

    def worker_left(self, address: str) -> None:
        """The worker at ``address`` left the cluster (called on the worker's event loop: be quick)."""

    def health(self) -> Health:
        return Health()

    def stats(self) -> dict:
        return {}

    @staticmethod
    def capabilities() -> dict:
        """Can this process run the engine? ``{"ok": bool, "reason": str, ...}``."""
        return {"ok": True, "reason": "needs nothing beyond distributed"}
