"""Engines for tests: fault injection, selected with ``redist.engine="engines:SlowEngine"`` (a third
engine of its own is a package of its own: tests/third_party_engine)."""

from __future__ import annotations

import os
import tempfile
import time

from dask_redist.engines import Health
from dask_redist.engines.dask import DaskDescription, DaskEngine


class SlowEngine(DaskEngine):
    """The dask engine, after a pause: a window to kill a worker mid-exchange."""

    pause = 3.0

    def execute(self, run, transport):
        run.set_phase("exchange")
        deadline = time.monotonic() + self.pause
        while time.monotonic() < deadline and run.state != "failed":
            time.sleep(0.05)
        super().execute(run, transport)


class StallingEngine(DaskEngine):
    """The last rank never sends (until the run is aborted): the others must time out."""

    def execute(self, run, transport):
        if run.rank == len(run.spec.workers) - 1:
            run.set_phase("stalled")
            deadline = time.monotonic() + 120
            while run.state != "failed" and time.monotonic() < deadline:
                time.sleep(0.05)
            run.set_phase("stalled")  # raises the abort error
        super().execute(run, transport)


class FailingEngine(DaskEngine):
    """Rank 0 raises at once: the others must be released without waiting for a timeout."""

    def execute(self, run, transport):
        if run.rank == 0:
            raise ValueError("injected failure on rank 0")
        super().execute(run, transport)


class UnavailableEngine(DaskEngine):
    """Every rank refuses to start, as cufftmp does when NVSHMEM's heap cannot fit the GPU."""

    def execute(self, run, transport):
        from dask_redist.errors import EngineUnavailableError

        raise EngineUnavailableError(f"{run.name()}: cannot start here: set redist.injected-key lower")


class PreferredDescription(DaskDescription):
    """``auto`` tries it before every built-in engine."""

    preference = 100


class PreferredUnavailableEngine(UnavailableEngine):
    """`UnavailableEngine`, which ``auto`` tries first (register it in ``redist.engines``)."""

    description = PreferredDescription


class PreferredWorldDescription(PreferredDescription):
    """``auto`` tries it first; it has a world, as cufftmp has NVSHMEM's."""

    world = True
    world_name = "the stand-in's world"


class PreferredFailingWorldEngine(FailingEngine):
    """`FailingEngine` with a world, which ``auto`` tries first: a failed run leaves its world
    not to be trusted, as a cufftmp run's failure leaves NVSHMEM's."""

    description = PreferredWorldDescription


class PreferredStallingWorldEngine(StallingEngine):
    """`StallingEngine` with a world, which ``auto`` tries first: a run that timed out leaves its
    world not to be trusted, as a cufftmp run's timeout leaves NVSHMEM's."""

    description = PreferredWorldDescription


class RestartingEngine(DaskEngine):
    """Run 1: rank 0 finds its state stale and asks for a restart; later runs work."""

    def execute(self, run, transport):
        from dask_redist.errors import RedistConsistencyError

        if run.run_id == 1 and run.rank == 0:
            time.sleep(0.5)  # this rank's unpack tasks are waiting for the run by now
            raise RedistConsistencyError(f"{run.name()}: injected stale state")
        super().execute(run, transport)


class PeerDiesEngine(DaskEngine):
    """Run 1: the last rank's process dies mid-run while rank 0 does `survive`. Later runs work."""

    stuck = False  # (pretend) GPU work of an aborted run can never finish here
    in_flight_since = None  # (pretend) GPU work that only peers can complete was queued then

    def health(self) -> Health:
        return Health(None, self.stuck, self.in_flight_since)

    def execute(self, run, transport):

        if run.run_id == 1 and run.rank == len(run.spec.workers) - 1:
            time.sleep(0.5)
            os._exit(1)
        if run.run_id == 1 and run.rank == 0:
            self.survive(run)
        super().execute(run, transport)

    def survive(self, run):
        pass


class StuckEngine(PeerDiesEngine):
    """Rank 0 sits in a call that ignores the abort (as NVSHMEM's bootstrap does, retrying
    the dead peer)."""

    stuck_for = 30.0

    def survive(self, run):
        run.set_phase("stuck")
        time.sleep(self.stuck_for)  # never looks at the run's state


