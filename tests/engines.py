"""Engines for tests: fault injection, selected with ``redist.engine="engines:SlowEngine"``, and a
third engine of its own (`FolderEngine`), registered with ``redist.engines``."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import time

import numpy as np

from dask_redist.engines import Engine, EngineDescription, Health, Request
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
        import os

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
        import os

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
        import os

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


# -- a third engine, registered by configuration alone (tests/test_third_engine.py) ----------

#: Where the folder engine's ranks leave each other's pieces (every worker of one host shares it).
FOLDER = os.path.join(tempfile.gettempdir(), "dask-redist-folder-engine")


class FolderDescription(EngineDescription):
    """The folder engine as the scheduler sees it: ``auto`` takes it for integer NumPy chunks
    (after cufftmp, before dask) where every worker can write `FOLDER` on one host."""

    preference = 10
    probes = True  # every worker says whether it can write the folder, and on which host

    def declines(self, request: Request) -> str | None:
        if request.chunk_type != "numpy":
            return f"{request.chunks}: the folder engine takes NumPy chunks"
        if request.dtype is not None and np.dtype(request.dtype).kind not in "iu":
            return f"NumPy chunks of {request.dtype}: the folder engine takes integers"
        return None

    def unable(self, answers: dict[str, dict], request: Request) -> str | None:
        if bad := [w for w, a in answers.items() if not a.get("ok")]:
            return f"{bad[0]} cannot write {FOLDER}"
        if len({a.get("host") for a in answers.values()}) > 1:
            return "the workers are on several hosts: the folder engine needs one"
        return None

    def chosen(self, request: Request, passed_over: list[str]) -> str:
        return "integer NumPy chunks, every worker on one host: through files"

    def mapping(self, plan, settings) -> tuple[str, int, int]:
        return f"one file per pair of ranks in {FOLDER}", 0, 1

    def doctor_line(self, reports: dict[str, dict]) -> str:
        hosts = sorted({r.get("capabilities", {}).get("host") for r in reports.values()})
        return f"every worker writes {FOLDER}" + (
            f" on {hosts[0]}" if len(hosts) == 1 else f" on {len(hosts)} hosts"
        )


class FolderEngine(Engine):
    """Pieces through files in one folder: each rank writes what it sends to each peer into one
    file (`dask_redist.core.wire`'s packed buffer), renamed into place when complete; each rank
    waits for the files it receives, reads and removes them. A real engine of a few lines."""

    name = "folder"
    description = FolderDescription
    poll_s = 0.01

    @staticmethod
    def capabilities() -> dict:
        os.makedirs(FOLDER, exist_ok=True)
        ok = os.access(FOLDER, os.W_OK)
        return {
            "ok": ok,
            "reason": f"writes {FOLDER}" if ok else f"cannot write {FOLDER}",
        }  # (and its host: the registry adds each worker's, dask_redist.config.host)

    def execute(self, run, transport):
        from dask_redist.core.assemble import cut
        from dask_redist.core.wire import Packed, pack
        from dask_redist.errors import RedistTimeoutError

        run.set_phase("send")
        ranks = hashlib.sha1(" ".join(run.spec.workers).encode()).hexdigest()[:12]  # (one cluster's run)
        folder = os.path.join(FOLDER, f"{run.spec.token}-{run.run_id}-{ranks}")
        os.makedirs(folder, exist_ok=True)
        rechunk = run.spec.collective.rechunk
        t = run.plan.transfers
        sends = t.take(t.src == run.rank)
        sends = sends.take(sends.canonical_order())
        for dst in sorted(set(sends.dst.tolist())):
            mine = sends.take(sends.dst == dst)
            arrays = [
                cut(run.inputs[int(f)], rechunk.old_box(int(f))[0], lo, hi)
                for f, lo, hi in zip(mine.old_block, mine.lo, mine.hi)
            ]
            if dst == run.rank:
                run.receive(run.rank, 0, arrays)
                continue
            path = os.path.join(folder, f"{run.rank}-{dst}")
            pack(arrays, mine.nbytes).tofile(path + ".part")
            os.replace(path + ".part", path)
        run.inputs = {}
        recv = t.take(t.dst == run.rank)
        recv = recv.take(recv.canonical_order())
        for src in sorted(set(recv.src.tolist()) - {run.rank}):
            path = os.path.join(folder, f"{src}-{run.rank}")
            deadline = time.monotonic() + run.timeout
            while not os.path.exists(path):
                run.set_phase("exchange")  # raises once the run is aborted
                if time.monotonic() > deadline:
                    raise RedistTimeoutError(
                        f"{run.name()}: no file from rank {src} in {folder} after {run.timeout:g}s"
                    )
                time.sleep(self.poll_s)
            buffer = np.fromfile(path, dtype=np.uint8)
            os.remove(path)
            run.receive(src, 0, Packed(int((recv.src == src).sum()), buffer))
        with contextlib.suppress(OSError):  # (the last rank to finish removes it)
            os.rmdir(folder)
        run.finish(run.assemblies(run.wait_received(recv)))


class SleepingEngine(DaskEngine):
    """Every rank sleeps through its run, deaf to aborts, as ranks held inside a native call are."""

    pause = 8.0

    def execute(self, run, transport):
        run.set_phase("asleep")
        time.sleep(self.pause)
        super().execute(run, transport)


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
