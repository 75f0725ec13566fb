"""The hybrid engine on CPU worker processes, for tests: NumPy chunks stand in for CuPy ones, their
output chunks live in POSIX shared memory, and "CUDA IPC" maps a peer's output allocation by its
shared-memory name; the copy kernel's jobs are replayed with ``memmove``. Everything else (the
scheduler's all-gathers, Dask's comms, the routes, the faults) is the engine's own code.

Selected with ``redist.engine="hybrid_cpu:CpuHybridEngine"`` (tests/test_hybrid_cluster.py)."""

from __future__ import annotations

from multiprocessing import shared_memory
from types import SimpleNamespace

import numpy as np
from copy_helpers import replay_at_addresses

from dask_redist.core.wire import Packed
from dask_redist.engines.hybrid import HybridEngine
from dask_redist.engines.hybrid.description import HybridDescription


class Dev(np.ndarray):
    """A NumPy array read as the engine reads a CuPy one: ``.data.ptr``, its first byte's address."""

    @property
    def data(self):
        return SimpleNamespace(ptr=self.__array_interface__["data"][0])


class SharedIpc:
    """Allocations in shared memory, exported by name and mapped by peers of this machine."""

    def __init__(self):
        self.owned: dict[int, shared_memory.SharedMemory] = {}  # base address -> its segment
        self.opened: dict[int, shared_memory.SharedMemory] = {}

    @staticmethod
    def _base(segment) -> int:
        return np.frombuffer(segment.buf, np.uint8).ctypes.data

    def allocate(self, nbytes: int) -> tuple[int, memoryview]:
        segment = shared_memory.SharedMemory(create=True, size=max(nbytes, 1))
        self.owned[self._base(segment)] = segment
        return self._base(segment), segment.buf

    def allocation(self, ptr: int) -> int:
        for base, segment in self.owned.items():
            if base <= ptr < base + segment.size:
                return base
        raise RuntimeError(f"address {ptr:#x} is not in shared memory: no IPC handle")

    def handle(self, base: int) -> bytes:
        return self.owned[base].name.encode()

    def open(self, handle: bytes) -> int:
        segment = shared_memory.SharedMemory(name=handle.decode())
        self.opened[self._base(segment)] = segment
        return self._base(segment)

    def close(self, ptr: int) -> None:
        segment = self.opened.pop(ptr)
        segment.close()


class CpuDevice:
    """The engine's GPU on the CPU of a worker process."""

    def __init__(self):
        self.ipc = SharedIpc()

    def empty(self, shape, dtype):
        dtype = np.dtype(dtype)
        _, buf = self.ipc.allocate(int(np.prod(shape)) * dtype.itemsize)
        return np.ndarray(shape, dtype, buffer=buf).view(Dev)

    def synchronize(self) -> None:
        pass

    def launch(self, jobs) -> None:
        replay_at_addresses(jobs)

    def place(self, pairs) -> None:
        for dst, src in pairs:
            dst[...] = src


class CpuHybridDescription(HybridDescription):
    chunk_types = ("numpy",)  # (NumPy chunks standing in for CuPy ones)

    def refuses(self, request):
        return None


class CpuHybridEngine(HybridEngine):
    description = CpuHybridDescription

    def __init__(self):
        super().__init__(device=CpuDevice())

    @staticmethod
    def capabilities() -> dict:
        return {"ok": True, "reason": "the CPU stand-in"}

    def execute(self, run, transport) -> None:
        run.inputs = {f: np.ascontiguousarray(a).view(Dev) for f, a in run.inputs.items()}
        finish = run.finish  # (what leaves the engine is plain NumPy: Dask's serializers read .data)
        run.finish = lambda outputs: finish({f: a.view(np.ndarray) for f, a in outputs.items()})
        super().execute(run, Plain(transport))


class Plain:
    """The worker's transport, sending plain NumPy buffers."""

    def __init__(self, transport):
        self._transport = transport

    def send(self, batches) -> None:
        self._transport.send([(d, f, Packed(p.count, p.buffer.view(np.ndarray))) for d, f, p in batches])

    def exchange_factory(self, rank, nranks):
        return self._transport.exchange_factory(rank, nranks)


class FailingSendHybridEngine(CpuHybridEngine):
    """Rank 0's sends fail (as a piece Dask cannot serialize would): its peers must not wait for them."""

    def execute(self, run, transport) -> None:
        if run.rank == 0:
            transport = Failing(transport)
        super().execute(run, transport)


class Failing(Plain):
    def send(self, batches) -> None:
        raise TypeError("memoryview: a bytes-like object is required")


class HeldHybridEngine(CpuHybridEngine):
    """Rank 0 holds before its copies until the run is aborted (at most a minute): its peers wait
    for it in the last all-gather, as behind a slow peer."""

    def _copy(self, run, *args) -> None:
        if run.rank == 0:
            hold_until_aborted(run)
        return CpuHybridEngine._copy(run, *args)


class HeldOnceHybridEngine(CpuHybridEngine):
    """Rank 0 of a rechunk's first run holds before its copies (a minute at most; a file marks the
    rechunk held, so that its restart, in a new process too, does not hold)."""

    def _copy(self, run, *args) -> None:
        import os
        import tempfile

        marker = os.path.join(tempfile.gettempdir(), f"redist-hybrid-held-{run.spec.token}")
        if run.rank == 0 and not os.path.exists(marker):
            open(marker, "w").close()
            hold_until_aborted(run)
        return CpuHybridEngine._copy(run, *args)


class AbortedAfterExportHybridEngine(CpuHybridEngine):
    """Rank 1 hears of its run's abort between the first all-gather and the next: it holds after
    that all-gather until the run is aborted (a minute at most), its peers wait in the next."""

    def execute(self, run, transport) -> None:
        from dask_redist.engines.hybrid.engine import _run_group

        self._group = lambda r: HeldAfterFirst(_run_group(r, transport), r)
        super().execute(run, transport)


class HeldAfterFirst:
    """``group``'s all-gathers for ``run``; rank 1 holds after the first until the run is aborted."""

    def __init__(self, group, run):
        self.group, self.run, self.calls = group, run, 0

    def allgather(self, obj, stop=None) -> list:
        everyone = self.group.allgather(obj, stop)
        self.calls += 1
        if self.calls == 1 and self.run.rank == 1:
            hold_until_aborted(self.run)
        return everyone


def hold_until_aborted(run, seconds: float = 60) -> None:
    """Wait until ``run`` is aborted, ``seconds`` at most."""
    import time

    deadline = time.monotonic() + seconds
    while run.state != "failed" and time.monotonic() < deadline:
        time.sleep(0.01)