class StuckGpuEngine(PeerDiesEngine):
    """Rank 0 finds its (pretend) GPU work stuck waiting for the dead peer, as cufftmp
    does when a peer dies inside a reshape."""

    stuck = False

    def survive(self, run):
        deadline = time.monotonic() + 60
        while run.state != "failed" and time.monotonic() < deadline:
            time.sleep(0.05)
        self.stuck = True
        run.set_phase("exchange")  # raises the abort's error


class BlockedGpuEngine(PeerDiesEngine):
    """Rank 0 has (pretend) GPU work in flight that waits for the dead peer, and its thread
    blocks in a call that never returns, as a kernel launch does once the GPU's queue is
    full behind an NVSHMEM wait for a dead peer."""

    watched = True  # as cufftmp: the worker runs a watchdog for it

    def survive(self, run):
        self.in_flight_since = time.monotonic()
        time.sleep(300)  # ignores the abort and never reaches a check


class FrozenGpuEngine(BlockedGpuEngine):
    """Rank 0's thread blocks in a native call that holds the interpreter lock, as NVSHMEM's
    host-side wait for a dead PE did on PEs sharing a GPU: no Python thread of the process runs."""

    def survive(self, run):
        import ctypes

        self.in_flight_since = time.monotonic()
        ctypes.PyDLL(None).sleep(300)  # (PyDLL: the lock is held through the call)


class FrozenAmongLiveEngine(FrozenGpuEngine):
    """`FrozenGpuEngine`'s rank 0, its peers all alive: they time out sending to it before its
    watchdog's grace is over and its dead man's switch ends the process."""

    def execute(self, run, transport):
        if run.run_id == 1 and run.rank == 0:
            self.survive(run)
        DaskEngine.execute(self, run, transport)


class StopsItselfEngine(DaskEngine):
    """Run 1: rank 0's process stops itself (SIGSTOP) 2 s into the run, before sending anything
    (the test resumes it)."""

    after_s = 2.0

    def execute(self, run, transport):
        import signal

        if run.run_id == 1 and run.rank == 0:
            time.sleep(self.after_s)
            os.kill(os.getpid(), signal.SIGSTOP)
        super().execute(run, transport)


class StopsAtOnceEngine(StopsItselfEngine):
    """As `StopsItselfEngine`, at the run's start: the run starts before its barrier task has run
    (`runtime.eager`), which may still be fetching a stage marker from the stopped worker."""

    after_s = 0.0


class StopsAfterBarrierEngine(DaskEngine):
    """Run 1: the rank whose worker ran the barrier task stops itself (SIGSTOP) once the scheduler
    handed the unpack tasks out: the other ranks' unpack tasks wait to fetch the barrier's result
    from it (the ranks that did not run it go on once they see that)."""

    def execute(self, run, transport):
        import signal

        from distributed.worker import Worker

        if run.run_id == 1:
            (worker,) = [w for w in Worker._instances if w.address == run.address]
            barrier, outputs = run.spec.collective.barrier_key, set(run.spec.collective.output_keys())
            deadline = time.monotonic() + 10  # (a busy machine's barrier task; the test allows 30 s)
            while time.monotonic() < deadline:
                ts = worker.state.tasks.get(barrier)
                ran = ts is not None and any(s.get("action") == "compute" for s in ts.startstops)
                if ts is not None and ts.state not in ("waiting", "ready", "executing") and not ran:
                    break  # (fetched from elsewhere: not the rank that ran it)
                if ran and ts.state == "memory" and outputs & set(worker.state.tasks):
                    os.kill(os.getpid(), signal.SIGSTOP)
                    break
                time.sleep(0.001)
        super().execute(run, transport)


class BlockedBootstrapEngine(BlockedGpuEngine):
    """Rank 0's thread blocks before any GPU work, as in NVSHMEM's bootstrap retrying the dead
    peer's socket: nothing is in flight, and the abort is never seen."""

    def survive(self, run):
        run.set_phase("bootstrap")
        time.sleep(300)


class BarrierElsewhereDiesEngine(DaskEngine):
    """Run 1: the process of a rank that did not run the barrier task dies, while that task's
    result may still be on its way to the scheduler."""

    def execute(self, run, transport):

        from distributed.worker import Worker

        if run.run_id == 1:
            (worker,) = [w for w in Worker._instances if w.address == run.address]
            if f"redist-barrier-{run.spec.token}" not in worker.state.tasks:
                time.sleep(0.3)
                os._exit(1)
        super().execute(run, transport)


