"""This worker's NVSHMEM world.

NVSHMEM is bootstrapped inside the Dask worker processes with a unique id: one rank
creates it, the others receive it through an nvmath-python ``ProcessGroup`` whose
collectives go through the Dask scheduler (`DaskProcessGroup`: each collective is one
all-gather there). No MPI, no launcher. A world spans one set of workers, in rank order;
a run over another set leaves the old world and joins a new one, in the same processes
(docs/benchmarks.md has the cost), unless a PE of the old world died: NVSHMEM's finalize then waits
for it forever, so the scheduler records the survivors as *stranded*
(`dask_redist.engines.description.WorldRecord`) and ``bootstrap(restart_broken=True)`` restarts them.

Each rank unpickles its own copies of the group's contributions, so a reducer may mutate
its arguments (nvmath 1.0's ``Box`` reducer does) without corrupting any rank's result.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from typing import Any, Callable, NamedTuple

import numpy as np

from dask_redist.config import host
from dask_redist.engines.cufftmp import hostfiles, remote
from dask_redist.engines.cufftmp.hostfiles import FileExchange
from dask_redist.engines.ipc import ExchangeGroup
from dask_redist.engines.cufftmp.nvshmem import gpu_memory, heap_problem, parse_symmetric_size
from dask_redist.engines.registry import engine_settings
from dask_redist.errors import EngineUnavailableError, RedistError

logger = logging.getLogger("dask_redist")

try:  # the ABC nvmath checks for; optional so that the group is usable (and tested) without it
    from nvmath.distributed.process_group import ProcessGroup as _ProcessGroup
except ImportError:  # pragma: no cover - depends on the environment
    _ProcessGroup = object

#: nvmath's ReductionOp values (SUM, MIN, MAX) -> the NumPy reduction
_REDUCE = {0: np.sum, 1: np.min, 2: np.max}

#: exchange(tag, payload) -> every rank's payload, in rank order
Exchange = Callable[[str, bytes], list]


def gpu_identity(device: int) -> tuple[str, str]:
    """This machine (its boot id: host names repeat across containers) and the GPU's PCI address
    (the same whatever ``CUDA_VISIBLE_DEVICES`` numbers it)."""
    import socket

    import cupy

    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            machine = f.read().strip()
    except OSError:  # (not Linux)
        machine = socket.gethostname()
    try:
        return machine, cupy.cuda.Device(device).pci_bus_id
    except Exception as e:  # noqa: BLE001 - unknown: a GPU shared with nobody (the peers agree all the same)
        return machine, f"{type(e).__name__} in process {os.getpid()}"


class Member(NamedTuple):
    """What every rank of a world tells the others before NVSHMEM starts."""

    host: str  # its `dask_redist.config.host`: redist.host, else its address's host
    gpu: tuple[str, str]  # `gpu_identity`
    transport: dict  # `remote.facts`: its InfiniBand devices, its NVSHMEM_REMOTE_TRANSPORT


def shares_gpu(members: list[Member]) -> bool:
    """Every PE on one GPU of one host (the same ``redist.host`` too: PEs of two pseudo-hosts
    are on two hosts for dask-redist, even on one GPU): the peers' chunk-to-chunk path."""
    return len({(m.host, m.gpu) for m in members}) == 1


def across_hosts(workers, members: list[Member]) -> str | None:
    """Why a world over ``workers`` (with the ``members`` they told) cannot form across hosts."""
    return remote.across_hosts_problem({w: {"host": m.host, **m.transport} for w, m in zip(workers, members)})