class LockstepEngine(DaskEngine):
    """Ranks that must make matching calls, as cufftmp's must: each rank first queues
    `rounds_per_run` rounds on a stand-in for NVSHMEM shared by the workers of this host
    (marker files: round k completes once every rank queued it), then the data moves the
    dask engine's way. Aborts are completed as cufftmp completes them, with one `Rounds`
    per engine as cufftmp keeps (`dask_redist.engines.rounds`); a rank left waiting is
    stuck and its worker exits (redist.nvshmem.exit-when-stuck). Ranks run at different
    speeds, so they see an abort after different numbers of rounds."""

    watched = True
    completes_aborted_runs = True
    rounds_per_run = 40
    pause = 0.01  # per round, times (rank + 1)
    folder = None  # set on the workers by the test: where the marker files go

    def __init__(self):
        super().__init__()
        from dask_redist.engines.rounds import Rounds

        self.rounds = Rounds(lambda: _Done(self._complete(list(self._queued))))
        self.rounds.poll_s = 0.005
        self._queued: list = []
        self._complete = None
        self.broken = None

    def health(self) -> Health:
        return Health(self.broken or self.rounds.broken, self.rounds.stuck, self.rounds.in_flight_since)

    def abandoned(self, run) -> None:
        self.broken = f"{run.name()} was abandoned"

    def execute(self, run, transport):

        from dask_redist.errors import RedistError

        if self.health().broken:
            raise RedistError(f"{run.name()}: {self.health().broken}")
        run.set_phase("exchange")
        folder = os.path.join(self.folder, f"{run.spec.token}-{run.run_id}")
        os.makedirs(folder, exist_ok=True)
        n = len(run.spec.workers)

        def complete(rounds):
            return lambda: all(
                os.path.exists(os.path.join(folder, f"{k}.{r}")) for k in rounds for r in range(n)
            )

        self.rounds.reset()
        self._queued, self._complete = [], complete
        queued = self._queued

        def exchange(k):
            open(os.path.join(folder, f"{k}.{run.rank}"), "w").close()
            queued.append(k)
            self.rounds.queued(_Done(complete([k])))

        def work(k, go):
            time.sleep(self.pause * (run.rank + 1))
            go()

        self.rounds.run(run, self.rounds_per_run, exchange, work)
        self.rounds.wait(run)
        super().execute(run, transport)


class _Done:
    def __init__(self, test):
        self._test, self._done = test, False

    @property
    def done(self) -> bool:
        self._done = self._done or self._test()
        return self._done


class SleepingEngine(DaskEngine):
    """Every rank sleeps through its run, deaf to aborts, as ranks held inside a native call are."""

    pause = 8.0

    def execute(self, run, transport):
        run.set_phase("asleep")
        time.sleep(self.pause)
        super().execute(run, transport)


class BrieflySleepingEngine(SleepingEngine):
    """Sleeps past a soak's stall limit (2 s in tests/test_soak.py), waking while the stall's
    stacks are being taken (about a second)."""

    pause = 2.4


def unusable_gate(token: str) -> str:
    """The file whose creation lets `UnusableWorldEngine`'s run 1 of rechunk ``token`` go on."""
    return os.path.join(tempfile.gettempdir(), f"redist-test-unusable-{token}")


class UnusableWorldEngine(DaskEngine):
    """Run 1: every rank waits for its `unusable_gate`, then rank 0 refuses the run as a survivor of
    an NVSHMEM world that lost a PE does (cufftmp's ``prepare``), the others go on. Later runs work."""

    def execute(self, run, transport):
        from dask_redist.errors import RedistError

        if run.run_id == 1:
            deadline = time.monotonic() + 60
            while not os.path.exists(unusable_gate(run.spec.token)) and time.monotonic() < deadline:
                time.sleep(0.05)
            if run.rank == 0:
                raise RedistError(
                    f"{run.name()}: NVSHMEM is unusable in this worker: worker tcp://gone:1 of this worker's "
                    "NVSHMEM world left, and NVSHMEM cannot leave a world that lost a PE"
                )
        super().execute(run, transport)