class DaskProcessGroup(_ProcessGroup):
    """Rank ``rank`` of ``nranks`` in group ``name``; ``exchange`` does the all-gather."""

    def __init__(self, name: str, rank: int, nranks: int, exchange: Exchange):
        if not 0 <= rank < nranks:
            raise ValueError(f"rank {rank} is not in [0, {nranks})")
        self.name = name
        self._rank, self._nranks = rank, nranks
        self._exchange = exchange
        until = exchange if isinstance(exchange, FileExchange) else None  # (it looks at stop as it polls)
        self._group = ExchangeGroup(name, exchange, until)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def nranks(self) -> int:
        return self._nranks

    def allgather(self, obj: Any, stop: Callable[[], bool] | None = None) -> list:
        """Every rank's ``obj``, in rank order (fresh copies). With ``stop``: `ipc.Stopped`
        once ``stop()`` is true (checked as files are looked for, else every `ipc.STOP_POLL_S`), where
        a rank that is gone would never answer."""
        return self._group.allgather(obj, stop)

    def broadcast_buffer(self, array: np.ndarray, *, root: int = 0) -> None:
        values = self.allgather(array if self._rank == root else None)
        array[...] = values[root]

    def allreduce_buffer(self, array: np.ndarray, *, op) -> None:
        values = self.allgather(array)
        array[...] = _REDUCE[int(op)](np.stack(values), axis=0)

    def allreduce_object(self, obj, *, op):
        return functools.reduce(op, self.allgather(obj))

    def barrier(self) -> None:
        self.allgather(None)


class World:
    """The NVSHMEM world of this worker process (worker side): its members, joining, leaving."""

    def __init__(self):
        self.members: tuple[str, ...] | None = None  # the workers it spans, in rank order
        self.group: DaskProcessGroup | None = None
        self.broken: str | None = None  # why NVSHMEM in this process cannot be trusted any more
        self.bootstrap_s: float | None = None
        #: every PE of the world runs on this process's GPU (`dask_redist.engines.cufftmp.peers`)
        self.shared_gpu = False
        #: the group PEs sharing one GPU all-gather through (`dask_redist.engines.cufftmp.peers`):
        #: files where they can share them (`dask_redist.engines.cufftmp.hostfiles`), else `group`
        self.peers_group: DaskProcessGroup | None = None
        self._files: FileExchange | None = None

    def join(self, run, exchange_factory, release: Callable[[], None]) -> bool:
        """Be in a world over ``run``'s workers (collective); True if NVSHMEM started now.

        ``release`` frees what lives in the old world (plans, symmetric memory) before it is left.
        """
        import cupy
        import nvmath.distributed

        workers = run.spec.workers
        if self.members == workers:
            return False
        settings = run.spec.collective.settings
        problem = None
        if self.members is not None:  # a new worker set: leave the old world first
            try:
                self._leave_within(settings.bootstrap_timeout, release)
            except RedistError as e:
                problem = str(e)
        if (symmetric_size := engine_settings(run.spec.engine, settings).symmetric_size) is not None:
            os.environ["NVSHMEM_SYMMETRIC_SIZE"] = str(symmetric_size)
        elif "NVSHMEM_SYMMETRIC_SIZE" not in os.environ:  # the arena (budget + 13% + workspace) must fit
            os.environ["NVSHMEM_SYMMETRIC_SIZE"] = str(settings.memory_budget * 5 // 4 + 2**28)
        start = time.perf_counter()
        group = DaskProcessGroup(
            f"nvshmem/{run.spec.token}/{run.run_id}",
            run.rank,
            len(workers),
            exchange_factory(run.rank, len(workers)),
        )
        # agreed on by every rank before NVSHMEM starts: one rank refusing alone would leave
        # the others inside NVSHMEM's bootstrap until it times out
        problem = problem or self._rejoin_problem() or self._heap_problem()
        device = cupy.cuda.runtime.getDevice()
        mine = Member(host(workers[run.rank]), gpu_identity(device), remote.facts())
        everyone = group.allgather((problem, mine))
        problems = [(workers[r], p) for r, (p, _) in enumerate(everyone) if p]
        if problems:
            raise EngineUnavailableError(
                f"{run.name()}: cufftmp cannot start on {problems[0][0]}: {problems[0][1]}"
            )
        members = [m for _, m in everyone]
        if why := across_hosts(workers, members):  # (alike on every rank: NVSHMEM not started)
            raise EngineUnavailableError(f"{run.name()}: cufftmp cannot start: {why}")
        # (one host, no InfiniBand: no remote transport, no "no IB devices" line)
        remote.set_for_world([m.host for m in members])
        try:
            nvmath.distributed.initialize(device, group, ["nvshmem"])
        except BaseException as e:  # noqa: B036 - NVSHMEM may be half started: never again here
            self.broken = f"NVSHMEM's bootstrap failed in this process ({type(e).__name__}: {e})"
            raise
        self.group, self.members = group, workers
        self.shared_gpu = shares_gpu(members)
        self.peers_group, self._files = group, None
        hosts = [m.host for m in members]  # (alike on every rank, as is shared_gpu)
        if self.shared_gpu and (files := hostfiles.agree(group, settings.bootstrap_timeout, hosts)):
            self.peers_group = DaskProcessGroup("peers", run.rank, len(workers), files)
            self._files = files
        self.bootstrap_s = time.perf_counter() - start
        logger.info("NVSHMEM bootstrapped over %d workers in %.2fs", len(workers), self.bootstrap_s)
        return True

    def member_left(self, address: str) -> None:
        """A worker of this world left: the world can never be left normally (NVSHMEM's frees and
        finalize wait for every PE), so this process refuses cufftmp runs until it is restarted,
        at once and saying so, instead of blocking inside NVSHMEM when asked to form a new world."""
        if self.members is not None and address in self.members and self.broken is None:
            self.broken = (
                f"worker {address} of this worker's NVSHMEM world left, and NVSHMEM cannot leave a world that lost "
                "a PE (its frees and finalize wait for that PE forever); restart this worker: "
                "dask_redist.bootstrap(client, restart_broken=True)"
            )

    @staticmethod
    def _heap_problem() -> str | None:
        try:
            size = parse_symmetric_size(os.environ["NVSHMEM_SYMMETRIC_SIZE"])
        except ValueError as e:
            return str(e)
        return heap_problem(size, *gpu_memory())

    def _rejoin_problem(self) -> str | None:
        """Why this process cannot start NVSHMEM for a new world: it is still up from the last one."""
        from nvmath.bindings import nvshmem

        if nvshmem.init_status() == nvshmem.STATUS_NOT_INITIALIZED:
            return None
        self.broken = (
            "NVSHMEM is still initialized after leaving this worker's previous world; restart the worker"
        )
        return self.broken

    def _leave_within(self, timeout: float, release: Callable[[], None]) -> None:
        """`leave` on a helper thread: with a PE of the old world gone it may never return."""
        done, failed = threading.Event(), []

        def target():
            try:
                self.leave(release)
            except BaseException as e:  # noqa: B036 - reported below
                failed.append(e)
            finally:
                done.set()

        threading.Thread(target=target, name="redist-nvshmem-finalize", daemon=True).start()
        if not done.wait(timeout) or failed:
            why = f"failed ({type(failed[0]).__name__}: {failed[0]})" if failed else "did not return"
            self.broken = f"NVSHMEM finalize of the previous worker set {why}; restart this worker"
            raise RedistError(self.broken)

    def leave(self, release: Callable[[], None]) -> None:
        """Leave the NVSHMEM world, in the same process (every member of the old world does it
        in the same run, so the collective frees in ``release`` match up).

        Plans are destroyed and symmetric memory freed first (``release``): NVSHMEM counts its
        initializations, and with a plan alive the finalize left NVSHMEM initialized for the
        old world (the next world, of another size, then failed to start). Only for a healthy
        world: where a PE died, the collectives here would wait for it forever, and the
        scheduler has the survivors restarted instead.
        """
        import cupy
        import nvmath.distributed

        cupy.cuda.Device().synchronize()
        release()
        nvmath.distributed.finalize()
        if self._files is not None:  # (every peer is past its last all-gather: NVSHMEM's finalize waited)
            self._files.close()
        self.members, self.shared_gpu, self.peers_group, self._files = None, False, None, None
